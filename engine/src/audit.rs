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
    sqlx::query("INSERT INTO audit_log (actor, action, subject, old_value, new_value) VALUES ($1, $2, $3, $4, $5)")
        .bind(actor)
        .bind(action)
        .bind(subject)
        .bind(old_value)
        .bind(new_value)
        .execute(conn)
        .await?;
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
