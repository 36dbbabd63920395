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
}

impl Default for Retention {
    /// Done jobs 30 days, failed ones 90 (DESIGN).
    fn default() -> Self {
        Retention { done: Duration::from_secs(30 * 86_400), failed: Duration::from_secs(90 * 86_400) }
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
