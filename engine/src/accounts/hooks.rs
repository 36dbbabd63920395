//! Accounts at the queue's terminal transitions: in-flight down on done, failed and canceled,
//! the settlement on failed (with a notice) and on canceled (what `sluice_types::settlement`
//! says is given back); a replay from the DLQ counts in flight again (free: the refund stands).

use sqlx::PgConnection;

use sluice_types::settlement::{refund_on_failure, Fault, FREE_UNREADABLE_PER_DAY};
use sluice_types::FailureKind;

use super::ledger;
use super::notices::{self, OperatorAction};
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
    /// Its parts answered, and its parts (1 for a document in one call).
    parts_done: i32,
    parts_total: i32,
    /// Its answered parts were downloaded before it ended.
    parts_read: bool,
}

async fn settlement_of(conn: &mut PgConnection, job: &TerminalJob) -> Result<Settlement, sqlx::Error> {
    sqlx::query_as(
        "SELECT least(coalesce(settled_cost, cost), cost)::int8 AS price, failed_unreadable AS unreadable,
                cancel_kept_credits::int8 AS kept, parts_done, coalesce(parts_total, 1) AS parts_total,
                EXISTS (SELECT 1 FROM parts_read r WHERE r.job_id = jobs.id) AS parts_read
         FROM jobs WHERE id = $1",
    )
    .bind(job.id)
    .fetch_one(conn)
    .await
}

/// Whose a failure is: the document's when it is invalid input (unreadable, or answered in
/// part and then not), or when its answered parts were downloaded before it failed (they were
/// had, so they are paid for), else ours or the provider's.
async fn fault_of(conn: &mut PgConnection, job: &TerminalJob, settlement: &Settlement) -> Result<Fault, sqlx::Error> {
    Ok(match job.failure {
        _ if settlement.unreadable => {
            Fault::Unreadable { refunded_today: ledger::unreadable_refunded_today(conn, job.owner_id, job.id).await? }
        }
        Some((FailureKind::InvalidInput, _)) => Fault::Document {
            calls_made: settlement.parts_done.max(0) as u32,
            calls_total: settlement.parts_total.max(1) as u32,
        },
        _ if settlement.parts_read && settlement.parts_done > 0 => Fault::Document {
            calls_made: settlement.parts_done as u32,
            calls_total: settlement.parts_total.max(1) as u32,
        },
        _ => Fault::Ours,
    })
}

/// Why a failed job is charged at all, in the user's words.
fn charged_because(fault: Fault) -> Option<String> {
    match fault {
        Fault::Ours => None,
        Fault::Unreadable { .. } => {
            Some(format!("only {FREE_UNREADABLE_PER_DAY} unreadable documents a day are refunded"))
        }
        Fault::Document { calls_made, calls_total } => {
            Some(format!("the provider had answered {calls_made} of its {calls_total} parts"))
        }
    }
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
            notices::mail_done(tx, job).await
        })
    }

    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            let settlement = settlement_of(tx, job).await?;
            let fault = fault_of(tx, job, &settlement).await?;
            let refund = refund_on_failure(i64::from(job.cost), settlement.price, fault);
            let reason = job.failure.as_ref().map(|(_, reason)| reason.as_str()).unwrap_or("it failed");
            let documents_fault = matches!(job.failure, Some((FailureKind::InvalidInput, _)));
            let why = match fault {
                // Kept because its answered parts were downloaded, though the failure is ours.
                Fault::Document { calls_made, calls_total } if settlement.parts_read && !documents_fault => {
                    Some(format!("the {calls_made} of its {calls_total} parts answered had been downloaded"))
                }
                _ => charged_because(fault),
            };
            let note = match &why {
                Some(why) if refund < i64::from(job.cost) => format!("{reason}; charged: {why}"),
                _ => reason.to_string(),
            };
            ledger::refund_job(tx, job, refund, &note).await?;
            // Once per job, like the refund (a replayed job failing again is told nothing new).
            notices::add_refund_notice(tx, job, refund, why).await?;
            notices::mail_failed(tx, job, refund).await
        })
    }

    /// Replayed: in flight again, and its owner told an operator runs it again.
    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, 1).await?;
            notices::add_operator_notice(tx, job, OperatorAction::Replayed).await
        })
    }

    /// Discarded: its owner told it will not be run again.
    fn on_discarded<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(notices::add_operator_notice(tx, job, OperatorAction::Discarded))
    }

    /// Canceled: out of flight and refunded less what the cancel keeps (fixed when it was
    /// asked for), once, by the ledger's unique index. No notice: the user (or an admin, whom
    /// the audit log names) asked for it.
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(async move {
            change_in_flight(tx, job.owner_id, -1).await?;
            let settlement = settlement_of(tx, job).await?;
            let cost = i64::from(job.cost);
            let mut refund = cost - settlement.kept;
            let mut note =
                if settlement.kept > 0 { "canceled after the provider call started" } else { "canceled" }.to_string();
            // Canceled while read: the reader's work counts like an unreadable document's.
            if settlement.unreadable {
                let fault = Fault::Unreadable {
                    refunded_today: ledger::unreadable_refunded_today(tx, job.owner_id, job.id).await?,
                };
                let allowed = refund_on_failure(cost, settlement.price, fault);
                if allowed < refund {
                    refund = allowed;
                    note = format!("canceled while read; charged: {}", charged_because(fault).unwrap_or_default());
                }
            }
            ledger::refund_job(tx, job, refund, &note).await?;
            Ok(())
        })
    }
}
