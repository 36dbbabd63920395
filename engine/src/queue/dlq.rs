//! The dead-letter queue: failed jobs, grouped by kind and reason, to inspect, replay or discard.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::hooks::{TerminalHooks, TerminalJob};
use super::reviews::Resolution;
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

/// The most groups listed (the largest first); the rest are found by the job search.
pub const GROUPS_SHOWN: i64 = 200;

/// The largest groups (at most [`GROUPS_SHOWN`]), the largest first.
pub async fn groups(pool: &PgPool) -> Result<Vec<DlqGroup>> {
    Ok(sqlx::query_as(
        "SELECT failure_kind, coalesce(failure_reason, '') AS failure_reason, count(*) AS jobs,
                max(finished_at) AS newest
         FROM dead_letters
         GROUP BY failure_kind, coalesce(failure_reason, '') ORDER BY count(*) DESC, max(finished_at) DESC
         LIMIT $1",
    )
    .bind(GROUPS_SHOWN)
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
    Group {
        kind: FailureKind,
        reason: String,
    },
    /// A batch of a bulk action ([`super::bulk`]), which audits the whole action once itself.
    Batch(Vec<Uuid>),
}

impl Selection {
    /// For the audit log; None for a batch (not audited on its own).
    fn describe(&self) -> Option<String> {
        match self {
            Selection::Job(id) => Some(format!("job {id}")),
            Selection::Group { kind, reason } => Some(format!("group {}: {reason}", kind.as_str())),
            Selection::Batch(_) => None,
        }
    }

    /// The parameters `$1` (job ids) or `$2`, `$3` (a group) of the statements below.
    fn parameters(&self) -> (Option<Vec<Uuid>>, Option<FailureKind>, Option<&str>) {
        match self {
            Selection::Job(id) => (Some(vec![*id]), None, None),
            Selection::Batch(ids) => (Some(ids.clone()), None, None),
            Selection::Group { kind, reason } => (None, Some(*kind), Some(reason)),
        }
    }
}

/// A dead job a replay may requeue, with what decides whether it can be.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct ReplayCandidate {
    pub id: Uuid,
    pub owner_id: i64,
    pub idempotency_key: Option<String>,
    /// The owner's live (not failed) job with the same key: the document was uploaded again.
    pub newer: Option<Uuid>,
    /// Its document was released (its replay window ended): there is nothing to run again.
    #[sqlx(default)]
    pub released: bool,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replayed {
    /// Requeued.
    pub ids: Vec<Uuid>,
    /// Left failed because the owner uploaded the document again: (this job, the newer one).
    pub already_reuploaded: Vec<(Uuid, Uuid)>,
    /// Left failed because their document was released when its replay window ended: the
    /// owner has to upload it again.
    pub document_released: Vec<Uuid>,
}

/// Pure: which candidates to requeue. One with a live twin stays failed (requeueing it would
/// make two live jobs for one document); of several candidates sharing an owner and a key,
/// only the first is requeued and the others point at it.
pub fn plan_replay(candidates: &[ReplayCandidate]) -> Replayed {
    let mut plan = Replayed::default();
    let mut taken: std::collections::HashMap<(i64, &str), Uuid> = std::collections::HashMap::new();
    for c in candidates {
        if c.released {
            plan.document_released.push(c.id);
            continue;
        }
        if let Some(newer) = c.newer {
            plan.already_reuploaded.push((c.id, newer));
            continue;
        }
        match c.idempotency_key.as_deref() {
            Some(key) => match taken.get(&(c.owner_id, key)) {
                Some(&first) => plan.already_reuploaded.push((c.id, first)),
                None => {
                    taken.insert((c.owner_id, key), c.id);
                    plan.ids.push(c.id);
                }
            },
            None => plan.ids.push(c.id),
        }
    }
    plan
}

/// Replay: attempts reset, back to `queued`, the replayed hook in the same transaction.
/// Only jobs still failed are touched, so two identical requests at once requeue once. A job
/// whose document its owner has since uploaded again, or whose document was released, is left
/// failed and reported (a released one would only fail again, reading nothing).
pub async fn replay(pool: &PgPool, hooks: &dyn TerminalHooks, selection: &Selection, actor: &str) -> Result<Replayed> {
    let (id, kind, reason) = selection.parameters();
    let mut tx = pool.begin().await?;
    let candidates: Vec<ReplayCandidate> = sqlx::query_as(
        "SELECT d.id, d.owner_id, d.idempotency_key, twin.id AS newer, d.document_released_at IS NOT NULL AS released
         FROM dead_letters d
         LEFT JOIN LATERAL (
             SELECT j.id FROM jobs j
             WHERE j.owner_id = d.owner_id AND j.idempotency_key = d.idempotency_key AND j.state NOT IN ('failed', 'canceled')
             LIMIT 1
         ) twin ON true
         WHERE (($1::uuid[] IS NOT NULL AND d.id = ANY($1))
                OR ($1::uuid[] IS NULL AND d.failure_kind = $2 AND coalesce(d.failure_reason, '') = $3))
           -- Its owner deleted it: it is theirs no more to run.
           AND NOT EXISTS (SELECT 1 FROM jobs x WHERE x.id = d.id AND x.deleted_at IS NOT NULL)
         ORDER BY d.finished_at DESC, d.id
         FOR UPDATE OF d",
    )
    .bind(id)
    .bind(kind)
    .bind(reason)
    .fetch_all(&mut *tx)
    .await?;
    let mut plan = plan_replay(&candidates);
    // Their rows are locked: now their owners' lines, in order, for the new tags.
    let owners: Vec<i64> = candidates.iter().map(|c| c.owner_id).collect();
    sqlx::query("SELECT sluice_lock_lines($1)").bind(&owners).execute(&mut *tx).await?;
    let replayed: Vec<TerminalJob> = sqlx::query_as(
        "UPDATE dead_letters SET state = 'queued', attempts = 0, run_at = now(), failure_kind = NULL,
             failure_reason = NULL, finished_at = NULL, replays = replays + 1, updated_at = now()
         WHERE id = ANY($1)
         RETURNING id, owner_id, cost, attempts",
    )
    .bind(&plan.ids)
    .fetch_all(&mut *tx)
    .await?;
    for job in &replayed {
        hooks.on_replayed(&mut tx, job).await?;
    }
    let ids: Vec<Uuid> = replayed.iter().map(|job| job.id).collect();
    super::reviews::close_for(&mut tx, &ids, Resolution::Replayed, actor).await?;
    if !replayed.is_empty() {
        if let Some(what) = selection.describe() {
            audit(&mut tx, actor, "dlq_replay", Some(&what), "failed", &format!("{} queued", replayed.len())).await?;
        }
        super::notify_workers(&mut tx).await?;
    }
    tx.commit().await?;
    plan.ids = replayed.into_iter().map(|job| job.id).collect();
    Ok(plan)
}

/// Discard: the jobs stay `failed` (and refunded) for their owners but leave the DLQ; the
/// discarded hook runs for each in the same transaction (its owner is told).
pub async fn discard(pool: &PgPool, hooks: &dyn TerminalHooks, selection: &Selection, actor: &str) -> Result<u64> {
    let (id, kind, reason) = selection.parameters();
    let mut tx = pool.begin().await?;
    let discarded: Vec<TerminalJob> = sqlx::query_as(
        "UPDATE dead_letters SET discarded_at = now(), updated_at = now()
         WHERE ($1::uuid[] IS NOT NULL AND id = ANY($1))
            OR ($1::uuid[] IS NULL AND failure_kind = $2 AND coalesce(failure_reason, '') = $3)
         RETURNING id, owner_id, cost, attempts",
    )
    .bind(id)
    .bind(kind)
    .bind(reason)
    .fetch_all(&mut *tx)
    .await?;
    for job in &discarded {
        hooks.on_discarded(&mut tx, job).await?;
    }
    let ids: Vec<Uuid> = discarded.iter().map(|job| job.id).collect();
    super::reviews::close_for(&mut tx, &ids, Resolution::Discarded, actor).await?;
    let discarded = ids.len() as u64;
    if let Some(what) = selection.describe().filter(|_| discarded > 0) {
        audit(&mut tx, actor, "dlq_discard", Some(&what), "failed", &format!("{discarded} discarded")).await?;
    }
    tx.commit().await?;
    Ok(discarded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(n: u128, owner: i64, key: Option<&str>, newer: Option<u128>) -> ReplayCandidate {
        ReplayCandidate {
            id: Uuid::from_u128(n),
            owner_id: owner,
            idempotency_key: key.map(str::to_string),
            newer: newer.map(Uuid::from_u128),
            released: false,
        }
    }

    #[test]
    fn a_reuploaded_document_stays_failed_and_twins_replay_once() {
        let plan = plan_replay(&[
            candidate(1, 7, Some("a"), Some(99)),
            candidate(2, 7, Some("b"), None),
            candidate(3, 7, Some("b"), None),
            candidate(4, 8, Some("b"), None),
            candidate(5, 7, None, None),
            ReplayCandidate { released: true, ..candidate(6, 7, Some("c"), None) },
        ]);
        let id = Uuid::from_u128;
        assert_eq!(plan.ids, vec![id(2), id(4), id(5)]);
        assert_eq!(plan.already_reuploaded, vec![(id(1), id(99)), (id(3), id(2))]);
        assert_eq!(plan.document_released, vec![id(6)], "a released document is not run again");
    }
}
