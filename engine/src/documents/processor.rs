//! The worker's processor for documents: fetch the blob, extract the text, call the provider,
//! return the result with its token usage.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::blobs::Blobs;
use super::providers::{Provider, Task};
use super::sandbox::{extract_in_child, SandboxConfig};
use super::sniff::DocType;
use crate::error::EngineError;
use crate::queue::capacity::Budget;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::stages::StageLog;
use crate::queue::worker::Processor;
use crate::queue::{ClaimedJob, JobError, JobOutput, JobStage};
use crate::Preset;

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
    /// The most input tokens one request may carry (the provider's context); larger texts
    /// fail as invalid input before the provider is called.
    pub context_tokens: Option<u64>,
}

/// What this attempt still holds of the budget (reserved at the claim, not yet settled).
struct Held {
    input: i64,
    output: i64,
}

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
        self.stages.enter(job, JobStage::Reading, None).await?;
        let bytes = self.blobs.get(&spec.document.key).await.map_err(|e| match e {
            EngineError::NotFound => JobError::new(ErrorClass::InvalidInput, "the uploaded document is gone"),
            other => JobError::new(ErrorClass::Connection, format!("could not read the document: {other}")),
        })?;
        let doc_type = spec.document.doc_type;
        let extracted = extract_in_child(&self.sandbox, doc_type, bytes).await?;
        let task =
            Task { preset: spec.preset, language: spec.language.clone(), text: extracted.text, pages: extracted.pages };
        let estimated = task.estimated_tokens();
        if let Some(context) = self.context_tokens.filter(|c| estimated as u64 > *c) {
            return Err(JobError::new(
                ErrorClass::InvalidInput,
                format!(
                    "the document's text is about {estimated} tokens, more than the provider reads at once ({context}); split it and upload the parts"
                ),
            ));
        }
        self.budget.refine(job.id, job.lease_token, held.input, estimated).await;
        held.input = estimated;
        self.stages.enter(job, JobStage::WaitingForProvider, task.pages).await?;
        let output = self.provider.run(&task).await?;
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
        })
    }
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
