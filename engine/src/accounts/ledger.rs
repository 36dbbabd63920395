//! The credit ledger: append-only, and the balance on `users` moves in the same transaction.
//! Every ledger row is written here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::audit::audit;
use crate::error::{EngineError, Result};
use crate::queue::hooks::TerminalJob;

pub use sluice_types::CreditKind;

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
        .bind(kind)
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
    // A deleted account takes no grants (its refunds still land, through the hooks).
    let live: Option<i64> = sqlx::query_scalar("SELECT id FROM users WHERE id = $1 AND deleted_at IS NULL FOR UPDATE")
        .bind(user_id)
        .fetch_optional(&mut *tx)
        .await?;
    if live.is_none() {
        return Err(EngineError::NotFound);
    }
    let kind = if amount >= 0 { CreditKind::Grant } else { CreditKind::Adjustment };
    let balance = add_credits(&mut tx, user_id, kind, amount, actor, Some(note)).await?;
    audit(&mut tx, actor, "credits", Some(&format!("user {user_id}")), &amount.to_string(), &balance.to_string())
        .await?;
    tx.commit().await?;
    Ok(balance)
}

/// One ledger row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct LedgerEntry {
    pub id: i64,
    pub kind: CreditKind,
    pub amount: i64,
    pub job_id: Option<Uuid>,
    pub note: Option<String>,
    pub at: DateTime<Utc>,
}

/// A user's newest `limit` ledger rows, newest first.
pub async fn history(pool: &PgPool, user_id: i64, limit: i64) -> Result<Vec<LedgerEntry>> {
    Ok(sqlx::query_as(
        "SELECT id, kind, amount, job_id, note, at FROM ledger WHERE user_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
    )
    .bind(user_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

pub use sluice_types::MonthTotals;

/// A user's totals for the newest `months` months with any activity, newest first.
pub async fn monthly_totals(pool: &PgPool, user_id: i64, months: i64) -> Result<Vec<MonthTotals>> {
    Ok(sqlx::query_as(
        "WITH money AS (
             SELECT to_char(date_trunc('month', at AT TIME ZONE 'UTC'), 'YYYY-MM') AS month,
                    count(*) FILTER (WHERE kind = 'debit') AS documents,
                    coalesce(-sum(amount) FILTER (WHERE kind = 'debit'), 0) AS charged,
                    coalesce(sum(amount) FILTER (WHERE kind = 'refund'), 0) AS refunded
             FROM ledger WHERE user_id = $1 AND kind IN ('debit', 'refund') GROUP BY 1),
         usage AS (
             SELECT to_char(date_trunc('month', l.accepted_at AT TIME ZONE 'UTC'), 'YYYY-MM') AS month,
                    coalesce(sum(j.input_tokens), 0) AS input_tokens,
                    coalesce(sum(j.output_tokens), 0) AS output_tokens
             FROM job_listing l JOIN jobs j ON j.id = l.job_id WHERE l.owner_id = $1 GROUP BY 1)
         SELECT month, coalesce(documents, 0)::bigint AS documents, coalesce(charged, 0)::bigint AS charged,
                coalesce(refunded, 0)::bigint AS refunded, coalesce(input_tokens, 0)::bigint AS input_tokens,
                coalesce(output_tokens, 0)::bigint AS output_tokens
         FROM money FULL JOIN usage USING (month)
         ORDER BY month DESC LIMIT $2",
    )
    .bind(user_id)
    .bind(months)
    .fetch_all(pool)
    .await?)
}

/// The debit for an admitted job, inside admission's transaction (which has already taken the
/// balance in its conditional write). A second debit for the same job is refused by an index.
pub(crate) async fn debit_for_job(conn: &mut PgConnection, user_id: i64, job_id: uuid::Uuid, cost: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO ledger (user_id, kind, amount, job_id, note) VALUES ($1, 'debit', $2, $3, 'document accepted')",
    )
    .bind(user_id)
    .bind(-cost)
    .bind(job_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The sum of a user's ledger (equals the balance; checked by tests).
pub async fn ledger_sum(pool: &PgPool, user_id: i64) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT coalesce(sum(amount), 0)::int8 FROM ledger WHERE user_id = $1")
        .bind(user_id)
        .fetch_one(pool)
        .await?)
}

/// Settle a job that ended without a result: one `refund` row of `amount` credits (0 when the
/// job is charged after all; the row still records that it was settled and why), at most once
/// whatever races (the unique index on refunds decides). A job that cost nothing gets no row.
/// Returns whether this call settled it.
pub async fn refund_job(
    conn: &mut PgConnection,
    job: &TerminalJob,
    amount: i64,
    note: &str,
) -> Result<bool, sqlx::Error> {
    let amount = amount.clamp(0, i64::from(job.cost.max(0)));
    let inserted = sqlx::query(
        "INSERT INTO ledger (user_id, kind, amount, job_id, note)
         SELECT $1, 'refund', $2, $3, $4 WHERE $5 > 0
         ON CONFLICT (job_id) WHERE kind = 'refund' DO NOTHING",
    )
    .bind(job.owner_id)
    .bind(amount)
    .bind(job.id)
    .bind(note)
    .bind(job.cost)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if inserted && amount > 0 {
        // Counted when written (a transaction rolled back later would over-count by one).
        metrics::counter!("sluice_credits_refunded_total").increment(amount as u64);
        sqlx::query("UPDATE users SET balance = balance + $2 WHERE id = $1")
            .bind(job.owner_id)
            .bind(amount)
            .execute(&mut *conn)
            .await?;
    }
    Ok(inserted)
}

/// How many unreadable documents (failed as such, refused once read, or canceled while read)
/// `owner_id` was refunded for in full (free ones) in the last 24 hours, `job_id` aside. Run after the owner's row is locked (the in-flight update), so two failing at once
/// count each other.
pub async fn unreadable_refunded_today(
    conn: &mut PgConnection,
    owner_id: i64,
    job_id: uuid::Uuid,
) -> Result<u32, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j JOIN ledger l ON l.job_id = j.id AND l.kind = 'refund' AND l.amount = j.cost
         WHERE j.owner_id = $1 AND j.failed_unreadable AND j.state IN ('failed', 'canceled')
           AND j.finished_at > now() - interval '1 day' AND j.id <> $2",
    )
    .bind(owner_id)
    .bind(job_id)
    .fetch_one(conn)
    .await?;
    Ok(n.clamp(0, u32::MAX as i64) as u32)
}
