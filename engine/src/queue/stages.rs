//! What a running job is doing, recorded as it moves (reading, waiting for the provider,
//! writing) so the people watching it see progress during a job that takes minutes.

use sqlx::PgPool;
use uuid::Uuid;

use sluice_types::JobStage;

use super::ClaimedJob;
use crate::error::Result;

/// Records a running job's stage. Only the attempt holding the lease writes (fenced by its
/// token), so a worker that lost its lease cannot move someone else's attempt backwards.
#[derive(Clone)]
pub struct StageLog {
    pool: Option<PgPool>,
}

impl StageLog {
    pub fn new(pool: PgPool) -> StageLog {
        StageLog { pool: Some(pool) }
    }

    /// Records nothing (a processor run outside the queue, as in some tests).
    pub fn disabled() -> StageLog {
        StageLog { pool: None }
    }

    /// Record `stage` (and the page count, once known) for `job`'s current attempt. A failure
    /// to record is logged, never the job's failure: the stage is for display.
    pub async fn enter(&self, job: &ClaimedJob, stage: JobStage, pages: Option<u32>) {
        let Some(pool) = &self.pool else { return };
        if let Err(e) = set_stage(pool, job.id, job.lease_token, stage, pages).await {
            tracing::debug!(job = %job.id, error = %e, "could not record the job's stage");
        }
    }
}

/// `true` when the attempt with `lease_token` still holds `job_id` and the stage was written.
pub async fn set_stage(
    pool: &PgPool,
    job_id: Uuid,
    lease_token: Uuid,
    stage: JobStage,
    pages: Option<u32>,
) -> Result<bool> {
    let updated = sqlx::query(
        "UPDATE jobs SET stage = $3, stage_since = clock_timestamp(), stage_pages = coalesce($4, stage_pages)
         WHERE id = $1 AND lease_token = $2 AND state = 'running'",
    )
    .bind(job_id)
    .bind(lease_token)
    .bind(stage)
    .bind(pages.map(|p| p.min(i32::MAX as u32) as i32))
    .execute(pool)
    .await?;
    Ok(updated.rows_affected() == 1)
}
