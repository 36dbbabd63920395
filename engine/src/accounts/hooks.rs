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

/// What the job's document costs: its settled price (a PDF admitted at a hold), else its cost.
async fn settled_price(conn: &mut PgConnection, job: &TerminalJob) -> Result<i64, sqlx::Error> {
    let settled: Option<i32> =
        sqlx::query_scalar("SELECT settled_cost FROM jobs WHERE id = $1").bind(job.id).fetch_one(conn).await?;
    Ok(i64::from(settled.unwrap_or(job.cost).min(job.cost)))
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
            let price = settled_price(tx, job).await?;
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
            let unreadable: bool = sqlx::query_scalar("SELECT failed_unreadable FROM jobs WHERE id = $1")
                .bind(job.id)
                .fetch_one(&mut *tx)
                .await?;
            let earlier =
                if unreadable { ledger::unreadable_refunded_today(tx, job.owner_id, job.id).await? } else { 0 };
            let price = settled_price(tx, job).await?;
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
            let kept: i32 = sqlx::query_scalar("SELECT cancel_kept_credits FROM jobs WHERE id = $1")
                .bind(job.id)
                .fetch_one(&mut *tx)
                .await?;
            let note = if kept > 0 { "canceled after the provider call started" } else { "canceled" };
            ledger::refund_job(tx, job, i64::from(job.cost - kept), note).await?;
            Ok(())
        })
    }
}
