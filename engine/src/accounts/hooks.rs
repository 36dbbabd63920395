//! Accounts at the queue's terminal transitions: in-flight down on done, failed and canceled,
//! the refund on failed (with a notice) and on canceled; a replay from the DLQ counts in flight again (free: the
//! refund stands).

use sqlx::PgConnection;

use super::{ledger, notices};
use crate::queue::hooks::{HookResult, TerminalHooks, TerminalJob};

/// The hooks the server runs the queue with.
#[derive(Clone, Copy, Debug, Default)]
pub struct AccountHooks;

/// Move a user's in-flight count (never below zero).
async fn change_in_flight(conn: &mut PgConnection, user_id: i64, delta: i32) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE users SET in_flight = greatest(in_flight + $2, 0) WHERE id = $1")
        .bind(user_id)
        .bind(delta)
        .execute(conn)
        .await?;
    Ok(())
}

impl TerminalHooks for AccountHooks {
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(change_in_flight(tx, job.owner_id, -1))
    }

    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            ledger::refund_job(tx, job).await?;
            notices::add_refund_notice(tx, job).await?;
            Ok(())
        })
    }

    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(change_in_flight(tx, job.owner_id, 1))
    }

    /// Canceled: out of flight and refunded (once, by the ledger's unique index). No notice:
    /// the user (or an admin, whom the audit log names) asked for it.
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            ledger::refund_job(tx, job).await?;
            Ok(())
        })
    }
}
