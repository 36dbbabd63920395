//! "Retry now": a job waiting out its backoff becomes due at once. It keeps its attempt count
//! (no attempt is added or used) and goes through the claim like any due job, so the gate, the
//! kill switch and the fair order between owners still decide when it runs.

use sqlx::PgPool;
use uuid::Uuid;

use crate::audit::audit;
use crate::error::{EngineError, Result};
use crate::JobState;

/// What a "retry now" did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetriedNow {
    /// Due now: the next claim with a free slot takes it.
    Due,
    /// Only a retrying job can be brought forward; this one is in another state.
    NotRetrying(JobState),
}

/// Bring `job_id`'s retry forward to now. `owner`: only that user's job (else not found), for
/// an owner acting on their own job; `None` for an admin (then audited).
pub async fn retry_now(pool: &PgPool, job_id: Uuid, owner: Option<i64>, actor: &str) -> Result<RetriedNow> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT owner_id FROM jobs WHERE id = $1 AND deleted_at IS NULL AND ($2::int8 IS NULL OR owner_id = $2)",
    )
    .bind(job_id)
    .bind(owner)
    .fetch_optional(pool)
    .await?;
    found.ok_or(EngineError::NotFound)?;
    let mut tx = pool.begin().await?;
    // Only its due time moves: a retry was tagged when it failed (its owner charged then), and
    // keeps that tag, so its place among the jobs due.
    let (state, moved): (JobState, bool) = sqlx::query_as(
        "WITH moved AS (
             UPDATE jobs SET run_at = now(), updated_at = now()
             WHERE id = $1 AND state = 'retrying' AND run_at > now() RETURNING id
         )
         SELECT state, EXISTS (SELECT 1 FROM moved) FROM jobs WHERE id = $1",
    )
    .bind(job_id)
    .fetch_one(&mut *tx)
    .await?;
    let outcome = if moved || state == JobState::Retrying { RetriedNow::Due } else { RetriedNow::NotRetrying(state) };
    if moved {
        if owner.is_none() {
            audit(&mut tx, actor, "retry_now", Some(&job_id.to_string()), "retrying", "due now").await?;
        }
        super::notify_workers(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(outcome)
}
