//! The worker processes alive and their slots: each pool announces itself at every heartbeat
//! and retires on a graceful shutdown; one that stops beating (killed) stops counting after
//! three missed beats. The gate is global, the slots are per process: the concurrency in
//! effect is the smaller of the two.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Result;

/// Worker slots alive across every process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveSlots {
    pub processes: i64,
    pub slots: i64,
}

/// Pure: how many jobs can run at once: the gate in force, unless fewer worker slots are alive.
pub fn effective_concurrency(gate_in_force: i64, live: LiveSlots) -> i64 {
    gate_in_force.min(live.slots).max(0)
}

/// What a process says of itself at each beat.
#[derive(Clone, Debug)]
pub struct Announcement<'a> {
    pub name: &'a str,
    /// `all` (web and workers), `web` or `worker`.
    pub role: &'a str,
    pub slots: usize,
    /// Jobs it runs now.
    pub running: usize,
    pub heartbeat: Duration,
}

/// The version every process reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Say this process is alive (an upsert; cheap enough per beat).
pub async fn announce(pool: &PgPool, me: &Announcement<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO worker_processes (name, role, version, slots, running, heartbeat_secs)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (name) DO UPDATE SET role = EXCLUDED.role, version = EXCLUDED.version, slots = EXCLUDED.slots,
             running = EXCLUDED.running, heartbeat_secs = EXCLUDED.heartbeat_secs, seen_at = now()",
    )
    .bind(me.name)
    .bind(me.role)
    .bind(VERSION)
    .bind(me.slots.min(i32::MAX as usize) as i32)
    .bind(me.running.min(i32::MAX as usize) as i32)
    .bind(me.heartbeat.as_secs_f64().max(0.001))
    .execute(pool)
    .await?;
    Ok(())
}

/// A process as the console lists it.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct ProcessRow {
    pub name: String,
    pub role: String,
    pub version: String,
    pub slots: i32,
    pub running: i32,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub seen_at: chrono::DateTime<chrono::Utc>,
    /// Seen within three of its heartbeats; false: it stopped beating (killed, hung, cut off).
    pub alive: bool,
}

/// The processes seen in the last day (the newest 200), live ones first.
pub async fn list(pool: &PgPool) -> Result<Vec<ProcessRow>> {
    Ok(sqlx::query_as(
        "SELECT name, role, version, slots, running, started_at, seen_at,
                seen_at > now() - make_interval(secs => 3 * heartbeat_secs + 1) AS alive
         FROM worker_processes WHERE seen_at > now() - interval '1 day'
         ORDER BY alive DESC, started_at DESC LIMIT 200",
    )
    .fetch_all(pool)
    .await?)
}

/// Forget processes not seen for a day (the upkeep sweep).
pub async fn forget_stopped(pool: &PgPool) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM worker_processes WHERE seen_at < now() - interval '1 day'")
        .execute(pool)
        .await?
        .rows_affected())
}

/// Record a process without workers (`web`) every `beat` until aborted, so the console lists
/// it beside the worker pools.
pub async fn keep_announcing(pool: PgPool, name: String, role: &'static str, beat: Duration) {
    let mut tick = tokio::time::interval(beat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let me = Announcement { name: &name, role, slots: 0, running: 0, heartbeat: beat };
        if let Err(e) = announce(&pool, &me).await {
            tracing::warn!(error = %e, "could not announce this process");
        }
    }
}

/// This process stops working (graceful shutdown).
pub async fn retire(pool: &PgPool, name: &str) -> Result<()> {
    sqlx::query("DELETE FROM worker_processes WHERE name = $1").bind(name).execute(pool).await?;
    Ok(())
}

/// The worker processes seen within three of their heartbeats, and their slots.
pub async fn live(pool: &PgPool) -> Result<LiveSlots> {
    let (processes, slots): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(slots), 0)::int8 FROM worker_processes
         WHERE seen_at > now() - make_interval(secs => 3 * heartbeat_secs + 1) AND role <> 'web'",
    )
    .fetch_one(pool)
    .await?;
    Ok(LiveSlots { processes, slots })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smaller_of_the_gate_and_the_live_slots_is_in_effect() {
        assert_eq!(effective_concurrency(24, LiveSlots { processes: 1, slots: 70 }), 24);
        assert_eq!(effective_concurrency(70, LiveSlots { processes: 1, slots: 24 }), 24);
        assert_eq!(effective_concurrency(24, LiveSlots::default()), 0, "no worker alive: nothing runs");
    }
}
