//! The queue's transitions. Every transition is one transaction; results and failures are
//! fenced by the attempt's lease token, so a stale worker's late write changes nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::error::{EngineError, Result};
use crate::hooks::{TerminalHooks, TerminalJob};
use crate::retry::{Decision, ErrorClass, Failure, FailureKind, RetryPolicy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Retrying,
    Done,
    Failed,
}

impl JobState {
    pub fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "retrying" => JobState::Retrying,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed)
    }
}

/// A job to enqueue.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub owner_id: i64,
    pub kind: String,
    pub payload: Value,
    pub idempotency_key: Option<String>,
    pub cost: i32,
    pub max_attempts: i32,
    /// A REST client's `Idempotency-Key`, and the fingerprint of the request it came with.
    pub client_key: Option<String>,
    pub request_fingerprint: Option<String>,
}

impl NewJob {
    pub fn new(owner_id: i64, payload: Value) -> NewJob {
        NewJob {
            owner_id,
            kind: "document".into(),
            payload,
            idempotency_key: None,
            cost: 0,
            max_attempts: 3,
            client_key: None,
            request_fingerprint: None,
        }
    }
}

/// Insert a job inside the caller's transaction (admission debits credits in the same one).
/// Workers are woken by a trigger when the transaction commits.
pub async fn enqueue(conn: &mut PgConnection, job: &NewJob) -> Result<Uuid> {
    Ok(sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, kind, payload, idempotency_key, cost, max_attempts, client_key, request_fingerprint)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(job.owner_id)
    .bind(&job.kind)
    .bind(&job.payload)
    .bind(&job.idempotency_key)
    .bind(job.cost)
    .bind(job.max_attempts)
    .bind(&job.client_key)
    .bind(&job.request_fingerprint)
    .fetch_one(conn)
    .await?)
}

/// A job a worker holds under a lease.
#[derive(Clone, Debug)]
pub struct ClaimedJob {
    pub id: Uuid,
    pub owner_id: i64,
    pub kind: String,
    pub payload: Value,
    /// This attempt's number, 1-based.
    pub attempt: i32,
    pub max_attempts: i32,
    /// The fencing token: also this attempt's id.
    pub lease_token: Uuid,
}

/// Claim up to `max` due jobs for `worker`, fairly across owners, within the global gate and
/// only while processing is enabled. One round trip: the `sluice_claim` function (see its
/// migration) locks the settings row, so claims are serialised across every process and the
/// gate's count of running jobs cannot be raced past.
pub async fn claim(pool: &PgPool, worker: &str, max: i64, lease: Duration) -> Result<Vec<ClaimedJob>> {
    if max <= 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query("SELECT * FROM sluice_claim($1, $2, $3)")
        .bind(max)
        .bind(worker)
        .bind(lease.as_secs_f64())
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(claimed_from_row).collect())
}

fn claimed_from_row(row: &PgRow) -> ClaimedJob {
    ClaimedJob {
        id: row.get("id"),
        owner_id: row.get("owner_id"),
        kind: row.get("kind"),
        payload: row.get("payload"),
        attempt: row.get("attempts"),
        max_attempts: row.get("max_attempts"),
        lease_token: row.get("lease_token"),
    }
}

/// Extend the leases of the given attempts (one statement for all of a worker's jobs).
/// Returns how many leases are still held.
pub async fn heartbeat(pool: &PgPool, tokens: &[Uuid], lease: Duration) -> Result<u64> {
    if tokens.is_empty() {
        return Ok(0);
    }
    // A lost heartbeat only shortens a lease, so it need not wait for the WAL flush.
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL synchronous_commit = off").execute(&mut *tx).await?;
    let done = sqlx::query(
        "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $2)
         WHERE lease_token = ANY($1) AND state = 'running'",
    )
    .bind(tokens)
    .bind(lease.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// What a processor produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOutput {
    pub result: Value,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

/// Why an attempt failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    pub class: ErrorClass,
    /// Human-readable; shown to the user and in the DLQ. Never secrets, never document bytes.
    pub message: String,
    pub provider_status: Option<u16>,
    pub retry_after: Option<Duration>,
}

impl JobError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> JobError {
        JobError { class, message: message.into(), provider_status: None, retry_after: None }
    }

    pub fn with_retry_after(mut self, retry_after: Duration) -> JobError {
        self.retry_after = Some(retry_after);
        self
    }

    pub fn with_status(mut self, status: u16) -> JobError {
        self.provider_status = Some(status);
        self
    }
}

/// What recording an attempt's outcome did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Done,
    Retrying {
        at: DateTime<Utc>,
    },
    Requeued,
    Failed(FailureKind),
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
    let results: Vec<Value> = items.iter().map(|(_, o)| o.result.clone()).collect();
    let input_tokens: Vec<Option<i64>> = items.iter().map(|(_, o)| o.input_tokens).collect();
    let output_tokens: Vec<Option<i64>> = items.iter().map(|(_, o)| o.output_tokens).collect();
    let mut tx = pool.begin().await?;
    let rows = sqlx::query(
        "WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[], $4::int8[], $5::int8[])
                 AS t(id, token, result, input_tokens, output_tokens)
         ),
         done AS (
             UPDATE jobs j SET state = 'done', result = i.result, input_tokens = i.input_tokens,
                 output_tokens = i.output_tokens, lease_token = NULL, lease_owner = NULL,
                 lease_expires_at = NULL, last_error = NULL, finished_at = now(), updated_at = now()
             FROM input i
             WHERE j.id = i.id AND j.lease_token = i.token AND j.state = 'running'
             RETURNING j.id, j.owner_id, j.cost, j.attempts, i.token, i.input_tokens, i.output_tokens
         ),
         attempt_rows AS (
             UPDATE job_attempts a SET finished_at = now(), outcome = 'succeeded',
                 input_tokens = d.input_tokens, output_tokens = d.output_tokens
             FROM done d WHERE a.id = d.token
         )
         SELECT id, owner_id, cost, attempts FROM done",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&results)
    .bind(&input_tokens)
    .bind(&output_tokens)
    .fetch_all(&mut *tx)
    .await?;
    let mut written = std::collections::HashSet::with_capacity(rows.len());
    for row in &rows {
        let terminal =
            TerminalJob { id: row.get(0), owner_id: row.get(1), cost: row.get(2), attempts: row.get(3), failure: None };
        hooks.on_done(&mut tx, &terminal).await?;
        written.insert(terminal.id);
    }
    tx.commit().await?;
    Ok(ids.iter().map(|id| if written.contains(id) { Recorded::Done } else { Recorded::Stale }).collect())
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
    let row = sqlx::query(
        "SELECT j.attempts, s.processing_enabled, now() FROM jobs j, queue_settings s
         WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'running' FOR UPDATE OF j",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(Recorded::Stale);
    };
    let failure = Failure {
        attempt: row.get::<i32, _>(0) as u32,
        class: error.class,
        retry_after: error.retry_after,
        processing_enabled: row.get(1),
    };
    let now: DateTime<Utc> = row.get(2);
    let decision = policy.decide(&failure, now, rand::random::<f64>());
    let recorded = apply_failure(&mut tx, hooks, job.id, job.lease_token, error, decision).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// Apply a policy decision to a running job the caller has locked. Shared by workers'
/// failures and the rescue of expired leases.
pub(crate) async fn apply_failure(
    tx: &mut PgConnection,
    hooks: &dyn TerminalHooks,
    job_id: Uuid,
    lease_token: Uuid,
    error: &JobError,
    decision: Decision,
) -> Result<Recorded> {
    let release = "lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()";
    let (outcome, recorded) = match decision {
        Decision::Retry { at, .. } => {
            sqlx::query(&format!(
                "UPDATE jobs SET state = 'retrying', run_at = $2, last_error = $3, {release} WHERE id = $1"
            ))
            .bind(job_id)
            .bind(at)
            .bind(&error.message)
            .execute(&mut *tx)
            .await?;
            ("retry_scheduled", Recorded::Retrying { at })
        }
        Decision::Requeue => {
            sqlx::query(&format!(
                "UPDATE jobs SET state = 'queued', attempts = attempts - 1, run_at = now(), last_error = $2,
                 {release} WHERE id = $1"
            ))
            .bind(job_id)
            .bind(&error.message)
            .execute(&mut *tx)
            .await?;
            ("paused_requeue", Recorded::Requeued)
        }
        Decision::Fail(kind) => {
            let row = sqlx::query(&format!(
                "UPDATE jobs SET state = 'failed', failure_kind = $2, failure_reason = $3, last_error = $3,
                 finished_at = now(), {release} WHERE id = $1 RETURNING owner_id, cost, attempts"
            ))
            .bind(job_id)
            .bind(kind.as_str())
            .bind(&error.message)
            .fetch_one(&mut *tx)
            .await?;
            let terminal = TerminalJob {
                id: job_id,
                owner_id: row.get(0),
                cost: row.get(1),
                attempts: row.get(2),
                failure: Some((kind, error.message.clone())),
            };
            hooks.on_failed(&mut *tx, &terminal).await?;
            ("failed", Recorded::Failed(kind))
        }
    };
    sqlx::query(
        "UPDATE job_attempts SET finished_at = now(), outcome = $2, error_class = $3, error = $4,
         provider_status = $5, retry_after_ms = $6 WHERE id = $1",
    )
    .bind(lease_token)
    .bind(outcome)
    .bind(error.class.as_str())
    .bind(&error.message)
    .bind(error.provider_status.map(i32::from))
    .bind(error.retry_after.map(|d| d.as_millis() as i64))
    .execute(&mut *tx)
    .await?;
    Ok(recorded)
}

/// Give running jobs back to `queued` without using their attempt (graceful shutdown).
pub async fn hand_back(pool: &PgPool, tokens: &[Uuid]) -> Result<u64> {
    if tokens.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    let done = sqlx::query(
        "UPDATE jobs SET state = 'queued', attempts = attempts - 1, run_at = now(), lease_token = NULL,
             lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
         WHERE lease_token = ANY($1) AND state = 'running'",
    )
    .bind(tokens)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE job_attempts SET finished_at = now(), outcome = 'handed_back' WHERE id = ANY($1) AND outcome IS NULL",
    )
    .bind(tokens)
    .execute(&mut *tx)
    .await?;
    crate::settings::notify(&mut tx).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// When the next waiting job falls due (for the worker's sleep), if any is waiting.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar("SELECT min(run_at) FROM jobs WHERE state IN ('queued', 'retrying')").fetch_one(pool).await?)
}

/// A job as users and operators see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}

pub(crate) const JOB_COLUMNS: &str = "id, owner_id, kind, payload, state, attempts, max_attempts, run_at, \
    last_error, failure_kind, failure_reason, result, input_tokens, output_tokens, cost, accepted_at, \
    started_at, finished_at, replays";

pub(crate) fn job_from_row(row: &PgRow) -> JobView {
    let state: String = row.get("state");
    let failure_kind: Option<String> = row.get("failure_kind");
    JobView {
        id: row.get("id"),
        owner_id: row.get("owner_id"),
        kind: row.get("kind"),
        payload: row.get("payload"),
        state: JobState::parse(&state).expect("state is checked by the schema"),
        attempts: row.get("attempts"),
        max_attempts: row.get("max_attempts"),
        run_at: row.get("run_at"),
        last_error: row.get("last_error"),
        failure_kind: failure_kind.as_deref().and_then(FailureKind::parse),
        failure_reason: row.get("failure_reason"),
        result: row.get("result"),
        input_tokens: row.get("input_tokens"),
        output_tokens: row.get("output_tokens"),
        cost: row.get("cost"),
        accepted_at: row.get("accepted_at"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
        replays: row.get("replays"),
    }
}

pub async fn get(pool: &PgPool, id: Uuid) -> Result<JobView> {
    let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound)?;
    Ok(job_from_row(&row))
}

/// One attempt of a job, for the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub id: Uuid,
    pub attempt: i32,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
    pub error_class: Option<String>,
    pub error: Option<String>,
    pub provider_status: Option<i32>,
    pub retry_after_ms: Option<i64>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

pub async fn attempts(pool: &PgPool, job_id: Uuid) -> Result<Vec<AttemptView>> {
    let rows = sqlx::query(
        "SELECT id, attempt, worker, started_at, finished_at, outcome, error_class, error, provider_status,
                retry_after_ms, input_tokens, output_tokens
         FROM job_attempts WHERE job_id = $1 ORDER BY started_at, attempt",
    )
    .bind(job_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| AttemptView {
            id: r.get(0),
            attempt: r.get(1),
            worker: r.get(2),
            started_at: r.get(3),
            finished_at: r.get(4),
            outcome: r.get(5),
            error_class: r.get(6),
            error: r.get(7),
            provider_status: r.get(8),
            retry_after_ms: r.get(9),
            input_tokens: r.get(10),
            output_tokens: r.get(11),
        })
        .collect())
}

/// A user's jobs, newest first.
pub async fn list_for_owner(pool: &PgPool, owner_id: i64, limit: i64) -> Result<Vec<JobView>> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE owner_id = $1 ORDER BY accepted_at DESC, id LIMIT $2"
    ))
    .bind(owner_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(job_from_row).collect())
}

/// Where an owner's due waiting jobs stand in line, with what their start estimates need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaitingLine {
    /// Jobs claimed before each of the owner's due waiting jobs (see [`crate::position`]).
    pub ahead: std::collections::HashMap<Uuid, u64>,
    /// Gate slots not taken by running jobs (0 while processing is paused).
    pub free_slots: u64,
    /// Jobs reaching done or failed per second over the last 5 minutes.
    pub finishing_per_sec: f64,
    pub processing_enabled: bool,
}

impl WaitingLine {
    /// The estimated wait before `job` starts, if it is waiting and there is a rate to go by.
    pub fn estimated_start(&self, job: Uuid) -> Option<Duration> {
        if !self.processing_enabled {
            return None;
        }
        crate::position::estimated_start(*self.ahead.get(&job)?, self.free_slots, self.finishing_per_sec)
    }
}

/// Other owners with due waiting jobs, each with its due jobs counted up to a cap. The owners
/// come from the same loose index scan `sluice_claim` uses (a migration, so it cannot share the
/// text); without it this would read every waiting job.
const CAPPED_LOADS: &str = "
    WITH RECURSIVE owners(owner_id) AS (
        (SELECT j.owner_id FROM jobs j WHERE j.state IN ('queued', 'retrying') ORDER BY j.owner_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.owner_id FROM jobs j
                WHERE j.state IN ('queued', 'retrying') AND j.owner_id > o.owner_id
                ORDER BY j.owner_id LIMIT 1)
        FROM owners o WHERE o.owner_id IS NOT NULL
    )
    SELECT o.owner_id,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs j
                WHERE j.owner_id = o.owner_id AND j.state IN ('queued', 'retrying') AND j.run_at <= now()
                ORDER BY j.run_at, j.id LIMIT $2) due)
    FROM owners o WHERE o.owner_id IS NOT NULL AND o.owner_id <> $1";

/// Where the given jobs of an owner stand in line (those that are due and waiting), with what
/// their start estimates need. Reads only what the answer depends on: running jobs (at most the
/// gate's worth), the owner's waiting jobs, and each other owner's due jobs up to the highest
/// score asked about, since a count past it cannot change any answer.
pub async fn waiting_line(pool: &PgPool, owner_id: i64, jobs: &[Uuid]) -> Result<WaitingLine> {
    let settings = crate::settings::read(pool).await?;
    let running: Vec<(i64, i64)> =
        sqlx::query_as("SELECT owner_id, count(*) FROM jobs WHERE state = 'running' GROUP BY owner_id")
            .fetch_all(pool)
            .await?;
    let running_of = |owner: i64| running.iter().find(|(o, _)| *o == owner).map_or(0, |(_, n)| *n as u64);
    let running_total: u64 = running.iter().map(|(_, n)| *n as u64).sum();
    let mine_running = running_of(owner_id);

    let ranks: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, rank FROM (
             SELECT id, row_number() OVER (ORDER BY run_at, id) AS rank FROM jobs
             WHERE owner_id = $1 AND state IN ('queued', 'retrying') AND run_at <= now()
         ) mine WHERE id = ANY($2)",
    )
    .bind(owner_id)
    .bind(jobs)
    .fetch_all(pool)
    .await?;
    let mut ahead = std::collections::HashMap::with_capacity(ranks.len());
    if let Some(max_rank) = ranks.iter().map(|(_, rank)| *rank as u64).max() {
        let cap = mine_running + max_rank;
        let loads: Vec<(i64, i64)> =
            sqlx::query_as(CAPPED_LOADS).bind(owner_id).bind(cap as i64).fetch_all(pool).await?;
        let others: Vec<crate::position::OwnerLoad> = loads
            .iter()
            .map(|&(owner, waiting)| crate::position::OwnerLoad { running: running_of(owner), waiting: waiting as u64 })
            .collect();
        for (id, rank) in ranks {
            ahead.insert(id, crate::position::jobs_ahead(mine_running, rank as u64, &others));
        }
    }
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes'")
            .fetch_one(pool)
            .await?;
    let free_slots =
        if settings.processing_enabled { (settings.gate_size.max(0) as u64).saturating_sub(running_total) } else { 0 };
    Ok(WaitingLine {
        ahead,
        free_slots,
        finishing_per_sec: finished as f64 / 300.0,
        processing_enabled: settings.processing_enabled,
    })
}

#[cfg(test)]
mod tests {
    use super::JobState;

    #[test]
    fn state_names_match_the_schema_and_the_json() {
        for state in [JobState::Queued, JobState::Running, JobState::Retrying, JobState::Done, JobState::Failed] {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}
