//! Cancellation. A waiting job (`queued`, `retrying`) is canceled at once: `canceled`, out of
//! flight and refunded in one transaction. A running job gets a request instead: its worker
//! stops at the next safe point (before the provider call), and whatever its attempt ends with
//! (a result, an error, an expired lease) it becomes `canceled` and refunded: a result that
//! arrives anyway is not delivered. Done, failed and canceled jobs stay as they are.
//!
//! What the cancel keeps is fixed when it is asked for (`sluice_types::settlement`): the share
//! of the job's provider calls already made or in flight, which the provider bills us for.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::hooks::{TerminalHooks, TerminalJob};
use crate::audit::audit;
use crate::error::{EngineError, Result};
use crate::JobState;
use sluice_types::settlement::{calls_started, kept_on_cancel};

/// What a cancellation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canceled {
    /// The job was waiting: it is canceled and refunded.
    Now,
    /// The job is running: it stops at its next safe point, then is canceled and refunded.
    Requested,
    /// The job had already ended (or a request was already made): nothing changed.
    AlreadyEnded(JobState),
}

#[derive(sqlx::FromRow)]
struct Found {
    state: JobState,
    requested: bool,
    /// What its document costs: its settled price (a PDF held at admission), else its cost.
    price: i32,
    parts_done: i32,
    parts_total: Option<i32>,
    provider_call_in_flight: bool,
    /// Its attempt is reading the document: the reader's work is spent whatever comes next.
    reading: bool,
}

/// Cancel `job_id` for `actor`. `audited` puts it in the audit log (an admin acting on
/// someone's job). Safe against a worker claiming or finishing the job at the same moment: the
/// job row is locked, and the claim and the completions check the state they change.
pub async fn cancel(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    job_id: Uuid,
    actor: &str,
    audited: bool,
) -> Result<Canceled> {
    let mut tx = pool.begin().await?;
    let found: Option<Found> = sqlx::query_as(
        "SELECT state, cancel_requested_at IS NOT NULL AS requested, coalesce(settled_cost, cost) AS price,
             parts_done, parts_total,
             -- This attempt's stage (one left by an earlier attempt or part is older than it).
             coalesce(state = 'running' AND stage IN ('waiting_for_provider', 'writing')
                 AND stage_since >= claimed_at,
                 false) AS provider_call_in_flight,
             coalesce(state = 'running' AND stage = 'reading'
                 AND stage_since >= claimed_at,
                 false) AS reading
         FROM jobs WHERE id = $1 FOR UPDATE",
    )
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await?;
    let found = found.ok_or(EngineError::NotFound)?;
    let state = found.state;
    let kept = kept_on_cancel(
        i64::from(found.price),
        calls_started(found.parts_done.max(0) as u32, found.provider_call_in_flight),
        found.parts_total.unwrap_or(1).max(1) as u32,
    );
    let outcome = match state {
        JobState::Queued | JobState::Retrying => {
            let job: TerminalJob = sqlx::query_as(
                "UPDATE jobs SET state = 'canceled', canceled_by = $2, cancel_requested_at = now(),
                     cancel_kept_credits = $3, finished_at = now(), updated_at = now()
                 WHERE id = $1 RETURNING id, owner_id, cost, attempts",
            )
            .bind(job_id)
            .bind(actor)
            .bind(kept as i32)
            .fetch_one(&mut *tx)
            .await?;
            super::parts::forget(&mut tx, &[job_id]).await?;
            // Work canceled unserved costs its owner no place later (its row, then its line).
            sqlx::query("SELECT sluice_shorten_line($1)").bind(job.owner_id).execute(&mut *tx).await?;
            hooks.on_canceled(&mut tx, &job).await?;
            Canceled::Now
        }
        JobState::Running if !found.requested => {
            // Canceled by its owner while read: it counts against the day's free unreadable
            // documents (`failed_unreadable`), or hostile files canceled mid-read would be free
            // past it. An admin's cancel (audited) costs the owner nothing.
            sqlx::query(
                "UPDATE jobs SET cancel_requested_at = now(), canceled_by = $2, cancel_kept_credits = $3,
                     failed_unreadable = $4, updated_at = now()
                 WHERE id = $1",
            )
            .bind(job_id)
            .bind(actor)
            .bind(kept as i32)
            .bind(found.reading && !audited)
            .execute(&mut *tx)
            .await?;
            Canceled::Requested
        }
        other => Canceled::AlreadyEnded(other),
    };
    if audited && outcome != Canceled::AlreadyEnded(state) {
        audit(&mut tx, actor, "cancel", Some(&job_id.to_string()), state.as_str(), "canceled").await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

/// End running attempts whose job has a cancellation request (`(job id, lease token)` pairs
/// the caller holds): `canceled`, the attempt too, and the cancel hook for each. Returns the
/// jobs it ended. Fenced by the lease token like every transition.
pub(crate) async fn end_requested(
    tx: &mut PgConnection,
    hooks: &dyn TerminalHooks,
    attempts: &[(Uuid, Uuid)],
    error: Option<&str>,
) -> Result<Vec<Uuid>> {
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = attempts.iter().map(|a| a.0).collect();
    let tokens: Vec<Uuid> = attempts.iter().map(|a| a.1).collect();
    let ended: Vec<TerminalJob> = sqlx::query_as(
        "WITH ended AS (
             UPDATE jobs j SET state = 'canceled', lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
                 finished_at = now(), updated_at = now()
             FROM unnest($1::uuid[], $2::uuid[]) AS t(id, token) JOIN jobs o ON o.id = t.id
             WHERE j.id = t.id AND j.lease_token = t.token AND j.state = 'running'
               AND j.cancel_requested_at IS NOT NULL
             RETURNING j.id, j.owner_id, j.cost, j.attempts, t.token, o.lease_owner, j.claimed_at
         ),
         -- The attempt's row, from the lease as the attempt left it (`o`: its worker).
         attempt_rows AS (
             INSERT INTO job_attempts (id, job_id, attempt, worker, started_at, finished_at, outcome, error)
             SELECT e.token, e.id, e.attempts, coalesce(e.lease_owner, ''), coalesce(e.claimed_at, now()), now(), 'canceled', $3
             FROM ended e
         )
         SELECT id, owner_id, cost, attempts FROM ended",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(error)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<Uuid> = ended.iter().map(|j| j.id).collect();
    super::parts::forget(&mut *tx, &ids).await?;
    for job in &ended {
        hooks.on_canceled(&mut *tx, job).await?;
    }
    Ok(ids)
}
