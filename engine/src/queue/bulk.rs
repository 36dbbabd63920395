//! Bulk actions: cancel, replay or discard everything an admin's search matches. The matches
//! are read once (at most the cap, in id order), then acted on in batches, each its own short
//! transaction through the normal transition: cancel refunds a waiting job once, replay and
//! discard only touch jobs still in the dead-letter queue. A job that changed meanwhile is
//! skipped by that transition, not forced. The action is audited once, with the search and
//! the counts, when it ends.

use sqlx::PgPool;

use super::dlq::{self, Selection};
use super::hooks::TerminalHooks;
use super::views::{count_matching, matching_ids, JobSearch};
use crate::audit::audit;
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

/// What a bulk action did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkDone {
    /// Jobs the search matched when the action began.
    pub matched: i64,
    /// Jobs the action changed (the rest had ended, or were not in the state it acts on).
    pub acted: i64,
}

/// Pure: whether `matched` jobs are within `cap`, or the error that says to narrow the search.
pub fn within_cap(matched: i64, cap: i64) -> Result<()> {
    if matched > cap {
        return Err(EngineError::Invalid(format!(
            "the search matches more than {cap} jobs, the most one bulk action takes: narrow it (by state, kind or days)"
        )));
    }
    Ok(())
}

/// How many jobs `search` matches, counted up to one past `cap` (what the console shows
/// before it asks to confirm).
pub async fn preview(pool: &PgPool, search: &JobSearch, cap: i64) -> Result<i64> {
    count_matching(pool, search, cap + 1).await
}

/// Apply `action` to every job `search` matches, refusing more than `cap`.
pub async fn run(
    pool: &PgPool,
    hooks: &dyn TerminalHooks,
    search: &JobSearch,
    action: BulkAction,
    cap: i64,
    actor: &str,
) -> Result<BulkDone> {
    let ids = matching_ids(pool, search, cap + 1).await?;
    let matched = ids.len() as i64;
    within_cap(matched, cap)?;
    let mut acted = 0i64;
    for batch in ids.chunks(BATCH) {
        acted += match action {
            BulkAction::Cancel => {
                let mut n = 0;
                for id in batch {
                    let outcome = super::cancel(pool, hooks, *id, actor, false).await;
                    match outcome {
                        Ok(super::Canceled::Now | super::Canceled::Requested) => n += 1,
                        Ok(super::Canceled::AlreadyEnded(_)) | Err(EngineError::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                }
                n
            }
            BulkAction::Replay => dlq::replay(pool, hooks, &Selection::Batch(batch.to_vec()), actor).await?.ids.len() as i64,
            BulkAction::Discard => dlq::discard(pool, &Selection::Batch(batch.to_vec()), actor).await? as i64,
        };
    }
    let mut conn = pool.acquire().await?;
    let counts = format!("{acted} of {matched} matched");
    audit(&mut conn, actor, &format!("bulk_{}", action.as_str()), Some(&search.describe()), "", &counts).await?;
    Ok(BulkDone { matched, acted })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_past_the_cap_is_refused_with_a_way_forward() {
        assert!(within_cap(10_000, 10_000).is_ok());
        assert!(within_cap(0, 10_000).is_ok());
        let refused = within_cap(10_001, 10_000).unwrap_err().to_string();
        assert!(refused.contains("narrow"), "{refused}");
    }

    #[test]
    fn actions_read_back_from_their_names() {
        for action in [BulkAction::Cancel, BulkAction::Replay, BulkAction::Discard] {
            assert_eq!(BulkAction::parse(action.as_str()), Some(action));
        }
        assert_eq!(BulkAction::parse("delete"), None);
    }
}
