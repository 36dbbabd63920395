//! Where a user's waiting jobs stand in line, read from the database: due jobs are claimed in
//! tag order (see [`super::policy::fair_tags`]), so a job's place is the count of due jobs
//! before it in that order. The estimate of its start is [`super::policy::position`]'s.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::policy::position::estimated_start;
use crate::error::Result;

/// Where an owner's due waiting jobs stand in line, with what their start estimates need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaitingLine {
    /// Jobs claimed before each of the owner's due waiting jobs.
    pub ahead: HashMap<Uuid, u64>,
    /// Gate slots not taken by running jobs (0 while processing is paused).
    pub free_slots: u64,
    /// Jobs reaching done or failed per second over the last 5 minutes.
    pub finishing_per_sec: f64,
    pub processing_enabled: bool,
}

impl WaitingLine {
    /// The estimated wait before `job` starts, if it is waiting and there is a rate to go by.
    pub fn estimated_start(&self, job: Uuid) -> Option<Duration> {
        if !self.processing_enabled {
            return None;
        }
        estimated_start(*self.ahead.get(&job)?, self.free_slots, self.finishing_per_sec)
    }
}

/// What every answer about the line shares: the kill switch, the gate's free slots and the
/// recent rate of finishing.
#[derive(Debug)]
struct LineLoad {
    processing_enabled: bool,
    free_slots: u64,
    finishing_per_sec: f64,
}

impl LineLoad {
    async fn read(pool: &PgPool) -> Result<LineLoad> {
        let settings = super::switches::read(pool).await?;
        let running: i64 =
            sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'running'").fetch_one(pool).await?;
        let finished: i64 =
            sqlx::query_scalar("SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes'")
                .fetch_one(pool)
                .await?;
        let free_slots = if settings.processing_enabled {
            (settings.gate_size.max(0) as u64).saturating_sub(running.max(0) as u64)
        } else {
            0
        };
        Ok(LineLoad {
            processing_enabled: settings.processing_enabled,
            free_slots,
            finishing_per_sec: finished as f64 / 300.0,
        })
    }

    fn line(&self, ahead: HashMap<Uuid, u64>) -> WaitingLine {
        WaitingLine {
            ahead,
            free_slots: self.free_slots,
            finishing_per_sec: self.finishing_per_sec,
            processing_enabled: self.processing_enabled,
        }
    }
}

/// Where the given jobs of an owner stand in line (those that are due and waiting), with what
/// their start estimates need. Reads the due jobs in claim order up to the last of these.
pub async fn waiting_line(pool: &PgPool, owner_id: i64, jobs: &[Uuid]) -> Result<WaitingLine> {
    let load = LineLoad::read(pool).await?;
    let places: Vec<(Uuid, i64)> = sqlx::query_as(
        "WITH mine AS (
             SELECT fair_tag FROM waiting_jobs WHERE owner_id = $1 AND id = ANY($2) AND run_at <= now()
         )
         SELECT id, ahead FROM (
             SELECT w.id, w.owner_id, row_number() OVER (ORDER BY w.fair_tag, w.run_at, w.id) - 1 AS ahead
             FROM waiting_jobs w
             WHERE w.run_at <= now() AND w.fair_tag <= (SELECT max(fair_tag) FROM mine)
         ) line
         WHERE owner_id = $1 AND id = ANY($2)",
    )
    .bind(owner_id)
    .bind(jobs)
    .fetch_all(pool)
    .await?;
    Ok(load.line(places.into_iter().map(|(id, ahead)| (id, ahead.max(0) as u64)).collect()))
}

/// Where a new job of an owner's would stand if it were admitted now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewJobPlace {
    /// Jobs claimed before it.
    pub ahead: u64,
    /// Its estimated wait to start, when there is a rate to go by and processing is on.
    pub starts_in: Option<Duration>,
    pub processing_enabled: bool,
}

/// Where a new job of `owner_id`'s would stand if admitted now: after the owner's due
/// waiting jobs, in the claim's fair order among everyone else's (for an upload's estimate).
pub async fn place_for_new_job(pool: &PgPool, owner_id: i64) -> Result<NewJobPlace> {
    let load = LineLoad::read(pool).await?;
    // It would be tagged where its owner's line ends, or at the virtual time, and be due last.
    let ahead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM waiting_jobs w
         WHERE w.run_at <= now()
           AND w.fair_tag <= (SELECT greatest(q.virtual_time,
                                              coalesce((SELECT l.finish_tag FROM owner_lines l WHERE l.owner_id = $1), 0))
                              FROM queue_settings q WHERE q.id = 1)",
    )
    .bind(owner_id)
    .fetch_one(pool)
    .await?;
    let ahead = ahead.max(0) as u64;
    let starts_in =
        load.processing_enabled.then(|| estimated_start(ahead, load.free_slots, load.finishing_per_sec)).flatten();
    Ok(NewJobPlace { ahead, starts_in, processing_enabled: load.processing_enabled })
}

/// Everyone's place in line at one moment, read in one query and answered from memory: with
/// 10,000 users polling every 2 s, asking the database per poll would cost seconds of database
/// time every second; one read a second per process costs milliseconds.
#[derive(Debug)]
pub struct LineSnapshot {
    load: LineLoad,
    /// Each due waiting job's owner and the due jobs before it in claim order.
    due: HashMap<Uuid, (i64, u64)>,
    /// Waiting jobs not due yet (retries scheduled later): no place in line.
    later: HashSet<Uuid>,
}

/// Waiting jobs read into one snapshot at most; past it, polls ask the database as before.
const SNAPSHOT_MAX_JOBS: i64 = 100_000;

impl LineSnapshot {
    /// Read the line now; `None` when more jobs wait than a snapshot holds.
    pub async fn read(pool: &PgPool) -> Result<Option<LineSnapshot>> {
        let load = LineLoad::read(pool).await?;
        let waiting: Vec<(i64, Uuid, bool)> = sqlx::query_as(
            "SELECT owner_id, id, run_at <= now() FROM waiting_jobs ORDER BY fair_tag, run_at, id LIMIT $1",
        )
        .bind(SNAPSHOT_MAX_JOBS + 1)
        .fetch_all(pool)
        .await?;
        if waiting.len() as i64 > SNAPSHOT_MAX_JOBS {
            return Ok(None);
        }
        let mut due = HashMap::with_capacity(waiting.len());
        let mut later = HashSet::new();
        for (owner, id, is_due) in waiting {
            if is_due {
                due.insert(id, (owner, due.len() as u64));
            } else {
                later.insert(id);
            }
        }
        Ok(Some(LineSnapshot { load, due, later }))
    }

    /// `owner`'s jobs among `jobs` in line, as [`waiting_line`] answers; `None` when one of
    /// them is not in the snapshot (it came after it was read: ask the database).
    pub fn line_for(&self, owner: i64, jobs: &[Uuid]) -> Option<WaitingLine> {
        let mut ahead = HashMap::with_capacity(jobs.len());
        for id in jobs {
            match self.due.get(id) {
                Some(&(job_owner, before)) if job_owner == owner => {
                    ahead.insert(*id, before);
                }
                None if self.later.contains(id) => {}
                _ => return None,
            }
        }
        Some(self.load.line(ahead))
    }
}

/// One snapshot of the line per process, read again when a poll finds it older than a second
/// (one poll reads; the others wait for it and share it). When no snapshot can be had (too many
/// waiting, or the read failed), that too is remembered for the second, and polls ask the
/// database directly rather than queue up behind another attempt.
#[derive(Debug, Default)]
pub struct SharedLine {
    current: std::sync::Mutex<Option<(std::time::Instant, Option<std::sync::Arc<LineSnapshot>>)>>,
    reading: tokio::sync::Mutex<()>,
}

/// How old a snapshot may be when a poll uses it.
const SNAPSHOT_FOR: Duration = Duration::from_secs(1);

impl SharedLine {
    /// The snapshot taken less than a second ago (`Some(None)`: none could be had then).
    fn fresh(&self) -> Option<Option<std::sync::Arc<LineSnapshot>>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().filter(|(at, _)| at.elapsed() < SNAPSHOT_FOR).map(|(_, s)| s.clone())
    }

    async fn snapshot(&self, pool: &PgPool) -> Result<Option<std::sync::Arc<LineSnapshot>>> {
        if let Some(snapshot) = self.fresh() {
            return Ok(snapshot);
        }
        let _turn = self.reading.lock().await;
        if let Some(snapshot) = self.fresh() {
            return Ok(snapshot);
        }
        // Timed from before the read, so an answer is never older than the second.
        let taken = std::time::Instant::now();
        let read = LineSnapshot::read(pool).await.map(|s| s.map(std::sync::Arc::new));
        let kept = read.as_ref().ok().cloned().flatten();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((taken, kept));
        read
    }

    /// Where `owner`'s `jobs` stand: from the shared snapshot, or from the database when a job
    /// is newer than the snapshot or there is no snapshot.
    pub async fn waiting_line(&self, pool: &PgPool, owner: i64, jobs: &[Uuid]) -> Result<WaitingLine> {
        match self.snapshot(pool).await?.and_then(|s| s.line_for(owner, jobs)) {
            Some(line) => Ok(line),
            None => waiting_line(pool, owner, jobs).await,
        }
    }
}
