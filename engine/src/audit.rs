//! The audit log: who changed what, written in the same transaction as the change.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use crate::error::Result;

/// Append an audit record inside the caller's transaction.
pub async fn audit(
    conn: &mut PgConnection,
    actor: &str,
    action: &str,
    subject: Option<&str>,
    old_value: &str,
    new_value: &str,
) -> Result<()> {
    record(conn, actor, action, subject, old_value, new_value).await.map(|_| ())
}

/// [`audit`], returning the entry's id: for an action that completes its entry when it ends
/// ([`complete`]).
pub async fn record(
    conn: &mut PgConnection,
    actor: &str,
    action: &str,
    subject: Option<&str>,
    old_value: &str,
    new_value: &str,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO audit_log (actor, action, subject, old_value, new_value) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(actor)
    .bind(action)
    .bind(subject)
    .bind(old_value)
    .bind(new_value)
    .fetch_one(conn)
    .await?)
}

/// Write the outcome of a long action into the entry it made before its first change (the
/// only change an audit entry ever gets: from "started" to its counts).
pub async fn complete(pool: &PgPool, id: i64, new_value: &str) -> Result<()> {
    sqlx::query("UPDATE audit_log SET new_value = $2 WHERE id = $1").bind(id).bind(new_value).execute(pool).await?;
    Ok(())
}

/// One audited change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    pub actor: String,
    /// What changed: `processing`, `gate_size`, `credits`, `dlq_replay`, `dlq_discard`.
    pub action: String,
    pub subject: Option<String>,
    pub old_value: Option<String>,
    pub new_value: Option<String>,
}

/// The newest `limit` entries, newest first.
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<AuditEntry>> {
    page(pool, 0, limit).await
}

/// `limit` entries after skipping the newest `offset` (a page of the console's audit log).
pub async fn page(pool: &PgPool, offset: i64, limit: i64) -> Result<Vec<AuditEntry>> {
    Ok(sqlx::query_as(
        "SELECT at, actor, action, subject, old_value, new_value FROM audit_log
         ORDER BY at DESC, id DESC LIMIT $1 OFFSET $2",
    )
    .bind(limit)
    .bind(offset.max(0))
    .fetch_all(pool)
    .await?)
}
