//! The kill switch and the global concurrency gate: one persisted row, audited, announced.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::audit::audit;
use crate::error::{EngineError, Result};

/// The smallest gate an admin may set.
pub const GATE_MIN: i32 = 1;
/// The largest gate an admin may set.
pub const GATE_MAX: i32 = 70;

/// The queue's switches as stored in `queue_settings`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct QueueSettings {
    /// False while an operator has paused processing (the kill switch).
    pub processing_enabled: bool,
    /// Jobs running at once across every process.
    pub gate_size: i32,
    pub processing_changed_at: DateTime<Utc>,
    pub processing_changed_by: String,
}

/// The switches as they are now.
pub async fn read(pool: &PgPool) -> Result<QueueSettings> {
    Ok(sqlx::query_as(
        "SELECT processing_enabled, gate_size, processing_changed_at, processing_changed_by
         FROM queue_settings WHERE id = 1",
    )
    .fetch_one(pool)
    .await?)
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
        // The pauses are kept so that paused time does not count as waiting (admission).
        let pause = if enabled {
            "UPDATE processing_pauses SET resumed_at = now() WHERE resumed_at IS NULL"
        } else {
            "INSERT INTO processing_pauses (paused_at) VALUES (now())"
        };
        sqlx::query(pause).execute(&mut *tx).await?;
    }
    audit(&mut tx, actor, "processing", None, on_off(old), on_off(enabled)).await?;
    super::notify_workers(&mut tx).await?;
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
    super::notify_workers(&mut tx).await?;
    tx.commit().await?;
    read(pool).await
}

fn on_off(enabled: bool) -> &'static str {
    if enabled {
        "on"
    } else {
        "off"
    }
}
