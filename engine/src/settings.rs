//! The kill switch and the global concurrency gate: persisted, audited, announced.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};

use crate::error::{EngineError, Result};
use crate::JOBS_CHANNEL;

pub const GATE_MIN: i32 = 1;
pub const GATE_MAX: i32 = 70;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueSettings {
    pub processing_enabled: bool,
    pub gate_size: i32,
    pub processing_changed_at: DateTime<Utc>,
    pub processing_changed_by: String,
}

pub async fn read(pool: &PgPool) -> Result<QueueSettings> {
    let row = sqlx::query(
        "SELECT processing_enabled, gate_size, processing_changed_at, processing_changed_by
         FROM queue_settings WHERE id = 1",
    )
    .fetch_one(pool)
    .await?;
    Ok(QueueSettings {
        processing_enabled: row.get(0),
        gate_size: row.get(1),
        processing_changed_at: row.get(2),
        processing_changed_by: row.get(3),
    })
}

/// Flip the kill switch. Workers in every process stop claiming at once (claims read the flag
/// in their transaction); resuming wakes idle workers through NOTIFY. Audited.
pub async fn set_processing(pool: &PgPool, enabled: bool, actor: &str) -> Result<QueueSettings> {
    let mut tx = pool.begin().await?;
    let old: bool = sqlx::query_scalar("SELECT processing_enabled FROM queue_settings WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    if old != enabled {
        sqlx::query(
            "UPDATE queue_settings SET processing_enabled = $1, processing_changed_at = now(),
             processing_changed_by = $2 WHERE id = 1",
        )
        .bind(enabled)
        .bind(actor)
        .execute(&mut *tx)
        .await?;
    }
    audit(&mut tx, actor, "processing", None, &on_off(old), &on_off(enabled)).await?;
    notify(&mut tx).await?;
    tx.commit().await?;
    read(pool).await
}

/// Resize the global gate (1 to 70). Audited; idle workers are woken to use new slots.
pub async fn set_gate_size(pool: &PgPool, size: i32, actor: &str) -> Result<QueueSettings> {
    if !(GATE_MIN..=GATE_MAX).contains(&size) {
        return Err(EngineError::InvalidSetting(format!(
            "the gate size must be between {GATE_MIN} and {GATE_MAX}, not {size}"
        )));
    }
    let mut tx = pool.begin().await?;
    let old: i32 =
        sqlx::query_scalar("SELECT gate_size FROM queue_settings WHERE id = 1 FOR UPDATE").fetch_one(&mut *tx).await?;
    sqlx::query("UPDATE queue_settings SET gate_size = $1 WHERE id = 1").bind(size).execute(&mut *tx).await?;
    audit(&mut tx, actor, "gate_size", None, &old.to_string(), &size.to_string()).await?;
    notify(&mut tx).await?;
    tx.commit().await?;
    read(pool).await
}

fn on_off(enabled: bool) -> String {
    if enabled { "on" } else { "off" }.to_string()
}

pub(crate) async fn notify(conn: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, 'work')").bind(JOBS_CHANNEL).execute(conn).await?;
    Ok(())
}

/// Append an audit record inside the caller's transaction.
pub async fn audit(
    conn: &mut sqlx::PgConnection,
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub subject: Option<String>,
    pub old_value: Option<String>,
    pub new_value: Option<String>,
}

pub async fn audit_log(pool: &PgPool, limit: i64) -> Result<Vec<AuditEntry>> {
    let rows = sqlx::query(
        "SELECT at, actor, action, subject, old_value, new_value FROM audit_log ORDER BY at DESC, id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| AuditEntry {
            at: r.get(0),
            actor: r.get(1),
            action: r.get(2),
            subject: r.get(3),
            old_value: r.get(4),
            new_value: r.get(5),
        })
        .collect())
}
