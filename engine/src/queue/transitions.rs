//! A running job's outcome: done, retrying, requeued, failed, or handed back. Every transition
//! is one transaction; each write is fenced by the attempt's lease token, so a stale worker's
//! late write changes nothing.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_types::AttemptOutcome;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::claim::ClaimedJob;
use super::hooks::{TerminalHooks, TerminalJob};
use super::parts::{self, PartsProgress};
use super::policy::retry::{Decision, ErrorClass, Failure, RetryPolicy};
use crate::error::Result;
use crate::FailureKind;

/// What a processor produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOutput {
    pub result: Value,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// Set when the attempt stored parts of a job done in parts and stopped before its end:
    /// the job goes back in line instead of ending.
    #[serde(default)]
    pub part: Option<PartsProgress>,
}

/// Why an attempt failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    pub class: ErrorClass,
    /// Human-readable; shown to the user and in the DLQ. Never secrets, never document bytes.
    pub message: String,
    pub provider_status: Option<u16>,
    pub retry_after: Option<Duration>,
    /// What the provider said, masked and cut short: for admins, never shown to users.
    #[serde(default)]
    pub detail: Option<String>,
    /// The document reader could not read the document (the file's doing): such a failure
    /// counts against its owner's daily allowance of refunded unreadable documents, and a
    /// cancel asked for meanwhile does not turn it into a free cancel.
    #[serde(default)]
    pub unreadable: bool,
    /// With [`ErrorClass::TooLong`]: the prompt's tokens as the provider counted them, when
    /// it said (the processor learns its tokenizer's ratio to ours from it).
    #[serde(default)]
    pub provider_counted_tokens: Option<u64>,
    /// Tokens in and out the attempt's calls used before it failed (a document in parts: the
    /// parts it answered): recorded on its attempt, so outcomes and costs count them.
    #[serde(default)]
    pub usage: Option<(i64, i64)>,
    /// Not a failure: the call was kept for the provider's batch (the economy lane), and the
    /// job goes back in line until the batch answers.
    #[serde(default, skip)]
    pub deferred: bool,
}

impl JobError {
    /// An error of `class` with a message a user may read.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> JobError {
        JobError {
            class,
            message: message.into(),
            provider_status: None,
            retry_after: None,
            detail: None,
            unreadable: false,
            provider_counted_tokens: None,
            usage: None,
            deferred: false,
        }
    }

    /// The reader could not read the document (see [`JobError::unreadable`]).
    pub fn unreadable(mut self) -> JobError {
        self.unreadable = true;
        self
    }

    /// The provider's `Retry-After`, a floor for the next attempt's delay.
    pub fn with_retry_after(mut self, retry_after: Duration) -> JobError {
        self.retry_after = Some(retry_after);
        self
    }

    /// The provider's own words, with anything that looks like a secret masked, at most 500
    /// characters; kept on the attempt row for admins.
    pub fn with_detail(mut self, raw: &str) -> JobError {
        let masked = mask_secrets(raw);
        self.detail = (!masked.trim().is_empty()).then(|| masked.chars().take(500).collect());
        self
    }

    /// The provider's HTTP status, kept on the attempt row.
    pub fn with_status(mut self, status: u16) -> JobError {
        self.provider_status = Some(status);
        self
    }

    /// `input` and `output` tokens more billed for the failed attempt (a failed call's, or the
    /// answers before the failure): its attempt row counts them.
    pub fn with_usage_added(mut self, input: i64, output: i64) -> JobError {
        let (was_in, was_out) = self.usage.unwrap_or_default();
        self.usage = Some((was_in.saturating_add(input.max(0)), was_out.saturating_add(output.max(0))));
        self
    }
}

/// Pure: `text` with every word that looks like a credential (an API key, a bearer token:
/// 20 or more characters of letters, digits, `-` and `_`, with both letters and digits)
/// reduced to its first four characters and an ellipsis.
pub fn mask_secrets(text: &str) -> String {
    let looks_secret = |word: &str| {
        word.len() >= 20
            && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '*')
            && word.chars().any(|c| c.is_ascii_digit() || c == '*')
            && word.chars().any(|c| c.is_ascii_alphabetic())
    };
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if looks_secret(word) {
            out.extend(word.chars().take(4));
            out.push('…');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '*' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// What recording an attempt's outcome did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Done,
    Retrying {
        at: DateTime<Utc>,
    },
    Requeued,
    /// A job in parts stored parts and stopped before its end; it is back in line.
    PartDone,
    Failed(FailureKind),
    /// The job had a cancellation request: canceled and refunded, whatever the attempt did.
    Canceled,
    /// The lease token no longer matches: another attempt owns the job. Nothing was written.
    Stale,
}

/// Store the result; `done` and the done hook commit together.
pub async fn complete(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    job: &ClaimedJob,
    output: &JobOutput,
) -> Result<Recorded> {
    let recorded = complete_many(pool, hooks, &[(job, output)]).await?;
    Ok(recorded[0])
}

/// Store several results in one transaction (one commit for many jobs is what makes a
/// busy queue fast). Each job is fenced by its own lease token; the done hook runs for each
/// job that was written. Returns one `Done` or `Stale` per input, in order.
pub async fn complete_many(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    items: &[(&ClaimedJob, &JobOutput)],
) -> Result<Vec<Recorded>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = items.iter().map(|(j, _)| j.id).collect();
    let tokens: Vec<Uuid> = items.iter().map(|(j, _)| j.lease_token).collect();
    let (steps, finals): (Vec<_>, Vec<_>) = items.iter().copied().partition(|(_, o)| o.part.is_some());
    let mut tx = pool.begin().await?;
    if !steps.is_empty() {
        // Parts back in line take their owners' lines: every job's row of the batch first, as a
        // rescue or a retry takes a row before its line, or one racing a result here deadlocks.
        super::enqueue::lock_entries(&mut tx, &ids).await?;
    }
    let steps: Vec<_> =
        steps.iter().filter_map(|(j, o)| o.part.as_ref().map(|p| (*j, p, o.input_tokens, o.output_tokens))).collect();
    let continued: HashSet<Uuid> = parts::requeue(&mut tx, &steps).await?.into_iter().collect();
    let mut done = write_results(&mut tx, &finals).await?;
    // The hooks write each owner's row: in owner order, so that two batches written at once
    // (the completer runs two) take those locks in the same order and never deadlock.
    done.sort_by_key(|d| (d.job.owner_id, d.job.id));
    if !done.is_empty() {
        // A finished document's text is not kept twice: its parts keep their answers only.
        let ids: Vec<Uuid> = done.iter().map(|d| d.job.id).collect();
        sqlx::query("UPDATE job_parts SET body = '', overlap = '' WHERE job_id = ANY($1) AND body <> ''")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
    }
    let mut written = HashSet::with_capacity(done.len());
    for DoneRow { job, .. } in &done {
        hooks.on_done(&mut tx, job).await?;
        written.insert(job.id);
    }
    // A result for a job whose owner canceled it meanwhile is not charged: canceled instead.
    let others: Vec<(Uuid, Uuid)> = ids
        .iter()
        .zip(&tokens)
        .filter(|(id, _)| !written.contains(*id) && !continued.contains(*id))
        .map(|(id, t)| (*id, *t))
        .collect();
    let canceled: HashSet<Uuid> =
        super::cancel::end_requested(&mut tx, hooks, &others, Some("canceled; the result that came is not charged"))
            .await?
            .into_iter()
            .collect();
    tx.commit().await?;
    for row in &done {
        metrics::histogram!("sluice_job_time_to_done_seconds").record(row.time_to_done);
    }
    Ok(ids
        .iter()
        .map(|id| match (written.contains(id), continued.contains(id), canceled.contains(id)) {
            (true, ..) => Recorded::Done,
            (_, true, _) => Recorded::PartDone,
            (.., true) => Recorded::Canceled,
            _ => Recorded::Stale,
        })
        .collect())
}

/// Write final results (`done`), each fenced by its lease token; the jobs written.
async fn write_results(tx: &mut PgConnection, items: &[(&ClaimedJob, &JobOutput)]) -> Result<Vec<DoneRow>> {
    // Where the claim left each row, unless it has moved since; those that moved (or came
    // without a place) are then found by id.
    let placed: Vec<_> = items.iter().copied().filter(|(j, _)| j.place.is_some()).collect();
    let mut done = write_results_where(tx, &placed, ResultsBy::Place).await?;
    let written: HashSet<Uuid> = done.iter().map(|d| d.job.id).collect();
    let rest: Vec<_> = items.iter().copied().filter(|(j, _)| !written.contains(&j.id)).collect();
    done.extend(write_results_where(tx, &rest, ResultsBy::Id).await?);
    Ok(done)
}

/// How [`write_results_where`] finds the rows.
#[derive(Clone, Copy, PartialEq)]
enum ResultsBy {
    /// At the places the claim left them (a TID scan): a row that moved is not found there.
    Place,
    /// By key.
    Id,
}

async fn write_results_where(
    tx: &mut PgConnection,
    items: &[(&ClaimedJob, &JobOutput)],
    by: ResultsBy,
) -> Result<Vec<DoneRow>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = items.iter().map(|(j, _)| j.id).collect();
    let tokens: Vec<Uuid> = items.iter().map(|(j, _)| j.lease_token).collect();
    let results: Vec<Value> = items.iter().map(|(_, o)| o.result.clone()).collect();
    let input_tokens: Vec<Option<i64>> = items.iter().map(|(_, o)| o.input_tokens).collect();
    let output_tokens: Vec<Option<i64>> = items.iter().map(|(_, o)| o.output_tokens).collect();
    // The successful attempt is kept on the job's row (its token and worker; the rest the row
    // holds already), not as a row of `job_attempts`: `attempt_history` shows both. Its worker
    // comes with the claimed job (the lease's owner), not from a second read of the row.
    let workers: Vec<&str> = items.iter().map(|(j, _)| j.worker.as_str()).collect();
    let places: Vec<&str> = items.iter().filter_map(|(j, _)| j.place.as_deref()).collect();
    // By key, a matching lease token means the job runs (`jobs_check`), so no state test,
    // which let the planner read the running jobs' index (its statistics taken when none ran)
    // once per result, 256 x 1,500 entries in a drain. The generic plan, for this statement only:
    // the custom plan, seeing hundreds of ids, read the whole table while it was small (7.5 ms a
    // batch of 256 at 20,000 jobs, against 1 ms by key). A TID scan is every plan's choice.
    let found = match by {
        ResultsBy::Place => "j.ctid = ANY($7::text[]::tid[])",
        ResultsBy::Id => "j.id = ANY($1)",
    };
    if by == ResultsBy::Id {
        sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan").execute(&mut *tx).await?;
    }
    let sql = format!(
        "UPDATE jobs j SET state = 'done', result = i.result, input_tokens = i.input_tokens,
             output_tokens = i.output_tokens, lease_token = NULL, lease_owner = NULL,
             lease_expires_at = NULL, last_error = NULL, finished_at = now(), updated_at = now(),
             done_attempt = i.token, done_worker = i.worker
         FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[], $4::int8[], $5::int8[], $6::text[])
             AS i(id, token, result, input_tokens, output_tokens, worker)
         WHERE {found} AND j.id = i.id AND j.lease_token = i.token AND j.cancel_requested_at IS NULL
         RETURNING j.id, j.owner_id, j.cost, j.attempts,
                   extract(epoch FROM j.finished_at - j.accepted_at)::float8 AS time_to_done"
    );
    let done = sqlx::query_as(&sql)
        .bind(&ids)
        .bind(&tokens)
        .bind(&results)
        .bind(&input_tokens)
        .bind(&output_tokens)
        .bind(&workers);
    let done = match by {
        ResultsBy::Place => done.bind(&places),
        ResultsBy::Id => done,
    };
    let done = done.fetch_all(&mut *tx).await?;
    if by == ResultsBy::Id {
        // Back to what the session had, for the hooks and the rest of the transaction.
        sqlx::query("SET LOCAL plan_cache_mode TO DEFAULT").execute(&mut *tx).await?;
    }
    Ok(done)
}

/// A job just done, and how long it took from acceptance (for the time-to-done histogram).
#[derive(sqlx::FromRow)]
struct DoneRow {
    #[sqlx(flatten)]
    job: TerminalJob,
    time_to_done: f64,
}

/// A running job as a failure sees it, locked for the transition.
#[derive(sqlx::FromRow)]
pub(crate) struct RunningJob {
    pub id: Uuid,
    pub lease_token: Uuid,
    pub attempts: i32,
    pub processing_enabled: bool,
    /// Seconds the job could have run toward its retry budget: since its acceptance, or since
    /// its last part was stored (the budget runs per part), less the time processing was
    /// paused meanwhile (`sluice_retry_age`).
    pub retry_age_secs: f64,
    pub now: DateTime<Utc>,
    /// Its owner (or an admin) asked to cancel it while it ran.
    pub cancel_requested: bool,
}

impl RunningJob {
    /// The policy's input for this job failing with `class`.
    pub fn failure(&self, class: ErrorClass, retry_after: Option<Duration>) -> Failure {
        Failure {
            attempt: self.attempts.max(0) as u32,
            class,
            retry_after,
            processing_enabled: self.processing_enabled,
            age: Duration::try_from_secs_f64(self.retry_age_secs.max(0.0)).unwrap_or_default(),
        }
    }
}

/// Record a failed attempt and apply the retry policy: retry later (re-enqueue with `run_at`,
/// freeing the gate slot), requeue without using the attempt (paused), or fail for good
/// (with the failed hook in the same transaction).
pub async fn fail(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    policy: &RetryPolicy,
    job: &ClaimedJob,
    error: &JobError,
) -> Result<Recorded> {
    let mut tx = pool.begin().await?;
    let running: Option<RunningJob> = sqlx::query_as(
        "SELECT j.id, j.lease_token, j.attempts, s.processing_enabled,
                sluice_retry_age(j.id, j.accepted_at) AS retry_age_secs, now() AS now,
                j.cancel_requested_at IS NOT NULL AS cancel_requested
         FROM jobs j, queue_settings s
         WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'running' FOR UPDATE OF j",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(running) = running else {
        return Ok(Recorded::Stale);
    };
    if error.class == ErrorClass::QuotaExhausted {
        // The owner's line before the settings row (the job comes back into the line below):
        // a part grant takes them in that order, and the other way round the two deadlock.
        super::enqueue::lock_line(&mut tx, job.owner_id).await?;
        // The operator's problem, not the document's: hold processing and fail nobody.
        super::switches::hold_for_provider(&mut tx, policy.quota_hold).await?;
    }
    let decision = policy.decide(&running.failure(error.class, error.retry_after), running.now, rand::random::<f64>());
    let recorded = apply_failure(&mut tx, hooks, &running, error, decision).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// Apply a policy decision to a running job the caller has locked. Shared by workers'
/// failures and the rescue of expired leases.
pub(crate) async fn apply_failure(
    tx: &mut PgConnection,
    hooks: &dyn TerminalHooks,
    job: &RunningJob,
    error: &JobError,
    decision: Decision,
) -> Result<Recorded> {
    // A document the reader could not read fails as such, cancel or not: otherwise canceling
    // while it is read would make hostile files free past the daily allowance.
    if job.cancel_requested && !error.unreadable {
        // No retry and no failure for a job its owner canceled: canceled and refunded.
        super::cancel::end_requested(tx, hooks, &[(job.id, job.lease_token)], Some(&error.message)).await?;
        return Ok(Recorded::Canceled);
    }
    let outcome = match decision {
        Decision::Retry { .. } => AttemptOutcome::RetryScheduled,
        Decision::Requeue => AttemptOutcome::PausedRequeue,
        Decision::Fail(_) => AttemptOutcome::Failed,
    };
    end_attempts(tx, &[job.id], &[job.lease_token], outcome, Some(error)).await?;
    let recorded = match decision {
        Decision::Retry { at, .. } => {
            sqlx::query(
                "UPDATE jobs SET state = 'retrying', run_at = $2, last_error = $3, lease_token = NULL,
                     lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(job.id)
            .bind(at)
            .bind(&error.message)
            .execute(&mut *tx)
            .await?;
            Recorded::Retrying { at }
        }
        Decision::Requeue => {
            sqlx::query(
                "UPDATE jobs SET state = 'queued', attempts = attempts - 1, run_at = now(), last_error = $2,
                     lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(job.id)
            .bind(&error.message)
            .execute(&mut *tx)
            .await?;
            Recorded::Requeued
        }
        Decision::Fail(kind) => {
            let mut terminal: TerminalJob = sqlx::query_as(
                "UPDATE jobs SET state = 'failed', failure_kind = $2, failure_reason = $3, last_error = $3,
                     finished_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
                     failed_unreadable = $4, updated_at = now()
                 WHERE id = $1 RETURNING id, owner_id, cost, attempts",
            )
            .bind(job.id)
            .bind(kind)
            .bind(&error.message)
            .bind(error.unreadable)
            .fetch_one(&mut *tx)
            .await?;
            terminal.failure = Some((kind, error.message.clone()));
            hooks.on_failed(&mut *tx, &terminal).await?;
            Recorded::Failed(kind)
        }
    };
    Ok(recorded)
}

/// The attempts of these running jobs end with `outcome`: one row each, written from the job's
/// lease (token, number, worker, start) before the transition that clears it. The caller
/// holds the jobs' rows locked, so the transition that follows moves exactly these.
pub(crate) async fn end_attempts(
    tx: &mut PgConnection,
    ids: &[Uuid],
    tokens: &[Uuid],
    outcome: AttemptOutcome,
    error: Option<&JobError>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO job_attempts (id, job_id, attempt, worker, started_at, finished_at, outcome, error_class, error,
                                   provider_status, retry_after_ms, detail, input_tokens, output_tokens)
         SELECT j.lease_token, j.id, j.attempts, coalesce(j.lease_owner, ''), coalesce(j.claimed_at, now()), now(),
                $3, $4, $5, $6, $7, $8, $9, $10
         FROM jobs j WHERE j.id = ANY($1) AND j.lease_token = ANY($2) AND j.state = 'running'",
    )
    .bind(ids)
    .bind(tokens)
    .bind(outcome)
    .bind(error.map(|e| e.class))
    .bind(error.map(|e| &e.message))
    .bind(error.and_then(|e| e.provider_status).map(i32::from))
    .bind(error.and_then(|e| e.retry_after).map(|d| d.as_millis().min(i64::MAX as u128) as i64))
    .bind(error.and_then(|e| e.detail.as_ref()))
    .bind(error.and_then(|e| e.usage).map(|u| u.0))
    .bind(error.and_then(|e| e.usage).map(|u| u.1))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Give running jobs back to `queued` without using their attempt (graceful shutdown).
pub async fn hand_back(pool: &PgPool, tokens: &[Uuid]) -> Result<u64> {
    give_back(pool, tokens, false).await
}

/// Give back jobs a process fetched ahead and never started: as if never claimed, they keep
/// their place in line and leave no attempt behind.
pub async fn unclaim(pool: &PgPool, tokens: &[Uuid]) -> Result<u64> {
    give_back(pool, tokens, true).await
}

/// Back to `queued`, the attempt not used; at the end of the line with the attempt recorded as
/// handed back, or (`never_started`) in its place with no attempt row.
async fn give_back(pool: &PgPool, tokens: &[Uuid], never_started: bool) -> Result<u64> {
    if tokens.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    if !never_started {
        // Back at the end of the line: new tags (an undone claim keeps its run_at, so its tag).
        let ids: Vec<Uuid> =
            sqlx::query_scalar("SELECT id FROM jobs WHERE lease_token = ANY($1) AND state = 'running'")
                .bind(tokens)
                .fetch_all(&mut *tx)
                .await?;
        super::enqueue::lock_entries(&mut tx, &ids).await?;
        end_attempts(&mut tx, &ids, tokens, AttemptOutcome::HandedBack, None).await?;
    }
    let done = sqlx::query(
        "UPDATE jobs SET state = 'queued', attempts = attempts - 1, run_at = CASE WHEN $2 THEN run_at ELSE now() END,
             lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
         WHERE lease_token = ANY($1) AND state = 'running'",
    )
    .bind(tokens)
    .bind(never_started)
    .execute(&mut *tx)
    .await?;
    super::notify_workers(&mut tx).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::mask_secrets;

    #[test]
    fn keys_and_tokens_are_masked_and_words_are_kept() {
        let openai = "Incorrect API key provided: sk-proj-Ab12********************Xy89Qw7. See https://x.example/keys.";
        assert_eq!(mask_secrets(openai), "Incorrect API key provided: sk-p…. See https://x.example/keys.");
        assert_eq!(mask_secrets("Bearer abcdefghijklmnop1234567890"), "Bearer abcd…");
        let plain = "messages: text content blocks must be non-empty (request_id 42)";
        assert_eq!(mask_secrets(plain), plain);
        assert_eq!(mask_secrets("a_very_long_identifier_without_digits"), "a_very_long_identifier_without_digits");
    }
}
