//! Where a user's waiting jobs stand in line, read from the database for the pure
//! [`super::policy::position`] estimate.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::policy::position::{estimated_start, jobs_ahead, OwnerLoad};
use crate::error::Result;

/// Where an owner's due waiting jobs stand in line, with what their start estimates need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaitingLine {
    /// Jobs claimed before each of the owner's due waiting jobs (see [`super::policy::position`]).
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

/// Other owners with due waiting jobs, each with its due jobs counted up to a cap. The owners
/// come from `sluice_waiting_owners()`, a read of the heads the claim keeps (`owner_heads`);
/// without it this would read every waiting job.
const CAPPED_LOADS: &str = "
    SELECT o.owner_id,
           (SELECT count(*) FROM (
                SELECT 1 FROM waiting_jobs j
                WHERE j.owner_id = o.owner_id AND j.run_at <= now()
                ORDER BY j.run_at, j.id LIMIT $2) due)
    FROM sluice_waiting_owners() o(owner_id) WHERE o.owner_id <> $1";

/// What every answer about the line shares: the kill switch, the gate's free slots, who runs
/// how many jobs, and the recent rate of finishing.
#[derive(Debug)]
struct LineLoad {
    processing_enabled: bool,
    free_slots: u64,
    finishing_per_sec: f64,
    running: HashMap<i64, u64>,
}

impl LineLoad {
    async fn read(pool: &PgPool) -> Result<LineLoad> {
        let settings = super::switches::read(pool).await?;
        // Each owner's running jobs and their token weight (the claim's fairness weighs tokens).
        let running: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT owner_id, count(*), sum(sluice_token_weight(est_input_tokens))::int8
             FROM jobs WHERE state = 'running' GROUP BY owner_id",
        )
        .fetch_all(pool)
        .await?;
        let finished: i64 =
            sqlx::query_scalar("SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes'")
                .fetch_one(pool)
                .await?;
        let running_total: u64 = running.iter().map(|(_, n, _)| *n as u64).sum();
        let running: HashMap<i64, u64> = running.into_iter().map(|(o, _, weight)| (o, weight as u64)).collect();
        let free_slots = if settings.processing_enabled {
            (settings.gate_size.max(0) as u64).saturating_sub(running_total)
        } else {
            0
        };
        Ok(LineLoad {
            processing_enabled: settings.processing_enabled,
            free_slots,
            finishing_per_sec: finished as f64 / 300.0,
            running,
        })
    }

    fn running_of(&self, owner: i64) -> u64 {
        self.running.get(&owner).copied().unwrap_or(0)
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
/// their start estimates need. Reads only what the answer depends on: running jobs (at most the
/// gate's worth), the owner's waiting jobs, and each other owner's due jobs up to the highest
/// score asked about, since a count past it cannot change any answer.
pub async fn waiting_line(pool: &PgPool, owner_id: i64, jobs: &[Uuid]) -> Result<WaitingLine> {
    let load = LineLoad::read(pool).await?;
    let mine_running = load.running_of(owner_id);

    let ranks: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, rank FROM (
             SELECT id, row_number() OVER (ORDER BY run_at, id) AS rank FROM waiting_jobs
             WHERE owner_id = $1 AND run_at <= now()
         ) mine WHERE id = ANY($2)",
    )
    .bind(owner_id)
    .bind(jobs)
    .fetch_all(pool)
    .await?;
    let mut ahead = HashMap::with_capacity(ranks.len());
    if let Some(max_rank) = ranks.iter().map(|(_, rank)| *rank as u64).max() {
        let others = other_owners(pool, &load, owner_id, mine_running + max_rank).await?;
        for (id, rank) in ranks {
            ahead.insert(id, jobs_ahead(mine_running, rank as u64, &others));
        }
    }
    Ok(load.line(ahead))
}

/// Every other owner with due waiting jobs, each counted up to `cap` (the highest score asked
/// about: a count past it cannot change an answer).
async fn other_owners(pool: &PgPool, load: &LineLoad, owner_id: i64, cap: u64) -> Result<Vec<OwnerLoad>> {
    let loads: Vec<(i64, i64)> = sqlx::query_as(CAPPED_LOADS).bind(owner_id).bind(cap as i64).fetch_all(pool).await?;
    Ok(loads
        .iter()
        .map(|&(owner, waiting)| OwnerLoad { running: load.running_of(owner), waiting: waiting as u64 })
        .collect())
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
    let mine_running = load.running_of(owner_id);
    let mine_due: i64 = sqlx::query_scalar("SELECT count(*) FROM waiting_jobs WHERE owner_id = $1 AND run_at <= now()")
        .bind(owner_id)
        .fetch_one(pool)
        .await?;
    let rank = mine_due.max(0) as u64 + 1;
    let others = other_owners(pool, &load, owner_id, mine_running + rank).await?;
    let ahead = jobs_ahead(mine_running, rank, &others);
    let starts_in =
        load.processing_enabled.then(|| estimated_start(ahead, load.free_slots, load.finishing_per_sec)).flatten();
    Ok(NewJobPlace { ahead, starts_in, processing_enabled: load.processing_enabled })
}

/// Everyone's place in line at one moment, read in three queries and answered from memory:
/// with 10,000 users polling every 2 s, asking the database per poll would cost seconds of
/// database time every second; one read a second per process costs milliseconds.
#[derive(Debug)]
pub struct LineSnapshot {
    load: LineLoad,
    /// Each due waiting job's owner and rank among that owner's due jobs (claim order).
    due: HashMap<Uuid, (i64, u64)>,
    /// Each owner's due waiting jobs.
    due_per_owner: HashMap<i64, u64>,
    /// Waiting jobs not due yet (retries scheduled later): no place in line.
    later: std::collections::HashSet<Uuid>,
    /// Jobs ahead of a score, counted over every owner (memoised: few scores are asked).
    ahead_of_score: std::sync::Mutex<HashMap<u64, u64>>,
}

/// Waiting jobs read into one snapshot at most; past it, polls ask the database as before.
const SNAPSHOT_MAX_JOBS: i64 = 100_000;

impl LineSnapshot {
    /// Read the line now; `None` when more jobs wait than a snapshot holds.
    pub async fn read(pool: &PgPool) -> Result<Option<LineSnapshot>> {
        let load = LineLoad::read(pool).await?;
        let waiting: Vec<(i64, Uuid, bool)> = sqlx::query_as(
            "SELECT owner_id, id, run_at <= now() FROM waiting_jobs ORDER BY owner_id, run_at, id LIMIT $1",
        )
        .bind(SNAPSHOT_MAX_JOBS + 1)
        .fetch_all(pool)
        .await?;
        if waiting.len() as i64 > SNAPSHOT_MAX_JOBS {
            return Ok(None);
        }
        let mut due = HashMap::with_capacity(waiting.len());
        let mut due_per_owner: HashMap<i64, u64> = HashMap::new();
        let mut later = std::collections::HashSet::new();
        for (owner, id, is_due) in waiting {
            if is_due {
                let rank = due_per_owner.entry(owner).or_default();
                *rank += 1;
                due.insert(id, (owner, *rank));
            } else {
                later.insert(id);
            }
        }
        Ok(Some(LineSnapshot { load, due, due_per_owner, later, ahead_of_score: Default::default() }))
    }

    fn load_of(&self, owner: i64) -> OwnerLoad {
        OwnerLoad {
            running: self.load.running_of(owner),
            waiting: self.due_per_owner.get(&owner).copied().unwrap_or(0),
        }
    }

    /// `owner`'s jobs among `jobs` in line, as [`waiting_line`] answers; `None` when one of
    /// them is not in the snapshot (it came after it was read: ask the database).
    pub fn line_for(&self, owner: i64, jobs: &[Uuid]) -> Option<WaitingLine> {
        let mine = self.load_of(owner);
        let mut ahead = HashMap::with_capacity(jobs.len());
        for id in jobs {
            match self.due.get(id) {
                Some(&(job_owner, rank)) if job_owner == owner => {
                    let score = mine.running + rank;
                    // Every owner's jobs scoring at most this, less this owner's own term (its
                    // earlier jobs count as `rank - 1` instead, as in `jobs_ahead`).
                    let everyone = self.everyone_ahead_of(score);
                    let own_term = score.saturating_sub(mine.running).min(mine.waiting);
                    ahead.insert(*id, jobs_ahead(mine.running, rank, &[]) + everyone - own_term);
                }
                None if self.later.contains(id) => {}
                _ => return None,
            }
        }
        Some(self.load.line(ahead))
    }

    fn everyone_ahead_of(&self, score: u64) -> u64 {
        let mut memo = self.ahead_of_score.lock().unwrap_or_else(|e| e.into_inner());
        *memo.entry(score).or_insert_with(|| {
            let owners: Vec<OwnerLoad> = self.due_per_owner.keys().map(|&o| self.load_of(o)).collect();
            jobs_ahead(score, 0, &owners)
        })
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
