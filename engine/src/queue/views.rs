//! Jobs and attempts as users and operators read them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_types::AttemptOutcome;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgExecutor, PgPool};
use uuid::Uuid;

use super::policy::retry::ErrorClass;
use crate::error::{EngineError, Result};
use crate::{FailureKind, JobStage, JobState};

/// A job as users and operators see it (read with `SELECT *`: extra columns are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct JobView {
    pub id: Uuid,
    pub owner_id: i64,
    pub kind: String,
    pub payload: Value,
    pub state: JobState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub run_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub failure_kind: Option<FailureKind>,
    pub failure_reason: Option<String>,
    pub result: Option<Value>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost: i32,
    pub accepted_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub replays: i32,
    // Defaults: the `dead_letters` view was made before these columns (a view keeps the
    // columns `*` meant when it was made), and a dead job has no stage anyway.
    #[sqlx(default)]
    pub stage: Option<JobStage>,
    #[sqlx(default)]
    pub stage_since: Option<DateTime<Utc>>,
    #[sqlx(default)]
    pub stage_pages: Option<i32>,
    /// When its cancellation was asked for (a running job stops at its next safe point).
    #[sqlx(default)]
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// A long document's parts (set once it is split) and how many are done; `parts_stage`
    /// is `combining` once their answers are being combined.
    #[sqlx(default)]
    pub parts_total: Option<i32>,
    #[sqlx(default)]
    pub parts_done: i32,
    #[sqlx(default)]
    pub parts_stage: Option<String>,
    /// Credits a cancel keeps (fixed when it was asked for: the provider calls started).
    #[sqlx(default)]
    pub cancel_kept_credits: i32,
    /// Credits given back for this job (read where the owner sees costs; 0 elsewhere).
    #[sqlx(default)]
    pub refunded: i64,
    /// Its owner deleted its document and result (the job stays in their credit history).
    #[sqlx(default)]
    pub deleted_at: Option<DateTime<Utc>>,
    /// While running: about how many tokens of the answers its calls are writing are written
    /// so far, and how many are expected (streamed answers).
    #[sqlx(default)]
    pub written_tokens: Option<i64>,
    #[sqlx(default)]
    pub expected_tokens: Option<i64>,
    /// When its owner needs it done, and when it must start for that.
    #[sqlx(default)]
    pub due_by: Option<DateTime<Utc>>,
    #[sqlx(default)]
    pub latest_start: Option<DateTime<Utc>>,
    /// In the urgent lane.
    #[sqlx(default)]
    pub urgent: bool,
    /// Of its output tokens, those billed and not kept (a cut or flawed translation's
    /// paragraphs asked again).
    #[sqlx(default)]
    #[serde(default)]
    pub output_tokens_discarded: i64,
    /// A translation's paragraphs whose inline formatting came back wrong: plain, in their
    /// paragraph's look.
    #[sqlx(default)]
    #[serde(default)]
    pub paragraphs_plain: i32,
    /// A translation's glossary entries its answers left out even asked again.
    #[sqlx(default)]
    #[serde(default)]
    pub terms_missed: Vec<String>,
    /// A translation in parts: the key terms found in its opening (`[{source, target}]`).
    #[sqlx(default)]
    #[serde(default)]
    pub found_terms: Option<Value>,
    /// While a scan is read by OCR: the page being read (of `stage_pages`).
    #[sqlx(default)]
    #[serde(default)]
    pub reading_page: Option<i32>,
    /// How a scan's pages were read (a [`sluice_types::scan::ScanReport`]).
    #[sqlx(default)]
    #[serde(default)]
    pub scan_report: Option<Value>,
}

impl JobView {
    /// Where its deadline stands at `now`, if it has one.
    pub fn deadline(&self, now: DateTime<Utc>, lead: chrono::TimeDelta) -> Option<super::policy::deadline::Standing> {
        use super::policy::deadline::{standing, DeadlineFacts};
        let facts = DeadlineFacts {
            due_by: self.due_by?,
            latest_start: self.latest_start.or(self.due_by)?,
            waiting: matches!(self.state, JobState::Queued | JobState::Retrying),
            done_at: self.finished_at.filter(|_| self.state == JobState::Done),
            ended_without_result: self.state.is_terminal() && self.state != JobState::Done,
        };
        Some(standing(facts, now, lead))
    }

    /// What the current attempt is doing, while running: a stage left by an earlier attempt
    /// (older than this attempt's start) does not count.
    pub fn current_stage(&self) -> Option<(JobStage, DateTime<Utc>)> {
        match (self.state, self.stage, self.stage_since, self.started_at) {
            (JobState::Running, Some(stage), Some(since), Some(started)) if since >= started => Some((stage, since)),
            _ => None,
        }
    }
}

/// A query for [`JobView`]s: the job rows and the credits refunded for each (one index probe),
/// plus any `extra` columns.
macro_rules! select_jobs {
    ($rest:literal) => {
        select_jobs!("", $rest)
    };
    ($extra:literal, $rest:literal) => {
        concat!(
            "SELECT jobs.*, coalesce((SELECT sum(amount) FROM ledger
                    WHERE ledger.job_id = jobs.id AND ledger.kind = 'refund'), 0)::bigint AS refunded,
                    w.written_tokens, w.expected_tokens",
            $extra,
            " FROM jobs LEFT JOIN job_writing w ON w.job_id = jobs.id AND w.lease_token = jobs.lease_token
                         AND jobs.state = 'running' ",
            $rest
        )
    };
}

/// One job, or `NotFound`.
pub async fn get<'e>(db: impl PgExecutor<'e>, id: Uuid) -> Result<JobView> {
    sqlx::query_as(select_jobs!("WHERE id = $1")).bind(id).fetch_optional(db).await?.ok_or(EngineError::NotFound)
}

/// Which of a user's jobs to list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<JobState>,
    /// Part of the file name, any case.
    pub name_contains: Option<String>,
}

/// Pure: `text` as a literal inside a `LIKE` pattern (`%`, `_` and the backslash match only
/// themselves).
pub fn like_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One page of a user's jobs, newest first: `limit` jobs after skipping `offset`, and whether
/// there are more. A user with 10,000 jobs loads one page.
pub async fn page_for_owner(
    pool: &PgPool,
    owner_id: i64,
    filter: &JobFilter,
    offset: i64,
    limit: i64,
) -> Result<(Vec<JobView>, bool)> {
    let pattern = filter.name_contains.as_deref().map(|n| format!("%{}%", like_literal(n.trim())));
    let jobs: Vec<JobView> = sqlx::query_as(select_jobs!(
        "JOIN job_listing l ON l.job_id = jobs.id
         WHERE l.owner_id = $1 AND ($2::text IS NULL OR jobs.state = $2)
           AND ($3::text IS NULL OR jobs.payload #>> '{document,name}' ILIKE $3)
         ORDER BY l.accepted_at DESC, l.job_id LIMIT $4 OFFSET $5"
    ))
    .bind(owner_id)
    .bind(filter.state)
    .bind(pattern)
    .bind(limit + 1)
    .bind(offset.max(0))
    .fetch_all(pool)
    .await?;
    Ok(one_page(jobs, limit))
}

/// Pure: a page from rows read with one more than `limit`: the rows, and whether more follow.
fn one_page<T>(mut rows: Vec<T>, limit: i64) -> (Vec<T>, bool) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit.max(0) as usize);
    (rows, more)
}

/// What an admin searches jobs by (every part optional).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobSearch {
    /// A job id, part of an owner's e-mail (with `@`), or part of a file name.
    pub text: Option<String>,
    pub state: Option<JobState>,
    pub failure_kind: Option<FailureKind>,
    /// Accepted at or after, and before.
    pub from: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Only jobs with an open review.
    pub needs_review: bool,
}

impl JobSearch {
    /// Pure: the search in words, for the audit log of a bulk action.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(text) = self.text.as_deref() {
            parts.push(format!("text {text:?}"));
        }
        if let Some(state) = self.state {
            parts.push(format!("state {}", state.as_str()));
        }
        if let Some(kind) = self.failure_kind {
            parts.push(format!("failure {}", kind.as_str()));
        }
        if let Some(from) = self.from {
            parts.push(format!("accepted from {}", from.format("%Y-%m-%d")));
        }
        if let Some(until) = self.until {
            parts.push(format!("accepted before {}", until.format("%Y-%m-%d")));
        }
        if self.needs_review {
            parts.push("needs review".into());
        }
        if parts.is_empty() {
            "every job".into()
        } else {
            parts.join(", ")
        }
    }

    /// `$1` to `$8` of [`Self::matches`].
    fn arguments(&self) -> PgArguments {
        let (id, email, name) = search_terms(self.text.as_deref());
        let mut args = PgArguments::default();
        // Encoding these plain values into a buffer cannot fail.
        let _ = args.add(id);
        let _ = args.add(email);
        let _ = args.add(name);
        let _ = args.add(self.state);
        let _ = args.add(self.failure_kind);
        let _ = args.add(self.from);
        let _ = args.add(self.until);
        let _ = args.add(self.needs_review);
        args
    }
}

impl JobSearch {
    /// The jobs this search matches, after `FROM jobs`, with their listing as `l` (its
    /// parameters: [`Self::arguments`]).
    /// "Needs review" starts from the few open reviews (written into the text, so the plan
    /// does not have to cover both cases).
    fn matches(&self) -> String {
        let review = if self.needs_review {
            "$8 AND jobs.id = ANY (ARRAY(SELECT job_id FROM reviews WHERE resolved_at IS NULL AND job_id IS NOT NULL))"
        } else {
            "NOT $8"
        };
        // The listing gives the order and the time range, from its index (`jobs` has none on
        // acceptance time). Joined by the job id alone: a join on its whole key had the planner
        // expect no rows and loop over every user for each job (checked at 1,000,000 jobs).
        format!(
            "JOIN job_listing l ON l.job_id = jobs.id
             JOIN users u ON u.id = jobs.owner_id
             WHERE ($1::uuid IS NULL OR jobs.id = $1)
               AND ($2::text IS NULL OR u.email ILIKE $2)
               AND ($3::text IS NULL OR jobs.payload #>> '{{document,name}}' ILIKE $3)
               AND ($4::text IS NULL OR jobs.state = $4)
               AND ($5::text IS NULL OR jobs.failure_kind = $5)
               AND l.accepted_at >= coalesce($6::timestamptz, '-infinity')
               AND l.accepted_at < coalesce($7::timestamptz, 'infinity')
               AND {review}"
        )
    }
}

/// Pure: how the search box is read: (job id, e-mail pattern, file-name pattern).
pub fn search_terms(text: Option<&str>) -> (Option<Uuid>, Option<String>, Option<String>) {
    let text = text.map(str::trim).filter(|t| !t.is_empty());
    match text {
        None => (None, None, None),
        Some(t) => match Uuid::parse_str(t) {
            Ok(id) => (Some(id), None, None),
            Err(_) if t.contains('@') => (None, Some(format!("%{}%", like_literal(t))), None),
            Err(_) => (None, None, Some(format!("%{}%", like_literal(t)))),
        },
    }
}

/// A job found by an admin's search, with its owner's e-mail.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct FoundJob {
    #[sqlx(flatten)]
    pub job: JobView,
    pub owner_email: String,
}

/// One page of every user's jobs matching `search`, newest first, and whether there are more.
pub async fn search(pool: &PgPool, search: &JobSearch, offset: i64, limit: i64) -> Result<(Vec<FoundJob>, bool)> {
    let sql = format!(
        "{} {} ORDER BY l.accepted_at DESC, l.job_id LIMIT $9 OFFSET $10",
        select_jobs!(", u.email AS owner_email", ""),
        search.matches()
    );
    let mut args = search.arguments();
    let _ = args.add(limit + 1);
    let _ = args.add(offset.max(0));
    let found: Vec<FoundJob> = sqlx::query_as_with(&sql, args).fetch_all(pool).await?;
    Ok(one_page(found, limit))
}

/// How many jobs `search` matches, counting no further than `up_to` (a bound on the work).
pub async fn count_matching(pool: &PgPool, search: &JobSearch, up_to: i64) -> Result<i64> {
    let sql = format!("SELECT count(*) FROM (SELECT 1 FROM jobs {} LIMIT $9) m", search.matches());
    let mut args = search.arguments();
    let _ = args.add(up_to.max(0));
    Ok(sqlx::query_scalar_with(&sql, args).fetch_one(pool).await?)
}

/// The ids of at most `limit` jobs `search` matches, in id order.
pub async fn matching_ids(pool: &PgPool, search: &JobSearch, limit: i64) -> Result<Vec<Uuid>> {
    let sql = format!("SELECT jobs.id FROM jobs {} ORDER BY jobs.id LIMIT $9", search.matches());
    let mut args = search.arguments();
    let _ = args.add(limit.max(0));
    Ok(sqlx::query_scalar_with(&sql, args).fetch_all(pool).await?)
}

/// One attempt of a job, for the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct AttemptView {
    pub id: Uuid,
    pub attempt: i32,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// None while the attempt runs.
    pub outcome: Option<AttemptOutcome>,
    pub error_class: Option<ErrorClass>,
    /// In our words (users see this).
    pub error: Option<String>,
    /// The provider's own words, masked (admins only).
    pub detail: Option<String>,
    pub provider_status: Option<i32>,
    pub retry_after_ms: Option<i64>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

/// A job's attempts, oldest first: those ended (`attempt_history`: a successful one is kept on
/// the job's row), and the one running (its lease: an attempt's row is written when it ends).
pub async fn attempts(pool: &PgPool, job_id: Uuid) -> Result<Vec<AttemptView>> {
    Ok(sqlx::query_as(
        "SELECT id, attempt, worker, started_at, finished_at, outcome, error_class, error, detail, provider_status,
                retry_after_ms, input_tokens, output_tokens
         FROM attempt_history WHERE job_id = $1
         UNION ALL
         SELECT lease_token, attempts, lease_owner, coalesce(claimed_at, now()), NULL, NULL, NULL, NULL, NULL, NULL,
                NULL, NULL, NULL
         FROM jobs WHERE id = $1 AND state = 'running'
         ORDER BY started_at, attempt",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await?)
}
