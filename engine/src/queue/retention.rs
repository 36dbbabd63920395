//! Retention: finished jobs are deleted some days after they finish (canceled ones like done).

use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Result;

/// How long finished jobs are kept (by finish time).
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub done: Duration,
    pub failed: Duration,
    /// A failed job's document is kept this long for the admins to inspect (and replay), then
    /// released; a canceled job's is released at once.
    pub failed_documents: Duration,
}

impl Default for Retention {
    /// Done jobs 30 days, failed ones 90 (DESIGN).
    fn default() -> Self {
        Retention {
            done: Duration::from_secs(30 * 86_400),
            failed: Duration::from_secs(90 * 86_400),
            failed_documents: Duration::from_secs(7 * 86_400),
        }
    }
}

/// A pruned job: its payload tells the caller which blobs to delete.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PrunedJob {
    pub id: Uuid,
    pub payload: Value,
}

/// Delete done jobs older than `retention.done` and failed ones older than `retention.failed`
/// (by finish time), in batches. Attempts go with them (cascade).
pub async fn prune(pool: &PgPool, retention: Retention) -> Result<Vec<PrunedJob>> {
    const BATCH: usize = 1000;
    let mut pruned = Vec::new();
    loop {
        let batch: Vec<PrunedJob> = sqlx::query_as(
            "DELETE FROM jobs WHERE id IN (
                SELECT id FROM jobs WHERE finished_at IS NOT NULL AND (
                    (state IN ('done', 'canceled') AND finished_at < now() - make_interval(secs => $1))
                 OR (state = 'failed' AND finished_at < now() - make_interval(secs => $2)))
                LIMIT $3)
             RETURNING id, payload",
        )
        .bind(retention.done.as_secs_f64())
        .bind(retention.failed.as_secs_f64())
        .bind(BATCH as i64)
        .fetch_all(pool)
        .await?;
        let full = batch.len() == BATCH;
        pruned.extend(batch);
        if !full {
            break;
        }
    }
    Ok(pruned)
}

/// Documents no job needs any more: those of canceled jobs, and of failed jobs finished more
/// than `failed_documents` ago, not released yet (at most `limit`).
pub async fn releasable_documents(pool: &PgPool, failed_documents: Duration, limit: i64) -> Result<Vec<PrunedJob>> {
    Ok(sqlx::query_as(
        "SELECT id, payload FROM jobs
         WHERE state IN ('canceled', 'failed') AND document_released_at IS NULL AND kind = 'document'
           AND deleted_at IS NULL -- deleted jobs' documents: accounts::deletion::finish_deletions
           AND (state = 'canceled' OR finished_at < now() - make_interval(secs => $1))
         ORDER BY finished_at LIMIT $2",
    )
    .bind(failed_documents.as_secs_f64())
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Record that these jobs' documents are released (before deleting them: a crash in between
/// leaves a document no job needs, which the orphan sweep deletes). Their parts' text goes
/// with them: the job can no longer continue.
pub async fn mark_released(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<PrunedJob>> {
    let mut tx = pool.begin().await?;
    // Still ended: a job replayed from the dead-letter queue meanwhile keeps its document.
    let released: Vec<PrunedJob> = sqlx::query_as(
        "UPDATE jobs SET document_released_at = now()
         WHERE id = ANY($1) AND document_released_at IS NULL AND state IN ('canceled', 'failed')
         RETURNING id, payload",
    )
    .bind(ids)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<Uuid> = released.iter().map(|j| j.id).collect();
    super::parts::forget(&mut tx, &ids).await?;
    tx.commit().await?;
    Ok(released)
}
