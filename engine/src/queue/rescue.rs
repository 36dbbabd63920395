//! Lease rescue: a job whose worker vanished (crashed, stalled, partitioned) goes back to
//! `retrying`, using the attempt, or to `failed` / `timed_out` when none are left. A process
//! that stopped beating is noticed without waiting for its leases: what it had fetched ahead
//! and not started goes back to its place in line without using an attempt, the rest is rescued
//! at once.

use sluice_types::AttemptOutcome;
use sqlx::PgPool;
use uuid::Uuid;

use super::hooks::TerminalHooks;
use super::policy::retry::{ErrorClass, RetryPolicy};
use super::transitions::{apply_failure, JobError, Recorded, RunningJob};
use crate::error::Result;

/// Rescue every `running` job whose lease expired, each in its own transaction with the hooks.
pub async fn rescue_expired(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    policy: &RetryPolicy,
) -> Result<Vec<(Uuid, Recorded)>> {
    let mut rescued = Vec::new();
    loop {
        let mut tx = pool.begin().await?;
        let expired: Option<RunningJob> = sqlx::query_as(
            "SELECT j.id, j.lease_token, j.attempts, s.processing_enabled,
                    sluice_retry_age(j.id, j.accepted_at) AS retry_age_secs, now() AS now,
                    j.cancel_requested_at IS NOT NULL AS cancel_requested
             FROM jobs j, queue_settings s
             WHERE j.state = 'running' AND j.lease_expires_at < now()
             ORDER BY j.lease_expires_at LIMIT 1 FOR UPDATE OF j SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(job) = expired else { break };
        let error = JobError::new(ErrorClass::LeaseExpired, "the worker stopped answering (lease expired)");
        let decision = policy.decide(&job.failure(ErrorClass::LeaseExpired, None), job.now, rand::random::<f64>());
        let recorded = apply_failure(&mut tx, hooks, &job, &error, decision).await?;
        if recorded != Recorded::Canceled {
            sqlx::query("UPDATE job_attempts SET outcome = $2 WHERE id = $1")
                .bind(job.lease_token)
                .bind(AttemptOutcome::LeaseExpired)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        tracing::warn!(job = %job.id, ?recorded, "rescued a job whose lease expired");
        rescued.push((job.id, recorded));
    }
    Ok(rescued)
}

/// A job fetched ahead goes back unstarted, attempt kept, at most this many times: one that
/// kills its process before its start is known then uses attempts like any other.
pub const MAX_UNSTARTED_RETURNS: i32 = 3;

/// What [`rescue_dead_processes`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FromTheDead {
    /// Fetched ahead and never started: back in their place, no attempt used.
    pub returned_unstarted: Vec<Uuid>,
    /// Started (or fetched ahead too often): their leases end now, for [`rescue_expired`].
    pub leases_ended: u64,
}

/// Jobs held by worker processes that stopped beating (not seen for three heartbeats): work
/// fetched ahead and never started goes back to its place in line without an attempt; the
/// leases of the rest end now, so [`rescue_expired`] settles them at once instead of when the
/// lease would have run out. Call [`rescue_expired`] after it.
pub async fn rescue_dead_processes(pool: &PgPool) -> Result<FromTheDead> {
    const DEAD: &str = "SELECT p.name FROM worker_processes p
                        WHERE p.seen_at < now() - make_interval(secs => 3 * p.heartbeat_secs + 1) AND p.role <> 'web'";
    let mut tx = pool.begin().await?;
    let returned_unstarted: Vec<Uuid> = sqlx::query_scalar(&format!(
        "UPDATE jobs SET state = 'queued', attempts = attempts - 1, lease_token = NULL, lease_owner = NULL,
             lease_expires_at = NULL, fetched_ahead = false, unstarted_returns = unstarted_returns + 1,
             updated_at = now()
         WHERE state = 'running' AND fetched_ahead AND unstarted_returns < $1 AND lease_owner IN ({DEAD})
         RETURNING id"
    ))
    .bind(MAX_UNSTARTED_RETURNS)
    .fetch_all(&mut *tx)
    .await?;
    if !returned_unstarted.is_empty() {
        super::notify_workers(&mut tx).await?;
    }
    let leases_ended = sqlx::query(&format!(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 millisecond'
         WHERE state = 'running' AND lease_expires_at >= now() AND lease_owner IN ({DEAD})"
    ))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    if !returned_unstarted.is_empty() || leases_ended > 0 {
        tracing::warn!(
            returned = returned_unstarted.len(),
            leases_ended,
            "a worker process stopped beating: its work fetched ahead is back in line, the rest rescued"
        );
    }
    Ok(FromTheDead { returned_unstarted, leases_ended })
}
