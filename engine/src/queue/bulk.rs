//! Bulk actions: cancel, replay or discard everything an admin's search matches. The matches
//! are read once (at most the cap, in id order), then acted on in batches, each its own short
//! transaction through the normal transition: cancel refunds a waiting job once, replay and
//! discard only touch jobs still in the dead-letter queue. A job that changed meanwhile is
//! skipped by that transition, not forced, and one job's error skips that job only. The
//! action is one audit entry with the search, written before the first job changes (so no
//! change goes unrecorded, even if the process dies midway) and completed with the counts at
//! the end. One bulk action runs at a time across processes (an advisory lock held by the
//! run's connection: a dead process's lock goes with its connection).

use sqlx::PgPool;

use super::dlq::{self, Selection};
use super::hooks::TerminalHooks;
use super::views::{count_matching, matching_ids, JobSearch};
use crate::audit::{complete, record};
use crate::error::{EngineError, Result};

/// The most jobs one bulk action may take unless configured otherwise.
pub const DEFAULT_CAP: i64 = 10_000;
/// Jobs per transaction.
pub const BATCH: usize = 200;

/// What a bulk action does to each job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkAction {
    Cancel,
    Replay,
    Discard,
}

impl BulkAction {
    pub fn parse(name: &str) -> Option<BulkAction> {
        match name {
            "cancel" => Some(BulkAction::Cancel),
            "replay" => Some(BulkAction::Replay),
            "discard" => Some(BulkAction::Discard),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Replay => "replay",
            BulkAction::Discard => "discard",
        }
    }
}

/// The advisory lock one bulk action holds while it runs.
const BULK_LOCK: i64 = 0x51CE_B01C;

/// What a bulk action did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkDone {
    /// Jobs the search matched when the action began.
    pub matched: i64,
    /// Jobs the action changed (the rest had ended, or were not in the state it acts on).
    pub acted: i64,
    /// Jobs skipped because changing them failed (the database said no); see the log.
    pub failed: i64,
}

/// Pure: whether `matched` jobs may be acted on: within `cap`, and no more than the admin
/// confirmed (`confirmed`, the count they were shown); else the error that says what to do.
pub fn within_bounds(matched: i64, cap: i64, confirmed: i64) -> Result<()> {
    if matched > cap {
        return Err(EngineError::Invalid(format!(
            "the search matches more than {cap} jobs, the most one bulk action takes: narrow it (by state, kind or days)"
        )));
    }
    if matched > confirmed {
        return Err(EngineError::Invalid(format!(
            "{matched} jobs match now, more than the {confirmed} you confirmed: count again"
        )));
    }
    Ok(())
}

/// How many jobs `search` matches, counted up to one past `cap` (what the console shows
/// before it asks to confirm).
pub async fn preview(pool: &PgPool, search: &JobSearch, cap: i64) -> Result<i64> {
    count_matching(pool, search, cap + 1).await
}

/// Apply `action` to every job `search` matches: at most `cap`, and at most `confirmed` (the
/// count the admin was shown and agreed to).
pub async fn run(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    search: &JobSearch,
    action: BulkAction,
    limits: (i64, i64),
    actor: &str,
) -> Result<BulkDone> {
    let (cap, confirmed) = limits;
    let mut lock = pool.acquire().await?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(BULK_LOCK).fetch_one(&mut *lock).await?;
    if !ours {
        return Err(EngineError::Invalid("another bulk action is running; try again when it ends".into()));
    }
    let done = run_locked(pool, hooks, search, action, (cap, confirmed), actor).await;
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)").bind(BULK_LOCK).execute(&mut *lock).await;
    done
}

async fn run_locked(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    search: &JobSearch,
    action: BulkAction,
    (cap, confirmed): (i64, i64),
    actor: &str,
) -> Result<BulkDone> {
    let ids = matching_ids(pool, search, cap.min(confirmed) + 1).await?;
    let matched = ids.len() as i64;
    within_bounds(matched, cap, confirmed)?;
    let what = format!("bulk_{}", action.as_str());
    let started = format!("{matched} matched: started");
    let entry = record(&mut *pool.acquire().await?, actor, &what, Some(&search.describe()), "", &started).await?;
    let mut done = BulkDone { matched, ..BulkDone::default() };
    for batch in ids.chunks(BATCH) {
        match action {
            BulkAction::Cancel => {
                for id in batch {
                    match super::cancel(pool, hooks, *id, actor, false).await {
                        Ok(super::Canceled::Now | super::Canceled::Requested) => done.acted += 1,
                        Ok(super::Canceled::AlreadyEnded(_)) | Err(EngineError::NotFound) => {}
                        Err(e) => {
                            tracing::warn!(job = %id, error = %e, "a bulk cancel skipped a job");
                            done.failed += 1;
                        }
                    }
                }
            }
            BulkAction::Replay => match dlq::replay(pool, hooks, &Selection::Batch(batch.to_vec()), actor).await {
                Ok(replayed) => done.acted += replayed.ids.len() as i64,
                Err(e) => {
                    tracing::warn!(error = %e, jobs = batch.len(), "a bulk replay skipped a batch");
                    done.failed += batch.len() as i64;
                }
            },
            BulkAction::Discard => match dlq::discard(pool, hooks, &Selection::Batch(batch.to_vec()), actor).await {
                Ok(n) => done.acted += n as i64,
                Err(e) => {
                    tracing::warn!(error = %e, jobs = batch.len(), "a bulk discard skipped a batch");
                    done.failed += batch.len() as i64;
                }
            },
        }
    }
    let counts = match done.failed {
        0 => format!("{} of {matched} matched", done.acted),
        failed => format!("{} of {matched} matched, {failed} failed", done.acted),
    };
    complete(pool, entry, &counts).await?;
    tracing::info!(action = action.as_str(), matched, acted = done.acted, failed = done.failed, "bulk action done");
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_past_the_cap_or_the_confirmed_count_is_refused_with_a_way_forward() {
        assert!(within_bounds(10_000, 10_000, 10_000).is_ok());
        assert!(within_bounds(0, 10_000, 0).is_ok());
        assert!(within_bounds(3, 10_000, 5).is_ok(), "fewer than confirmed: some ended meanwhile");
        let refused = within_bounds(10_001, 10_000, 20_000).unwrap_err().to_string();
        assert!(refused.contains("narrow"), "{refused}");
        let refused = within_bounds(4, 10_000, 3).unwrap_err().to_string();
        assert!(refused.contains("count again"), "{refused}");
    }

    #[test]
    fn actions_read_back_from_their_names() {
        for action in [BulkAction::Cancel, BulkAction::Replay, BulkAction::Discard] {
            assert_eq!(BulkAction::parse(action.as_str()), Some(action));
        }
        assert_eq!(BulkAction::parse("delete"), None);
    }
}
