//! Periodic work that must run once per interval across all processes (reconciliation,
//! retention): each process asks often, and one conditional write on the task's row decides
//! whose turn it is. A process that dies mid-run loses only that run; the next interval's turn
//! goes to whoever asks first.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Result;

/// Whether it is `runner`'s turn to run `task` now: true for exactly one caller per `every`
/// across every process (the row's lock orders concurrent askers; the later ones then see the
/// run just taken). The first ask ever takes a turn.
pub async fn take_turn(pool: &PgPool, task: &str, every: Duration, runner: &str) -> Result<bool> {
    let taken: Option<i32> = sqlx::query_scalar(
        "INSERT INTO periodic_runs (task, last_run_at, last_runner) VALUES ($1, now(), $3)
         ON CONFLICT (task) DO UPDATE SET last_run_at = now(), last_runner = $3
             WHERE periodic_runs.last_run_at <= now() - make_interval(secs => $2)
         RETURNING 1",
    )
    .bind(task)
    .bind(every.as_secs_f64())
    .bind(runner)
    .fetch_optional(pool)
    .await?;
    Ok(taken.is_some())
}

/// Start `task`'s clock without running it, unless it already has one (a fleet that starts
/// does not all reconcile at once; the first run is one interval after the first start).
pub async fn start_clock(pool: &PgPool, task: &str, runner: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO periodic_runs (task, last_run_at, last_runner) VALUES ($1, now(), $2)
         ON CONFLICT (task) DO NOTHING",
    )
    .bind(task)
    .bind(runner)
    .execute(pool)
    .await?;
    Ok(())
}

/// Pure: how often a process asks whether a task of interval `every` is due: a tenth of the
/// interval (a run starts at most that late), but at most ten times a second and at least once
/// a minute.
pub fn ask_every(every: Duration) -> Duration {
    (every / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::ask_every;
    use std::time::Duration;

    #[test]
    fn asking_is_frequent_for_short_intervals_and_bounded_for_long_ones() {
        assert_eq!(ask_every(Duration::from_secs(3600)), Duration::from_secs(60));
        assert_eq!(ask_every(Duration::from_secs(100)), Duration::from_secs(10));
        assert_eq!(ask_every(Duration::from_secs(1)), Duration::from_millis(100));
        assert_eq!(ask_every(Duration::from_millis(50)), Duration::from_millis(100));
    }
}
