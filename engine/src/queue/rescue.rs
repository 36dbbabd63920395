//! Lease rescue: a job whose worker vanished (crashed, stalled, partitioned) goes back to
//! `retrying`, using the attempt, or to `failed` / `timed_out` when none are left.

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
