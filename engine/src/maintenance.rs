//! Background upkeep: rescue jobs whose worker vanished, and prune old jobs.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::Result;
use crate::hooks::TerminalHooks;
use crate::queue::{apply_failure, JobError, Recorded};
use crate::retry::{ErrorClass, Failure, RetryPolicy};

/// Return `running` jobs whose lease expired to `retrying` (using the attempt), or to `failed`
/// / `timed_out` when none are left. Each job in its own transaction, with the hooks.
pub async fn rescue_expired(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    policy: &RetryPolicy,
) -> Result<Vec<(Uuid, Recorded)>> {
    let mut rescued = Vec::new();
    loop {
        let mut tx = pool.begin().await?;
        let row = sqlx::query(
            "SELECT j.id, j.lease_token, j.attempts, s.processing_enabled, now() FROM jobs j, queue_settings s
             WHERE j.state = 'running' AND j.lease_expires_at < now()
             ORDER BY j.lease_expires_at LIMIT 1 FOR UPDATE OF j SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { break };
        let (id, token): (Uuid, Uuid) = (row.get(0), row.get(1));
        let error = JobError::new(ErrorClass::LeaseExpired, "the worker stopped answering (lease expired)");
        let failure = Failure {
            attempt: row.get::<i32, _>(2) as u32,
            class: ErrorClass::LeaseExpired,
            retry_after: None,
            processing_enabled: row.get(3),
        };
        let now: DateTime<Utc> = row.get(4);
        let decision = policy.decide(&failure, now, rand::random::<f64>());
        let recorded = apply_failure(&mut tx, hooks, id, token, &error, decision).await?;
        sqlx::query("UPDATE job_attempts SET outcome = 'lease_expired' WHERE id = $1")
            .bind(token)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::warn!(job = %id, ?recorded, "rescued a job whose lease expired");
        rescued.push((id, recorded));
    }
    Ok(rescued)
}

#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub done: Duration,
    pub failed: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { done: Duration::from_secs(30 * 86_400), failed: Duration::from_secs(90 * 86_400) }
    }
}

/// A pruned job: its payload tells the caller which blobs to delete.
#[derive(Clone, Debug)]
pub struct PrunedJob {
    pub id: Uuid,
    pub payload: Value,
}

/// Delete done jobs older than `retention.done` and failed ones older than `retention.failed`
/// (by finish time), in batches. Attempts go with them (cascade).
pub async fn prune(pool: &PgPool, retention: Retention) -> Result<Vec<PrunedJob>> {
    let mut pruned = Vec::new();
    loop {
        let rows = sqlx::query(
            "DELETE FROM jobs WHERE id IN (
                SELECT id FROM jobs WHERE finished_at IS NOT NULL AND (
                    (state = 'done' AND finished_at < now() - make_interval(secs => $1))
                 OR (state = 'failed' AND finished_at < now() - make_interval(secs => $2)))
                LIMIT 1000)
             RETURNING id, payload",
        )
        .bind(retention.done.as_secs_f64())
        .bind(retention.failed.as_secs_f64())
        .fetch_all(pool)
        .await?;
        let n = rows.len();
        pruned.extend(rows.iter().map(|r| PrunedJob { id: r.get(0), payload: r.get(1) }));
        if n < 1000 {
            break;
        }
    }
    Ok(pruned)
}

/// Runs rescue every `rescue_every` and retention every `prune_every` until aborted.
/// `on_pruned` gets the pruned jobs (to delete their blobs).
pub async fn run(
    pool: PgPool,
    hooks: Arc<dyn TerminalHooks>,
    policy: RetryPolicy,
    retention: Retention,
    rescue_every: Duration,
    prune_every: Duration,
    on_pruned: Arc<dyn Fn(Vec<PrunedJob>) + Send + Sync>,
) {
    let mut rescue_tick = tokio::time::interval(rescue_every);
    let mut prune_tick = tokio::time::interval(prune_every);
    loop {
        tokio::select! {
            _ = rescue_tick.tick() => {
                if let Err(e) = rescue_expired(&pool, hooks.as_ref(), &policy).await {
                    tracing::error!(error = %e, "lease rescue failed");
                }
            }
            _ = prune_tick.tick() => {
                match prune(&pool, retention).await {
                    Ok(jobs) if !jobs.is_empty() => {
                        tracing::info!(jobs = jobs.len(), "pruned old jobs");
                        on_pruned(jobs);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "retention pruning failed"),
                }
            }
        }
    }
}
