//! Claiming due jobs under a lease, and keeping the lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Result;

/// A job a worker holds under a lease.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ClaimedJob {
    pub id: Uuid,
    pub owner_id: i64,
    pub kind: String,
    pub payload: Value,
    /// This attempt's number, 1-based.
    #[sqlx(rename = "attempts")]
    pub attempt: i32,
    pub max_attempts: i32,
    /// The fencing token: also this attempt's id.
    pub lease_token: Uuid,
    /// Input tokens the claim reserved from the provider budget for this attempt.
    pub est_input_tokens: i64,
    /// Where the claim left the job's row (its `ctid`): the result is written there, with no
    /// lookup by id, unless the row has moved since (a heartbeat, a stage, a part moves it).
    #[sqlx(default)]
    pub place: Option<String>,
    /// The worker that claimed it (the lease's owner), kept for the attempt's row.
    #[sqlx(skip)]
    pub worker: String,
    /// When the worker abandons the attempt (set by the worker as it starts it): long work
    /// inside one attempt, a document's parts, stops starting new calls well before it.
    #[sqlx(skip)]
    pub deadline: Option<std::time::Instant>,
}

/// Claim up to `max` due jobs for `worker`, fairly across owners, within the global gate and
/// only while processing is enabled. One round trip: the `sluice_claim_with_places` function
/// (see its migration) locks the settings row, so claims are serialised across every process
/// and the gate's count of running jobs cannot be raced past.
pub async fn claim(pool: &PgPool, worker: &str, max: i64, lease: Duration) -> Result<Vec<ClaimedJob>> {
    if max <= 0 {
        return Ok(Vec::new());
    }
    let jobs: Vec<ClaimedJob> = sqlx::query_as("SELECT * FROM sluice_claim_with_places($1, $2, $3)")
        .bind(max)
        .bind(worker)
        .bind(lease.as_secs_f64())
        .fetch_all(pool)
        .await?;
    Ok(jobs.into_iter().map(|job| ClaimedJob { worker: worker.to_owned(), ..job }).collect())
}

/// What a worker pool's claim got: the jobs, and how many attempts the process may run at once
/// from now on (see [`claim_batch`]).
#[derive(Debug, Default)]
pub struct Batch {
    pub jobs: Vec<ClaimedJob>,
    pub allowance: usize,
}

/// A row of a pool's claim: a job, or (all NULL but the allowance) the claim's last row.
#[derive(sqlx::FromRow)]
struct BatchRow {
    id: Option<Uuid>,
    owner_id: Option<i64>,
    kind: Option<String>,
    payload: Option<Value>,
    attempts: Option<i32>,
    max_attempts: Option<i32>,
    lease_token: Option<Uuid>,
    est_input_tokens: Option<i64>,
    gate_allowance: i32,
    place: Option<String>,
}

impl BatchRow {
    fn job(self, worker: &str) -> Option<ClaimedJob> {
        Some(ClaimedJob {
            id: self.id?,
            owner_id: self.owner_id?,
            kind: self.kind?,
            payload: self.payload?,
            attempt: self.attempts?,
            max_attempts: self.max_attempts?,
            lease_token: self.lease_token?,
            est_input_tokens: self.est_input_tokens?,
            place: self.place,
            worker: worker.to_owned(),
            deadline: None,
        })
    }
}

/// A worker pool's claim. `busy` is how many of its jobs the process will still run (running
/// now, or fetched and waiting in its memory); it counts those itself, while the claim counts
/// every other process's running rows. The process may then run `allowance` attempts at once:
/// the gate less the others' rows and every job's extra calls (0 while processing is paused;
/// see the hot path's migration). Beyond the slots free, up to `prefetch` more jobs come when
/// any slot is free: short jobs are fetched a batch ahead. Fairness and the budget apply as in
/// [`claim`].
pub async fn claim_batch(
    pool: &PgPool,
    worker: &str,
    max: usize,
    lease: Duration,
    busy: usize,
    prefetch: usize,
) -> Result<Batch> {
    let rows: Vec<BatchRow> = sqlx::query_as("SELECT * FROM sluice_claim_with_places($1, $2, $3, $4, $5)")
        .bind(max as i64)
        .bind(worker)
        .bind(lease.as_secs_f64())
        .bind(busy as i64)
        .bind(prefetch as i64)
        .fetch_all(pool)
        .await?;
    let allowance = rows.last().map_or(0, |r| r.gate_allowance.max(0) as usize);
    Ok(Batch { jobs: rows.into_iter().filter_map(|r| r.job(worker)).collect(), allowance })
}

/// Extend the leases of the given attempts (one statement for all of a worker's jobs), and
/// record that those of `started` have started (no longer work fetched ahead, which would go
/// back unstarted if this process died). Returns how many leases are still held.
pub async fn heartbeat(pool: &PgPool, tokens: &[Uuid], started: &[Uuid], lease: Duration) -> Result<u64> {
    if tokens.is_empty() {
        return Ok(0);
    }
    // A lost heartbeat only shortens a lease, so it need not wait for the WAL flush.
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL synchronous_commit = off").execute(&mut *tx).await?;
    let done = sqlx::query(
        "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $2),
             fetched_ahead = fetched_ahead AND NOT (lease_token = ANY($3))
         WHERE lease_token = ANY($1) AND state = 'running'",
    )
    .bind(tokens)
    .bind(lease.as_secs_f64())
    .bind(started)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// When the next waiting job falls due (for the worker's sleep), if any is waiting.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar("SELECT min(run_at) FROM waiting_jobs").fetch_one(pool).await?)
}

/// Record that `job`'s attempt has started, durably, before it does anything that costs (a
/// provider call): were its process to die now, it is rescued with an attempt used, never
/// returned as work fetched ahead and never started. False: the attempt holds the job no more
/// (it went back to the line meanwhile): it must not start.
pub async fn mark_started(pool: &PgPool, job: &ClaimedJob) -> Result<bool> {
    let held: Option<i32> = sqlx::query_scalar(
        "UPDATE jobs SET fetched_ahead = false WHERE id = $1 AND lease_token = $2 AND state = 'running' RETURNING 1",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .fetch_optional(pool)
    .await?;
    Ok(held.is_some())
}
