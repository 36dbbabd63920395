//! The worker's processor for documents: fetch the blob, extract the text, call the provider,
//! return the result with its token usage.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::Instrument;

use super::blobs::Blobs;
use super::providers::{PartOf, Provider, ProviderOutput, Task};
use super::sandbox::{extract_in_child, SandboxConfig};
use super::sniff::DocType;
use super::split;
use crate::error::EngineError;
use crate::queue::capacity::Budget;
use crate::queue::parts::{NewPart, PartDone, PartStore, PendingPart, Progress};
use crate::queue::policy::retry::ErrorClass;
use crate::queue::stages::StageLog;
use crate::queue::worker::Processor;
use crate::queue::{ClaimedJob, JobError, JobOutput, JobStage};
use crate::Preset;
use sluice_types::capacity;
use sluice_types::capacity::SizeKind;

/// What a document job's payload holds (ids and metadata, never the bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentRef {
    pub key: String,
    #[serde(rename = "type")]
    pub doc_type: DocType,
    pub sha256: String,
    pub size: u64,
    /// The user's file name, sanitised, for display only.
    pub name: Option<String>,
}

/// A document job's payload: the document and what to do with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentJob {
    pub document: DocumentRef,
    pub preset: Preset,
    #[serde(default)]
    pub language: Option<String>,
}

/// The worker's processor for document jobs.
#[derive(Clone)]
pub struct DocumentProcessor {
    pub blobs: Blobs,
    pub provider: Arc<dyn Provider>,
    /// Where documents are parsed (never in this process).
    pub sandbox: Arc<SandboxConfig>,
    /// Where the job's stage is recorded as it moves.
    pub stages: StageLog,
    /// The shared provider budget, corrected as each job's real size becomes known.
    pub budget: Budget,
    /// The most input tokens one request may carry (the provider's context); longer texts
    /// are processed in parts (or fail as invalid input when `parts` is disabled).
    pub context_tokens: Option<u64>,
    /// Where the parts of long documents are kept.
    pub parts: PartStore,
    /// The most estimated tokens a document may have at all (a text is refused at upload; a
    /// PDF's text is only known here).
    pub max_document_tokens: Option<u64>,
    /// Settling a PDF (admitted at a hold) to its text's price once read. None: PDFs are not
    /// settled (the engine's own tests), and one needing parts is refused past
    /// [`PDF_HOLD_FACTOR`] times its size's estimate.
    pub settle_pdfs: Option<PdfSettlement>,
}

/// The price table, and where a PDF's settled price is recorded.
#[derive(Clone, Debug)]
pub struct PdfSettlement {
    pub pool: sqlx::PgPool,
    pub prices: sluice_types::capacity::PriceTable,
}

/// What this attempt still holds of the budget (reserved at the claim, not yet settled).
struct Held {
    input: i64,
    output: i64,
}

/// Tokens a part's prompt adds around its text (the instruction and the part's place).
const PART_PROMPT_TOKENS: u64 = 200;
use sluice_types::settlement::PDF_HOLD_FACTOR;
/// Levels of summaries of summaries before giving up (each level must shrink the text).
const MAX_LEVELS: i32 = 8;

impl DocumentProcessor {
    /// One attempt; whatever it reserved and did not spend goes back to the budget, except
    /// when the provider may have counted the request: after a 429/529 (it saw more than the
    /// budget allowed for, and keeping the reservation spent brings the budget back under its
    /// own count), a timeout or a server error.
    async fn run(&self, job: ClaimedJob) -> Result<JobOutput, JobError> {
        let reserve = if self.budget.is_enabled() { self.budget.output_reserve } else { 0 };
        let mut held = Held { input: job.est_input_tokens, output: reserve };
        let outcome = self.attempt(&job, &mut held).await;
        let counted = matches!(&outcome, Err(e) if matches!(
            e.class,
            ErrorClass::RateLimited | ErrorClass::Overloaded | ErrorClass::Timeout | ErrorClass::ServerError
        ));
        if !counted {
            self.budget.correct(-held.input, -held.output).await;
        }
        outcome
    }

    /// One claim: the whole document, or its next part, or the combination of its parts.
    async fn attempt(&self, job: &ClaimedJob, held: &mut Held) -> Result<JobOutput, JobError> {
        let spec: DocumentJob = serde_json::from_value(job.payload.clone()).map_err(|e| {
            JobError::new(ErrorClass::InvalidInput, format!("the job's description is unreadable: {e}"))
        })?;
        if !self.provider.supports(spec.preset) {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!("\"{}\" needs a language model, and none is configured", spec.preset.label()),
            ));
        }
        match self.parts.progress(job.id).await.map_err(database_error)? {
            Progress::Unsplit => self.read_document(job, &spec, held).await,
            Progress::Pending(part) => self.run_part(job, &spec, part, held).await,
            Progress::LevelDone { level, count } => self.combine(job, &spec, level, count, held).await,
        }
    }

    /// The first claim: read the document; do it in one call if it fits, else split it and
    /// do its first part.
    async fn read_document(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        self.stages.enter(job, JobStage::Reading, None).await?;
        let bytes = self.blobs.get(&spec.document.key).await.map_err(|e| match e {
            EngineError::NotFound => JobError::new(ErrorClass::InvalidInput, "the uploaded document is gone"),
            other => JobError::new(ErrorClass::Connection, format!("could not read the document: {other}")),
        })?;
        let reading = tracing::info_span!("read document", doc_type = ?spec.document.doc_type, bytes = bytes.len());
        let extracted = extract_in_child(&self.sandbox, spec.document.doc_type, bytes).instrument(reading).await?;
        let task = Task {
            preset: spec.preset,
            language: spec.language.clone(),
            text: extracted.text,
            pages: extracted.pages,
            part: None,
        };
        let estimated = task.estimated_tokens();
        let pdf_within_hold = match spec.document.doc_type {
            DocType::Pdf => self.settle_pdf(job, spec, estimated).await?,
            _ => true,
        };
        if let Some(ceiling) = self.max_document_tokens.filter(|c| estimated as u64 > *c) {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document's text is about {} tokens, more than Sluice takes in one document ({}); split it and upload the pieces",
                    sluice_types::thousands(estimated),
                    sluice_types::thousands(ceiling as i64)
                ),
            ));
        }
        let Some(context) = self.context_tokens.filter(|c| estimated as u64 > *c) else {
            return self.run_whole(job, spec, task, estimated, held).await;
        };
        if !self.parts.is_enabled() {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document's text is about {estimated} tokens, more than the provider reads at once ({context}); split it and upload the parts"
                ),
            ));
        }
        // Parts are paid work: a PDF whose text costs more than the price held for it (a
        // dense, compressed one) is not done in parts for less; a text file (priced by its
        // text) is the way.
        if !pdf_within_hold {
            let by_size = sluice_types::capacity::estimate_input_tokens(SizeKind::Pdf, spec.document.size) as i64;
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the PDF holds about {} tokens of text, more than one provider call takes and more than the \
                     price held for it covers ({PDF_HOLD_FACTOR} times the {} its size suggested); upload its text \
                     as a .txt file (priced by its text)",
                    sluice_types::thousands(estimated),
                    sluice_types::thousands(by_size)
                ),
            ));
        }
        let parts = split_for(spec.preset, &task.text, self.part_tokens(spec.preset, context), 0);
        if parts.len() < 2 {
            return self.run_whole(job, spec, task, estimated, held).await;
        }
        if !self.parts.add_level(job, 0, &parts).await.map_err(database_error)? {
            return Err(JobError::new(ErrorClass::Timeout, "the attempt lost its lease"));
        }
        match self.parts.progress(job.id).await.map_err(database_error)? {
            Progress::Pending(part) => self.run_part(job, spec, part, held).await,
            _ => Err(JobError::new(ErrorClass::ServerError, "the document's parts were not stored")),
        }
    }

    /// A PDF was admitted at a hold (its worst case); now that its text is known, settle it to
    /// its text's price (the difference comes back when the job ends). Returns whether the
    /// text's price is within the hold.
    async fn settle_pdf(&self, job: &ClaimedJob, spec: &DocumentJob, estimated: i64) -> Result<bool, JobError> {
        let Some(settlement) = &self.settle_pdfs else {
            let by_size = sluice_types::capacity::estimate_input_tokens(SizeKind::Pdf, spec.document.size);
            return Ok(estimated.max(0) as u64 <= by_size.saturating_mul(PDF_HOLD_FACTOR));
        };
        let text_price = settlement.prices.price(estimated.max(0) as u64);
        let held: Option<i32> = sqlx::query_scalar(
            "UPDATE jobs SET settled_cost = least(cost, $3) WHERE id = $1 AND lease_token = $2 AND state = 'running'
             RETURNING cost",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(text_price.clamp(0, i32::MAX as i64) as i32)
        .fetch_optional(&settlement.pool)
        .await
        .map_err(|e| database_error(e.into()))?;
        let held = held.ok_or_else(|| JobError::new(ErrorClass::Timeout, "the attempt lost its lease"))?;
        Ok(text_price <= i64::from(held))
    }

    /// The document in one call, as it always was.
    async fn run_whole(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        task: Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let output = self.call(job, &task, estimated, held).await?;
        Ok(JobOutput {
            result: serde_json::json!({
                "markdown": output.text,
                "provider": self.provider.name(),
                "preset": spec.preset,
                "estimated_input_tokens": estimated,
                "pages": task.pages,
                "details": output.data,
            }),
            input_tokens: output.input_tokens.or(Some(estimated)),
            output_tokens: output.output_tokens,
            part: None,
        })
    }

    /// One part: its output is stored and the job goes back in line for the next.
    async fn run_part(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        part: PendingPart,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let of = PartOf {
            number: part.idx as u32 + 1,
            count: part.count as u32,
            level: part.level as u32,
            overlap: part.overlap,
        };
        let where_ = if part.level == 0 {
            format!("part {} of {}", of.number, of.count)
        } else {
            format!("combining the parts ({} of {})", of.number, of.count)
        };
        let task =
            Task { preset: spec.preset, language: spec.language.clone(), text: part.body, pages: None, part: Some(of) };
        let estimated = task.estimated_tokens();
        let output = self.call(job, &task, estimated, held).await.map_err(|mut e| {
            e.message = format!("{where_}: {}", e.message);
            e
        })?;
        // The next claim reserves what it will send: the next part, or about the combined
        // outputs (a join takes no call at all).
        let next_est_tokens = match part.following_est_tokens {
            Some(next) => next,
            // A join, or the one answer at a combining level, is the result: no call.
            None if (joins(spec.preset) && part.level == 0) || (part.level > 0 && part.count == 1) => 0,
            None => self.context_tokens.map_or(estimated, |c| c as i64).min(estimated),
        };
        Ok(JobOutput {
            result: serde_json::Value::Null,
            input_tokens: output.input_tokens.or(Some(estimated)),
            output_tokens: output.output_tokens,
            part: Some(PartDone { level: part.level, idx: part.idx, output: output.text, next_est_tokens }),
        })
    }

    /// Every part of `level` is done: a translation joins them; a summary of one part at a
    /// combining level is the result; otherwise the outputs become the next level's parts.
    async fn combine(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        level: i32,
        count: i32,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let outputs = self.parts.outputs(job.id, level).await.map_err(database_error)?;
        let parts_total = self.parts.count(job.id, 0).await.map_err(database_error)?;
        if (joins(spec.preset) && level == 0) || (level > 0 && count == 1) {
            // No provider call: give back what the claim reserved.
            self.budget.correct(-held.input, -held.output).await;
            *held = Held { input: 0, output: 0 };
            self.stages.enter(job, JobStage::Writing, None).await?;
            let markdown = outputs.join("\n\n");
            return Ok(JobOutput {
                result: serde_json::json!({
                    "markdown": markdown,
                    "provider": self.provider.name(),
                    "preset": spec.preset,
                    "parts": parts_total,
                    "levels": level + 1,
                    "details": { "parts": parts_total },
                }),
                input_tokens: None,
                output_tokens: None,
                part: None,
            });
        }
        if level + 1 >= MAX_LEVELS {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                "the parts' answers did not get shorter when combined; the document cannot be summarised in parts",
            ));
        }
        let combined = outputs.join("\n\n");
        let context = self.context_tokens.unwrap_or(u64::MAX / 8);
        let parts = split_for(spec.preset, &combined, self.part_tokens(spec.preset, context), level + 1);
        if parts.len() >= count as usize {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                "the parts' answers did not get shorter when combined; the document cannot be summarised in parts",
            ));
        }
        if !self.parts.add_level(job, level + 1, &parts).await.map_err(database_error)? {
            return Err(JobError::new(ErrorClass::Timeout, "the attempt lost its lease"));
        }
        match self.parts.progress(job.id).await.map_err(database_error)? {
            Progress::Pending(part) => self.run_part(job, spec, part, held).await,
            _ => Err(JobError::new(ErrorClass::ServerError, "the combined parts were not stored")),
        }
    }

    /// The most tokens a part may carry: one call's context; for a translation also no more
    /// than the answer may hold (its output is as long as its input, and an answer cut at the
    /// provider's `max_tokens` would lose the end of the part).
    fn part_tokens(&self, preset: Preset, context: u64) -> u64 {
        match self.provider.max_output_tokens() {
            Some(output) if joins(preset) => context.min(output.saturating_mul(3) / 4 + PART_PROMPT_TOKENS),
            _ => context,
        }
    }

    /// One provider call for `task`, with the budget settled by what the provider counted.
    async fn call(
        &self,
        job: &ClaimedJob,
        task: &Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<ProviderOutput, JobError> {
        self.budget.refine(job.id, job.lease_token, held.input, estimated).await;
        held.input = estimated;
        self.stages.enter(job, JobStage::WaitingForProvider, task.pages).await?;
        let span = tracing::info_span!(
            "provider call",
            provider = self.provider.name(),
            preset = ?task.preset,
            estimated_input_tokens = estimated,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
            error = tracing::field::Empty,
            provider_status = tracing::field::Empty,
        );
        let output = self.provider.run(task).instrument(span.clone()).await;
        match &output {
            Ok(output) => {
                span.record("input_tokens", output.input_tokens);
                span.record("output_tokens", output.output_tokens);
            }
            Err(e) => {
                span.record("error", e.message.as_str());
                span.record("provider_status", e.provider_status.map(u64::from));
            }
        }
        let output = output?;
        // The provider counted what it counted: settle the reservation with the real usage, as
        // far as it is believable (tokenizers differ from our estimate, but not fourfold; an
        // answer is never longer than the `max_tokens` reserved for it).
        let believable_in = estimated.saturating_mul(4).max(estimated.saturating_add(10_000));
        let used_in = output.input_tokens.unwrap_or(estimated).clamp(0, believable_in);
        let used_out = output.output_tokens.unwrap_or(held.output).clamp(0, held.output.max(0));
        let reserved = std::mem::replace(held, Held { input: 0, output: 0 });
        self.budget.correct(used_in.saturating_sub(reserved.input), used_out.saturating_sub(reserved.output)).await;
        self.budget.observe(&output.remaining).await;
        self.stages.enter(job, JobStage::Writing, None).await?;
        Ok(output)
    }
}

/// Whether a preset's parts are combined by joining them in order (a translation), rather than
/// by a summary of their answers.
fn joins(preset: Preset) -> bool {
    preset == Preset::Translate
}

/// `text` split into parts whose prompts fit `context_tokens`, as new parts of `level`. A
/// summary's parts carry a little of the text before them as context; a translation's none
/// (it would be translated twice).
fn split_for(preset: Preset, text: &str, context_tokens: u64, level: i32) -> Vec<NewPart> {
    let max_chars = context_tokens.saturating_sub(PART_PROMPT_TOKENS).max(100).saturating_mul(4);
    let max_chars = usize::try_from(max_chars).unwrap_or(usize::MAX / 2);
    let overlap = if joins(preset) || level > 0 { 0 } else { (max_chars / 50).min(2_000) };
    // Postgres text holds no NUL, and no provider needs one.
    let text = &text.replace('\0', "");
    split::split(text, max_chars, overlap)
        .into_iter()
        .map(|p| {
            let (body, overlap) = (p.body(text).to_string(), p.overlap(text).to_string());
            let chars = (body.chars().count() + overlap.chars().count()) as u64;
            let est_tokens = (capacity::tokens_in_chars(chars) + PART_PROMPT_TOKENS) as i64;
            NewPart { body, overlap, est_tokens }
        })
        .collect()
}

fn database_error(e: EngineError) -> JobError {
    JobError::new(ErrorClass::Connection, format!("the database did not answer: {e}"))
}

impl Processor for DocumentProcessor {
    fn process(&self, job: ClaimedJob) -> BoxFuture<'static, Result<JobOutput, JobError>> {
        let this = self.clone();
        Box::pin(async move { this.run(job).await })
    }
}

/// The blob key a job's payload points at, for retention.
pub fn blob_key(payload: &Value) -> Option<&str> {
    payload.pointer("/document/key").and_then(Value::as_str)
}
