//! The worker's processor for documents: fetch the blob, extract the text, call the provider,
//! return the result with its token usage.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::Instrument;

use super::blobs::Blobs;
use super::calls::{calls_for, joins, CallLimits, Calls, PART_PROMPT_TOKENS};
use super::payload::{size_kind, DocumentJob};
use super::providers::{self, vendor, OnWritten, PartOf, Provider, ProviderOutput, Task};
use super::ratio::TokenRatio;
use super::sandbox::{extract_in_child, SandboxConfig};
use super::split;
use super::tokens;
use super::{glossary, inline, kept_answers, markers};
use crate::error::EngineError;
use crate::queue::capacity::Budget;
use crate::queue::parts::{NewPart, PartStore, PartsProgress, PendingPart, Progress, StoredPart};
use crate::queue::policy::retry::ErrorClass;
use crate::queue::stages::StageLog;
use crate::queue::worker::{with_db_retries, Processor};
use crate::queue::{ClaimedJob, JobError, JobOutput, JobStage};
use crate::Preset;

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
    /// Settling a document admitted at a hold (a PDF, a Word file, a page) to its text's price
    /// once read. None: they are not settled (the engine's own tests), and one needing parts is
    /// refused past its hold factor times its size's estimate.
    pub settle_held: Option<HoldSettlement>,
    /// What the provider's tokenizer counts against ours, learned from its usage: parts are
    /// planned by the provider's count.
    pub token_ratio: TokenRatio,
    /// The answers being written, per attempt, for the job page.
    pub writing: WritingBoard,
    /// The economy lane (none: it is not offered; an economy job is done interactively).
    pub economy: Option<super::economy::EconomyLane>,
}

/// A scan that could not be read (`why`): the document's fault (unreadable, the usual rule),
/// unless most of its skipped pages ran out of time, which a busy server does too: then ours,
/// tried again.
fn unread_scan(readings: &[super::ocr::PageReading], why: &str) -> JobError {
    let skipped = readings.iter().filter(|r| r.skipped.is_some()).count();
    let timed_out = readings.iter().filter(|r| r.timed_out).count();
    if timed_out * 2 > skipped {
        return JobError::new(
            ErrorClass::ServerError,
            format!("{why}: pages ran out of time (the server may have been busy); it is tried again"),
        );
    }
    JobError::new(ErrorClass::InvalidInput, why).unreadable()
}

/// What a scan's settlement goes by: its text layer's own tokens and its pages read by OCR.
struct ScanRead {
    text_layer_tokens: i64,
    read: u32,
}

/// About how much of the answers each attempt's calls are writing is written (streamed),
/// written to `job_writing` every few seconds while it changes.
#[derive(Clone, Default)]
pub struct WritingBoard(Arc<std::sync::Mutex<std::collections::HashMap<uuid::Uuid, Arc<Writing>>>>);

/// One attempt's answers being written: tokens written so far and expected, over its calls in
/// flight.
#[derive(Default)]
pub struct Writing {
    written: AtomicU64,
    expected: AtomicU64,
    /// Its progress was written to `job_writing` (the row is removed when the attempt ends).
    reported: std::sync::atomic::AtomicBool,
}

impl WritingBoard {
    fn of(&self, lease: uuid::Uuid) -> Arc<Writing> {
        self.0.lock().unwrap().entry(lease).or_default().clone()
    }

    fn end(&self, lease: uuid::Uuid) {
        self.0.lock().unwrap().remove(&lease);
    }
}

/// How often the answers' progress is written while it changes.
const WRITING_EVERY: Duration = Duration::from_secs(2);

/// The price table, and where a held document's settled price is recorded.
#[derive(Clone, Debug)]
pub struct HoldSettlement {
    pub pool: sqlx::PgPool,
    pub prices: sluice_types::capacity::PriceTable,
    /// The economy lane's terms (an economy document is settled at its discount).
    pub economy: Option<sluice_types::capacity::EconomyTerms>,
}

/// What a call still holds of the budget (reserved, not yet settled).
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    input: i64,
    output: i64,
}

use sluice_types::settlement::hold_factor;
/// Levels of summaries of summaries before giving up (each level must shrink the text).
const MAX_LEVELS: i32 = 8;
/// The most parts of one document in flight at once (the gate's maximum is 70).
const MAX_PARTS_AT_ONCE: usize = 64;
/// How long one claim of a document in parts starts new parts, at most; then it lets the parts
/// in flight finish and goes back in line. Never more than a third of the attempt's time, so
/// the calls it started end before the attempt's deadline.
const PARTS_TURN: Duration = Duration::from_secs(240);
/// How often a document asks again for calls the gate or the budget could not give yet.
const ASK_AGAIN: Duration = Duration::from_millis(250);
/// Halvings of a part whose answer was cut before giving up.
const MAX_HALVINGS: u32 = 6;
/// The answer a key-term list is asked for (30 short lines).
const TERMS_ANSWER_TOKENS: u32 = 2_048;
/// The most glossary entries a job reports as left out.
const MAX_TERMS_REPORTED: usize = 50;
/// The language a translation naming none is made into (the prompt's).
const DEFAULT_LANGUAGE: &str = "English";
/// The most provider calls one part's translation makes (its rounds, halves and the
/// glossary's second ask together): a normal part takes one, a cut one two or three.
const MAX_CALLS_PER_ANSWER: u32 = 24;
/// Rounds of asking a translation's missing paragraphs again before the rest goes in halves.
const MAX_ROUNDS: u32 = 4;

/// Tokens used by this attempt's calls.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    input: i64,
    output: i64,
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
    }
}

/// A whole answer (perhaps made of the answers to halves of a text whose answer was cut) and
/// what its calls used.
#[derive(Default)]
struct Answer {
    text: String,
    usage: Usage,
    /// Output tokens paid for and not kept (a cut or flawed answer's unchecked paragraphs).
    discarded: i64,
    /// Paragraphs whose inline tags came back wrong: plain, in their paragraph's look.
    plain_paragraphs: i64,
    /// Glossary entries whose agreed translation an answer left out, asked again once
    /// (`Supplier → Lieferant`).
    terms_missed: Vec<String>,
}

impl Answer {
    /// Count `other`'s calls in this one's.
    fn absorb(&mut self, other: &Answer) {
        self.usage.add(other.usage);
        self.discarded += other.discarded;
        self.plain_paragraphs += other.plain_paragraphs;
        for term in &other.terms_missed {
            if !self.terms_missed.contains(term) {
                self.terms_missed.push(term.clone());
            }
        }
    }
}

/// One part's call, ended.
struct PartEnded {
    part: PendingPart,
    reserved: i64,
    result: Result<Answer, JobError>,
}

/// A level's part calls in flight, each its own task.
#[derive(Default)]
struct PartCalls {
    tasks: tokio::task::JoinSet<PartEnded>,
    /// The part each task calls for, should the task panic.
    parts: std::collections::HashMap<tokio::task::Id, (PendingPart, i64)>,
}

impl PartCalls {
    /// Start a part's call; `granted`: its reservation came from [`PartStore::calls`] (counted
    /// in the job's tokens in flight), not from the claim.
    fn start(
        &mut self,
        processor: &DocumentProcessor,
        job: &ClaimedJob,
        spec: &DocumentJob,
        part: PendingPart,
        held: Held,
        granted: bool,
    ) {
        let (this, job, spec) = (processor.clone(), job.clone(), spec.clone());
        let granted_tokens = if granted { held.input } else { 0 };
        let meta = (PendingPart { body: String::new(), overlap: String::new(), ..part.clone() }, granted_tokens);
        let task = self.tasks.spawn(async move { this.call_part(&job, &spec, part, held, granted_tokens).await });
        self.parts.insert(task.id(), meta);
    }

    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next call to end; a panicked one ends as a server error for its part.
    async fn next(&mut self) -> Option<PartEnded> {
        let joined = self.tasks.join_next_with_id().await?;
        Some(match joined {
            Ok((id, ended)) => {
                self.parts.remove(&id);
                ended
            }
            Err(e) => {
                let (part, reserved) = self.parts.remove(&e.id()).expect("every task's part is known");
                let error = JobError::new(ErrorClass::ServerError, "the part's call failed unexpectedly");
                PartEnded { part, reserved, result: Err(error) }
            }
        })
    }
}

/// How a level's turn ended.
enum LevelEnd {
    /// Every part of the level is done.
    Done,
    /// Stopped before (paused, to be canceled, the turn over): back in line.
    Stopped,
}

impl DocumentProcessor {
    /// One attempt; whatever it reserved and did not spend goes back to the budget, except
    /// when the provider may have counted the request: after a 429/529 (it saw more than the
    /// budget allowed for, and keeping the reservation spent brings the budget back under its
    /// own count), a timeout or a server error.
    async fn run(&self, job: ClaimedJob) -> Result<JobOutput, JobError> {
        let reserve = if self.budget.is_enabled() { self.budget.output_reserve } else { 0 };
        let mut held = Held { input: job.est_input_tokens, output: reserve };
        let writing = WritingReport::start(self, &job);
        let gathering = self.gathers_a_batch(&job).await;
        // Before anything that costs: were this process to die from here on, the attempt is
        // counted, never taken for work fetched ahead and not started.
        let outcome = match self.stages.started(&job).await {
            Ok(()) => self.attempt_unless_answered(&job, &mut held).await,
            Err(e) => Err(e),
        };
        let outcome = if gathering { self.send_batch(&job, outcome).await } else { outcome };
        if writing.stop() {
            self.stages.writing_ended(&job).await;
        }
        match &outcome {
            Err(e) => self.give_back_unless_counted(e, held).await,
            Ok(_) => self.budget.correct(-held.input, -held.output).await,
        }
        outcome
    }

    /// Whether this claim gathers the job's calls into a batch (the economy lane's first claim).
    async fn gathers_a_batch(&self, job: &ClaimedJob) -> bool {
        let Some(economy) = &self.economy else { return false };
        match economy.begin(job, self.provider.as_ref()).await {
            Ok(gathering) => gathering,
            Err(e) => {
                tracing::warn!(job = %job.id, error = %e, "could not tell whether a job's calls were sent to a batch; done at once");
                false
            }
        }
    }

    /// The gathering claim's end: the calls it kept sent as one batch, and the job back in line
    /// until the window's end (the poller makes it due as soon as the batch answers). A claim
    /// that kept nothing ends as it ended.
    async fn send_batch(&self, job: &ClaimedJob, outcome: Result<JobOutput, JobError>) -> Result<JobOutput, JobError> {
        let Some(economy) = &self.economy else { return outcome };
        let tasks = economy.end(job);
        match outcome {
            Err(e) if e.deferred && !tasks.is_empty() => {
                // Taken: the job waits for the batch (the poller makes it due sooner). Not
                // taken: it is back in line at once, its next claim asking as the standard
                // lane does; no attempt used either way.
                let taken = economy.submit(self.provider.as_ref(), job, &tasks).await?;
                let (input, output) = e.usage.unwrap_or_default();
                Ok(JobOutput {
                    result: serde_json::Value::Null,
                    input_tokens: Some(input),
                    output_tokens: Some(output),
                    part: Some(PartsProgress {
                        next_est_tokens: job.est_input_tokens,
                        wait: taken.then_some(economy.window),
                    }),
                })
            }
            // Never a failure of its own: should one escape, it is an ordinary passing one.
            Err(e) if e.deferred => Err(JobError { deferred: false, ..e }),
            other => other,
        }
    }

    /// The answer an earlier attempt got and could not complete (its process died before its
    /// completion was written), or this attempt's; a final answer is kept before it is handed
    /// on, so it is never paid for twice.
    async fn attempt_unless_answered(&self, job: &ClaimedJob, held: &mut Held) -> Result<JobOutput, JobError> {
        let Some(pool) = self.parts.pool() else { return self.attempt(job, held).await };
        if let Some(kept) = kept_answers::kept(pool, job.id).await.map_err(database_error)? {
            tracing::info!(job = %job.id, "an earlier attempt's answer was kept: used, no call made");
            return Ok(kept);
        }
        let output = self.attempt(job, held).await?;
        if output.part.is_none() && !output.result.is_null() {
            // A paid answer is worth a few tries of the database before it is given up.
            let kept = with_db_retries("a document's answer", || kept_answers::keep(pool, job, &output)).await;
            if kept.is_none() {
                tracing::warn!(job = %job.id, "could not keep the answer before completing it");
            }
        }
        Ok(output)
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
            Progress::Pending(part) => self.run_in_parts(job, &spec, part.level, held).await,
            Progress::LevelDone { level, .. } => self.run_in_parts(job, &spec, level, held).await,
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
        let extracted =
            extract_in_child(&self.sandbox, spec.document.doc_type, bytes.clone()).instrument(reading).await?;
        let (extracted, scan) = self.read_scans(job, spec, extracted, bytes).await?;
        // A translation's paragraphs are numbered, so its answer is checked paragraph by
        // paragraph and its result has the source's paragraphs.
        // Only Sluice's readers of Word and OpenDocument files and web pages make inline tags:
        // in any other document, text that reads like one is the document's own.
        let extracted = match spec.document.doc_type {
            super::DocType::Docx | super::DocType::Odt | super::DocType::Html => extracted,
            _ => super::extract::Extracted { text: inline::escape(&extracted.text), ..extracted },
        };
        // Other presets read inline tags as the Markdown they stand for.
        let text = if joins(spec.preset) {
            markers::mark(&extracted.text)
        } else if inline::has_tags(&extracted.text) {
            inline::to_markdown(&extracted.text)
        } else {
            extracted.text
        };
        let mut task = Task {
            preset: spec.preset,
            language: spec.language.clone(),
            text,
            pages: extracted.pages,
            part: None,
            prompt_tokens: None,
            answer_tokens: None,
            on_written: None,
            guidance: spec.guidance.clone(),
            finds_terms: false,
        };
        let estimated = count_prompt(&mut task).await;
        let kind = size_kind(spec.document.doc_type);
        let within_hold = if let Some(scan) = &scan {
            self.settle_hold(job, spec, scan.text_layer_tokens, scan.read).await?
        } else if kind.priced_once_read() {
            self.settle_hold(job, spec, own_text_tokens(&task.text).await, 0).await?
        } else {
            true
        };
        if let Some(ceiling) = self.max_document_tokens.filter(|c| estimated as u64 > *c) {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document's text is about {} tokens, more than Sluice takes in one document ({}); split it and upload the pieces",
                    sluice_types::thousands(estimated),
                    sluice_types::thousands(ceiling as i64)
                ),
            )
            // The reader's work came to nothing: it counts against the day's free ones.
            .unreadable());
        }
        let limits = self.call_limits(spec);
        let calls = calls_for(spec.preset, estimated.max(0) as u64, limits);
        if let Calls::Parts { part_tokens } = calls {
            if !self.parts.is_enabled() {
                let limit = limits.part_tokens(spec.preset).unwrap_or(part_tokens);
                let refused = JobError::new(
                    ErrorClass::InvalidInput,
                    format!(
                        "the document's text is about {estimated} tokens, more than the provider reads or writes at once ({limit}); split it and upload the parts"
                    ),
                );
                // Past its hold too: the reader's work counts against the day's free ones.
                return Err(if within_hold { refused } else { refused.unreadable() });
            }
        }
        // Every call is paid work: a PDF or Word file whose text costs more than the price
        // held for it (a dense, compressed one) is not sent for less, neither in one call nor
        // in parts; a text file (priced by its text) is the way.
        if !within_hold {
            let by_size = sluice_types::capacity::estimate_input_tokens(kind, spec.document.size) as i64;
            let factor = hold_factor(kind);
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document holds about {} tokens of text, more than the price held for it covers \
                     ({factor} times the {} its size suggested); upload its text as a .txt file (priced by its text)",
                    sluice_types::thousands(estimated),
                    sluice_types::thousands(by_size)
                ),
            )
            .unreadable());
        }
        let Calls::Parts { part_tokens } = calls else {
            return self.run_whole(job, spec, task, estimated, held).await;
        };
        self.split_and_run(job, spec, task.text, part_tokens, held).await
    }

    /// A PDF's or an image's scanned pages (without a text layer), read by OCR one at a time
    /// in the sandbox: the job shows the page being read, and its owner which pages OCR read
    /// with what confidence. Returns the document with its text in page order, and what the
    /// scan's settlement goes by (none for a document without scanned pages).
    async fn read_scans(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        extracted: super::extract::Extracted,
        bytes: bytes::Bytes,
    ) -> Result<(super::extract::Extracted, Option<ScanRead>), JobError> {
        use super::ocr::{self, OcrSource, PageReading};
        if extracted.scanned.is_empty() {
            return Ok((extracted, None));
        }
        // An earlier attempt read it: its text is used, no page read again.
        let pool = self.parts.pool();
        if let Some(pool) = pool {
            if let Some(kept) = kept_answers::kept_scan_text(pool, job.id).await.map_err(database_error)? {
                tracing::info!(job = %job.id, "the scan's text an earlier attempt read: used");
                let read = ScanRead { text_layer_tokens: kept.text_layer_tokens, read: kept.pages_read };
                return Ok((super::extract::Extracted { text: kept.text, ..extracted }, Some(read)));
            }
        }
        let pages = extracted.pages.unwrap_or(extracted.page_texts.len() as u32);
        let scanned = extracted.scanned.len() as u32;
        let text_layer_tokens = match extracted.text.trim().is_empty() {
            true => 0,
            false => own_text_tokens(&extracted.text).await,
        };
        let Some(config) = self.sandbox.ocr.clone() else {
            // No OCR here: a document with text is read without its scanned pages (they are
            // named); one with none fails in words, free.
            if text_layer_tokens == 0 {
                return Err(ocr::no_ocr_error());
            }
            let skipped: Vec<PageReading> = extracted
                .scanned
                .iter()
                .map(|&page| PageReading {
                    page,
                    skipped: Some("no OCR is installed on this server".into()),
                    ..Default::default()
                })
                .collect();
            self.stages.record_scan(job, &ocr::report(pages, "", &skipped, 0.0)).await;
            return Ok((extracted, Some(ScanRead { text_layer_tokens, read: 0 })));
        };
        if scanned > config.max_pages {
            return Err(
                JobError::new(ErrorClass::InvalidInput, ocr::too_many_pages(scanned, config.max_pages)).unreadable()
            );
        }
        // Priced before a page is read: a scan whose pages cost more than was held for it (its
        // survey at upload did not price it) is refused, not read for nothing.
        if !self.settle_hold(job, spec, text_layer_tokens, scanned).await? {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document's {scanned} scanned pages and its text cost more than the price held for it; upload it again to have it priced by its pages"
                ),
            ));
        }
        let mut language = config
            .language_for(spec.document_language.as_deref())
            .map_err(|reason| JobError::new(ErrorClass::InvalidInput, reason))?;
        let source = |page| match spec.document.doc_type.is_image() {
            true => OcrSource::Image { frames: scanned },
            false => OcrSource::PdfPage(page),
        };
        // A document whose pages keep failing is stopped: a few bad pages are skipped, a
        // document of them is not read page after page for nothing.
        let most_skipped = (scanned / 10).max(3);
        let mut readings: Vec<PageReading> = Vec::new();
        for &page in &extracted.scanned {
            if readings.iter().any(|r| r.page == page) {
                continue; // an image's frames come back together
            }
            self.stages.reading_page(job, page, pages).await?;
            let read = if language == ocr::AUTO {
                let (detected, read) = self.detect_language(&config, source(page), bytes.clone()).await?;
                language = detected;
                read
            } else {
                ocr::read_in_child(&self.sandbox, &config, source(page), &language, bytes.clone()).await?
            };
            readings.extend(read);
            if spec.document.doc_type.is_image() {
                // An image is read in one run: a frame it did not answer for is skipped with the
                // run's reason, never read again (each run reads the whole image).
                let why = readings.iter().find_map(|r| r.skipped.clone());
                let why = why.unwrap_or_else(|| "the reader gave no answer for it".into());
                let timed_out = readings.iter().any(|r| r.timed_out);
                for &frame in &extracted.scanned {
                    if !readings.iter().any(|r| r.page == frame) {
                        let skipped = Some(format!("the image was read once, without this page: {why}"));
                        readings.push(PageReading { page: frame, skipped, timed_out, ..Default::default() });
                    }
                }
                break;
            }
            if readings.iter().filter(|r| r.skipped.is_some()).count() as u32 > most_skipped {
                return Err(unread_scan(&readings, "too many of its pages could not be read within their bounds"));
            }
        }
        let report = ocr::report(pages, &language, &readings, config.confidence_floor);
        self.stages.record_scan(job, &report).await;
        let text = ocr::compose(&extracted.page_texts, &readings);
        if text.trim().is_empty() {
            return Err(unread_scan(
                &readings,
                "no text could be read from the document, not even by OCR (is it blank?)",
            ));
        }
        let read = report.read.len() as u32;
        tracing::info!(job = %job.id, pages, read, skipped = report.skipped.len(), %language, "scan read by OCR");
        // Kept for the next attempts, unless a page ran out of time (a busy server): then the
        // next attempt reads again.
        if let Some(pool) = pool.filter(|_| !readings.iter().any(|r| r.timed_out)) {
            let kept = kept_answers::ScanText { text: text.clone(), pages_read: read, text_layer_tokens };
            if let Err(e) = kept_answers::keep_scan_text(pool, job, &kept).await {
                tracing::warn!(job = %job.id, error = %e, "could not keep the scan's text for a next attempt");
            }
        }
        Ok((super::extract::Extracted { text, ..extracted }, Some(ScanRead { text_layer_tokens, read })))
    }

    /// The first scanned page read in each offered language; the one read with most confidence
    /// is the document's language.
    async fn detect_language(
        &self,
        ocr: &super::ocr::OcrConfig,
        source: super::ocr::OcrSource,
        bytes: bytes::Bytes,
    ) -> Result<(String, Vec<super::ocr::PageReading>), JobError> {
        let mut best: Option<(f32, String, Vec<super::ocr::PageReading>)> = None;
        for language in &ocr.languages {
            let read = super::ocr::read_in_child(&self.sandbox, ocr, source, language, bytes.clone()).await?;
            let confidence = read.iter().filter_map(|r| r.confidence).fold(0.0f32, f32::max);
            if best.as_ref().is_none_or(|(most, _, _)| confidence > *most) {
                best = Some((confidence, language.clone(), read));
            }
        }
        let (_, language, read) = best.unwrap_or((0.0, ocr.default_language().to_string(), Vec::new()));
        Ok((language, read))
    }

    /// Store `text` as the document's parts of at most `limit` tokens and run them.
    async fn split_and_run(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        text: String,
        limit: u64,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let preset = spec.preset;
        let parts = crate::documents::cpu::run(move || split_for(preset, &text, limit, 0))
            .await
            .map_err(|_| JobError::new(ErrorClass::ServerError, "the document could not be split"))?;
        if !self.parts.add_level(job, 0, &parts).await.map_err(database_error)? {
            return Err(no_longer_held());
        }
        self.run_in_parts(job, spec, 0, held).await
    }

    /// A document was admitted at a hold (its worst case); now that its text is known, settle
    /// it to its text's price (the difference comes back when the job ends). Returns whether
    /// the text's price is within the hold.
    /// A scan's `scanned_read` pages read by OCR are priced by page, and its text layer
    /// (`estimated` its own tokens) by the price table.
    async fn settle_hold(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        estimated: i64,
        scanned_read: u32,
    ) -> Result<bool, JobError> {
        let Some(settlement) = &self.settle_held else {
            let kind = size_kind(spec.document.doc_type);
            let by_size = sluice_types::capacity::estimate_input_tokens(kind, spec.document.size);
            return Ok(scanned_read > 0 || estimated.max(0) as u64 <= by_size.saturating_mul(hold_factor(kind)));
        };
        let interactive = match scanned_read {
            0 => settlement.prices.price(sluice_types::capacity::billed_tokens(spec.preset, estimated.max(0) as u64)),
            read => settlement.prices.scanned_document_price(spec.preset, estimated.max(0) as u64, read),
        };
        // At the discount it was admitted at (its hold was).
        let discount = spec.economy_discount.or(settlement.economy.map(|t| t.discount));
        let text_price = match discount.filter(|_| spec.economy) {
            Some(discount) => sluice_types::capacity::EconomyTerms { discount, window_hours: 0.0 }.price(interactive),
            None => interactive,
        };
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
        let held = held.ok_or_else(no_longer_held)?;
        Ok(text_price <= i64::from(held))
    }

    /// The document in one call, as it always was.
    async fn run_whole(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        mut task: Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        if joins(spec.preset) {
            return self.translate_whole(job, spec, task, estimated, held).await;
        }
        let output = match self.call(job, &mut task, estimated, held).await {
            Err(e) if e.class == ErrorClass::TooLong && self.parts.is_enabled() => {
                return self.in_parts_by_the_providers_count(job, spec, task.text, estimated, held).await;
            }
            other => other.map_err(too_long_in_words)?,
        };
        if output.cut {
            // The answer stopped at its limit: never a success. The text goes in parts of half
            // its size (each a whole answer), at no extra charge to the user.
            if !joins(spec.preset) || !self.parts.is_enabled() || !self.may_halve(estimated) {
                let used = Usage {
                    input: output.input_tokens.unwrap_or(estimated),
                    output: output.output_tokens.unwrap_or(0),
                };
                return Err(billed(self.cut_error(), used));
            }
            tracing::info!(job = %job.id, estimated, "answer cut at its limit; the document goes in parts");
            let half = (estimated as u64).div_ceil(2) + PART_PROMPT_TOKENS;
            return self.split_and_run(job, spec, task.text, half, held).await;
        }
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

    /// The provider counted the whole prompt past its context (more than we do): the document
    /// goes in parts planned by its count (learned from the refusal), no attempt used, nothing
    /// more charged.
    async fn in_parts_by_the_providers_count(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        text: String,
        estimated: i64,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let limit = match calls_for(spec.preset, estimated.max(0) as u64, self.call_limits(spec)) {
            Calls::Parts { part_tokens } => part_tokens,
            Calls::Whole => (estimated as u64).div_ceil(2) + PART_PROMPT_TOKENS,
        };
        tracing::info!(job = %job.id, estimated, limit, "the provider counted the prompt past its context; the document goes in parts");
        self.split_and_run(job, spec, text, limit, held).await
    }

    /// A translation in one call, checked paragraph by paragraph ([`Self::translate_checked`]):
    /// a paragraph that did not come back whole is asked again, no attempt used. Refused as too
    /// long for the provider's count, it goes in parts planned by that count.
    async fn translate_whole(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        task: Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let calls = AtomicU32::new(0);
        let answer = match self.answer(job, spec, task.text.clone(), None, held, 0, &calls).await {
            Err(e) if e.class == ErrorClass::TooLong && self.parts.is_enabled() => {
                return self.in_parts_by_the_providers_count(job, spec, task.text, estimated, held).await;
            }
            other => other.map_err(too_long_in_words)?,
        };
        self.stages.checked(job, answer.discarded, answer.plain_paragraphs, &answer.terms_missed).await;
        let mut result = translation_result(markers::unmark(&[answer.text]));
        result["provider"] = self.provider.name().into();
        result["preset"] = serde_json::json!(spec.preset);
        result["estimated_input_tokens"] = estimated.into();
        result["pages"] = serde_json::json!(task.pages);
        result["details"] = serde_json::json!({ "output_tokens_discarded": answer.discarded });
        Ok(JobOutput {
            result,
            input_tokens: Some(answer.usage.input),
            output_tokens: Some(answer.usage.output),
            part: None,
        })
    }

    /// The job's parts from `level` on, side by side, within this claim: each level's parts run
    /// at once as far as the gate and the budget allow, each stored when it ends; a level done
    /// is combined (a translation joined, no call; a summary's answers become the next level)
    /// until one answer is left. Stops early, back in line with its parts kept, when
    /// processing is paused, a cancel is asked for, or the turn is over.
    async fn run_in_parts(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        mut level: i32,
        claim_held: &mut Held,
    ) -> Result<JobOutput, JobError> {
        let started = Instant::now();
        let turn = job.deadline.map_or(PARTS_TURN, |d| PARTS_TURN.min(d.saturating_duration_since(started) / 3));
        // The claim reserved its first call: the first part started uses it.
        let mut first = Some(std::mem::take(claim_held));
        let mut used = Usage::default();
        // A translation in parts keeps its key terms the same in every part: found once in its
        // opening, under the user's own glossary.
        let with_terms;
        let spec = if joins(spec.preset) && level == 0 {
            let found = match self.parts.found_terms(job.id).await.map_err(database_error)? {
                Some(found) => found,
                None => {
                    let (found, usage) = self.find_terms(job, spec).await;
                    used.add(usage);
                    self.parts.keep_found_terms(job, &found).await.map_err(database_error)?;
                    found
                }
            };
            let glossary = glossary::merged(&spec.guidance.glossary, &found);
            with_terms =
                DocumentJob { guidance: glossary::Guidance { glossary, ..spec.guidance.clone() }, ..spec.clone() };
            &with_terms
        } else {
            spec
        };
        loop {
            let count = self.parts.count(job.id, level).await.map_err(database_error)? as i32;
            let end = match self.run_level(job, spec, level, count, &mut first, &mut used, started + turn).await {
                Ok(end) => end,
                // Kept for a batch: nothing was called; what the claim reserved goes back.
                Err(e) if e.deferred => {
                    if let Some(unused) = first.take() {
                        self.budget.correct(-unused.input, -unused.output).await;
                    }
                    return Err(JobError { usage: Some((used.input, used.output)), ..e });
                }
                // What the parts answered before the failure was paid for: its attempt says so.
                Err(e) => return Err(JobError { usage: Some((used.input, used.output)), ..e }),
            };
            if let Some(unused) = first.take() {
                self.budget.correct(-unused.input, -unused.output).await;
            }
            if let LevelEnd::Stopped = end {
                let next = self.parts.pending(job.id, level, count, 1).await.map_err(database_error)?;
                return Ok(JobOutput {
                    result: serde_json::Value::Null,
                    input_tokens: Some(used.input),
                    output_tokens: Some(used.output),
                    part: Some(PartsProgress { next_est_tokens: next.first().map_or(0, |p| p.est_tokens), wait: None }),
                });
            }
            let outputs = self.parts.outputs(job.id, level).await.map_err(database_error)?;
            if (joins(spec.preset) && level == 0) || (level > 0 && count == 1) {
                self.stages.enter(job, JobStage::Writing, None).await?;
                let parts_total = self.parts.count(job.id, 0).await.map_err(database_error)?;
                let mut result = if joins(spec.preset) {
                    translation_result(markers::unmark(&outputs))
                } else {
                    serde_json::json!({ "markdown": outputs.join("\n\n") })
                };
                result["provider"] = self.provider.name().into();
                result["preset"] = serde_json::json!(spec.preset);
                result["parts"] = parts_total.into();
                result["levels"] = (level + 1).into();
                result["details"] = serde_json::json!({ "parts": parts_total });
                return Ok(JobOutput {
                    result,
                    input_tokens: Some(used.input),
                    output_tokens: Some(used.output),
                    part: None,
                });
            }
            let too_long = || {
                JobError::new(
                    ErrorClass::InvalidInput,
                    "the parts' answers did not get shorter when combined; the document cannot be summarised in parts",
                )
            };
            if level + 1 >= MAX_LEVELS {
                return Err(too_long());
            }
            let (preset, limit) =
                (spec.preset, self.call_limits(spec).part_tokens(spec.preset).unwrap_or(u64::MAX / 8));
            let combined = outputs.join("\n\n");
            let parts = crate::documents::cpu::run(move || split_for(preset, &combined, limit, level + 1))
                .await
                .map_err(|_| JobError::new(ErrorClass::ServerError, "the answers could not be combined"))?;
            if parts.len() >= count as usize {
                return Err(too_long());
            }
            if !self.parts.add_level(job, level + 1, &parts).await.map_err(database_error)? {
                return Err(no_longer_held());
            }
            level += 1;
        }
    }

    /// The key terms of a translation's opening (its first part not done) and their
    /// translations, by one call; none when that call fails (the translation goes on without).
    async fn find_terms(&self, job: &ClaimedJob, spec: &DocumentJob) -> (Vec<glossary::Entry>, Usage) {
        let count = match self.parts.count(job.id, 0).await {
            Ok(count) => count as i32,
            Err(_) => return (Vec::new(), Usage::default()),
        };
        let Ok(opening) = self.parts.pending(job.id, 0, count, 1).await else { return (Vec::new(), Usage::default()) };
        let Some(opening) = opening.into_iter().next() else { return (Vec::new(), Usage::default()) };
        let text = inline::strip(&markers::unmark(&[opening.body]));
        let end = text.char_indices().nth(glossary::OPENING_CHARS).map_or(text.len(), |(i, _)| i);
        let mut task = Task {
            preset: spec.preset,
            language: spec.language.clone(),
            text: text[..end].to_string(),
            pages: None,
            part: None,
            prompt_tokens: None,
            answer_tokens: Some(TERMS_ANSWER_TOKENS),
            on_written: None,
            guidance: Default::default(),
            finds_terms: true,
        };
        let estimated = count_prompt(&mut task).await;
        let mut held = Held { input: estimated, output: i64::from(TERMS_ANSWER_TOKENS) };
        self.budget.correct(held.input, held.output).await;
        match self.call(job, &mut task, estimated, &mut held).await {
            Ok(output) => {
                let usage = Usage {
                    input: output.input_tokens.unwrap_or(estimated).clamp(0, believable_input(estimated)),
                    output: output.output_tokens.unwrap_or(0).clamp(0, i64::from(TERMS_ANSWER_TOKENS) * 2),
                };
                let found = glossary::found_terms(&output.text);
                tracing::info!(job = %job.id, terms = found.len(), "key terms found in the translation's opening");
                (found, usage)
            }
            Err(e) => {
                self.give_back_unless_counted(&e, held).await;
                tracing::info!(job = %job.id, error = %e.message, "no key terms found; the translation goes on without");
                // An answer not kept was billed all the same.
                (Vec::new(), billed_usage(&e))
            }
        }
    }

    /// One level's parts not done yet, as many at once as [`PartStore::calls`] grants. A part
    /// that fails for a transient reason counts against that part; the others in flight
    /// finish and are kept, and then the attempt fails (the job retries with backoff, the
    /// part's failures deciding). A permanent failure ends the job at once.
    #[allow(clippy::too_many_arguments)]
    async fn run_level(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        level: i32,
        count: i32,
        first: &mut Option<Held>,
        used: &mut Usage,
        turn_ends: Instant,
    ) -> Result<LevelEnd, JobError> {
        let mut waiting: VecDeque<PendingPart> =
            self.parts.pending(job.id, level, count, i64::MAX).await.map_err(database_error)?.into();
        // Each call its own task: a call in a transaction must not wait on this loop to be
        // polled (dropping the set, at a deadline or a permanent failure, aborts them).
        let mut running = PartCalls::default();
        let mut failed: Option<(JobError, i32)> = None;
        let mut go_on = true;
        // The economy lane's first claim keeps each part's call for the batch: they cost
        // nothing now, so every part starts at once, with no reservation.
        let gathering = self.economy.as_ref().is_some_and(|e| e.is_gathering(job));
        let mut sent_to_batch = false;
        if gathering {
            while let Some(part) = waiting.pop_front() {
                running.start(self, job, spec, part, Held::default(), false);
            }
        }
        loop {
            let may_start = go_on && failed.is_none() && Instant::now() < turn_ends;
            let room = MAX_PARTS_AT_ONCE.saturating_sub(running.len()).min(waiting.len());
            if may_start && room > 0 {
                if let Some(claimed) = running.is_empty().then(|| first.take()).flatten() {
                    let part = waiting.pop_front().expect("room means a part waits");
                    // The claim reserved the job's estimate: the first part's own replaces it
                    // before any other part is granted, or a grant would count on tokens this
                    // call is about to spend (two calls over the provider's bucket at once).
                    let held = Held {
                        input: part.est_tokens,
                        output: self.expected_output(spec.preset, spec.language.as_deref(), part.est_tokens),
                    };
                    self.budget.reserve_anew((claimed.input, claimed.output), (held.input, held.output)).await;
                    running.start(self, job, spec, part, held, false);
                    continue;
                }
                let wants: Vec<(i64, i64)> = waiting
                    .iter()
                    .take(room)
                    .map(|p| (p.est_tokens, self.expected_output(spec.preset, spec.language.as_deref(), p.est_tokens)))
                    .collect();
                let grant = self.parts.calls(job, running.len(), &wants).await.map_err(database_error)?;
                go_on = grant.go_on;
                for (input, output) in wants.into_iter().take(grant.granted) {
                    let part = waiting.pop_front().expect("granted parts wait");
                    running.start(self, job, spec, part, Held { input, output }, true);
                }
            }
            if running.is_empty() {
                if sent_to_batch && failed.is_none() && waiting.is_empty() {
                    return Err(super::economy::in_batch());
                }
                if let Some((error, attempts)) = failed {
                    let next = self.parts.pending(job.id, level, count, 1).await.map_err(database_error)?;
                    let next_est = next.first().map_or(0, |p| p.est_tokens);
                    self.parts.stand_down(job, attempts, next_est).await.map_err(database_error)?;
                    return Err(error);
                }
                if waiting.is_empty() {
                    return Ok(LevelEnd::Done);
                }
                if !go_on || Instant::now() >= turn_ends {
                    return Ok(LevelEnd::Stopped);
                }
            }
            let ended = tokio::select! {
                Some(ended) = running.next() => ended,
                _ = tokio::time::sleep(ASK_AGAIN) => continue,
            };
            let PartEnded { part, reserved, result } = ended;
            // A failed part's calls were billed too: its attempt counts them with the rest.
            let result = result.map_err(|mut e| {
                if let Some((input, output)) = e.usage.take() {
                    used.add(Usage { input, output });
                }
                e
            });
            let place = part_place(&part);
            match result {
                Ok(answer) => {
                    used.add(answer.usage);
                    self.stages.checked(job, answer.discarded, answer.plain_paragraphs, &answer.terms_missed).await;
                    let stored = StoredPart {
                        level: part.level,
                        idx: part.idx,
                        output: &answer.text,
                        input_tokens: Some(answer.usage.input),
                        output_tokens: Some(answer.usage.output),
                        reserved_tokens: reserved,
                    };
                    // A paid answer is worth a few tries of the database before the calls in
                    // flight are given up with it.
                    let written = with_db_retries("a part's answer", || self.parts.store_output(job, &stored)).await;
                    match written {
                        Some(true) => {}
                        Some(false) => return Err(no_longer_held()),
                        None => {
                            return Err(JobError::new(
                                ErrorClass::Connection,
                                "the database did not answer; the part's answer was not stored",
                            ))
                        }
                    }
                }
                Err(e) if e.deferred => sent_to_batch = true,
                Err(mut e) if e.class == ErrorClass::QuotaExhausted => {
                    // Nobody's failure: no part counts it; the job waits while processing is
                    // held, its parts kept.
                    e.message = format!("{place}: {}", e.message);
                    go_on = false;
                    let most = failed.as_ref().map_or(job.attempt, |(_, n)| (*n).max(job.attempt));
                    failed = Some((e, most));
                }
                Err(mut e) if e.class.is_transient() => {
                    let failures = with_db_retries("a part's failure", || {
                        self.parts.part_failed(job, part.level, part.idx, reserved)
                    })
                    .await
                    .unwrap_or(1);
                    e.message = format!("{place}: {}", e.message);
                    let most = failed.as_ref().map_or(0, |(_, n)| *n).max(failures);
                    // A spent quota stays the reason: nobody fails for it.
                    let quota = failed.as_ref().is_some_and(|(f, _)| f.class == ErrorClass::QuotaExhausted);
                    failed = Some(if quota { (failed.take().unwrap().0, most) } else { (e, most) });
                }
                Err(mut e) => {
                    e.message = format!("{place}: {}", e.message);
                    return Err(e);
                }
            }
        }
    }

    /// One part's call (its halves', if its answer was cut), with the reservation it holds.
    async fn call_part(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        part: PendingPart,
        mut held: Held,
        reserved: i64,
    ) -> PartEnded {
        {
            let of = PartOf {
                number: part.idx as u32 + 1,
                count: part.count as u32,
                level: part.level as u32,
                overlap: part.overlap.clone(),
            };
            let calls = AtomicU32::new(0);
            let result = self.answer(job, spec, part.body.clone(), Some(of), &mut held, 0, &calls).await;
            if let Err(e) = &result {
                self.give_back_unless_counted(e, held).await;
            }
            PartEnded { part, reserved, result }
        }
    }

    /// The whole answer for `text` (one part): one call, or, when the answer was cut at its
    /// limit, the answers for its two halves joined, each split again if cut (a translation
    /// loses nothing; a summary of a part becomes two shorter ones, combined at the next
    /// level). No attempt is used and the user pays nothing more; the calls' tokens count.
    fn answer<'a>(
        &'a self,
        job: &'a ClaimedJob,
        spec: &'a DocumentJob,
        text: String,
        of: Option<PartOf>,
        held: &'a mut Held,
        halvings: u32,
        calls: &'a AtomicU32,
    ) -> BoxFuture<'a, Result<Answer, JobError>> {
        Box::pin(async move {
            if joins(spec.preset) && markers::is_marked(&text) {
                return self.translate_checked(job, spec, text, of, held, halvings, calls).await;
            }
            let mut task = Task {
                preset: spec.preset,
                language: spec.language.clone(),
                text,
                pages: None,
                part: of,
                prompt_tokens: None,
                answer_tokens: None,
                on_written: None,
                guidance: Default::default(),
                finds_terms: false,
            };
            let estimated = count_prompt(&mut task).await;
            let mut usage = Usage::default();
            match self.call(job, &mut task, estimated, held).await {
                Ok(output) => {
                    // What the provider says it used, as far as believable (the budget's bounds).
                    let most_out =
                        self.provider.max_output_tokens().map_or(i64::MAX / 4, |n| n.min(i64::MAX as u64) as i64);
                    usage = Usage {
                        input: output.input_tokens.unwrap_or(estimated).clamp(0, believable_input(estimated)),
                        output: output.output_tokens.unwrap_or(0).clamp(0, most_out.saturating_mul(2)),
                    };
                    if !output.cut {
                        return Ok(Answer { text: output.text, usage, ..Answer::default() });
                    }
                    // Only a translation is redone in halves (its answer is its text's); a
                    // summary cut at its limit rambles, and halves would too, at the
                    // provider's price.
                    let level = task.part.as_ref().map_or(0, |p| p.level);
                    if !joins(spec.preset) || level > 0 || halvings >= MAX_HALVINGS || !self.may_halve(estimated) {
                        return Err(billed(self.cut_error(), usage));
                    }
                    tracing::info!(job = %job.id, estimated, "answer cut at its limit; the part is redone in halves");
                }
                // The provider counts more than we do: the part is redone in halves (the ratio
                // learned from the refusal plans the parts after it), no attempt used; the
                // refused call used nothing of the budget.
                Err(e) if e.class == ErrorClass::TooLong && halvings < MAX_HALVINGS => {
                    tracing::info!(job = %job.id, estimated, "the provider counted the part past its context; it is redone in halves");
                    let refused = std::mem::take(held);
                    self.budget.correct(-refused.input, -refused.output).await;
                }
                Err(e) => return Err(too_long_in_words(e)),
            }
            let Task { text, part: of, .. } = task;
            let chars = text.chars().count();
            let halves = split::split(&text, chars.div_ceil(2).max(1), 0);
            // A cut answer was paid for and is thrown away (a refused prompt paid nothing).
            let mut discarded = usage.output;
            let mut answers = Vec::with_capacity(halves.len());
            for half in &halves {
                let body = half.body(&text).to_string();
                let tokens = tokens::count(&body) as i64 + PART_PROMPT_TOKENS as i64;
                let mut half_held =
                    Held { input: tokens, output: self.expected_output(spec.preset, spec.language.as_deref(), tokens) };
                self.budget.correct(half_held.input, half_held.output).await;
                let result = self.answer(job, spec, body, of.clone(), &mut half_held, halvings + 1, calls).await;
                if let Err(e) = &result {
                    self.give_back_unless_counted(e, half_held).await;
                }
                let half_answer = result.map_err(|e| billed(e, usage))?;
                usage.add(half_answer.usage);
                discarded += half_answer.discarded;
                answers.push(half_answer.text);
            }
            Ok(Answer { text: answers.join("\n\n"), usage, discarded, ..Answer::default() })
        })
    }

    /// A translation's answer for a marked `text`, checked paragraph by paragraph
    /// ([`markers::check`]): what came back whole is kept, and only the rest is asked again (a
    /// cut answer is continued, a merged or dropped paragraph asked with its neighbour), no
    /// attempt used and nothing more charged. A round that keeps nothing goes in halves (one
    /// paragraph longer than an answer: its text in halves). The answer is marked; the
    /// output tokens paid for and not kept are counted.
    async fn translate_checked(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        text: String,
        of: Option<PartOf>,
        held: &mut Held,
        halvings: u32,
        calls: &AtomicU32,
    ) -> Result<Answer, JobError> {
        let mut answer = Answer::default();
        let mut kept: Vec<(u32, String)> = Vec::new();
        let source = text.clone();
        let mut ask = text;
        for round in 0..=MAX_ROUNDS {
            // A provider that never answers the paragraphs whole (or a document that tells it
            // not to) costs a bounded number of calls, then the part fails in words.
            if calls.fetch_add(1, Ordering::Relaxed) >= MAX_CALLS_PER_ANSWER {
                // No call was made with what it holds: all of it goes back.
                let unused = std::mem::take(held);
                self.budget.correct(-unused.input, -unused.output).await;
                return Err(billed(paragraphs_not_kept(), answer.usage));
            }
            let asked = markers::numbers(&ask);
            let mut task = Task {
                preset: spec.preset,
                language: spec.language.clone(),
                text: ask.clone(),
                pages: None,
                part: of.clone(),
                prompt_tokens: None,
                answer_tokens: None,
                on_written: None,
                guidance: spec.guidance.for_text(&ask),
                finds_terms: false,
            };
            let estimated = count_prompt(&mut task).await;
            // The first round spends what the caller reserved; each later one reserves its own.
            let mut reserved = std::mem::take(held);
            if round > 0 || (reserved.input == 0 && reserved.output == 0) {
                let fresh = Held {
                    input: estimated,
                    output: self.expected_output(spec.preset, spec.language.as_deref(), estimated),
                };
                self.budget.reserve_anew((reserved.input, reserved.output), (fresh.input, fresh.output)).await;
                reserved = fresh;
            }
            let output = match self.call(job, &mut task, estimated, &mut reserved).await {
                Ok(output) => output,
                // Refused as too long for the provider's count: a part is done in halves (the
                // ratio learned plans the next ones); a whole document goes in parts.
                Err(e) if e.class == ErrorClass::TooLong && of.is_some() && halvings < MAX_HALVINGS => {
                    tracing::info!(job = %job.id, estimated, "the provider counted the part past its context; it is redone in halves");
                    self.budget.correct(-reserved.input, -reserved.output).await;
                    let halves = self
                        .in_halves(job, spec, &ask, &of, halvings, calls)
                        .await
                        .map_err(|e| billed(e, answer.usage))?;
                    answer.absorb(&halves);
                    kept.extend(
                        markers::segments(&halves.text)
                            .into_iter()
                            .filter_map(|s| Some((s.number?, s.text.to_string()))),
                    );
                    break;
                }
                Err(e) => {
                    self.give_back_unless_counted(&e, reserved).await;
                    return Err(billed(e, answer.usage));
                }
            };
            let most_out = self.provider.max_output_tokens().map_or(i64::MAX / 4, |n| n.min(i64::MAX as u64) as i64);
            let used = Usage {
                input: output.input_tokens.unwrap_or(estimated).clamp(0, believable_input(estimated)),
                output: output.output_tokens.unwrap_or(0).clamp(0, most_out.saturating_mul(2)),
            };
            answer.usage.add(used);
            let mut checked = markers::check(&output.text, &asked, output.cut);
            if checked.kept.is_empty() && asked.len() == 1 && !output.cut {
                // One paragraph asked, and one answered without its marker: that is its
                // translation (anything more, a preface, a repeat, is not).
                if let [only] = markers::segments(&output.text).as_slice() {
                    if only.number.is_none() && markers::has_words(only.text) {
                        checked =
                            markers::Checked { kept: vec![(asked[0], only.text.to_string())], ..Default::default() };
                    }
                }
            }
            let not_kept = not_kept_share(used.output, &output.text, &checked);
            answer.discarded += not_kept;
            if let Some(billed) = output.output_tokens.filter(|_| !checked.kept.is_empty()) {
                // What the kept paragraphs cost against their text teaches the language's
                // expansion (a cut answer's too: its whole paragraphs are as long as any).
                let numbers: Vec<u32> = checked.kept.iter().map(|(n, _)| *n).collect();
                let source = markers::only(&ask, &numbers);
                let source_tokens =
                    crate::documents::tokens::count_off_runtime(source).await.min(i64::MAX as u64) as i64;
                let language = spec.language.as_deref().unwrap_or(DEFAULT_LANGUAGE);
                self.token_ratio.observe_expansion(language, billed.saturating_sub(not_kept), source_tokens);
            }
            if checked.outside > 0 || !checked.missing.is_empty() {
                tracing::info!(
                    job = %job.id, asked = asked.len(), kept = checked.kept.len(), cut = output.cut,
                    outside_bytes = checked.outside, "a translation's answer did not hold every paragraph whole; the rest is asked again"
                );
            }
            if checked.kept.is_empty() || (round == MAX_ROUNDS && !checked.missing.is_empty()) {
                // Nothing more came back whole: smaller asks, while they are worth it.
                let last = checked.missing.clone();
                let rest = markers::only(&ask, &last);
                let rest_tokens = tokens::count(&rest) as i64;
                let one_cut = last.len() == 1 && output.cut && !self.may_halve(rest_tokens);
                if halvings >= MAX_HALVINGS || one_cut {
                    return Err(billed(
                        if output.cut { self.cut_error() } else { paragraphs_not_kept() },
                        answer.usage,
                    ));
                }
                let halves = self
                    .in_halves(job, spec, &rest, &of, halvings, calls)
                    .await
                    .map_err(|e| billed(e, answer.usage))?;
                answer.absorb(&halves);
                answer.plain_paragraphs += keep_tags_or_plain(&ask, &mut checked.kept);
                kept.extend(checked.kept);
                kept.extend(
                    markers::segments(&halves.text).into_iter().filter_map(|s| Some((s.number?, s.text.to_string()))),
                );
                break;
            }
            answer.plain_paragraphs += keep_tags_or_plain(&ask, &mut checked.kept);
            kept.extend(checked.kept);
            if checked.missing.is_empty() {
                break;
            }
            ask = markers::only(&ask, &checked.missing);
        }
        // In the text's order: numbers only grow through a text (a paragraph cut in pieces keeps
        // its number, and its pieces their order).
        kept.sort_by_key(|(number, _)| *number);
        if halvings == 0 && !spec.guidance.glossary.is_empty() {
            self.keep_to_the_glossary(job, spec, &source, &of, &mut kept, &mut answer, calls).await;
        }
        answer.text = kept.iter().map(|(n, t)| markers::marked(*n, t)).collect::<Vec<_>>().join("\n\n");
        Ok(answer)
    }

    /// The paragraphs of `kept` that left out a glossary entry's agreed translation (for a
    /// term their source has) asked again once; what is still missed is reported.
    async fn keep_to_the_glossary(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        source: &str,
        of: &Option<PartOf>,
        kept: &mut [(u32, String)],
        answer: &mut Answer,
        calls: &AtomicU32,
    ) {
        let glossary = &spec.guidance.glossary;
        let sources = markers::segments(source);
        let source_of = |n: u32| sources.iter().find(|s| s.number == Some(n)).map_or("", |s| s.text);
        let misses = |n: u32, text: &str| glossary::missed(glossary, source_of(n), &inline::strip(text));
        // A paragraph cut in pieces (its number twice) is not asked again: a piece lacks what
        // the other has.
        let mut seen = std::collections::HashSet::new();
        let cut: std::collections::HashSet<u32> =
            kept.iter().filter(|(n, _)| !seen.insert(*n)).map(|(n, _)| *n).collect();
        let once = |n: u32| !cut.contains(&n);
        let again: Vec<u32> =
            kept.iter().filter(|(n, t)| once(*n) && !misses(*n, t).is_empty()).map(|(n, _)| *n).collect();
        if !again.is_empty() {
            tracing::info!(job = %job.id, paragraphs = again.len(), "an answer left out agreed terms; those paragraphs are asked again once");
            let redo = markers::only(source, &again);
            match self.answer(job, spec, redo, of.clone(), &mut Held::default(), 1, calls).await {
                Ok(second) => {
                    answer.usage.add(second.usage);
                    answer.discarded += second.discarded;
                    for segment in markers::segments(&second.text) {
                        let Some(n) = segment.number else { continue };
                        if let Some((_, text)) = kept.iter_mut().find(|(k, _)| *k == n) {
                            if misses(n, segment.text).len() < misses(n, text).len() {
                                // The first answer was paid for and is not kept.
                                answer.discarded += tokens::count(text) as i64;
                                *text = segment.text.to_string();
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::info!(job = %job.id, error = %e.message, "asking again for agreed terms failed; the first answers stay");
                    answer.usage.add(billed_usage(&e));
                }
            }
        }
        for (n, text) in kept.iter().filter(|(n, _)| once(*n)) {
            for entry in misses(*n, text) {
                let shown = glossary::shown(entry);
                if !answer.terms_missed.contains(&shown) && answer.terms_missed.len() < MAX_TERMS_REPORTED {
                    answer.terms_missed.push(shown);
                }
            }
        }
    }

    /// A marked text's answer in two asks: its paragraphs in two halves, or one paragraph's
    /// text cut in two (each piece under its marker, joined again in the result).
    async fn in_halves(
        &self,
        job: &ClaimedJob,
        spec: &DocumentJob,
        text: &str,
        of: &Option<PartOf>,
        halvings: u32,
        calls: &AtomicU32,
    ) -> Result<Answer, JobError> {
        let numbers = markers::numbers(text);
        let halves = if numbers.len() > 1 {
            let (first, second) = numbers.split_at(numbers.len() / 2);
            vec![markers::only(text, first), markers::only(text, second)]
        } else {
            // One paragraph: its words in two, each piece under its marker (never a piece of
            // the marker alone).
            let Some(segment) = markers::segments(text).into_iter().find(|s| s.number.is_some()) else {
                return Err(paragraphs_not_kept());
            };
            let (number, words) = (segment.number.unwrap_or_default(), segment.text);
            let chars = words.chars().count();
            split::split(words, chars.div_ceil(2).max(1), 0)
                .into_iter()
                .map(|p| p.body(words))
                .filter(|piece| markers::has_words(piece))
                .map(|piece| markers::marked(number, piece))
                .collect()
        };
        let mut answer = Answer::default();
        let mut texts = Vec::with_capacity(halves.len());
        for half in halves {
            let half_answer = self
                .answer(job, spec, half, of.clone(), &mut Held::default(), halvings + 1, calls)
                .await
                .map_err(|e| billed(e, answer.usage))?;
            answer.absorb(&half_answer);
            texts.push(half_answer.text);
        }
        answer.text = texts.join("\n\n");
        Ok(answer)
    }

    /// Whether a text of `estimated` tokens whose answer was cut is worth redoing in halves:
    /// not when it is already small beside an answer's limit (the answer rambles, and halves
    /// would too).
    fn may_halve(&self, estimated: i64) -> bool {
        let floor = self.provider.max_output_tokens().unwrap_or(0).min(i64::MAX as u64) as i64 / 8;
        estimated >= floor.max(PART_PROMPT_TOKENS as i64 / 2)
    }

    /// An answer that stayed cut however the text was split.
    fn cut_error(&self) -> JobError {
        let limit = self.provider.max_output_tokens().map_or_else(String::new, |n| {
            format!(" ({} tokens)", sluice_types::thousands(n.min(i64::MAX as u64) as i64))
        });
        JobError::new(
            ErrorClass::InvalidInput,
            format!(
                "the provider's answer was longer than it may write at once{limit}, even for a short piece of the \
                 document, so it was not kept"
            ),
        )
    }

    /// A failed call gives back what it reserved, unless the provider may have counted the
    /// request (a 429/529, a timeout, a server error, an unfinished or broken-off answer it
    /// wrote): keeping it spent brings the budget back under the provider's own count.
    async fn give_back_unless_counted(&self, error: &JobError, held: Held) {
        // A call kept for a batch reached no provider.
        let counted = !error.deferred
            && matches!(
                error.class,
                ErrorClass::RateLimited
                    | ErrorClass::Overloaded
                    | ErrorClass::Timeout
                    | ErrorClass::ServerError
                    | ErrorClass::Unfinished
                    | ErrorClass::Connection
            );
        if !counted {
            self.budget.correct(-held.input, -held.output).await;
        }
    }

    /// Output tokens a call of `input_tokens` asks for (`max_tokens`), reserved from the budget
    /// until its usage is known: its expected answer with room, never the model's maximum
    /// ([`vendor::answer_tokens_to_ask`]). A provider without a limit (the local one): a
    /// translation's answer is about as long as its text; others are short.
    fn expected_output(&self, preset: Preset, language: Option<&str>, input_tokens: i64) -> i64 {
        if let Some(max) = self.provider.max_output_tokens() {
            let (growth, input) = self.answer_basis(preset, language, input_tokens);
            let ask = vendor::answer_tokens_to_ask(preset, growth, input, max, self.provider.reasons());
            return ask.min(i64::MAX as u64) as i64;
        }
        if joins(preset) {
            // About as long as its text, with room for a language that takes more tokens; the
            // usage corrects it once known.
            input_tokens.saturating_mul(5).saturating_div(4)
        } else {
            self.budget.output_reserve
        }
    }

    /// What an answer to a prompt of `input_tokens` (ours) is expected from, as the provider
    /// counts it: a translation's prompt at its language's learned expansion (the provider's
    /// tokenizer included); another's prompt as the provider counts it.
    fn answer_basis(&self, preset: Preset, language: Option<&str>, input_tokens: i64) -> (f64, u64) {
        if joins(preset) {
            (self.token_ratio.expansion(language.unwrap_or(DEFAULT_LANGUAGE)), input_tokens.max(0) as u64)
        } else {
            (1.0, self.theirs(input_tokens))
        }
    }

    /// A failed call's error with what it was billed: a call the provider answered, or began
    /// to, costs its prompt (as it counted it, else as we did) and what it wrote (as it said,
    /// else what was seen), within the same bounds as an answer's usage. A call it refused
    /// before answering costs nothing.
    fn billed_for(&self, error: JobError, estimated: i64, asked: i64, written: u64) -> JobError {
        let written = written.min(i64::MAX as u64) as i64;
        let (input, output) = match error.usage {
            Some((input, output)) => (if input > 0 { input } else { estimated }, output.max(written)),
            None if written > 0 => (estimated, written),
            None => return error,
        };
        let most_out = self.provider.max_output_tokens().map_or(asked, |n| n.min(i64::MAX as u64) as i64);
        JobError {
            usage: Some((input.clamp(0, believable_input(estimated)), output.clamp(0, most_out.max(asked).max(0)))),
            ..error
        }
    }

    /// `tokens` of ours as the provider counts them (the ratio learned).
    fn theirs(&self, tokens: i64) -> u64 {
        (tokens.max(0) as f64 * self.token_ratio.get()).ceil() as u64
    }

    /// The most an answer to a prompt of `estimated` tokens may ask for: what the context
    /// leaves beside the prompt as the provider counts it (a provider counts `max_tokens`
    /// against its context), with a margin.
    fn answer_room(&self, estimated: i64) -> u64 {
        self.context_tokens.map_or(u64::MAX, |context| {
            let prompt = self.theirs(estimated).saturating_mul(21) / 20;
            context.saturating_sub(prompt).saturating_sub(256).max(256)
        })
    }

    /// What one call to this processor's provider can carry.
    /// The context is counted in the provider's tokens: by ours it holds that divided by the
    /// ratio learned.
    /// A translation's parts are sized by its language's expansion learned.
    fn call_limits(&self, spec: &DocumentJob) -> CallLimits {
        let language = spec.language.as_deref().unwrap_or(DEFAULT_LANGUAGE);
        CallLimits {
            context_tokens: self.context_tokens,
            max_output_tokens: self.provider.max_output_tokens(),
            answer_growth: joins(spec.preset).then(|| self.token_ratio.expansion(language)),
        }
        .in_our_tokens(self.token_ratio.get())
    }

    /// One provider call for `task`, asking for its answer's size ([`Self::expected_output`]),
    /// with the budget settled by what the provider counted. An answer cut at a size asked
    /// below the model's maximum is asked again once at the maximum (both calls' usage counts).
    async fn call(
        &self,
        job: &ClaimedJob,
        task: &mut Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<ProviderOutput, JobError> {
        let room = self.answer_room(estimated);
        let model_max = self.provider.max_output_tokens();
        let max = model_max.map(|max| max.min(room));
        if task.answer_tokens.is_none() && max.is_some() {
            let ask = self.expected_output(task.preset, task.language.as_deref(), estimated);
            task.answer_tokens = Some((ask.max(1) as u64).min(room).min(u64::from(u32::MAX)) as u32);
        }
        // Cut having asked all the room the prompt left, less than the model may write: the
        // prompt is too long for its answer, and the text goes in smaller pieces.
        let cut_by_room = |output: &ProviderOutput, asked: Option<u32>| {
            output.cut && asked.map_or(0, u64::from) >= room && model_max.is_some_and(|m| room < m)
        };
        let first = match self.from_batch(job, task, held).await? {
            Some(answered) => answered,
            None => self.call_once(job, task, estimated, held).await?,
        };
        let first_used =
            Usage { input: first.input_tokens.unwrap_or(estimated), output: first.output_tokens.unwrap_or(0) };
        if cut_by_room(&first, task.answer_tokens) {
            return Err(billed(no_room_for_the_answer(), first_used));
        }
        let asked = task.answer_tokens.map_or(u64::MAX, u64::from);
        // A translation's cut answer keeps its whole paragraphs and only the rest is asked
        // again: asking it all again at the maximum would pay for them twice.
        let continued = joins(task.preset) && markers::is_marked(&task.text);
        let Some(max) = max.filter(|max| first.cut && asked < *max && !continued) else { return Ok(first) };
        tracing::info!(job = %job.id, asked, max, "answer cut at the size asked; asked again at the model's maximum");
        task.answer_tokens = Some(max.min(u64::from(u32::MAX)) as u32);
        let mut again = Held { input: estimated, output: max.min(i64::MAX as u64) as i64 };
        self.budget.correct(again.input, again.output).await;
        let second = self.call_once(job, task, estimated, &mut again).await;
        if let Err(e) = &second {
            self.give_back_unless_counted(e, again).await;
        }
        let mut second = second.map_err(|e| billed(e, first_used))?;
        if cut_by_room(&second, task.answer_tokens) {
            let second_used =
                Usage { input: second.input_tokens.unwrap_or(estimated), output: second.output_tokens.unwrap_or(0) };
            return Err(billed(billed(no_room_for_the_answer(), first_used), second_used));
        }
        let sum = |a: Option<i64>, b: Option<i64>, unknown: i64| {
            Some(a.unwrap_or(unknown).saturating_add(b.unwrap_or(unknown)))
        };
        second.input_tokens = sum(first.input_tokens, second.input_tokens, estimated);
        second.output_tokens = sum(first.output_tokens, second.output_tokens, 0);
        Ok(second)
    }

    /// The economy lane: the batch's answer for this call's text (what it held of the budget
    /// given back: no call is made), or the call kept for the batch the claim gathers (an
    /// error that is not a failure), or nothing (the call is made now).
    async fn from_batch(
        &self,
        job: &ClaimedJob,
        task: &Task,
        held: &mut Held,
    ) -> Result<Option<ProviderOutput>, JobError> {
        let Some(economy) = &self.economy else { return Ok(None) };
        match economy.prefetched(job, task).await {
            Ok(Some(answered)) => {
                let unused = std::mem::take(held);
                self.budget.correct(-unused.input, -unused.output).await;
                return Ok(Some(answered));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(job = %job.id, error = %e, "could not read the batch's answer; asked at once"),
        }
        if economy.collect(job, task) {
            return Err(super::economy::in_batch());
        }
        Ok(None)
    }

    /// One provider call: the budget reserves what it asks for and settles to its usage; its
    /// answer's progress is reported as it streams; its input's count teaches the ratio.
    async fn call_once(
        &self,
        job: &ClaimedJob,
        task: &mut Task,
        estimated: i64,
        held: &mut Held,
    ) -> Result<ProviderOutput, JobError> {
        if task.part.is_none() {
            self.budget.refine(job.id, job.lease_token, held.input, estimated).await;
        } else {
            // A part's job estimate is the sum of its parts in flight: only the bucket moves.
            self.budget.reserve_anew((held.input, 0), (estimated, 0)).await;
        }
        held.input = estimated;
        if let Some(asked) = task.answer_tokens.map(i64::from).filter(|a| *a != held.output) {
            self.budget.correct(0, asked - held.output).await;
            held.output = asked;
        }
        self.stages.enter(job, JobStage::WaitingForProvider, task.pages).await?;
        let writing = self.writing.of(job.lease_token);
        let (growth, basis) = self.answer_basis(task.preset, task.language.as_deref(), estimated);
        let expected = vendor::expected_answer_tokens(task.preset, growth, basis);
        writing.expected.fetch_add(expected, Ordering::Relaxed);
        let mine = Arc::new(AtomicU64::new(0));
        task.on_written = Some(OnWritten(Arc::new({
            let (writing, mine) = (writing.clone(), mine.clone());
            // An answer only grows as it streams.
            move |now: u64| {
                let before = mine.fetch_max(now, Ordering::Relaxed);
                writing.written.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
            }
        })));
        let span = tracing::info_span!(
            "provider call",
            provider = self.provider.name(),
            preset = ?task.preset,
            estimated_input_tokens = estimated,
            asked_output_tokens = task.answer_tokens,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
            error = tracing::field::Empty,
            provider_status = tracing::field::Empty,
        );
        let output = self.provider.run(task).instrument(span.clone()).await;
        task.on_written = None;
        // This call's answer is no longer being written.
        let _ = writing.written.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            Some(w.saturating_sub(mine.load(Ordering::Relaxed)))
        });
        let _ =
            writing.expected.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| Some(e.saturating_sub(expected)));
        match &output {
            Ok(output) => {
                span.record("input_tokens", output.input_tokens);
                span.record("output_tokens", output.output_tokens);
                if let Some(reported) = output.input_tokens {
                    self.token_ratio.observe(reported, estimated);
                }
            }
            Err(e) => {
                span.record("error", e.message.as_str());
                span.record("provider_status", e.provider_status.map(u64::from));
                if let Some(counted) = e.provider_counted_tokens.filter(|_| e.class == ErrorClass::TooLong) {
                    self.token_ratio.at_least(counted, estimated);
                }
            }
        }
        let output = output.map_err(|e| self.billed_for(e, estimated, held.output, mine.load(Ordering::Relaxed)))?;
        if let (Some(pool), Some(_)) = (self.parts.pool(), &output.deployment) {
            if let Err(e) = crate::documents::providers::router::record_calls(pool, job.id, &output).await {
                tracing::warn!(error = %e, "could not record which deployment answered");
            }
        }
        // The provider counted what it counted: settle the reservation with the real usage, as
        // far as it is believable (tokenizers differ from our count, but not fourfold; an
        // answer is never longer than the `max_tokens` asked for).
        let used_in = output.input_tokens.unwrap_or(estimated).clamp(0, believable_input(estimated));
        if let Some(cached) = output.cached_input_tokens {
            self.stages.cache_read(job, cached.min(used_in)).await;
        }
        let most_out = self.provider.max_output_tokens().map_or(held.output, |n| n.min(i64::MAX as u64) as i64);
        let used_out = output.output_tokens.unwrap_or(held.output).clamp(0, most_out.max(held.output).max(0));
        let reserved = std::mem::replace(held, Held { input: 0, output: 0 });
        self.budget.correct(used_in.saturating_sub(reserved.input), used_out.saturating_sub(reserved.output)).await;
        self.budget.observe(&output.remaining).await;
        self.stages.enter(job, JobStage::Writing, None).await?;
        Ok(output)
    }
}

/// An attempt's answers' progress, reported while the attempt runs and gone when it ends,
/// however it ends (a panic included).
struct WritingReport {
    board: WritingBoard,
    lease: uuid::Uuid,
    reporter: tokio::task::JoinHandle<()>,
    writing: Arc<Writing>,
}

impl WritingReport {
    fn start(processor: &DocumentProcessor, job: &ClaimedJob) -> WritingReport {
        let writing = processor.writing.of(job.lease_token);
        let reporter = tokio::spawn(report_writing(processor.stages.clone(), job.clone(), writing.clone()));
        WritingReport { board: processor.writing.clone(), lease: job.lease_token, reporter, writing }
    }

    /// Stop reporting; whether anything was written to `job_writing` for the attempt.
    fn stop(&self) -> bool {
        self.reporter.abort();
        self.writing.reported.load(Ordering::Relaxed)
    }
}

impl Drop for WritingReport {
    fn drop(&mut self) {
        self.reporter.abort();
        self.board.end(self.lease);
    }
}

/// Write an attempt's answers' progress every few seconds while it changes (for the job page),
/// until the attempt ends (the task is aborted then).
async fn report_writing(stages: StageLog, job: ClaimedJob, writing: Arc<Writing>) {
    let mut last = (0, 0);
    loop {
        tokio::time::sleep(WRITING_EVERY).await;
        let now = (writing.written.load(Ordering::Relaxed), writing.expected.load(Ordering::Relaxed));
        if now != last {
            writing.reported.store(true, Ordering::Relaxed);
            stages.writing(&job, now.0, now.1).await;
            last = now;
        }
    }
}

/// Pure: the kept paragraphs whose inline tags did not come back as their source's (in the
/// marked `asked` text) made plain; how many were.
fn keep_tags_or_plain(asked: &str, kept: &mut [(u32, String)]) -> i64 {
    let sources = markers::segments(asked);
    let mut plain = 0;
    for (number, text) in kept.iter_mut() {
        let source = sources.iter().find(|s| s.number == Some(*number)).map_or("", |s| s.text);
        if !inline::keeps_tags(source, text) {
            *text = inline::strip(text);
            plain += 1;
        }
    }
    plain
}

/// A translation's result from its text (tags kept where they came back whole): Markdown to
/// read, and the tagged text a Word file is rebuilt from.
fn translation_result(text: String) -> serde_json::Value {
    let markdown = inline::to_markdown(&text);
    if inline::has_tags(&text) {
        serde_json::json!({ "markdown": markdown, "tagged": text })
    } else {
        serde_json::json!({ "markdown": markdown })
    }
}

/// A translation whose paragraphs did not come back whole however they were asked.
fn paragraphs_not_kept() -> JobError {
    JobError::new(
        ErrorClass::ServerError,
        "the provider did not keep the document's paragraphs apart, even asked one by one; nothing was kept",
    )
}

/// Pure: of an answer's `output` tokens, those paid for and not kept: its text's share (by
/// bytes, markers aside) outside the paragraphs `checked` kept.
fn not_kept_share(output: i64, answer: &str, checked: &markers::Checked) -> i64 {
    let total = (markers::segments(answer).iter().map(|s| s.text.len()).sum::<usize>() as i64).max(1);
    let kept = (checked.kept.iter().map(|(_, t)| t.len()).sum::<usize>() as i64).min(total);
    output.max(0).saturating_mul(total - kept) / total
}

/// An answer cut where the context ran out: its prompt must be smaller (split, as a prompt the
/// provider refused as too long is).
fn no_room_for_the_answer() -> JobError {
    JobError::new(ErrorClass::TooLong, "the prompt left too little of the context for its answer")
}

/// A prompt the provider still counted past its context however it was split: the words a
/// user reads.
fn too_long_in_words(mut e: JobError) -> JobError {
    if e.class == ErrorClass::TooLong {
        e.message = "the provider counted the text past its context however it was split; it was not kept".into();
    }
    e
}

/// What a failed call was billed, as its error carries it (nothing when the provider refused it
/// before answering).
fn billed_usage(error: &JobError) -> Usage {
    error.usage.map_or_else(Usage::default, |(input, output)| Usage { input, output })
}

/// `error` with `usage` more billed before it (the answers its attempt got and kept nothing of).
fn billed(error: JobError, usage: Usage) -> JobError {
    error.with_usage_added(usage.input, usage.output)
}

/// Count `task`'s prompt once, off the async runtime, and keep the count on it (the client's
/// timeout reads it).
async fn count_prompt(task: &mut Task) -> i64 {
    let tokens = tokens::count_off_runtime(providers::prompt(task)).await.min(i64::MAX as u64) as i64;
    task.prompt_tokens = Some(tokens);
    tokens
}

/// The tokens of a document's own text, as its upload was priced (its words and the usual
/// prompt's few tokens), counted off the async runtime: the instruction every call repeats, and
/// the paragraph markers and inline tags Sluice adds, are Sluice's, not the document's.
async fn own_text_tokens(text: &str) -> i64 {
    let words = inline::strip(&markers::unmark(&[text.to_string()]));
    let tokens = tokens::count_off_runtime(words).await.min(i64::MAX as u64) as i64;
    tokens.saturating_add(sluice_types::capacity::PROMPT_OVERHEAD_TOKENS as i64)
}

/// The most input tokens a provider may believably report for a prompt we counted at
/// `estimated` (tokenizers differ, but not fourfold).
fn believable_input(estimated: i64) -> i64 {
    estimated.saturating_mul(4).max(estimated.saturating_add(10_000))
}

/// Where a part stands, for messages: "part 2 of 7", or a combining step's.
fn part_place(part: &PendingPart) -> String {
    if part.level == 0 {
        format!("part {} of {}", part.idx + 1, part.count)
    } else {
        format!("combining the parts ({} of {})", part.idx + 1, part.count)
    }
}

/// `text` split into parts whose prompts hold at most `limit_tokens` as the tokenizer counts
/// them, as new parts of `level`. A summary's parts carry a little of the text before them as
/// context; a translation's none (it would be translated twice). Parts are cut by characters
/// at the text's own density, then counted; if one is over (a denser stretch), the text is
/// cut again tighter. CPU work: run it off the async runtime.
fn split_for(preset: Preset, text: &str, limit_tokens: u64, level: i32) -> Vec<NewPart> {
    let budget = limit_tokens.saturating_sub(PART_PROMPT_TOKENS).max(50);
    // Postgres text holds no NUL, and no provider needs one.
    let text = &text.replace('\0', "");
    let chars = text.chars().count().max(1) as f64;
    let total = tokens::count(text).max(1) as f64;
    let mut max_chars = ((budget as f64 * chars / total) * 0.97).max(100.0) as usize;
    let mut parts = Vec::new();
    for _ in 0..8 {
        let overlap = if joins(preset) || level > 0 { 0 } else { (max_chars / 50).min(2_000) };
        let pieces = split::split(text, max_chars, overlap);
        // A translation's part that starts inside a paragraph carries its marker again.
        let bodies = if joins(preset) && markers::is_marked(text) {
            markers::pieces(text, pieces.iter().map(|p| (p.start, p.end)))
        } else {
            pieces.iter().map(|p| p.body(text).to_string()).collect()
        };
        parts = pieces
            .into_iter()
            .zip(bodies)
            .map(|(p, body)| {
                let overlap = p.overlap(text).to_string();
                let est_tokens = (tokens::count(&body) + tokens::count(&overlap) + PART_PROMPT_TOKENS) as i64;
                NewPart { body, overlap, est_tokens }
            })
            .collect();
        // A piece that is a marker and nothing else (a paragraph without spaces, cut right after
        // its marker) is no work.
        if joins(preset) {
            parts.retain(|p| markers::segments(&p.body).iter().any(|s| markers::has_words(s.text)));
        }
        let worst = parts.iter().map(|p| p.est_tokens as f64 / limit_tokens.max(1) as f64).fold(0.0, f64::max);
        if worst <= 1.0 || max_chars <= 100 {
            break;
        }
        max_chars = ((max_chars as f64 * 0.95 / worst) as usize).max(100);
    }
    parts
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

/// Nothing more can be stored: the attempt no longer holds the job (its lease ran out), or its
/// cancel was asked for (then the job ends canceled, whatever this says).
fn no_longer_held() -> JobError {
    JobError::new(ErrorClass::Timeout, "the attempt no longer holds the job (its lease ran out, or it was canceled)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paragraph_without_spaces_is_cut_into_parts_that_each_have_words() {
        // 6,000 characters of one word after its marker: the only space is the marker's.
        let text = markers::mark(&format!("{}\n\nnext paragraph", "字".repeat(6_000)));
        let parts = split_for(Preset::Translate, &text, 800, 0);
        assert!(parts.len() > 2, "{} parts", parts.len());
        for part in &parts {
            let segments = markers::segments(&part.body);
            assert!(segments.iter().all(|s| s.number.is_some()), "every piece under its marker: {:?}", part.body);
            assert!(segments.iter().any(|s| markers::has_words(s.text)), "no part of a marker alone: {:?}", part.body);
        }
        let joined = markers::unmark(&parts.iter().map(|p| p.body.clone()).collect::<Vec<_>>());
        assert_eq!(joined.split("\n\n").count(), 2, "still two paragraphs");
    }

    #[tokio::test]
    async fn a_held_documents_own_text_is_its_words_not_the_markers_and_tags_sluice_adds() {
        let marked = markers::mark("<b1>a</b1> <i2>a</i2> <b3>a</b3>\n\nb");
        let own = own_text_tokens(&marked).await;
        let words = tokens::count("a a a\n\nb") as i64;
        assert_eq!(own, words + sluice_types::capacity::PROMPT_OVERHEAD_TOKENS as i64);
        // Never less than its words, however many tags it has.
        let tagged: String = (1..=2_000).map(|i| format!("<b{i}>word</b{i}> ")).collect();
        assert!(own_text_tokens(&markers::mark(&tagged)).await >= tokens::count(&"word ".repeat(2_000)) as i64);
    }

    #[test]
    fn the_output_not_kept_is_the_share_of_words_outside_the_kept_paragraphs() {
        let answer = "Preface\n\n⟦1⟧ aaaa\n\n⟦2⟧ bbbb";
        let checked = markers::check(answer, &[1, 2, 3], true);
        // "Preface" (7) and "bbbb" (4, cut: not followed by 3) of 15 bytes of words.
        assert_eq!(not_kept_share(1_500, answer, &checked), 1_100);
        let whole = markers::check("⟦1⟧ aaaa\n\n⟦2⟧ bbbb", &[1, 2], false);
        assert_eq!(not_kept_share(1_500, "⟦1⟧ aaaa\n\n⟦2⟧ bbbb", &whole), 0);
    }
}
