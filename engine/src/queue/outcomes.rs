//! Outcomes and cost per hour or per day (UTC): jobs done and failed, the failure share,
//! credits charged and refunded, and the provider tokens of successful attempts beside those
//! spent on attempts that did not succeed (retried, failed, timed out, cut off).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::{EngineError, Result};

/// The length of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Period {
    Hour,
    Day,
}

impl Period {
    /// The most rows one read returns: a week of hours, 90 days.
    pub fn most(self) -> u32 {
        match self {
            Period::Hour => 168,
            Period::Day => 90,
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
        }
    }
}

/// One hour's or day's outcomes and cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Outcomes {
    pub start: DateTime<Utc>,
    pub done: i64,
    pub failed: i64,
    pub credits_charged: i64,
    pub credits_refunded: i64,
    /// Provider tokens, input and output apart (providers bill output at several times input),
    /// of successful attempts and of attempts that did not succeed.
    pub input_tokens_succeeded: i64,
    pub output_tokens_succeeded: i64,
    pub input_tokens_failed: i64,
    pub output_tokens_failed: i64,
    /// Of the input tokens, those read from the provider's prompt cache (cheaper).
    #[sqlx(default)]
    pub cached_input_tokens: i64,
    /// Of the output tokens billed, those not kept (a cut or flawed translation's paragraphs
    /// asked again): billed less these is what results hold.
    #[sqlx(default)]
    #[serde(default)]
    pub output_tokens_discarded: i64,
}

/// Pure: the share of ended jobs that failed, none when nothing ended.
pub fn failure_share(done: i64, failed: i64) -> Option<f64> {
    let ended = done.max(0) + failed.max(0);
    (ended > 0).then(|| failed.max(0) as f64 / ended as f64)
}

/// The last `count` hours or days, the newest (the current, partial one) first; every period
/// has a row, zeros where nothing happened.
pub async fn read(pool: &PgPool, period: Period, count: u32) -> Result<Vec<Outcomes>> {
    if !(1..=period.most()).contains(&count) {
        return Err(EngineError::Invalid(format!("1 to {} {}s", period.most(), period.unit())));
    }
    // Each source is read by its time index from the oldest period's start.
    Ok(sqlx::query_as(
        "WITH periods AS (
             SELECT generate_series(date_trunc($1, now(), 'UTC') - ($2 - 1) * make_interval(hours => $3),
                                    date_trunc($1, now(), 'UTC'), make_interval(hours => $3)) AS start
         ),
         since AS (SELECT min(start) AS at FROM periods),
         ended AS (
             SELECT date_trunc($1, finished_at, 'UTC') AS start,
                    count(*) FILTER (WHERE state = 'done') AS done, count(*) FILTER (WHERE state = 'failed') AS failed
             FROM jobs WHERE finished_at >= (SELECT at FROM since) GROUP BY 1
         ),
         money AS (
             SELECT date_trunc($1, at, 'UTC') AS start,
                    coalesce(-sum(amount) FILTER (WHERE kind = 'debit'), 0) AS charged,
                    coalesce(sum(amount) FILTER (WHERE kind = 'refund'), 0) AS refunded
             FROM ledger WHERE kind IN ('debit', 'refund') AND at >= (SELECT at FROM since) GROUP BY 1
         ),
         tokens AS (
             SELECT date_trunc($1, finished_at, 'UTC') AS start,
                    coalesce(sum(input_tokens) FILTER (WHERE outcome = 'succeeded'), 0) AS in_ok,
                    coalesce(sum(output_tokens) FILTER (WHERE outcome = 'succeeded'), 0) AS out_ok,
                    coalesce(sum(input_tokens) FILTER (WHERE outcome <> 'succeeded'), 0) AS in_failed,
                    coalesce(sum(output_tokens) FILTER (WHERE outcome <> 'succeeded'), 0) AS out_failed
             FROM attempt_history WHERE finished_at >= (SELECT at FROM since) GROUP BY 1
         ),
         cached AS (
             SELECT date_trunc($1, at, 'UTC') AS start, sum(cached_input_tokens) AS tokens
             FROM provider_cache_reads WHERE at >= (SELECT at FROM since) GROUP BY 1
         ),
         discarded AS (
             SELECT date_trunc($1, at, 'UTC') AS start, sum(output_tokens) AS tokens
             FROM provider_output_discarded WHERE at >= (SELECT at FROM since) GROUP BY 1
         )
         SELECT p.start, coalesce(e.done, 0) AS done, coalesce(e.failed, 0) AS failed,
                coalesce(m.charged, 0)::int8 AS credits_charged, coalesce(m.refunded, 0)::int8 AS credits_refunded,
                coalesce(t.in_ok, 0)::int8 AS input_tokens_succeeded, coalesce(t.out_ok, 0)::int8 AS output_tokens_succeeded,
                coalesce(t.in_failed, 0)::int8 AS input_tokens_failed, coalesce(t.out_failed, 0)::int8 AS output_tokens_failed,
                coalesce(c.tokens, 0)::int8 AS cached_input_tokens,
                coalesce(d.tokens, 0)::int8 AS output_tokens_discarded
         FROM periods p
         LEFT JOIN ended e ON e.start = p.start
         LEFT JOIN money m ON m.start = p.start
         LEFT JOIN tokens t ON t.start = p.start
         LEFT JOIN cached c ON c.start = p.start
         LEFT JOIN discarded d ON d.start = p.start
         ORDER BY p.start DESC",
    )
    .bind(period.unit())
    .bind(count as i32)
    .bind(if period == Period::Day { 24 } else { 1 })
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_share_is_of_the_jobs_that_ended() {
        assert_eq!(failure_share(0, 0), None);
        assert_eq!(failure_share(3, 1), Some(0.25));
        assert_eq!(failure_share(0, 5), Some(1.0));
        assert_eq!(failure_share(-1, 0), None, "nonsense counts do not divide by zero");
    }
}
