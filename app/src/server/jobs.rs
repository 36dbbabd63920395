//! A user's jobs: the list and one job's details.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::{JobDetails, JobStatus};
#[cfg(feature = "ssr")]
use crate::server::session::{answer, context, job_status, job_statuses, require_user, visible_job};

/// The caller's newest jobs (200), each with its place in line while waiting.
#[server(endpoint = "list_jobs")]
pub async fn list_jobs() -> Result<Vec<JobStatus>, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let jobs = engine::queue::list_for_owner(&ctx.pool, user.id, 200).await?;
        job_statuses(&ctx.pool, user.id, &jobs).await
    })
    .await
}

/// One of the caller's jobs with its result and attempts; anyone else's is 404.
#[server(endpoint = "job_detail")]
pub async fn job_detail(id: String) -> Result<JobDetails, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let job = visible_job(&ctx.pool, &user, &id).await?;
        let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
        Ok(JobDetails {
            job: job_status(&ctx.pool, &job).await?,
            result: job.result.clone(),
            attempts: attempts.into_iter().map(Into::into).collect(),
        })
    })
    .await
}
