//! Blobs no job needs: an upload is stored before its admission commits, so a crash between
//! the two (or a request that ends without its cleanup) leaves a blob no job points at, and a
//! deletion held off by a backup that then died leaves one only released jobs name.
//! Reconciliation reports them; the upkeep deletes those older than a grace period (an upload
//! in progress is never that old) once an hour, on the record, and an operator can too
//! (`server repair orphans`).

use std::time::Duration;

use futures::StreamExt;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::backup_holds::held_by_backup;
use super::payload::blob_key;
use super::Blobs;
use crate::error::Result;
use crate::queue::retention::PrunedJob;

/// Delete stored documents older than `grace` that no job needs, on the record as `actor`'s.
/// Returns how many.
pub async fn remove_orphans(pool: &PgPool, blobs: &Blobs, grace: Duration, actor: &str) -> Result<u64> {
    let removed = delete_unneeded_before(pool, blobs, grace).await?;
    let mut conn = pool.acquire().await?;
    crate::audit::audit(&mut conn, actor, "remove_orphans", None, "", &removed.to_string()).await?;
    Ok(removed)
}

/// The upkeep's turn of [`remove_orphans`]: on the record only when it removed something.
pub async fn sweep_orphans(pool: &PgPool, blobs: &Blobs, grace: Duration) -> Result<u64> {
    let removed = delete_unneeded_before(pool, blobs, grace).await?;
    if removed > 0 {
        let mut conn = pool.acquire().await?;
        crate::audit::audit(&mut conn, "upkeep", "remove_orphans", None, "", &removed.to_string()).await?;
    }
    Ok(removed)
}

async fn delete_unneeded_before(pool: &PgPool, blobs: &Blobs, grace: Duration) -> Result<u64> {
    let before = chrono::Utc::now() - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::hours(1));
    let mut batches = blobs.documents_before(before, 500);
    let mut removed = 0;
    while let Some(batch) = batches.next().await {
        for key in unneeded(pool, &batch?).await? {
            // Checked again under the document's lock (a "run again" admission takes it).
            if delete_if_unneeded(pool, blobs, &key).await? {
                removed += 1;
            }
        }
    }
    // Translated files whose job is gone or deleted (one a crash left between its build and
    // its job's deletion): nobody may download them any more.
    let mut batches = blobs.keys_before("translated", before, 500);
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        let jobs: Vec<Uuid> = batch.iter().filter_map(|key| translated_job(key)).collect();
        let gone: Vec<Uuid> = sqlx::query_scalar(
            "SELECT j FROM unnest($1::uuid[]) j
             WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = j AND deleted_at IS NULL)",
        )
        .bind(&jobs)
        .fetch_all(pool)
        .await?;
        for key in batch.iter().filter(|key| translated_job(key).is_some_and(|j| gone.contains(&j))) {
            blobs.delete(key).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Pure: the job a translated file's key (or its kept refusal's) belongs to.
fn translated_job(key: &str) -> Option<Uuid> {
    let name = key.strip_prefix("translated/")?;
    name.strip_suffix(".refused").unwrap_or(name).parse().ok()
}

/// The keys among `keys` that no job needs (none names them, or only jobs that let them go).
async fn unneeded(pool: &PgPool, keys: &[String]) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT k FROM unnest($1::text[]) k
         WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'document' AND j.payload #>> '{document,key}' = k
                             AND j.deleted_at IS NULL
                             AND (j.document_released_at IS NULL OR j.state NOT IN ('failed', 'canceled')))",
    )
    .bind(keys)
    .fetch_all(pool)
    .await?)
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

/// Delete the documents of jobs retention removed (those no other job still needs).
pub async fn delete_documents_of(pool: &PgPool, blobs: &Blobs, jobs: &[PrunedJob]) {
    for job in jobs {
        if let Err(e) = forget_translated_file(blobs, job.id).await {
            tracing::warn!(job = %job.id, error = %e, "could not delete a pruned job's translated file");
        }
        if let Some(key) = blob_key(&job.payload) {
            if let Err(e) = delete_if_unneeded(pool, blobs, key).await {
                tracing::warn!(job = %job.id, error = %e, "could not delete a pruned job's document");
            }
        }
    }
}

/// Delete a job's rebuilt translated file (and a kept refusal), if any (its job is pruned or
/// deleted).
pub async fn forget_translated_file(blobs: &Blobs, job: Uuid) -> Result<()> {
    blobs.delete(&Blobs::translated_key(job)).await?;
    blobs.delete(&Blobs::translated_refusal_key(job)).await
}

/// A stored upload no job names yet. Dropped before [`PendingBlob::keep`] (its request ended
/// on a deadline, its client went away, the server is shutting down), it deletes the blob in
/// the background unless a job came to need it meanwhile: an upload never strands its file.
pub struct PendingBlob {
    pool: PgPool,
    blobs: Blobs,
    key: Option<String>,
}

impl PendingBlob {
    pub fn new(pool: &PgPool, blobs: &Blobs, key: &str) -> PendingBlob {
        PendingBlob { pool: pool.clone(), blobs: blobs.clone(), key: Some(key.to_string()) }
    }

    /// A job names the blob now (or the intake deleted it): nothing more to do here.
    pub fn keep(mut self) {
        self.key = None;
    }

    /// Delete the blob now (its upload was refused).
    pub async fn delete(mut self) {
        if let Some(key) = self.key.take() {
            if let Err(e) = self.blobs.delete(&key).await {
                tracing::warn!(%key, error = %e, "could not delete a refused upload's file");
            }
        }
    }
}

impl Drop for PendingBlob {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (pool, blobs) = (self.pool.clone(), self.blobs.clone());
        // Checked under the document's lock, which an admission naming it holds until it
        // commits: a job admitted at the very moment of the drop keeps its document.
        runtime.spawn(async move {
            if let Err(e) = delete_if_unneeded(&pool, &blobs, &key).await {
                tracing::warn!(%key, error = %e, "could not delete an abandoned upload's file; the orphan sweep will");
            }
        });
    }
}

/// Hold the stored document `key`'s lock until `tx` ends: a deletion checking whether a job
/// needs it waits for this transaction to say.
pub async fn lock_document(tx: &mut PgConnection, key: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 23))").bind(key).execute(&mut *tx).await?;
    Ok(())
}

/// Whether a job still needs the stored document `key` (one naming it has not released it),
/// holding the document's lock until `tx` ends: a job admitted to share it ("run again")
/// checks this in its admission, a deletion just before deleting, so neither outruns the other.
pub async fn document_needed(tx: &mut PgConnection, key: &str) -> Result<bool> {
    lock_document(tx, key).await?;
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE kind = 'document' AND payload #>> '{document,key}' = $1
                        AND deleted_at IS NULL -- its owner deleted it: it needs nothing
                        AND (document_released_at IS NULL
                             -- a job replayed from the dead-letter queue after its release
                             OR state NOT IN ('failed', 'canceled')))",
    )
    .bind(key)
    .fetch_one(&mut *tx)
    .await?)
}

/// Delete the stored document `key` unless a job still needs it (documents are shared by the
/// jobs that name them: "run again" does not copy), or a backup in progress has yet to copy
/// it (the backup deletes it then). Returns whether it was deleted. A job admitted to share it
/// after this check finds it unneeded, and is refused (as gone).
pub async fn delete_if_unneeded(pool: &PgPool, blobs: &Blobs, key: &str) -> Result<bool> {
    let mut tx = pool.begin().await?;
    if held_by_backup(&mut tx, key).await? {
        tx.commit().await?;
        return Ok(false);
    }
    let needed = document_needed(&mut tx, key).await?;
    // Deleted while the locks are held: a backup starting now lists it only if still needed.
    if !needed {
        blobs.delete(key).await?;
    }
    tx.commit().await?;
    Ok(!needed)
}

/// Forget the stored documents of jobs their owners deleted (one job's, or any: an account's
/// go this way too), once those jobs have ended: each deleted unless another job still needs
/// it, and only then recorded released, so a deletion cut short is retried. Returns how many
/// jobs it released (at most 500 a call).
pub async fn forget_deleted_jobs_documents(pool: &PgPool, blobs: &Blobs, only: Option<Uuid>) -> Result<usize> {
    let jobs: Vec<(Uuid, serde_json::Value)> = sqlx::query_as(
        "SELECT id, payload FROM jobs
         WHERE deleted_at IS NOT NULL AND document_released_at IS NULL AND kind = 'document'
           AND state IN ('done', 'failed', 'canceled') AND ($1::uuid IS NULL OR id = $1)
         LIMIT 500",
    )
    .bind(only)
    .fetch_all(pool)
    .await?;
    for (id, payload) in &jobs {
        if let Some(key) = blob_key(payload) {
            delete_if_unneeded(pool, blobs, key).await?;
        }
        // Before the job is marked released: a failure here is tried again.
        forget_translated_file(blobs, *id).await?;
        sqlx::query("UPDATE jobs SET document_released_at = now() WHERE id = $1").bind(id).execute(pool).await?;
    }
    Ok(jobs.len())
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
        // Released first, so the deletion sees these jobs no longer needing their documents
        // (a crash in between leaves a document no unreleased job names: the orphan sweep's).
        let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.id).collect();
        let marked = crate::queue::retention::mark_released(pool, &ids).await?;
        for job in &marked {
            if let Some(key) = blob_key(&job.payload) {
                delete_if_unneeded(pool, blobs, key).await?;
            }
        }
        released += marked.len();
    }
}
