//! Blobs without a job: an upload is stored before its admission commits, so a crash between
//! the two leaves a blob no job points at. Reconciliation reports them; removing them is an
//! explicit, audited operator action (`server repair orphans`), which deletes those older than
//! a grace period (an upload in progress is never that old).

use std::time::Duration;

use futures::StreamExt;
use sqlx::PgPool;

use super::processor::blob_key;
use super::Blobs;
use crate::error::Result;
use crate::queue::retention::PrunedJob;

/// Delete stored documents older than `grace` that no job points at, on the record as
/// `actor`'s. Returns how many.
pub async fn remove_orphans(pool: &PgPool, blobs: &Blobs, grace: Duration, actor: &str) -> Result<u64> {
    let before = chrono::Utc::now() - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::hours(1));
    let mut batches = blobs.documents_before(before, 500);
    let mut removed = 0;
    while let Some(batch) = batches.next().await {
        for key in without_jobs(pool, &batch?).await? {
            blobs.delete(&key).await?;
            removed += 1;
        }
    }
    let mut conn = pool.acquire().await?;
    crate::audit::audit(&mut conn, actor, "remove_orphans", None, "", &removed.to_string()).await?;
    Ok(removed)
}

/// The keys among `keys` that no job points at.
pub async fn without_jobs(pool: &PgPool, keys: &[String]) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT k FROM unnest($1::text[]) k
         WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'document' AND j.payload #>> '{document,key}' = k)",
    )
    .bind(keys)
    .fetch_all(pool)
    .await?)
}

/// Delete the documents of jobs retention removed.
pub async fn delete_documents_of(blobs: &Blobs, jobs: &[PrunedJob]) {
    for job in jobs {
        if let Some(key) = blob_key(&job.payload) {
            if let Err(e) = blobs.delete(key).await {
                tracing::warn!(job = %job.id, error = %e, "could not delete a pruned job's document");
            }
        }
    }
}

/// Delete the documents no job needs any more (canceled jobs' at once, failed jobs' after the
/// inspection window), and mark them released. Returns how many.
pub async fn release_documents(pool: &PgPool, blobs: &Blobs, failed_documents: Duration) -> Result<usize> {
    let mut released = 0;
    loop {
        let jobs = crate::queue::retention::releasable_documents(pool, failed_documents, 500).await?;
        if jobs.is_empty() {
            return Ok(released);
        }
        for job in &jobs {
            if let Some(key) = blob_key(&job.payload) {
                blobs.delete(key).await?;
            }
        }
        let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.id).collect();
        crate::queue::retention::mark_released(pool, &ids).await?;
        released += jobs.len();
    }
}
