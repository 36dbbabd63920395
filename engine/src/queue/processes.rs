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

/// Say this process is alive with `slots` worker slots (an upsert; cheap enough per beat).
pub async fn announce(pool: &PgPool, name: &str, slots: usize, heartbeat: Duration) -> Result<()> {
    sqlx::query(
        "INSERT INTO worker_processes (name, slots, heartbeat_secs) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET slots = EXCLUDED.slots, heartbeat_secs = EXCLUDED.heartbeat_secs, seen_at = now()",
    )
    .bind(name)
    .bind(slots.min(i32::MAX as usize) as i32)
    .bind(heartbeat.as_secs_f64().max(0.001))
    .execute(pool)
    .await?;
    Ok(())
}

/// This process stops working (graceful shutdown).
pub async fn retire(pool: &PgPool, name: &str) -> Result<()> {
    sqlx::query("DELETE FROM worker_processes WHERE name = $1").bind(name).execute(pool).await?;
    Ok(())
}

/// The processes seen within three of their heartbeats, and their slots.
pub async fn live(pool: &PgPool) -> Result<LiveSlots> {
    let (processes, slots): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(slots), 0)::int8 FROM worker_processes
         WHERE seen_at > now() - make_interval(secs => 3 * heartbeat_secs + 1)",
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
