//! The dead-letter queue: failed jobs, grouped by kind and reason, to inspect, replay or discard.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::hooks::{TerminalHooks, TerminalJob};
use super::views::JobView;
use crate::audit::audit;
use crate::error::Result;
use crate::FailureKind;

/// Failed jobs that share a kind and a reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DlqGroup {
    pub failure_kind: FailureKind,
    pub failure_reason: String,
    pub jobs: i64,
    pub newest: DateTime<Utc>,
}

/// Every group, the largest first.
pub async fn groups(pool: &PgPool) -> Result<Vec<DlqGroup>> {
    Ok(sqlx::query_as(
        "SELECT failure_kind, coalesce(failure_reason, '') AS failure_reason, count(*) AS jobs,
                max(finished_at) AS newest
         FROM dead_letters
         GROUP BY failure_kind, failure_reason ORDER BY count(*) DESC, max(finished_at) DESC",
    )
    .fetch_all(pool)
    .await?)
}

/// The jobs of one group, newest first.
pub async fn group_jobs(pool: &PgPool, kind: FailureKind, reason: &str, limit: i64) -> Result<Vec<JobView>> {
    Ok(sqlx::query_as(
        "SELECT * FROM dead_letters WHERE failure_kind = $1 AND coalesce(failure_reason, '') = $2
         ORDER BY finished_at DESC LIMIT $3",
    )
    .bind(kind)
    .bind(reason)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// How many jobs are in the DLQ.
pub async fn depth(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM dead_letters").fetch_one(pool).await?)
}

/// Which failed jobs a replay or discard applies to.
#[derive(Clone, Debug)]
pub enum Selection {
    Job(Uuid),
    Group { kind: FailureKind, reason: String },
}

impl Selection {
    /// For the audit log.
    fn describe(&self) -> String {
        match self {
            Selection::Job(id) => format!("job {id}"),
            Selection::Group { kind, reason } => format!("group {}: {reason}", kind.as_str()),
        }
    }

    /// The parameters `$1` (a job id) or `$2`, `$3` (a group) of the statements below.
    fn parameters(&self) -> (Option<Uuid>, Option<FailureKind>, Option<&str>) {
        match self {
            Selection::Job(id) => (Some(*id), None, None),
            Selection::Group { kind, reason } => (None, Some(*kind), Some(reason)),
        }
    }
}

/// Replay: attempts reset, back to `queued`, the replayed hook in the same transaction.
/// Only jobs still failed are touched, so two identical requests at once requeue once.
/// Returns the ids replayed.
pub async fn replay(pool: &PgPool, hooks: &dyn TerminalHooks, selection: &Selection, actor: &str) -> Result<Vec<Uuid>> {
    let (id, kind, reason) = selection.parameters();
    let mut tx = pool.begin().await?;
    let replayed: Vec<TerminalJob> = sqlx::query_as(
        "UPDATE dead_letters SET state = 'queued', attempts = 0, run_at = now(), failure_kind = NULL,
             failure_reason = NULL, finished_at = NULL, replays = replays + 1, updated_at = now()
         WHERE ($1::uuid IS NOT NULL AND id = $1)
            OR ($1::uuid IS NULL AND failure_kind = $2 AND coalesce(failure_reason, '') = $3)
         RETURNING id, owner_id, cost, attempts",
    )
    .bind(id)
    .bind(kind)
    .bind(reason)
    .fetch_all(&mut *tx)
    .await?;
    for job in &replayed {
        hooks.on_replayed(&mut tx, job).await?;
    }
    if !replayed.is_empty() {
        let queued = format!("{} queued", replayed.len());
        audit(&mut tx, actor, "dlq_replay", Some(&selection.describe()), "failed", &queued).await?;
        super::notify_workers(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(replayed.into_iter().map(|job| job.id).collect())
}

/// Discard: the jobs stay `failed` (and refunded) for their owners but leave the DLQ.
pub async fn discard(pool: &PgPool, selection: &Selection, actor: &str) -> Result<u64> {
    let (id, kind, reason) = selection.parameters();
    let mut tx = pool.begin().await?;
    let discarded = sqlx::query(
        "UPDATE dead_letters SET discarded_at = now(), updated_at = now()
         WHERE ($1::uuid IS NOT NULL AND id = $1)
            OR ($1::uuid IS NULL AND failure_kind = $2 AND coalesce(failure_reason, '') = $3)",
    )
    .bind(id)
    .bind(kind)
    .bind(reason)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if discarded > 0 {
        let what = format!("{discarded} discarded");
        audit(&mut tx, actor, "dlq_discard", Some(&selection.describe()), "failed", &what).await?;
    }
    tx.commit().await?;
    Ok(discarded)
}
