//! The queue's vital signs, read from the database (so they hold across processes).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};

use crate::drain::{drain_estimate, DrainEstimate};
use crate::error::Result;

/// Jobs per second over the last 1, 5 and 15 minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub m1: f64,
    pub m5: f64,
    pub m15: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VitalSigns {
    /// Queued plus retries that are due.
    pub backlog: i64,
    /// Retries waiting for their time.
    pub scheduled_retries: i64,
    pub running: i64,
    pub oldest_waiting_secs: Option<f64>,
    pub intake: Rates,
    /// Jobs reaching a terminal state (done or failed).
    pub completions: Rates,
    /// Acceptance to done, over jobs finished in the last hour.
    pub time_to_done_p50_secs: Option<f64>,
    pub time_to_done_p95_secs: Option<f64>,
    pub dlq_depth: i64,
    /// From the 5-minute rates.
    pub drain: DrainEstimate,
}

pub async fn read(pool: &PgPool) -> Result<VitalSigns> {
    let row = sqlx::query(
        "SELECT
            count(*) FILTER (WHERE state = 'queued' OR (state = 'retrying' AND run_at <= now())),
            count(*) FILTER (WHERE state = 'retrying' AND run_at > now()),
            extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8
         FROM jobs WHERE state IN ('queued', 'retrying')",
    )
    .fetch_one(pool)
    .await?;
    let (backlog, scheduled_retries, oldest_waiting_secs): (i64, i64, Option<f64>) =
        (row.get(0), row.get(1), row.get(2));
    let running: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'running'").fetch_one(pool).await?;

    let rates = sqlx::query(
        "SELECT
            (SELECT count(*) FROM jobs WHERE accepted_at > now() - interval '1 minute')::float8 / 60,
            (SELECT count(*) FROM jobs WHERE accepted_at > now() - interval '5 minutes')::float8 / 300,
            (SELECT count(*) FROM jobs WHERE accepted_at > now() - interval '15 minutes')::float8 / 900,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '1 minute')::float8 / 60,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes')::float8 / 300,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '15 minutes')::float8 / 900",
    )
    .fetch_one(pool)
    .await?;
    let intake = Rates { m1: rates.get(0), m5: rates.get(1), m15: rates.get(2) };
    let completions = Rates { m1: rates.get(3), m5: rates.get(4), m15: rates.get(5) };

    let latency = sqlx::query(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - accepted_at)),
                percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - accepted_at))
         FROM jobs WHERE state = 'done' AND finished_at > now() - interval '1 hour'",
    )
    .fetch_one(pool)
    .await?;
    let dlq_depth = crate::dlq::depth(pool).await?;
    Ok(VitalSigns {
        backlog,
        scheduled_retries,
        running,
        oldest_waiting_secs,
        intake,
        completions,
        time_to_done_p50_secs: latency.get(0),
        time_to_done_p95_secs: latency.get(1),
        dlq_depth,
        drain: drain_estimate(backlog.max(0) as u64, intake.m5, completions.m5),
    })
}

/// Per-minute intake and completions, oldest first (for the admin chart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinuteCounts {
    pub minute: DateTime<Utc>,
    pub intake: i64,
    pub completions: i64,
}

pub async fn history(pool: &PgPool, minutes: i32) -> Result<Vec<MinuteCounts>> {
    let rows = sqlx::query(
        "WITH buckets AS (
            SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => $1 - 1),
                                   date_trunc('minute', now()), interval '1 minute') AS minute
         )
         SELECT b.minute,
            (SELECT count(*) FROM jobs WHERE accepted_at >= b.minute AND accepted_at < b.minute + interval '1 minute'),
            (SELECT count(*) FROM jobs WHERE finished_at >= b.minute AND finished_at < b.minute + interval '1 minute')
         FROM buckets b ORDER BY b.minute",
    )
    .bind(minutes)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(|r| MinuteCounts { minute: r.get(0), intake: r.get(1), completions: r.get(2) }).collect())
}
