//! Accounts at the queue's terminal transitions: in-flight down on done, failed and canceled,
//! the settlement on failed (with a notice) and on canceled (what `sluice_types::settlement`
//! says is given back); a replay from the DLQ counts in flight again (free: the refund stands).

use sqlx::PgConnection;

use sluice_types::settlement::{refund_on_failure, FREE_UNREADABLE_PER_DAY};

use super::{ledger, notices};
use crate::queue::hooks::{HookResult, TerminalHooks, TerminalJob};

/// The hooks the server runs the queue with.
#[derive(Clone, Copy, Debug, Default)]
pub struct AccountHooks;

/// What settling an ended job depends on, read in one query.
#[derive(sqlx::FromRow)]
struct Settlement {
    /// What its document costs: its settled price (a PDF admitted at a hold), else its cost.
    price: i64,
    /// The reader could not read it (counts against the daily allowance).
    unreadable: bool,
    /// What its cancel keeps (fixed when the cancel was asked for).
    kept: i64,
}

async fn settlement_of(conn: &mut PgConnection, job: &TerminalJob) -> Result<Settlement, sqlx::Error> {
    sqlx::query_as(
        "SELECT least(coalesce(settled_cost, cost), cost)::int8 AS price, failed_unreadable AS unreadable,
                cancel_kept_credits::int8 AS kept
         FROM jobs WHERE id = $1",
    )
    .bind(job.id)
    .fetch_one(conn)
    .await
}

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
    /// Done: out of flight, and a PDF admitted at a hold gets back what its text's price
    /// left over (in this transaction, once).
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            let price = settlement_of(tx, job).await?.price;
            if price < i64::from(job.cost) {
                ledger::refund_job(tx, job, i64::from(job.cost) - price, "settled to the price of its text").await?;
            }
            Ok(())
        })
    }

    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            // Only the reader's failures count (not a policy refusal such as a dense PDF).
            let Settlement { price, unreadable, .. } = settlement_of(tx, job).await?;
            let earlier =
                if unreadable { ledger::unreadable_refunded_today(tx, job.owner_id, job.id).await? } else { 0 };
            let refund = refund_on_failure(i64::from(job.cost), price, unreadable, earlier);
            let reason = job.failure.as_ref().map(|(_, reason)| reason.as_str()).unwrap_or("it failed");
            let note = if refund < i64::from(job.cost) {
                format!("{reason}; charged: more than {FREE_UNREADABLE_PER_DAY} unreadable documents in a day")
            } else {
                reason.to_string()
            };
            ledger::refund_job(tx, job, refund, &note).await?;
            // Once per job, like the refund (a replayed job failing again is told nothing new).
            notices::add_refund_notice(tx, job, refund).await?;
            Ok(())
        })
    }

    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(change_in_flight(tx, job.owner_id, 1))
    }

    /// Canceled: out of flight and refunded less what the cancel keeps (fixed when it was
    /// asked for), once, by the ledger's unique index. No notice: the user (or an admin, whom
    /// the audit log names) asked for it.
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            let kept = settlement_of(tx, job).await?.kept;
            let note = if kept > 0 { "canceled after the provider call started" } else { "canceled" };
            ledger::refund_job(tx, job, i64::from(job.cost) - kept, note).await?;
            Ok(())
        })
    }
}
