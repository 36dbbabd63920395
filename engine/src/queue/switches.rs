//! The kill switch and the global concurrency gate: one persisted row, audited, announced.

use std::time::Duration;

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
    /// When a timed pause ends by itself (None: paused until someone resumes, or running).
    pub resume_at: Option<DateTime<Utc>>,
    /// Seconds until then, by the database's clock (the one the end is kept by).
    pub resume_in_secs: Option<f64>,
}

/// The longest timed pause: a week (longer is a pause without an end).
pub const PAUSE_MAX_MINUTES: u32 = 7 * 24 * 60;

/// Pure: a pause length as an operator writes it (`10m`, `2h`, `1d`, `90` minutes) in minutes,
/// 1 to [`PAUSE_MAX_MINUTES`].
pub fn parse_pause(text: &str) -> std::result::Result<u32, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, "m"),
    };
    let per_unit = match unit.trim() {
        "m" | "min" | "minutes" => 1,
        "h" | "hours" => 60,
        "d" | "days" => 24 * 60,
        other => return Err(format!("unknown unit {other:?}: write 10m, 2h or 1d")),
    };
    let minutes = number.parse::<u32>().ok().and_then(|n| n.checked_mul(per_unit));
    match minutes {
        Some(m) if (1..=PAUSE_MAX_MINUTES).contains(&m) => Ok(m),
        _ => Err(format!("a timed pause lasts 1 minute to {} days, not {text:?}", PAUSE_MAX_MINUTES / 1440)),
    }
}

/// The switches as they are now.
pub async fn read(pool: &PgPool) -> Result<QueueSettings> {
    Ok(sqlx::query_as(
        "SELECT processing_enabled, gate_size, processing_changed_at, processing_changed_by, resume_at,
                greatest(extract(epoch FROM resume_at - now()), 0)::float8 AS resume_in_secs
         FROM queue_settings WHERE id = 1",
    )
    .fetch_one(pool)
    .await?)
}

/// Flip the kill switch. Workers in every process stop claiming at once (claims read the flag
/// in their transaction); resuming wakes idle workers through NOTIFY. Audited. A pause set
/// here has no end; a resume ends a timed pause early.
pub async fn set_processing(pool: &PgPool, enabled: bool, actor: &str) -> Result<QueueSettings> {
    switch(pool, enabled, None, actor).await
}

/// Pause for `minutes`, then resume by itself (the maintenance tick of any process, so it
/// outlives a restart). A timed pause again sets the new end; a pause without an end (someone's
/// incident) is not turned into one that ends by itself: resume it first. Audited.
pub async fn pause_for(pool: &PgPool, minutes: u32, actor: &str) -> Result<QueueSettings> {
    if !(1..=PAUSE_MAX_MINUTES).contains(&minutes) {
        return Err(EngineError::InvalidSetting(format!(
            "a timed pause lasts 1 to {PAUSE_MAX_MINUTES} minutes, not {minutes}"
        )));
    }
    let mut tx = pool.begin().await?;
    let (enabled, resume_at, by): (bool, Option<DateTime<Utc>>, String) = sqlx::query_as(
        "SELECT processing_enabled, resume_at, processing_changed_by FROM queue_settings WHERE id = 1 FOR UPDATE",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !enabled && resume_at.is_none() {
        return Err(EngineError::Invalid(format!(
            "processing is already paused without an end (by {by}); resume it first to pause for a while"
        )));
    }
    change(&mut tx, false, Some(Duration::from_secs(u64::from(minutes) * 60)), actor).await?;
    tx.commit().await?;
    read(pool).await
}

/// Who holds processing after a provider refused for its quota or spend limit.
pub const PROVIDER_HOLD_ACTOR: &str = "provider (its quota or spend limit is reached)";

/// The provider is out of quota: hold processing for `hold` in the caller's transaction (a
/// timed pause; when it ends a call tries again, and another refusal holds it again), unless
/// an operator paused it without an end or for longer (their pause stays theirs: a hold only
/// ever lengthens a pause). The alert rule `provider_held` tells the operator.
pub async fn hold_for_provider(tx: &mut sqlx::PgConnection, hold: Duration) -> Result<()> {
    let hold = hold.max(Duration::from_secs(1));
    let (enabled, ends_later, held_already): (bool, Option<bool>, bool) = sqlx::query_as(
        "SELECT processing_enabled, resume_at > now() + make_interval(secs => $1),
                processing_changed_by = $2 AND resume_at > now()
         FROM queue_settings WHERE id = 1 FOR UPDATE",
    )
    .bind(hold.as_secs_f64())
    .bind(PROVIDER_HOLD_ACTOR)
    .fetch_one(&mut *tx)
    .await?;
    // Paused without an end (`resume_at` null), or until later than the hold would, or held
    // for the provider already (the other calls refused in the same moment): kept as it is.
    if !enabled && (ends_later.is_none_or(|later| later) || held_already) {
        return Ok(());
    }
    change(tx, false, Some(hold), PROVIDER_HOLD_ACTOR).await
}

/// Resume processing if a timed pause has run out; true if it did. Cheap (one indexed row),
/// so every process's maintenance asks every few seconds.
pub async fn resume_if_due(pool: &PgPool) -> Result<bool> {
    let due: bool = sqlx::query_scalar(
        "SELECT NOT processing_enabled AND resume_at IS NOT NULL AND resume_at <= now() FROM queue_settings WHERE id = 1",
    )
    .fetch_one(pool)
    .await?;
    if !due {
        return Ok(false);
    }
    let mut tx = pool.begin().await?;
    // Checked again under the lock: another process, or an operator, may have got there first.
    let still: bool = sqlx::query_scalar(
        "SELECT NOT processing_enabled AND resume_at IS NOT NULL AND resume_at <= now()
         FROM queue_settings WHERE id = 1 FOR UPDATE",
    )
    .fetch_one(&mut *tx)
    .await?;
    if still {
        change(&mut tx, true, None, "timer (the timed pause ended)").await?;
    }
    tx.commit().await?;
    Ok(still)
}

async fn switch(pool: &PgPool, enabled: bool, pause: Option<Duration>, actor: &str) -> Result<QueueSettings> {
    let mut tx = pool.begin().await?;
    change(&mut tx, enabled, pause, actor).await?;
    tx.commit().await?;
    read(pool).await
}

/// The switch's change in the caller's transaction: the flag, its end, the pause record, the
/// audit entry and the workers' wake-up.
async fn change(tx: &mut sqlx::PgConnection, enabled: bool, pause: Option<Duration>, actor: &str) -> Result<()> {
    let old: bool = sqlx::query_scalar("SELECT processing_enabled FROM queue_settings WHERE id = 1 FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("UPDATE queue_settings SET resume_at = now() + make_interval(secs => $1::float8) WHERE id = 1")
        .bind(pause.map(|p| p.as_secs_f64()))
        .execute(&mut *tx)
        .await?;
    if old == enabled && !enabled {
        // Paused already: the pause is now this actor's (an operator's pause over a provider's
        // hold is the operator's, and the `provider_held` alert reads who paused).
        sqlx::query("UPDATE queue_settings SET processing_changed_by = $1 WHERE id = 1")
            .bind(actor)
            .execute(&mut *tx)
            .await?;
    }
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
    let new = match pause {
        Some(p) if p.as_secs() % 60 == 0 => format!("off for {} min", p.as_secs() / 60),
        Some(p) => format!("off for {} s", p.as_secs()),
        None => on_off(enabled).to_string(),
    };
    audit(&mut *tx, actor, "processing", None, on_off(old), &new).await?;
    super::notify_workers(&mut *tx).await?;
    if !enabled {
        super::notify_pause(&mut *tx).await?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_lengths_read_as_an_operator_writes_them() {
        assert_eq!(parse_pause("10m"), Ok(10));
        assert_eq!(parse_pause("10"), Ok(10));
        assert_eq!(parse_pause("2h"), Ok(120));
        assert_eq!(parse_pause("1d"), Ok(1440));
        assert_eq!(parse_pause(" 7d "), Ok(PAUSE_MAX_MINUTES));
        for bad in ["", "0m", "8d", "10s", "-5m", "m", "99999999999h", "1.5h"] {
            assert!(parse_pause(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
