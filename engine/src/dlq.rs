//! The dead-letter queue: failed jobs, grouped by kind and reason, to inspect, replay or discard.

use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::Result;
use crate::hooks::{TerminalHooks, TerminalJob};
use crate::queue::{job_from_row, JobView, JOB_COLUMNS};
use crate::retry::FailureKind;
use crate::settings::{audit, notify};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DlqGroup {
    pub failure_kind: FailureKind,
    pub failure_reason: String,
    pub jobs: i64,
    pub newest: chrono::DateTime<chrono::Utc>,
}

pub async fn groups(pool: &PgPool) -> Result<Vec<DlqGroup>> {
    let rows = sqlx::query(
        "SELECT failure_kind, failure_reason, count(*), max(finished_at) FROM jobs
         WHERE state = 'failed' AND discarded_at IS NULL
         GROUP BY failure_kind, failure_reason ORDER BY count(*) DESC, max(finished_at) DESC",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| DlqGroup {
            failure_kind: FailureKind::parse(r.get(0)).expect("kind is checked by the schema"),
            failure_reason: r.get::<Option<String>, _>(1).unwrap_or_default(),
            jobs: r.get(2),
            newest: r.get(3),
        })
        .collect())
}

/// The jobs of one group, newest first.
pub async fn group_jobs(pool: &PgPool, kind: FailureKind, reason: &str, limit: i64) -> Result<Vec<JobView>> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE state = 'failed' AND discarded_at IS NULL
         AND failure_kind = $1 AND coalesce(failure_reason, '') = $2 ORDER BY finished_at DESC LIMIT $3"
    ))
    .bind(kind.as_str())
    .bind(reason)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(job_from_row).collect())
}

pub async fn depth(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'failed' AND discarded_at IS NULL")
        .fetch_one(pool)
        .await?)
}

/// Which failed jobs a replay or discard applies to.
#[derive(Clone, Debug)]
pub enum Selection {
    Job(Uuid),
    Group { kind: FailureKind, reason: String },
}

impl Selection {
    fn describe(&self) -> String {
        match self {
            Selection::Job(id) => format!("job {id}"),
            Selection::Group { kind, reason } => format!("group {}: {reason}", kind.as_str()),
        }
    }
}

const SELECTED: &str = "state = 'failed' AND discarded_at IS NULL AND \
    (($1::uuid IS NOT NULL AND id = $1) OR ($1::uuid IS NULL AND failure_kind = $2 AND coalesce(failure_reason, '') = $3))";

fn bind_selection(selection: &Selection) -> (Option<Uuid>, Option<&'static str>, Option<String>) {
    match selection {
        Selection::Job(id) => (Some(*id), None, None),
        Selection::Group { kind, reason } => (None, Some(kind.as_str()), Some(reason.clone())),
    }
}

/// Replay: attempts reset, back to `queued`, the replayed hook in the same transaction.
/// Only jobs still failed are touched, so two identical requests at once requeue once.
/// Returns the ids replayed.
pub async fn replay(pool: &PgPool, hooks: &dyn TerminalHooks, selection: &Selection, actor: &str) -> Result<Vec<Uuid>> {
    let (id, kind, reason) = bind_selection(selection);
    let mut tx = pool.begin().await?;
    let rows = sqlx::query(&format!(
        "UPDATE jobs SET state = 'queued', attempts = 0, run_at = now(), failure_kind = NULL,
             failure_reason = NULL, finished_at = NULL, replays = replays + 1, updated_at = now()
         WHERE {SELECTED} RETURNING id, owner_id, cost, attempts"
    ))
    .bind(id)
    .bind(kind)
    .bind(reason)
    .fetch_all(&mut *tx)
    .await?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in &rows {
        let job =
            TerminalJob { id: row.get(0), owner_id: row.get(1), cost: row.get(2), attempts: row.get(3), failure: None };
        hooks.on_replayed(&mut tx, &job).await?;
        ids.push(job.id);
    }
    if !ids.is_empty() {
        audit(&mut tx, actor, "dlq_replay", Some(&selection.describe()), "failed", &format!("{} queued", ids.len()))
            .await?;
        notify(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(ids)
}

/// Discard: the jobs stay `failed` (and refunded) for their owners but leave the DLQ.
pub async fn discard(pool: &PgPool, selection: &Selection, actor: &str) -> Result<u64> {
    let (id, kind, reason) = bind_selection(selection);
    let mut tx = pool.begin().await?;
    let done = sqlx::query(&format!("UPDATE jobs SET discarded_at = now(), updated_at = now() WHERE {SELECTED}"))
        .bind(id)
        .bind(kind)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
    if done.rows_affected() > 0 {
        audit(
            &mut tx,
            actor,
            "dlq_discard",
            Some(&selection.describe()),
            "failed",
            &format!("{} discarded", done.rows_affected()),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(done.rows_affected())
}
