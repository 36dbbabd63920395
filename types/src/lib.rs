//! The names Sluice's browser code and server share: a job's state, why it failed, and what to
//! do with a document. Wasm-safe (serde only); with the `sqlx` feature each enum is also a
//! Postgres `text` value spelled in snake_case, the same spelling as its JSON.

use serde::{Deserialize, Serialize};

pub mod capacity;
pub mod roles;
pub mod scan;
pub mod settlement;

/// Where a job is in its life: `queued -> running -> done`, with `retrying` and `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Durably accepted, waiting for a worker (also while processing is paused).
    Queued,
    /// Claimed by a worker under a lease.
    Running,
    /// The last attempt failed transiently; waiting until its `run_at`.
    Retrying,
    /// The result is stored.
    Done,
    /// Terminal without a result; refunded.
    Failed,
    /// Stopped by its owner or an admin before it finished; refunded.
    Canceled,
}

impl JobState {
    /// Every state, in the order of a job's life.
    pub const ALL: [JobState; 6] =
        [JobState::Queued, JobState::Running, JobState::Retrying, JobState::Done, JobState::Failed, JobState::Canceled];

    /// The snake_case name used in the database, the JSON and the CSS classes.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }

    /// Done, failed and canceled jobs never change again (a failed one may be replayed).
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Canceled)
    }

    /// Queued and retrying jobs wait for a worker.
    pub fn is_waiting(self) -> bool {
        matches!(self, JobState::Queued | JobState::Retrying)
    }
}

/// What a running job is doing right now, so people watching it see it move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobStage {
    /// Fetching the document and extracting its text (in the sandbox).
    Reading,
    /// The provider has the text; waiting for its answer (usually the longest part).
    WaitingForProvider,
    /// The answer is in; storing the result.
    Writing,
}

impl JobStage {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStage::Reading => "reading",
            JobStage::WaitingForProvider => "waiting_for_provider",
            JobStage::Writing => "writing",
        }
    }

    /// In words, for the job page and the list.
    pub fn label(self) -> &'static str {
        match self {
            JobStage::Reading => "Reading the document",
            JobStage::WaitingForProvider => "Waiting for the provider",
            JobStage::Writing => "Writing the result",
        }
    }
}

/// Why a job ended in `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The document cannot be processed (encrypted, no text, damaged).
    InvalidInput,
    /// The provider refused for good (400/401/403/404, spend limit).
    ProviderRejected,
    /// Every attempt failed transiently.
    RetriesExhausted,
    /// The last attempt's lease expired.
    TimedOut,
}

impl FailureKind {
    /// Every failure kind.
    pub const ALL: [FailureKind; 4] = [
        FailureKind::InvalidInput,
        FailureKind::ProviderRejected,
        FailureKind::RetriesExhausted,
        FailureKind::TimedOut,
    ];

    /// The snake_case name used in the database and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::InvalidInput => "invalid_input",
            FailureKind::ProviderRejected => "provider_rejected",
            FailureKind::RetriesExhausted => "retries_exhausted",
            FailureKind::TimedOut => "timed_out",
        }
    }

    /// The kind with this snake_case name, if any.
    pub fn parse(s: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// How one attempt ended (none yet while it runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    /// Failed transiently; the job waits in `retrying`.
    RetryScheduled,
    /// Failed for good; the job is `failed`.
    Failed,
    /// The worker stopped answering; the rescue task ended the attempt.
    LeaseExpired,
    /// Shutdown gave the job back without using the attempt.
    HandedBack,
    /// Failed transiently while processing was paused: back to `queued`, attempt not used.
    PausedRequeue,
    /// Its job was canceled while it ran.
    Canceled,
}

impl AttemptOutcome {
    /// Every outcome.
    pub const ALL: [AttemptOutcome; 7] = [
        AttemptOutcome::Succeeded,
        AttemptOutcome::RetryScheduled,
        AttemptOutcome::Failed,
        AttemptOutcome::LeaseExpired,
        AttemptOutcome::HandedBack,
        AttemptOutcome::PausedRequeue,
        AttemptOutcome::Canceled,
    ];

    /// In words, for the attempt timeline.
    pub fn words(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::RetryScheduled => "retry scheduled",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::LeaseExpired => "lease expired",
            AttemptOutcome::HandedBack => "handed back",
            AttemptOutcome::PausedRequeue => "paused requeue",
            AttemptOutcome::Canceled => "canceled",
        }
    }
}

/// Why credits moved in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum CreditKind {
    /// Credits given (the sign-up grant, an operator's grant).
    Grant,
    /// A document admitted.
    Debit,
    /// A failed job's credits returned.
    Refund,
    /// An operator took credits back.
    Adjustment,
}

impl CreditKind {
    /// The snake_case name (also the ledger row's CSS class).
    pub fn as_str(self) -> &'static str {
        match self {
            CreditKind::Grant => "grant",
            CreditKind::Debit => "debit",
            CreditKind::Refund => "refund",
            CreditKind::Adjustment => "adjustment",
        }
    }
}

/// What to do with a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    Summarize,
    Explain,
    Translate,
    KeyFacts,
}

impl Preset {
    /// Every preset, in the order the upload form offers them.
    pub const ALL: [Preset; 4] = [Preset::Summarize, Preset::Explain, Preset::Translate, Preset::KeyFacts];

    /// The preset with this snake_case name, if any.
    pub fn parse(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The snake_case name used in forms, payloads and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Summarize => "summarize",
            Preset::Explain => "explain",
            Preset::Translate => "translate",
            Preset::KeyFacts => "key_facts",
        }
    }

    /// Whether its answer is about as long as its document (a translation), rather than short.
    pub fn answer_grows_with_input(self) -> bool {
        self == Preset::Translate
    }

    /// The name a user reads.
    pub fn label(self) -> &'static str {
        match self {
            Preset::Summarize => "Summarize",
            Preset::Explain => "Explain simply",
            Preset::Translate => "Translate",
            Preset::KeyFacts => "Extract key facts",
        }
    }

    /// Whether only a language model can do it (the local processor cannot).
    pub fn needs_language_model(self) -> bool {
        matches!(self, Preset::Explain | Preset::Translate)
    }
}

/// Pure: a count with thousands separated: 12,345.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_json() {
        for state in JobState::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        for kind in FailureKind::ALL {
            assert_eq!(FailureKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        for preset in Preset::ALL {
            assert_eq!(Preset::parse(preset.as_str()), Some(preset));
            assert_eq!(serde_json::to_value(preset).unwrap(), preset.as_str());
        }
        for outcome in AttemptOutcome::ALL {
            let json = serde_json::to_value(outcome).unwrap();
            assert_eq!(json.as_str().unwrap().replace('_', " "), outcome.words());
        }
        for kind in [CreditKind::Grant, CreditKind::Debit, CreditKind::Refund, CreditKind::Adjustment] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert_eq!(FailureKind::parse("nonsense"), None);
        assert_eq!(Preset::parse("Summarize"), None);
    }

    #[test]
    fn only_done_failed_and_canceled_are_terminal() {
        let terminal: Vec<JobState> = JobState::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [JobState::Done, JobState::Failed, JobState::Canceled]);
        let waiting: Vec<JobState> = JobState::ALL.into_iter().filter(|s| s.is_waiting()).collect();
        assert_eq!(waiting, [JobState::Queued, JobState::Retrying]);
    }
}

/// What a user spent in one calendar month (UTC): the credits page's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct MonthTotals {
    /// `YYYY-MM`.
    pub month: String,
    /// Documents charged for, and the credits charged and refunded.
    pub documents: i64,
    pub charged: i64,
    pub refunded: i64,
    /// Provider tokens of the jobs accepted that month (jobs past retention no longer count).
    pub input_tokens: i64,
    pub output_tokens: i64,
}
