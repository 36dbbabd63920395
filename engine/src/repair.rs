//! Counter repair: the explicit, audited operator action for what reconciliation reports about
//! a user's counters (reconciliation itself fixes nothing). The ledger is the evidence, so a
//! balance is set to its ledger's sum; in flight is set to the jobs not yet ended.
//!
//! The users concerned are locked first and then read again in a new statement: admissions
//! and terminal transitions change these counters under the same row lock, so none is half
//! seen (under READ COMMITTED each statement sees what committed before it began).

use sqlx::PgPool;

use crate::audit::audit;
use crate::error::Result;

/// One counter set right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repaired {
    pub user_id: i64,
    /// `balance` or `in_flight`.
    pub counter: &'static str,
    pub was: i64,
    pub now: i64,
}

const COUNTERS: &str = "SELECT u.id, u.balance, coalesce(l.sum, 0)::bigint, u.in_flight::bigint, coalesce(j.open, 0)
     FROM users u
     LEFT JOIN (SELECT user_id, sum(amount) AS sum FROM ledger GROUP BY user_id) l ON l.user_id = u.id
     LEFT JOIN (SELECT owner_id, count(*) AS open FROM jobs WHERE state IN ('queued', 'running', 'retrying')
                GROUP BY owner_id) j ON j.owner_id = u.id
     WHERE ($1::bigint[] IS NULL OR u.id = ANY($1))
       AND (u.balance <> coalesce(l.sum, 0) OR u.in_flight <> coalesce(j.open, 0))
     ORDER BY u.id";

/// Set every user's balance and in-flight count to what the ledger and the jobs say, each
/// change audited as `actor`'s. Returns what was changed.
pub async fn repair_counters(pool: &PgPool, actor: &str) -> Result<Vec<Repaired>> {
    let mut tx = pool.begin().await?;
    let suspects: Vec<(i64, i64, i64, i64, i64)> =
        sqlx::query_as(COUNTERS).bind(None::<Vec<i64>>).fetch_all(&mut *tx).await?;
    if suspects.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = suspects.iter().map(|s| s.0).collect();
    sqlx::query("SELECT id FROM users WHERE id = ANY($1) ORDER BY id FOR UPDATE").bind(&ids).execute(&mut *tx).await?;
    let rows: Vec<(i64, i64, i64, i64, i64)> = sqlx::query_as(COUNTERS).bind(&ids).fetch_all(&mut *tx).await?;
    let mut repaired = Vec::new();
    for (user_id, balance, ledger, in_flight, open) in rows {
        let subject = format!("user {user_id}");
        if balance != ledger {
            sqlx::query("UPDATE users SET balance = $2 WHERE id = $1")
                .bind(user_id)
                .bind(ledger)
                .execute(&mut *tx)
                .await?;
            audit(&mut tx, actor, "repair_balance", Some(&subject), &balance.to_string(), &ledger.to_string()).await?;
            repaired.push(Repaired { user_id, counter: "balance", was: balance, now: ledger });
        }
        if in_flight != open {
            sqlx::query("UPDATE users SET in_flight = $2 WHERE id = $1")
                .bind(user_id)
                .bind(open as i32)
                .execute(&mut *tx)
                .await?;
            audit(&mut tx, actor, "repair_in_flight", Some(&subject), &in_flight.to_string(), &open.to_string())
                .await?;
            repaired.push(Repaired { user_id, counter: "in_flight", was: in_flight, now: open });
        }
    }
    tx.commit().await?;
    Ok(repaired)
}
