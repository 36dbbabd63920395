//! "Run next": an operator puts a waiting job at the front of the line, for a deadline at
//! risk, say. It is tagged before every waiting job, so the next claim with room in its lane
//! takes it once it is due; the gate, the lanes and the kill switch still decide when that is.
//! Its due time stays: a retry still waits out its backoff and the provider's `Retry-After`
//! ("retry now" is the deliberate way past them), and a document in the economy lane still
//! waits for its batch's answer (calling now would pay twice). Its owner is charged nothing
//! more (its owner's line stays as it was). Audited.

use sqlx::PgPool;
use uuid::Uuid;

use crate::audit::audit;
use crate::error::{EngineError, Result};
use crate::JobState;

/// What a "run next" did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunNext {
    /// At the front of its lane's line.
    Next,
    /// Only a waiting job (queued or retrying) can be moved; this one is in another state.
    NotWaiting(JobState),
}

/// Put `job_id` at the front of the line, on the record as `actor`'s.
pub async fn run_next(pool: &PgPool, job_id: Uuid, actor: &str) -> Result<RunNext> {
    let mut tx = pool.begin().await?;
    let state: Option<JobState> =
        sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 AND deleted_at IS NULL FOR UPDATE")
            .bind(job_id)
            .fetch_optional(&mut *tx)
            .await?;
    let state = state.ok_or(EngineError::NotFound)?;
    if !matches!(state, JobState::Queued | JobState::Retrying) {
        return Ok(RunNext::NotWaiting(state));
    }
    // One tag before the lowest waiting (the claim orders by tag, then due time, then id).
    sqlx::query(
        "UPDATE jobs SET updated_at = now(),
             fair_tag = least(fair_tag, (SELECT coalesce(min(w.fair_tag), 0) FROM jobs w
                                         WHERE w.state IN ('queued', 'retrying')) - 1)
         WHERE id = $1",
    )
    .bind(job_id)
    .execute(&mut *tx)
    .await?;
    audit(&mut tx, actor, "run_next", Some(&job_id.to_string()), state.as_str(), "first in line").await?;
    super::notify_workers(&mut tx).await?;
    tx.commit().await?;
    Ok(RunNext::Next)
}
