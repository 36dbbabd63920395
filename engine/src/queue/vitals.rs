//! The queue's vital signs, read from the database (so they hold across processes).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::policy::drain::{drain_estimate, DrainEstimate};
use crate::error::Result;

/// Jobs per second over the last 1, 5 and 15 minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub m1: f64,
    pub m5: f64,
    pub m15: f64,
}

/// The queue's health at a glance (the admin page's "vital signs").
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
    /// Documents with a deadline still waiting within the lead of their latest start (the
    /// `deadline_at_risk` alert), and those whose deadline passed in the last day unmet.
    #[serde(default)]
    pub deadlines_at_risk: i64,
    #[serde(default)]
    pub deadlines_missed_last_day: i64,
}

#[derive(sqlx::FromRow)]
struct Waiting {
    backlog: i64,
    scheduled_retries: i64,
    oldest_waiting_secs: Option<f64>,
}

#[derive(sqlx::FromRow)]
struct RateRow {
    intake_m1: f64,
    intake_m5: f64,
    intake_m15: f64,
    done_m1: f64,
    done_m5: f64,
    done_m15: f64,
}

#[derive(sqlx::FromRow)]
struct Latency {
    p50: Option<f64>,
    p95: Option<f64>,
}

/// The vital signs now.
pub async fn read(pool: &PgPool) -> Result<VitalSigns> {
    let waiting: Waiting = sqlx::query_as(
        "SELECT
            count(*) FILTER (WHERE state = 'queued' OR run_at <= now()) AS backlog,
            count(*) FILTER (WHERE state = 'retrying' AND run_at > now()) AS scheduled_retries,
            extract(epoch FROM now() - least(min(run_at) FILTER (WHERE run_at <= now()),
                (SELECT min(accepted_at) FROM jobs
                 WHERE state IN ('queued', 'retrying') AND parts_total IS NOT NULL AND run_at <= now())))::float8
                AS oldest_waiting_secs
         FROM waiting_jobs",
    )
    .fetch_one(pool)
    .await?;
    let running: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'running'").fetch_one(pool).await?;
    let rates: RateRow = sqlx::query_as(
        "SELECT
            (SELECT count(*) FROM job_listing WHERE accepted_at > now() - interval '1 minute')::float8 / 60 AS intake_m1,
            (SELECT count(*) FROM job_listing WHERE accepted_at > now() - interval '5 minutes')::float8 / 300 AS intake_m5,
            (SELECT count(*) FROM job_listing WHERE accepted_at > now() - interval '15 minutes')::float8 / 900 AS intake_m15,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '1 minute')::float8 / 60 AS done_m1,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '5 minutes')::float8 / 300 AS done_m5,
            (SELECT count(*) FROM jobs WHERE finished_at > now() - interval '15 minutes')::float8 / 900 AS done_m15",
    )
    .fetch_one(pool)
    .await?;
    let intake = Rates { m1: rates.intake_m1, m5: rates.intake_m5, m15: rates.intake_m15 };
    let completions = Rates { m1: rates.done_m1, m5: rates.done_m5, m15: rates.done_m15 };
    let latency: Latency = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - accepted_at)) AS p50,
                percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - accepted_at)) AS p95
         FROM jobs WHERE state = 'done' AND finished_at > now() - interval '1 hour'",
    )
    .fetch_one(pool)
    .await?;
    let dlq_depth = super::dlq::depth(pool).await?;
    // Only jobs due from a day ago on (their index).
    let (deadlines_at_risk, deadlines_missed_last_day): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE j.state IN ('queued', 'retrying') AND j.due_by >= now()
                                   AND j.latest_start <= now() + make_interval(secs => q.deadline_lead_secs)),
                count(*) FILTER (WHERE j.due_by < now() AND (j.state <> 'done' OR j.finished_at > j.due_by))
         FROM jobs j, queue_settings q
         WHERE q.id = 1 AND j.due_by > now() - interval '1 day'",
    )
    .fetch_one(pool)
    .await?;
    Ok(VitalSigns {
        backlog: waiting.backlog,
        scheduled_retries: waiting.scheduled_retries,
        running,
        oldest_waiting_secs: waiting.oldest_waiting_secs,
        intake,
        completions,
        time_to_done_p50_secs: latency.p50,
        time_to_done_p95_secs: latency.p95,
        dlq_depth,
        drain: drain_estimate(waiting.backlog.max(0) as u64, intake.m5, completions.m5),
        deadlines_at_risk,
        deadlines_missed_last_day,
    })
}

/// Per-minute intake and completions, oldest first (for the admin chart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct MinuteCounts {
    pub minute: DateTime<Utc>,
    pub intake: i64,
    pub completions: i64,
}

/// The last `minutes` minutes, one row each, oldest first.
pub async fn history(pool: &PgPool, minutes: i32) -> Result<Vec<MinuteCounts>> {
    Ok(sqlx::query_as(
        "WITH buckets AS (
            SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => $1 - 1),
                                   date_trunc('minute', now()), interval '1 minute') AS minute
         )
         SELECT b.minute,
            (SELECT count(*) FROM job_listing WHERE accepted_at >= b.minute AND accepted_at < b.minute + interval '1 minute')
                AS intake,
            (SELECT count(*) FROM jobs WHERE finished_at >= b.minute AND finished_at < b.minute + interval '1 minute') AS completions
         FROM buckets b ORDER BY b.minute",
    )
    .bind(minutes)
    .fetch_all(pool)
    .await?)
}
