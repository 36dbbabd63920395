//! What the browser and API clients see: plain serialisable types (no server-only crates).

use serde::{Deserialize, Serialize};
pub use sluice_types::roles::{Permission, Role};
pub use sluice_types::{AttemptOutcome, CreditKind, FailureKind, JobStage, JobState, MonthTotals, Preset};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserInfo {
    pub id: i64,
    pub email: String,
    pub is_admin: bool,
    /// What the console lets this account do (`Role::may`).
    pub role: Role,
    /// The address was proved by a mailed link (until then, no sign-up grant).
    pub email_verified: bool,
    pub balance: i64,
    pub in_flight: i32,
    pub max_in_flight: i32,
}

/// Which notices also come by e-mail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailChoicesInfo {
    pub done: bool,
    pub failed: bool,
    pub credits_low: bool,
}

/// One page of a user's jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobsPage {
    pub jobs: Vec<JobStatus>,
    /// Older jobs follow on the next page.
    pub has_more: bool,
}

/// An accepted upload: the job (new, or the earlier one for a repeated key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct UploadReply {
    pub id: String,
    pub status_url: String,
    pub duplicate: bool,
    /// Credits this upload took (the price by its size; 0 for a duplicate).
    #[serde(default)]
    pub charged: i64,
    /// With an `Idempotency-Key`: until when (RFC 3339) a repeat with it answers this job;
    /// after that the key is forgotten.
    #[serde(default)]
    pub idempotency_key_expires_at: Option<String>,
    /// A translation into several languages (`languages`): the job of each after the first,
    /// or why it was refused (each is priced and admitted on its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<AlsoInto>,
}

/// One more language of an upload's translation: its job, or why it was refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AlsoInto {
    pub language: String,
    /// Its job's id.
    #[serde(default)]
    pub id: Option<String>,
    /// Why it was refused (out of credits, too many documents in flight).
    #[serde(default)]
    pub refused: Option<String>,
}

/// What an upload would cost and when it should be done (`POST /api/v1/estimate`, and the
/// upload page before the user confirms). Nothing is stored or charged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct Estimate {
    /// What the file is, by its content: `pdf`, `docx`, `odt`, `html`, `md` or `txt`.
    pub doc_type: String,
    pub bytes: u64,
    /// A text's or a web page's tokens, counted; none for a PDF or a Word file (read later).
    pub counted_tokens: Option<u64>,
    /// What its provider calls will carry: counted, or estimated from its size.
    pub input_tokens: u64,
    /// Credits the upload takes (for a translation into several languages, all of them: each
    /// is priced on its own).
    pub credits: i64,
    /// The credits are a hold (a PDF, a Word or OpenDocument file, a web page), settled to its
    /// text's price once read, down to `least_credits`; the rest comes back.
    pub held: bool,
    pub least_credits: i64,
    /// Provider calls its text takes (those longer than one call are done in parts).
    pub parts: u64,
    /// Jobs that would start before it, were it uploaded now.
    pub jobs_ahead: u64,
    /// Seconds until it starts; none while processing is paused or nothing finished lately.
    pub starts_in_secs: Option<u64>,
    /// Seconds it should run once started.
    pub runs_for_secs: u64,
    /// `measured`: at the pace of the last day's attempts; `deadline`: nothing measured yet,
    /// so the most its attempt may take.
    #[cfg_attr(feature = "ssr", schema(pattern = "^(measured|deadline)$"))]
    pub run_time_basis: String,
    /// Seconds until it should be done, when its start can be told.
    pub done_in_secs: Option<u64>,
    /// An operator has paused processing: it waits until they resume.
    pub processing_paused: bool,
    /// With a `due_by`: whether it should be done by then, given the line and the provider's
    /// pace (none while its start cannot be told).
    pub meets_deadline: Option<bool>,
    /// A PDF's or an image's pages, as surveyed (none for other documents, or a PDF the
    /// survey could not read: its job reads it).
    #[serde(default)]
    pub pages: Option<u32>,
    /// Its pages without a text layer, read by OCR and priced by page (`scan_credits` of the
    /// credits).
    #[serde(default)]
    pub scanned_pages: Option<u32>,
    #[serde(default)]
    pub scan_credits: Option<i64>,
}

/// A job's state, as the jobs page and `GET /api/v1/jobs/{id}` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct JobStatus {
    pub id: String,
    pub state: JobState,
    pub file_name: Option<String>,
    pub preset: Option<Preset>,
    pub attempts: i32,
    pub max_attempts: i32,
    /// RFC 3339 times.
    pub accepted_at: String,
    pub run_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub last_error: Option<String>,
    pub failure_kind: Option<FailureKind>,
    pub failure_reason: Option<String>,
    pub cost: i32,
    pub has_result: bool,
    /// An operator has paused processing (the kill switch); waiting jobs wait for it.
    #[serde(default)]
    pub paused: bool,
    /// While waiting: how many jobs are claimed before this one (fair order).
    #[serde(default)]
    pub jobs_ahead: Option<i64>,
    /// While waiting: the estimated seconds until it starts, when there is a rate to go by.
    #[serde(default)]
    pub starts_in_secs: Option<i64>,
    /// While running: what the job is doing right now, and since when (RFC 3339).
    #[serde(default)]
    pub stage: Option<JobStage>,
    /// While its answer streams: about how many tokens are written, of how many expected.
    #[serde(default)]
    pub written_tokens: Option<i64>,
    #[serde(default)]
    pub expected_tokens: Option<i64>,
    #[serde(default)]
    pub stage_since: Option<String>,
    /// The document's pages, once read (PDFs).
    #[serde(default)]
    pub pages: Option<i32>,
    /// While its scanned pages are read by OCR: the page being read (of `pages`).
    #[serde(default)]
    pub reading_page: Option<i32>,
    /// Once read: which pages OCR read, with what confidence (those under the floor flagged),
    /// and which it skipped.
    #[serde(default)]
    pub scan: Option<sluice_types::scan::ScanReport>,
    /// Credits given back (a failed or canceled job's refund).
    #[serde(default)]
    pub refunded: i64,
    /// Its cancellation was asked for while it ran; it stops at its next safe point.
    #[serde(default)]
    pub cancel_requested: bool,
    /// Credits its cancel keeps (the provider calls started when it was asked for).
    #[serde(default)]
    pub cancel_kept: i64,
    /// Provider tokens in and out over all attempts, once known.
    #[serde(default)]
    pub input_tokens: Option<i64>,
    #[serde(default)]
    pub output_tokens: Option<i64>,
    /// Of the output tokens billed, those its result holds: the rest were paid for answers
    /// not kept (a cut or flawed translation's paragraphs asked again).
    #[serde(default)]
    pub output_tokens_kept: Option<i64>,
    /// A translation's paragraphs whose bold, italics or links did not come back from the
    /// model: they are plain, in their paragraph's look.
    #[serde(default)]
    pub paragraphs_without_formatting: i32,
    /// Glossary entries a translation left out even asked again (`Supplier → Lieferant`).
    #[serde(default)]
    pub terms_missed: Vec<String>,
    /// A translation in parts: the key terms one call found in its opening, kept the same in
    /// every part (`Supplier → Lieferant`).
    #[serde(default)]
    pub terms_found: Vec<String>,
    /// A document longer than one provider call: its parts, once split.
    #[serde(default)]
    pub parts: Option<PartsProgress>,
    /// Its owner deleted its document and result; the job stays as a line of their credits.
    #[serde(default)]
    pub deleted: bool,
    /// Failed, and an operator marked it (or its kind of failure) "needs review".
    #[serde(default)]
    pub under_review: bool,
    /// A translation of a Word or OpenDocument file: its result also comes back as a file of
    /// that format (`/api/v1/jobs/{id}/translated`), with this extension.
    #[serde(default)]
    pub translated_file: Option<String>,
    /// When its owner needs it done (RFC 3339), and where that stands.
    #[serde(default)]
    pub due_by: Option<String>,
    #[serde(default)]
    pub deadline: Option<DeadlineStanding>,
    /// In the urgent lane (small, asked for, or the account's).
    #[serde(default)]
    pub urgent: bool,
    /// In the economy lane: done through the provider's batch API, at its discount.
    #[serde(default)]
    pub economy: bool,
    /// While the provider's batch has its calls: when they were sent (RFC 3339).
    #[serde(default)]
    pub in_provider_batch_since: Option<String>,
}

/// Where a job's deadline stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeadlineStanding {
    /// Waiting or running with time to spare.
    OnTrack,
    /// Still waiting near when it must start to be done in time: the operator is alerted.
    AtRisk,
    Met,
    /// Done late, ended without a result, or not done at its deadline.
    Missed,
}

impl DeadlineStanding {
    /// In words, for the job's page.
    pub fn words(self) -> &'static str {
        match self {
            DeadlineStanding::OnTrack => "on track",
            DeadlineStanding::AtRisk => "at risk",
            DeadlineStanding::Met => "met",
            DeadlineStanding::Missed => "missed",
        }
    }
}

/// How far a document done in parts is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct PartsProgress {
    pub done: i32,
    pub total: i32,
    /// Every part is done and their answers are being combined (a summary of the summaries).
    pub combining: bool,
    /// Seconds the rest should take, at the pace of the parts done so far.
    #[serde(default)]
    pub left_secs: Option<i64>,
}

impl PartsProgress {
    /// What a user reads: "Translating 7 parts, 3 done" (parts run side by side, so there is
    /// no one part in progress), "Combining 7 parts".
    pub fn words(&self, preset: Option<Preset>, state: JobState) -> String {
        if state == JobState::Done {
            return format!("Done in {} parts", self.total);
        }
        if self.combining {
            return format!("Combining {} parts", self.total);
        }
        let verb = match preset {
            Some(Preset::Translate) => "Translating",
            Some(Preset::Explain) => "Explaining",
            Some(Preset::KeyFacts) => "Reading facts from",
            _ => "Summarizing",
        };
        format!("{verb} {} parts, {} done", self.total, self.done.min(self.total))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptInfo {
    pub attempt: i32,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// None while the attempt runs.
    pub outcome: Option<AttemptOutcome>,
    pub error: Option<String>,
    /// The provider's own words (masked); only the admin page gets them.
    #[serde(default)]
    pub detail: Option<String>,
    pub provider_status: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDetails {
    pub job: JobStatus,
    pub result: Option<serde_json::Value>,
    /// The result's Markdown rendered to sanitised HTML on the server (raw HTML escaped, only
    /// http/https/mailto links, no images fetched).
    #[serde(default)]
    pub result_html: Option<String>,
    pub attempts: Vec<AttemptInfo>,
    /// Which provider deployment each call went to (staff only; none without a providers file).
    #[serde(default)]
    pub calls: Vec<CallInfo>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerLine {
    pub kind: CreditKind,
    pub amount: i64,
    pub job_id: Option<String>,
    pub note: Option<String>,
    pub at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CreditSummary {
    pub balance: i64,
    pub history: Vec<LedgerLine>,
    /// Newest month first.
    #[serde(default)]
    pub months: Vec<MonthTotals>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoticeInfo {
    pub id: i64,
    pub job_id: Option<String>,
    pub kind: String,
    pub message: String,
    pub created_at: String,
    pub read: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub prefix: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub revoked: bool,
}

/// A token just created: the secret is shown this once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewToken {
    pub token: TokenInfo,
    pub secret: String,
}

#[cfg(feature = "ssr")]
pub use convert::time as time_text;

#[cfg(feature = "ssr")]
mod convert {
    use super::*;
    use chrono::{DateTime, SecondsFormat, Utc};

    /// RFC 3339 with milliseconds, in UTC (the browser shows it in its own zone).
    pub fn time(t: DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    impl From<engine::accounts::User> for UserInfo {
        fn from(u: engine::accounts::User) -> Self {
            UserInfo {
                id: u.id,
                is_admin: u.is_admin(),
                role: u.role,
                email_verified: u.email_verified_at.is_some(),
                email: u.email,
                balance: u.balance,
                in_flight: u.in_flight,
                max_in_flight: u.max_in_flight,
            }
        }
    }

    impl From<engine::accounts::recovery::MailChoices> for MailChoicesInfo {
        fn from(c: engine::accounts::recovery::MailChoices) -> Self {
            MailChoicesInfo { done: c.done, failed: c.failed, credits_low: c.credits_low }
        }
    }

    /// A waiting job is at risk this long before its latest start (the workers' default lead).
    const DEADLINE_LEAD: chrono::TimeDelta =
        chrono::TimeDelta::seconds(engine::queue::lanes::DEFAULT_DEADLINE_LEAD.as_secs() as i64);

    impl From<&engine::queue::JobView> for JobStatus {
        fn from(j: &engine::queue::JobView) -> Self {
            let text = |key: &str| j.payload.pointer(key).and_then(|v| v.as_str()).map(str::to_string);
            JobStatus {
                id: j.id.to_string(),
                state: j.state,
                file_name: text("/document/name"),
                preset: text("/preset").as_deref().and_then(Preset::parse),
                attempts: j.attempts,
                max_attempts: j.max_attempts,
                accepted_at: time(j.accepted_at),
                run_at: time(j.run_at),
                started_at: j.started_at.map(time),
                finished_at: j.finished_at.map(time),
                last_error: j.last_error.clone(),
                failure_kind: j.failure_kind,
                failure_reason: j.failure_reason.clone(),
                cost: j.cost,
                has_result: j.result.is_some(),
                paused: false,
                jobs_ahead: None,
                starts_in_secs: None,
                stage: j.current_stage().map(|(stage, _)| stage),
                written_tokens: j.written_tokens.filter(|_| j.current_stage().is_some()),
                expected_tokens: j.expected_tokens.filter(|_| j.current_stage().is_some()),
                stage_since: j.current_stage().map(|(_, since)| time(since)),
                pages: j.stage_pages,
                reading_page: j.reading_page.filter(|_| j.current_stage().is_some()),
                scan: j.scan_report.clone().and_then(|r| serde_json::from_value(r).ok()),
                refunded: j.refunded,
                cancel_requested: j.cancel_requested_at.is_some() && !j.state.is_terminal(),
                cancel_kept: j.cancel_kept_credits.into(),
                input_tokens: j.input_tokens,
                output_tokens: j.output_tokens,
                output_tokens_kept: j.output_tokens.map(|o| o.saturating_sub(j.output_tokens_discarded).max(0)),
                paragraphs_without_formatting: j.paragraphs_plain,
                terms_missed: j.terms_missed.clone(),
                terms_found: j
                    .found_terms
                    .clone()
                    .and_then(|f| serde_json::from_value::<Vec<engine::documents::glossary::Entry>>(f).ok())
                    .unwrap_or_default()
                    .iter()
                    .map(engine::documents::glossary::shown)
                    .collect(),
                economy: j.payload["economy"] == serde_json::Value::Bool(true),
                in_provider_batch_since: None,
                deleted: j.deleted_at.is_some(),
                under_review: false,
                translated_file: serde_json::from_value::<engine::documents::payload::DocumentJob>(j.payload.clone())
                    .ok()
                    .and_then(|spec| spec.translated_file_type())
                    .map(|doc_type| doc_type.extension().to_string()),
                parts: j.parts_total.map(|total| {
                    let combining = j.parts_stage.as_deref() == Some("combining");
                    let combines = text("/preset").as_deref() != Some("translate") && !combining;
                    let elapsed = j.started_at.map(|s| (Utc::now() - s).to_std().unwrap_or_default());
                    let left = elapsed.filter(|_| !j.state.is_terminal()).and_then(|elapsed| {
                        let (done, total) = (j.parts_done.max(0) as u32, total.max(0) as u32);
                        engine::queue::policy::position::parts_left(done, total, elapsed, combines)
                    });
                    PartsProgress { done: j.parts_done, total, combining, left_secs: left.map(|d| d.as_secs() as i64) }
                }),
                due_by: j.due_by.map(time),
                deadline: j.deadline(Utc::now(), DEADLINE_LEAD).map(|standing| {
                    use engine::queue::policy::deadline::Standing;
                    match standing {
                        Standing::OnTrack => DeadlineStanding::OnTrack,
                        Standing::AtRisk => DeadlineStanding::AtRisk,
                        Standing::Met => DeadlineStanding::Met,
                        Standing::Missed => DeadlineStanding::Missed,
                    }
                }),
                urgent: j.urgent,
            }
        }
    }

    impl From<engine::queue::AttemptView> for AttemptInfo {
        /// The error class stays on the server: users read the error in words.
        fn from(a: engine::queue::AttemptView) -> Self {
            AttemptInfo {
                attempt: a.attempt,
                started_at: time(a.started_at),
                finished_at: a.finished_at.map(time),
                outcome: a.outcome,
                error: a.error,
                detail: None,
                provider_status: a.provider_status,
            }
        }
    }

    impl From<engine::accounts::ledger::LedgerEntry> for LedgerLine {
        fn from(e: engine::accounts::ledger::LedgerEntry) -> Self {
            LedgerLine {
                kind: e.kind,
                amount: e.amount,
                job_id: e.job_id.map(|id| id.to_string()),
                note: e.note,
                at: time(e.at),
            }
        }
    }

    impl From<engine::accounts::notices::Notice> for NoticeInfo {
        fn from(n: engine::accounts::notices::Notice) -> Self {
            NoticeInfo {
                id: n.id,
                job_id: n.job_id.map(|id| id.to_string()),
                kind: n.kind,
                message: n.message,
                created_at: time(n.created_at),
                read: n.read,
            }
        }
    }

    impl From<engine::accounts::tokens::ApiToken> for TokenInfo {
        fn from(t: engine::accounts::tokens::ApiToken) -> Self {
            TokenInfo {
                id: t.id,
                name: t.name,
                prefix: t.prefix,
                created_at: time(t.created_at),
                last_used_at: t.last_used_at.map(time),
                revoked: t.revoked,
            }
        }
    }
}

/// A processing preset the upload form can offer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresetInfo {
    pub id: Preset,
    pub label: String,
}

/// What this server offers and charges, for the upload and sign-up pages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteTerms {
    pub presets: Vec<PresetInfo>,
    /// Credits the smallest document costs.
    pub cost: i64,
    /// Credits by estimated size (the upload page prices a file before it is sent).
    pub prices: sluice_types::capacity::PriceTable,
    /// The most input tokens the provider reads at once (a longer text is refused).
    pub max_document_tokens: Option<u64>,
    pub max_upload_bytes: u64,
    /// Credits a new account starts with.
    pub signup_grant: i64,
    /// The grant waits for the address to be proved by a mailed link.
    pub verify_email: bool,
    /// The economy lane's terms, where the provider has a batch API (none: not offered).
    #[serde(default)]
    pub economy: Option<sluice_types::capacity::EconomyTerms>,
    /// The languages scans are read in by OCR (Tesseract's codes; the first is the default),
    /// and whether an upload may ask for `auto`. None: this server reads no scans.
    #[serde(default)]
    pub ocr_languages: Vec<String>,
    #[serde(default)]
    pub detect_language: bool,
}

/// The admin page's capacity card: the provider's limits and what the budget holds now, and
/// the measured attempts the planner sizes from (the page computes the plan, so other limits
/// show their result at once).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacityInfo {
    pub limits: sluice_types::capacity::ProviderLimits,
    pub requests_left: Option<f64>,
    pub input_tokens_left: Option<f64>,
    pub output_tokens_left: Option<f64>,
    pub gate_size: i32,
    pub effective_gate: i32,
    pub days: u32,
    /// "all" first, then each preset.
    pub stats: Vec<sluice_types::capacity::AttemptStats>,
    /// The provider timeout and attempt deadline (growing with a call's tokens).
    #[serde(default)]
    pub time_limits: sluice_types::capacity::TimeLimits,
    /// The providers file's deployments, in order (none without one).
    #[serde(default)]
    pub deployments: Vec<sluice_types::capacity::DeploymentState>,
}

/// One provider call of a job's, for operators: which deployment, and whether it answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallInfo {
    pub at: String,
    pub deployment: String,
    pub answered: bool,
    pub failure: Option<String>,
}

/// The admin page's view of the queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    pub processing_enabled: bool,
    pub processing_changed_at: String,
    pub processing_changed_by: String,
    pub gate_size: i32,
    /// The gate claims use now: lower than `gate_size` while the adaptive gate grows back.
    pub effective_gate: i32,
    /// Why the gate in force is lower, and since when (`None` when it is not).
    pub gate_reduced: Option<(String, String)>,
    /// Worker slots alive across every process, and in how many processes.
    #[serde(default)]
    pub worker_slots: i64,
    #[serde(default)]
    pub worker_processes: i64,
    /// How many jobs can run at once: the gate in force, unless fewer slots are alive.
    #[serde(default)]
    pub effective_concurrency: i64,
    pub running: i64,
    pub backlog: i64,
    pub scheduled_retries: i64,
    pub oldest_waiting_secs: Option<f64>,
    pub intake_per_min: f64,
    pub completions_per_min: f64,
    pub time_to_done_p50_secs: Option<f64>,
    pub time_to_done_p95_secs: Option<f64>,
    pub dlq_depth: i64,
    /// The document store's free bytes (none for S3 or not measured lately), and whether it
    /// is full (uploads refused with 507).
    #[serde(default)]
    pub store_free_bytes: Option<i64>,
    #[serde(default)]
    pub store_full: bool,
    /// Documents with a deadline at risk now, and deadlines missed in the last day.
    #[serde(default)]
    pub deadlines_at_risk: i64,
    #[serde(default)]
    pub deadlines_missed_last_day: i64,
    /// "empty", "not draining", or a duration like "3 min".
    pub drain: String,
    /// Per minute over the last hour, oldest first: (intake, completions).
    pub history: Vec<(i64, i64)>,
    /// When a timed pause ends by itself, and the seconds left.
    #[serde(default)]
    pub resume_at: Option<(String, i64)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DlqGroupInfo {
    pub kind: FailureKind,
    pub reason: String,
    pub jobs: i64,
    /// Its open review, if someone was asked to look at it.
    #[serde(default)]
    pub review: Option<ReviewInfo>,
}

/// A dead-letter job as the admin page inspects it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DlqJobInfo {
    pub job: JobStatus,
    pub owner_email: String,
    pub attempts: Vec<AttemptInfo>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditInfo {
    pub at: String,
    pub actor: String,
    pub action: String,
    pub subject: Option<String>,
    pub old_value: Option<String>,
    pub new_value: Option<String>,
}

/// A reconciliation report, for the admin page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReconciliationInfo {
    pub id: i64,
    pub finished_at: String,
    pub actor: String,
    /// (check, rows examined, discrepancies found).
    pub checks: Vec<(String, i64, i64)>,
    /// (check, subject, detail).
    pub discrepancies: Vec<(String, String, String)>,
    #[serde(default)]
    pub acknowledged: Option<AckInfo>,
}

#[cfg(feature = "ssr")]
impl From<engine::reconcile::Report> for ReconciliationInfo {
    fn from(r: engine::reconcile::Report) -> Self {
        ReconciliationInfo {
            id: r.id,
            finished_at: time_text(r.finished_at),
            actor: r.actor,
            checks: r.checks.into_iter().map(|c| (c.check, c.examined, c.found)).collect(),
            discrepancies: r.discrepancies.into_iter().map(|d| (d.check, d.subject, d.detail)).collect(),
            acknowledged: r.acknowledged.map(|a| AckInfo { by: a.by, at: time_text(a.at), note: a.note }),
        }
    }
}

/// An alert firing (or fired and resolved), for the admin page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertInfo {
    #[serde(default)]
    pub id: i64,
    /// Who acknowledged it, when, and the note.
    #[serde(default)]
    pub acknowledged: Option<AckInfo>,
    pub rule: String,
    pub fired_at: String,
    pub resolved_at: Option<String>,
    pub value: f64,
    pub threshold: f64,
    pub detail: String,
}

#[cfg(feature = "ssr")]
impl From<engine::alerts::Firing> for AlertInfo {
    fn from(f: engine::alerts::Firing) -> Self {
        AlertInfo {
            id: f.id,
            acknowledged: f.acked_by.zip(f.acked_at).map(|(by, at)| AckInfo {
                by,
                at: time_text(at),
                note: f.ack_note,
            }),
            rule: f.rule,
            fired_at: time_text(f.fired_at),
            resolved_at: f.resolved_at.map(time_text),
            value: f.value,
            threshold: f.threshold,
            detail: f.detail,
        }
    }
}

/// The alerts card: what fires now, and the latest firings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertsInfo {
    pub firing: Vec<AlertInfo>,
    pub recent: Vec<AlertInfo>,
    /// Whether firings are also sent to a webhook.
    pub webhook: bool,
}

/// One page of an admin's job search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSearchPage {
    /// (the job, its owner's e-mail)
    pub jobs: Vec<(JobStatus, String)>,
    pub has_more: bool,
    /// The open reviews of the jobs on this page.
    #[serde(default)]
    pub reviews: Vec<ReviewInfo>,
}

/// What a DLQ replay did, for the admin page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayInfo {
    pub replayed: usize,
    /// (this job, the newer job of the same document): left failed, the owner uploaded again.
    pub already_reuploaded: Vec<(String, String)>,
    /// Left failed: their document was released when its replay window ended.
    #[serde(default)]
    pub document_released: Vec<String>,
}

/// Who acknowledged an alert or a report, when, and what they said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AckInfo {
    pub by: String,
    pub at: String,
    pub note: Option<String>,
}

/// A "needs review" on a failed job or a dead-letter group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReviewInfo {
    pub id: i64,
    pub job_id: Option<String>,
    /// The group's kind and reason, for a group's review.
    pub group: Option<(FailureKind, String)>,
    pub note: String,
    pub assignee: Option<String>,
    pub marked_by: String,
    pub marked_at: String,
    /// (who, when, how: `replayed`, `discarded` or `no_action`, why).
    pub resolved: Option<(String, String, String, Option<String>)>,
}

#[cfg(feature = "ssr")]
impl From<engine::queue::reviews::Review> for ReviewInfo {
    fn from(r: engine::queue::reviews::Review) -> Self {
        ReviewInfo {
            id: r.id,
            job_id: r.job_id.map(|id| id.to_string()),
            group: r.failure_kind.map(|kind| (kind, r.failure_reason.unwrap_or_default())),
            note: r.note,
            assignee: r.assignee,
            marked_by: r.marked_by,
            marked_at: time_text(r.marked_at),
            resolved: match (r.resolved_by, r.resolved_at, r.resolution) {
                (Some(by), Some(at), Some(how)) => Some((by, time_text(at), how, r.resolution_note)),
                _ => None,
            },
        }
    }
}

/// How many jobs a bulk action would take, and the most it may.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BulkCount {
    /// Counted up to one past the cap.
    pub matched: i64,
    pub cap: i64,
}

/// What a bulk action did (or, if it outlasts the request, that it goes on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BulkInfo {
    pub matched: i64,
    /// None while it still runs in the background.
    pub acted: Option<i64>,
    /// Jobs it could not change (the log says why).
    pub failed: i64,
}

/// A server process as the console lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub name: String,
    pub role: String,
    pub version: String,
    pub slots: i32,
    pub running: i32,
    pub started_at: String,
    pub seen_at: String,
    pub alive: bool,
}

/// The processes page: every process, and the concurrency they allow with the gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessesInfo {
    pub processes: Vec<ProcessInfo>,
    pub gate_size: i32,
    pub effective_gate: i32,
    pub live_slots: i64,
    pub effective_concurrency: i64,
}

/// One hour's or day's outcomes and cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutcomeRow {
    /// The period's start, UTC (`2026-12-01 14:00`, or the day).
    pub start: String,
    pub done: i64,
    pub failed: i64,
    /// Failed of ended, none when nothing ended.
    pub failure_share: Option<f64>,
    pub credits_charged: i64,
    pub credits_refunded: i64,
    /// Provider tokens, input and output apart, of successful attempts and of the others.
    pub input_tokens_succeeded: i64,
    pub output_tokens_succeeded: i64,
    pub input_tokens_failed: i64,
    pub output_tokens_failed: i64,
    /// Of the output tokens, those billed and not kept (a cut or flawed translation's
    /// paragraphs asked again).
    #[serde(default)]
    pub output_tokens_discarded: i64,
    /// What all those tokens cost at the provider, when the operator gave its prices.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

/// The console's job search as its form sends it (every field optional).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobFilterForm {
    /// A job id, part of an owner's e-mail (with `@`), or part of a file name.
    pub text: Option<String>,
    pub state: Option<String>,
    pub kind: Option<String>,
    /// Accepted on or after this day, and on or before `until` (`YYYY-MM-DD`).
    pub from: Option<String>,
    pub until: Option<String>,
    pub needs_review: Option<bool>,
}
