//! The credit ledger (append-only; the balance on `users` moves in the same transaction) and
//! the account hooks the queue runs at terminal transitions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::error::{EngineError, Result};
use crate::hooks::{HookResult, TerminalHooks, TerminalJob};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreditKind {
    Grant,
    Debit,
    Refund,
    Adjustment,
}

impl CreditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CreditKind::Grant => "grant",
            CreditKind::Debit => "debit",
            CreditKind::Refund => "refund",
            CreditKind::Adjustment => "adjustment",
        }
    }
}

/// Add (or, with a negative amount, take) credits: the ledger row and the balance together.
/// Fails with `Invalid` if the balance would go below zero.
pub async fn add_credits(
    conn: &mut PgConnection,
    user_id: i64,
    kind: CreditKind,
    amount: i64,
    actor: &str,
    note: Option<&str>,
) -> Result<i64> {
    let balance: Option<i64> = sqlx::query_scalar(
        "UPDATE users SET balance = balance + $2 WHERE id = $1 AND balance + $2 >= 0 RETURNING balance",
    )
    .bind(user_id)
    .bind(amount)
    .fetch_optional(&mut *conn)
    .await?;
    let balance = balance.ok_or_else(|| EngineError::Invalid("the balance cannot go below zero".into()))?;
    sqlx::query("INSERT INTO ledger (user_id, kind, amount, actor, note) VALUES ($1, $2, $3, $4, $5)")
        .bind(user_id)
        .bind(kind.as_str())
        .bind(amount)
        .bind(actor)
        .bind(note)
        .execute(&mut *conn)
        .await?;
    Ok(balance)
}

/// An admin's grant or adjustment, audited.
pub async fn admin_adjust(pool: &PgPool, user_id: i64, amount: i64, actor: &str, note: &str) -> Result<i64> {
    let mut tx = pool.begin().await?;
    let kind = if amount >= 0 { CreditKind::Grant } else { CreditKind::Adjustment };
    let balance = add_credits(&mut tx, user_id, kind, amount, actor, Some(note)).await?;
    crate::settings::audit(
        &mut tx,
        actor,
        "credits",
        Some(&format!("user {user_id}")),
        &amount.to_string(),
        &balance.to_string(),
    )
    .await?;
    tx.commit().await?;
    Ok(balance)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub id: i64,
    pub kind: String,
    pub amount: i64,
    pub job_id: Option<Uuid>,
    pub note: Option<String>,
    pub at: DateTime<Utc>,
}

pub async fn history(pool: &PgPool, user_id: i64, limit: i64) -> Result<Vec<LedgerEntry>> {
    let rows = sqlx::query(
        "SELECT id, kind, amount, job_id, note, at FROM ledger WHERE user_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
    )
    .bind(user_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| LedgerEntry {
            id: r.get(0),
            kind: r.get(1),
            amount: r.get(2),
            job_id: r.get(3),
            note: r.get(4),
            at: r.get(5),
        })
        .collect())
}

/// The sum of a user's ledger (equals the balance; checked by tests).
pub async fn ledger_sum(pool: &PgPool, user_id: i64) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT coalesce(sum(amount), 0)::int8 FROM ledger WHERE user_id = $1")
        .bind(user_id)
        .fetch_one(pool)
        .await?)
}

/// Refund a failed job's cost, at most once whatever races (the unique index on refunds
/// decides), with a notice for the user. Returns whether this call refunded.
pub async fn refund_job(conn: &mut PgConnection, job: &TerminalJob) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO ledger (user_id, kind, amount, job_id, note)
         SELECT $1, 'refund', $2, $3, $4 WHERE $2 > 0
         ON CONFLICT (job_id) WHERE kind = 'refund' DO NOTHING",
    )
    .bind(job.owner_id)
    .bind(job.cost as i64)
    .bind(job.id)
    .bind(job.failure.as_ref().map(|(_, reason)| reason.as_str()))
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if inserted {
        sqlx::query("UPDATE users SET balance = balance + $2 WHERE id = $1")
            .bind(job.owner_id)
            .bind(job.cost as i64)
            .execute(&mut *conn)
            .await?;
    }
    let reason = job.failure.as_ref().map(|(_, r)| r.as_str()).unwrap_or("it failed");
    let credits = if job.cost == 1 { "1 credit".to_string() } else { format!("{} credits", job.cost) };
    let message = if job.cost > 0 {
        format!("Your document could not be processed ({reason}). {credits} refunded.")
    } else {
        format!("Your document could not be processed ({reason}).")
    };
    sqlx::query(
        "INSERT INTO notices (user_id, job_id, kind, message) VALUES ($1, $2, 'refund', $3)
         ON CONFLICT (job_id) WHERE kind = 'refund' DO NOTHING",
    )
    .bind(job.owner_id)
    .bind(job.id)
    .bind(message)
    .execute(&mut *conn)
    .await?;
    Ok(inserted)
}

/// Accounts at the queue's terminal transitions: in-flight down on done and failed, the
/// refund and the notice on failed; a replay from the DLQ counts in flight again (free: the
/// refund stands).
#[derive(Clone, Copy, Debug, Default)]
pub struct AccountHooks;

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
            refund_job(tx, job).await?;
            Ok(())
        })
    }

    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        Box::pin(change_in_flight(tx, job.owner_id, 1))
    }
}
