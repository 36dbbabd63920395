//! Blobs without a job: an upload is stored before its admission commits, so a crash between
//! the two leaves a blob no job points at. Reconciliation reports them; removing them is an
//! explicit, audited operator action (`server repair orphans`), which deletes those older than
//! a grace period (an upload in progress is never that old).

use std::time::Duration;

use futures::StreamExt;
use sqlx::{PgConnection, PgPool};

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

/// Delete the documents of jobs retention removed (those no other job still needs).
pub async fn delete_documents_of(pool: &PgPool, blobs: &Blobs, jobs: &[PrunedJob]) {
    for job in jobs {
        if let Some(key) = blob_key(&job.payload) {
            if let Err(e) = delete_if_unneeded(pool, blobs, key).await {
                tracing::warn!(job = %job.id, error = %e, "could not delete a pruned job's document");
            }
        }
    }
}

/// Whether a job still needs the stored document `key` (one naming it has not released it),
/// holding the document's lock until `tx` ends: a job admitted to share it ("run again")
/// checks this in its admission, a deletion just before deleting, so neither outruns the other.
pub async fn document_needed(tx: &mut PgConnection, key: &str) -> Result<bool> {
    // Shared with every other deletion, exclusive to a backup in progress (it copies first).
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1), pg_advisory_xact_lock(hashtextextended($2, 23))")
        .bind(crate::backup::BACKUP_LOCK)
        .bind(key)
        .execute(&mut *tx)
        .await?;
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
/// jobs that name them: "run again" does not copy). Returns whether it was deleted. A job
/// admitted to share it after this check finds it unneeded, and is refused (as gone).
pub async fn delete_if_unneeded(pool: &PgPool, blobs: &Blobs, key: &str) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let needed = document_needed(&mut tx, key).await?;
    // Deleted while the locks are held: a backup starting now waits for it to be done.
    if !needed {
        blobs.delete(key).await?;
    }
    tx.commit().await?;
    Ok(!needed)
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
