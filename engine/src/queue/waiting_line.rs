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
/// come from `sluice_waiting_owners()`, the loose index scan the claim uses too; without it
/// this would read every waiting job.
const CAPPED_LOADS: &str = "
    SELECT o.owner_id,
           (SELECT count(*) FROM (
                SELECT 1 FROM waiting_jobs j
                WHERE j.owner_id = o.owner_id AND j.run_at <= now()
                ORDER BY j.run_at, j.id LIMIT $2) due)
    FROM sluice_waiting_owners() o(owner_id) WHERE o.owner_id <> $1";

/// Where the given jobs of an owner stand in line (those that are due and waiting), with what
/// their start estimates need. Reads only what the answer depends on: running jobs (at most the
/// gate's worth), the owner's waiting jobs, and each other owner's due jobs up to the highest
/// score asked about, since a count past it cannot change any answer.
pub async fn waiting_line(pool: &PgPool, owner_id: i64, jobs: &[Uuid]) -> Result<WaitingLine> {
    let settings = super::switches::read(pool).await?;
    let running: Vec<(i64, i64)> =
        sqlx::query_as("SELECT owner_id, count(*) FROM jobs WHERE state = 'running' GROUP BY owner_id")
            .fetch_all(pool)
            .await?;
    let running_of = |owner: i64| running.iter().find(|(o, _)| *o == owner).map_or(0, |(_, n)| *n as u64);
    let running_total: u64 = running.iter().map(|(_, n)| *n as u64).sum();
    let mine_running = running_of(owner_id);

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
        let cap = mine_running + max_rank;
        let loads: Vec<(i64, i64)> =
            sqlx::query_as(CAPPED_LOADS).bind(owner_id).bind(cap as i64).fetch_all(pool).await?;
        let others: Vec<OwnerLoad> = loads
            .iter()
            .map(|&(owner, waiting)| OwnerLoad { running: running_of(owner), waiting: waiting as u64 })
            .collect();
        for (id, rank) in ranks {
            ahead.insert(id, jobs_ahead(mine_running, rank as u64, &others));
        }
    }
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes'")
            .fetch_one(pool)
            .await?;
    let free_slots =
        if settings.processing_enabled { (settings.gate_size.max(0) as u64).saturating_sub(running_total) } else { 0 };
    Ok(WaitingLine {
        ahead,
        free_slots,
        finishing_per_sec: finished as f64 / 300.0,
        processing_enabled: settings.processing_enabled,
    })
}
