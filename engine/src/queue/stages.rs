//! What a running job is doing, recorded as it moves (reading, waiting for the provider,
//! writing) so the people watching it see progress during a job that takes minutes.

use sqlx::PgPool;
use uuid::Uuid;

use sluice_types::JobStage;

use super::policy::retry::ErrorClass;
use super::{ClaimedJob, JobError};

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

    /// Record `stage` (and the page count, once known) for `job`'s current attempt. Also the
    /// job's safe point: if its cancellation was asked for, the processor stops here (the
    /// error ends the attempt, and the job becomes `canceled`). A failure to record is logged,
    /// never the job's failure: the stage is for display.
    pub async fn enter(&self, job: &ClaimedJob, stage: JobStage, pages: Option<u32>) -> Result<(), JobError> {
        let Some(pool) = &self.pool else { return Ok(()) };
        match set_stage(pool, job.id, job.lease_token, stage, pages).await {
            Ok(StageWritten { cancel_requested: true, .. }) => {
                Err(JobError::new(ErrorClass::Rejected, "canceled before it was finished"))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(job = %job.id, error = %e, "could not record the job's stage");
                Ok(())
            }
        }
    }
}

impl StageLog {
    /// Record that `job` is reading page `page` of `pages` by OCR (also a safe point, as
    /// [`Self::enter`] is).
    pub async fn reading_page(&self, job: &ClaimedJob, page: u32, pages: u32) -> Result<(), JobError> {
        self.enter(job, JobStage::Reading, Some(pages)).await?;
        let Some(pool) = &self.pool else { return Ok(()) };
        let written =
            sqlx::query("UPDATE jobs SET reading_page = $3 WHERE id = $1 AND lease_token = $2 AND state = 'running'")
                .bind(job.id)
                .bind(job.lease_token)
                .bind(page.min(i32::MAX as u32) as i32)
                .execute(pool)
                .await;
        if let Err(e) = written {
            tracing::debug!(job = %job.id, error = %e, "could not record the page being read");
        }
        Ok(())
    }

    /// Record how `job`'s scanned pages were read (for its owner; never the job's failure).
    pub async fn record_scan(&self, job: &ClaimedJob, report: &sluice_types::scan::ScanReport) {
        let Some(pool) = &self.pool else { return };
        let written = sqlx::query(
            "UPDATE jobs SET scan_report = $3, reading_page = NULL WHERE id = $1 AND lease_token = $2 AND state = 'running'",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(serde_json::to_value(report).expect("a report serialises"))
        .execute(pool)
        .await;
        if let Err(e) = written {
            tracing::warn!(job = %job.id, error = %e, "could not record how the scan was read");
        }
    }
}

impl StageLog {
    /// Record, durably, that `job`'s attempt has started (see [`super::mark_started`]): an
    /// attempt that cannot say so calls nobody, and fails as the database's (retried).
    pub async fn started(&self, job: &ClaimedJob) -> Result<(), JobError> {
        let Some(pool) = &self.pool else { return Ok(()) };
        match super::mark_started(pool, job).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(JobError::new(ErrorClass::Connection, "the job went back to the line before it began")),
            Err(e) => Err(JobError::new(
                ErrorClass::Connection,
                format!("the database did not answer before the attempt began: {e}"),
            )),
        }
    }

    /// Record about how many tokens of the answers `job`'s attempt is writing are written, of
    /// how many expected (for display: a failure is only logged).
    pub async fn writing(&self, job: &ClaimedJob, written: u64, expected: u64) {
        let Some(pool) = &self.pool else { return };
        let result = sqlx::query(
            "INSERT INTO job_writing (job_id, lease_token, written_tokens, expected_tokens)
             SELECT id, lease_token, $3, $4 FROM jobs WHERE id = $1 AND lease_token = $2 AND state = 'running'
             ON CONFLICT (job_id) DO UPDATE SET lease_token = excluded.lease_token,
                 written_tokens = excluded.written_tokens, expected_tokens = excluded.expected_tokens, updated_at = now()",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(written.min(i64::MAX as u64) as i64)
        .bind(expected.min(i64::MAX as u64) as i64)
        .execute(pool)
        .await;
        if let Err(e) = result {
            tracing::debug!(job = %job.id, error = %e, "could not record the answer's progress");
        }
    }
}

impl StageLog {
    /// The attempt's answers are no longer being written: its progress row goes.
    pub async fn writing_ended(&self, job: &ClaimedJob) {
        let Some(pool) = &self.pool else { return };
        let result = sqlx::query("DELETE FROM job_writing WHERE job_id = $1 AND lease_token = $2")
            .bind(job.id)
            .bind(job.lease_token)
            .execute(pool)
            .await;
        if let Err(e) = result {
            tracing::debug!(job = %job.id, error = %e, "could not remove the answer's progress");
        }
    }

    /// Record what checking a translation's answers found: `tokens` output tokens billed and
    /// not kept (a cut or flawed answer's paragraphs asked again), and `plain` paragraphs
    /// whose inline formatting came back wrong. A failure is only logged.
    pub async fn checked(&self, job: &ClaimedJob, tokens: i64, plain: i64, terms_missed: &[String]) {
        let Some(pool) = &self.pool.as_ref().filter(|_| tokens > 0 || plain > 0 || !terms_missed.is_empty()) else {
            return;
        };
        // The terms left out, each once, at most 50.
        let result = sqlx::query(
            "WITH job AS (
                 UPDATE jobs SET output_tokens_discarded = output_tokens_discarded + $2,
                                 paragraphs_plain = paragraphs_plain + $3,
                                 terms_missed = (SELECT coalesce(array_agg(t), '{}')
                                                 FROM (SELECT DISTINCT t FROM unnest(terms_missed || $4::text[]) AS t
                                                       LIMIT 50) terms)
                 WHERE id = $1 AND lease_token = $5
             )
             INSERT INTO provider_output_discarded (job_id, output_tokens) SELECT $1, $2 WHERE $2 > 0",
        )
        .bind(job.id)
        .bind(tokens)
        .bind(plain.clamp(0, i32::MAX as i64) as i32)
        .bind(terms_missed)
        .bind(job.lease_token)
        .execute(*pool)
        .await;
        if let Err(e) = result {
            tracing::debug!(job = %job.id, error = %e, "could not record the output not kept");
        }
    }

    /// Record that a call of `job`'s read `cached` input tokens from the provider's prompt
    /// cache (priced at the cached rate in the console's costs). A failure is only logged.
    pub async fn cache_read(&self, job: &ClaimedJob, cached: i64) {
        let Some(pool) = &self.pool.as_ref().filter(|_| cached > 0) else { return };
        let result = sqlx::query("INSERT INTO provider_cache_reads (job_id, cached_input_tokens) VALUES ($1, $2)")
            .bind(job.id)
            .bind(cached)
            .execute(*pool)
            .await;
        if let Err(e) = result {
            tracing::debug!(job = %job.id, error = %e, "could not record the cached input");
        }
    }
}

/// What [`set_stage`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageWritten {
    /// The attempt with that lease token still holds the job, and the stage was written.
    pub written: bool,
    /// The job's cancellation was asked for.
    pub cancel_requested: bool,
}

/// Write the stage for the attempt holding `lease_token`; say whether it did, and whether the
/// job's cancellation was asked for.
pub async fn set_stage(
    pool: &PgPool,
    job_id: Uuid,
    lease_token: Uuid,
    stage: JobStage,
    pages: Option<u32>,
) -> crate::error::Result<StageWritten> {
    let requested: Option<bool> = sqlx::query_scalar(
        // A page being read is set after its stage (`reading_page`): never one of another stage's.
        "UPDATE jobs SET stage = $3, stage_since = clock_timestamp(), stage_pages = coalesce($4, stage_pages),
                         reading_page = NULL
         WHERE id = $1 AND lease_token = $2 AND state = 'running'
         RETURNING cancel_requested_at IS NOT NULL",
    )
    .bind(job_id)
    .bind(lease_token)
    .bind(stage)
    .bind(pages.map(|p| p.min(i32::MAX as u32) as i32))
    .fetch_optional(pool)
    .await?;
    Ok(StageWritten { written: requested.is_some(), cancel_requested: requested.unwrap_or(false) })
}
