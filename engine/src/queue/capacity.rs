//! The provider's capacity beside the gate: its limits and the token budget every process
//! shares (kept in the settings row the claim locks; the claim reserves from it, see
//! `20261201000002_capacity.sql`), corrections once a job's real size is known, what the
//! provider's rate-limit headers say is left, and the adaptive gate's cuts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::policy::adaptive;
use crate::error::Result;
pub use sluice_types::capacity::{AttemptStats, Percentiles, ProviderLimits};

/// How this deployment's provider is sized.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityConfig {
    pub limits: ProviderLimits,
    /// How much of a minute's rate a bucket holds (60 s: a minute's worth, as Anthropic's do).
    pub burst: Duration,
    /// Output tokens reserved per request until its usage is known (the request's `max_tokens`).
    pub output_reserve: i64,
    /// The adaptive gate grows back one slot per this long.
    pub recover_step: Duration,
    /// The share of each limit the budget plans to use (0.95): what reaches the provider
    /// jitters by the time between a claim and its request, and a budget at exactly the limit
    /// would meet the provider's bucket empty now and then.
    pub share: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            limits: ProviderLimits::default(),
            burst: Duration::from_secs(60),
            output_reserve: 1024,
            recover_step: Duration::from_secs(10),
            share: 0.95,
        }
    }
}

/// Store the limits for every process (the last process to start with other limits wins).
/// Buckets whose limit changed start full; the others keep their level, refilled to now.
pub async fn configure(pool: &PgPool, config: &CapacityConfig) -> Result<()> {
    let limit = |v: Option<u64>| v.map(|v| v.min(i64::MAX as u64) as i64);
    // A bucket keeps its level (refilled to now) while its limit, burst and share stay the same.
    let same = |limit: &str, n: u8| {
        format!("q.{limit} IS NOT DISTINCT FROM ${n} AND q.limit_burst_secs = $4 AND q.limit_share = $7")
    };
    sqlx::query(&format!(
        "UPDATE queue_settings q SET
            level_requests = CASE WHEN {} THEN {REQ} ELSE coalesce($1 * $7 / 60.0 * $4, 'Infinity') END,
            level_input = CASE WHEN {} THEN {IN} ELSE coalesce($2 * $7 / 60.0 * $4, 'Infinity') END,
            level_output = CASE WHEN {} THEN {OUT} ELSE coalesce($3 * $7 / 60.0 * $4, 'Infinity') END,
            levels_at = clock_timestamp(),
            limit_requests_per_min = $1, limit_input_tokens_per_min = $2, limit_output_tokens_per_min = $3,
            limit_burst_secs = $4, output_reserve = $5, adaptive_recover_secs = $6, limit_share = $7
         WHERE q.id = 1",
        same("limit_requests_per_min", 1),
        same("limit_input_tokens_per_min", 2),
        same("limit_output_tokens_per_min", 3),
    ))
    .bind(limit(config.limits.requests_per_min))
    .bind(limit(config.limits.input_tokens_per_min))
    .bind(limit(config.limits.output_tokens_per_min))
    .bind(config.burst.as_secs_f64().max(0.001))
    .bind(config.output_reserve.max(0))
    .bind(config.recover_step.as_secs_f64().max(0.001))
    .bind(config.share.clamp(0.01, 1.0))
    .execute(pool)
    .await?;
    Ok(())
}

/// The gate and the budget as they stand, for the admin page and `server capacity`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacityStatus {
    /// The gate an operator set.
    pub configured_gate: i32,
    /// The gate claims use now: lower while the adaptive gate grows back.
    pub effective_gate: i32,
    /// Why the effective gate is lower, and since when (`None` when it is not).
    pub reduced: Option<(String, DateTime<Utc>)>,
    pub limits: ProviderLimits,
    /// What each bucket holds now (`None`: no limit).
    pub requests_left: Option<f64>,
    pub input_tokens_left: Option<f64>,
    pub output_tokens_left: Option<f64>,
    pub burst_secs: f64,
    pub recover_secs: f64,
}

/// The gate and the budget now.
pub async fn status(pool: &PgPool) -> Result<CapacityStatus> {
    type Row = (
        i32,
        i32,
        Option<String>,
        Option<DateTime<Utc>>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        f64,
        f64,
        f64,
        f64,
        f64,
    );
    let row: Row = sqlx::query_as(&format!(
        "SELECT q.gate_size, sluice_effective_gate(q), q.adaptive_reason, q.adaptive_since,
                q.limit_requests_per_min, q.limit_input_tokens_per_min, q.limit_output_tokens_per_min,
                {REQ}, {IN}, {OUT}, q.limit_burst_secs, q.adaptive_recover_secs
         FROM queue_settings q WHERE q.id = 1"
    ))
    .fetch_one(pool)
    .await?;
    let (configured_gate, effective_gate, reason, since, rpm, itpm, otpm, req, input, output, burst, recover) = row;
    let left = |limit: Option<i64>, level: f64| limit.map(|_| level);
    Ok(CapacityStatus {
        configured_gate,
        effective_gate,
        reduced: match (reason, since) {
            (Some(reason), Some(since)) if effective_gate < configured_gate => Some((reason, since)),
            _ => None,
        },
        limits: ProviderLimits {
            requests_per_min: rpm.map(|v| v as u64),
            input_tokens_per_min: itpm.map(|v| v as u64),
            output_tokens_per_min: otpm.map(|v| v as u64),
        },
        requests_left: left(rpm, req),
        input_tokens_left: left(itpm, input),
        output_tokens_left: left(otpm, output),
        burst_secs: burst,
        recover_secs: recover,
    })
}

/// The provider refused for load (429 or 529): cut the gate in force (see
/// [`adaptive::after_refusal`]). Returns the new gate when this call cut it.
pub async fn provider_refused(pool: &PgPool, status: Option<u16>) -> Result<Option<i32>> {
    let (in_force, since_cut): (i32, Option<f64>) = sqlx::query_as(
        "SELECT sluice_effective_gate(q), extract(epoch FROM clock_timestamp() - q.adaptive_since)::float8
         FROM queue_settings q WHERE q.id = 1",
    )
    .fetch_one(pool)
    .await?;
    let since_cut = since_cut.map(|s| Duration::from_secs_f64(s.max(0.0)));
    let Some(cut) = adaptive::after_refusal(in_force, since_cut) else { return Ok(None) };
    // Only if nobody cut it meanwhile (another process saw the same burst).
    let done = sqlx::query(
        "UPDATE queue_settings q SET adaptive_gate = $1, adaptive_since = clock_timestamp(), adaptive_reason = $2
         WHERE q.id = 1 AND sluice_effective_gate(q) = $3
           AND (q.adaptive_since IS NULL OR q.adaptive_since < clock_timestamp() - make_interval(secs => $4))",
    )
    .bind(cut)
    .bind(adaptive::reason(status, in_force, cut))
    .bind(in_force)
    .bind(adaptive::DECREASE_COOLDOWN.as_secs_f64())
    .execute(pool)
    .await?;
    if done.rows_affected() == 1 {
        tracing::warn!(from = in_force, to = cut, ?status, "the provider refused for load; gate cut");
        metrics::counter!("sluice_gate_cuts_total").increment(1);
        Ok(Some(cut))
    } else {
        Ok(None)
    }
}

/// Each bucket's level refilled to now (the same expressions the claim uses), over the
/// settings row as `q`.
const REQ: &str =
    "sluice_refill(q.level_requests, q.limit_requests_per_min * q.limit_share, q.limit_burst_secs, q.levels_at)";
const IN: &str =
    "sluice_refill(q.level_input, q.limit_input_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at)";
const OUT: &str =
    "sluice_refill(q.level_output, q.limit_output_tokens_per_min * q.limit_share, q.limit_burst_secs, q.levels_at)";
/// What each bucket holds when full (null without a limit).
const IN_FULL: &str = "q.limit_input_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs";
const OUT_FULL: &str = "q.limit_output_tokens_per_min * q.limit_share / 60.0 * q.limit_burst_secs";
/// The largest correction one answer can make: a provider claiming more tokens than any
/// request can carry is wrong or hostile, and must not stall the budget for days.
pub const MAX_CORRECTION: i64 = 2_000_000;

/// What the provider's rate-limit headers say is left (`anthropic-ratelimit-*`, `x-ratelimit-*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateRemaining {
    pub requests: Option<i64>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
}

/// A process's handle on the shared budget: corrections as jobs turn out larger or smaller
/// than reserved. Disabled (does nothing) when no limit is configured.
#[derive(Clone, Debug)]
pub struct Budget {
    pool: Option<PgPool>,
    /// Output tokens the claim reserves per request.
    pub output_reserve: i64,
}

impl Budget {
    pub fn new(pool: PgPool, config: &CapacityConfig) -> Budget {
        let enabled = !config.limits.is_unlimited();
        Budget { pool: enabled.then_some(pool), output_reserve: config.output_reserve }
    }

    /// A budget that records nothing (no limits configured, or a test without them).
    pub fn disabled() -> Budget {
        Budget { pool: None, output_reserve: 0 }
    }

    pub fn is_enabled(&self) -> bool {
        self.pool.is_some()
    }

    /// Take `input` and `output` more tokens from the buckets (negative: give them back), to
    /// settle a call that went out with a reservation by what it used.
    pub async fn correct(&self, input: i64, output: i64) {
        self.give_back_then_take((-input.min(0), -output.min(0)), (input.max(0), output.max(0))).await
    }

    /// A reservation held since earlier (the claim's) makes room for a call's own, about to go
    /// out. While it was held the buckets refilled as if it had been spent, but the
    /// provider's did not (it was full): what is held comes back first, to full at most, and
    /// the call's own is taken after, or the next grant would count on room the provider lacks.
    pub async fn reserve_anew(&self, held: (i64, i64), call: (i64, i64)) {
        if held != call {
            self.give_back_then_take(held, call).await
        }
    }

    /// Give back `back` (input, output) tokens, filling each bucket no further than full (a
    /// reservation not spent leaves the provider's bucket full, not over), then take `taken`.
    /// A failed change is logged, not fatal: the buckets refill anyway.
    async fn give_back_then_take(&self, back: (i64, i64), taken: (i64, i64)) {
        let Some(pool) = &self.pool else { return };
        if back == (0, 0) && taken == (0, 0) {
            return;
        }
        // Refilled to now first, so the change is not lost in (or added to) the refill since the
        // last claim.
        let changed = sqlx::query(&format!(
            "UPDATE queue_settings q SET levels_at = greatest(q.levels_at, clock_timestamp()),
                level_requests = {REQ},
                level_input = least({IN} + $1, coalesce({IN_FULL}, 'Infinity')) - $3,
                level_output = least({OUT} + $2, coalesce({OUT_FULL}, 'Infinity')) - $4
             WHERE q.id = 1"
        ))
        .bind(back.0.clamp(0, MAX_CORRECTION))
        .bind(back.1.clamp(0, MAX_CORRECTION))
        .bind(taken.0.clamp(0, MAX_CORRECTION))
        .bind(taken.1.clamp(0, MAX_CORRECTION))
        .execute(pool)
        .await;
        if let Err(e) = changed {
            tracing::warn!(error = %e, "could not change the token budget");
        }
    }

    /// The provider says this much is left: the buckets hold no more than that (it also
    /// counts what other users of the same key sent).
    pub async fn observe(&self, remaining: &RateRemaining) {
        let Some(pool) = &self.pool else { return };
        if remaining == &RateRemaining::default() {
            return;
        }
        let observed = sqlx::query(&format!(
            "UPDATE queue_settings q SET levels_at = greatest(q.levels_at, clock_timestamp()),
                level_requests = CASE WHEN $1::bigint IS NULL THEN {REQ} ELSE least({REQ}, $1) END,
                level_input = CASE WHEN $2::bigint IS NULL THEN {IN} ELSE least({IN}, $2) END,
                level_output = CASE WHEN $3::bigint IS NULL THEN {OUT} ELSE least({OUT}, $3) END
             WHERE q.id = 1"
        ))
        .bind(remaining.requests)
        .bind(remaining.input_tokens)
        .bind(remaining.output_tokens)
        .execute(pool)
        .await;
        if let Err(e) = observed {
            tracing::warn!(error = %e, "could not record the provider's remaining limits");
        }
    }

    /// The job's text is read: its estimate becomes `tokens` (for the rest of this attempt and
    /// the next ones), and the claim's reservation is made anew for it.
    pub async fn refine(&self, job_id: uuid::Uuid, lease_token: uuid::Uuid, reserved: i64, tokens: i64) {
        let Some(pool) = &self.pool else { return };
        if tokens == reserved {
            return;
        }
        let stored = sqlx::query("UPDATE jobs SET est_input_tokens = $3 WHERE id = $1 AND lease_token = $2")
            .bind(job_id)
            .bind(lease_token)
            .bind(tokens.max(0))
            .execute(pool)
            .await;
        if let Err(e) = stored {
            tracing::warn!(error = %e, "could not store a job's refined estimate");
        }
        self.reserve_anew((reserved, 0), (tokens, 0)).await;
    }
}

/// Duration and token percentiles of the successful attempts of the last `days`, per preset
/// and for all ("all" first), for the capacity planner.
pub async fn attempt_stats(pool: &PgPool, days: u32) -> Result<Vec<AttemptStats>> {
    type Row = (Option<String>, i64, Option<Vec<f64>>, Option<Vec<f64>>, Option<Vec<f64>>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT CASE WHEN GROUPING(j.payload->>'preset') = 1 THEN 'all' ELSE coalesce(j.payload->>'preset', 'other') END,
                count(*),
                percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
                    ORDER BY extract(epoch FROM a.finished_at - a.started_at)::float8),
                percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY a.input_tokens::float8),
                percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY a.output_tokens::float8)
         FROM attempt_history a JOIN jobs j ON j.id = a.job_id
         WHERE a.outcome = 'succeeded' AND a.finished_at > now() - make_interval(days => $1)
         GROUP BY GROUPING SETS ((j.payload->>'preset'), ())
         ORDER BY GROUPING(j.payload->>'preset') DESC, 1",
    )
    .bind(days.min(3650) as i32)
    .fetch_all(pool)
    .await?;
    let percentiles = |v: Option<Vec<f64>>| match v.as_deref() {
        Some([p50, p90, p99]) => Percentiles { p50: *p50, p90: *p90, p99: *p99 },
        _ => Percentiles::default(),
    };
    Ok(rows
        .into_iter()
        .map(|(preset, attempts, duration, input, output)| AttemptStats {
            preset: preset.unwrap_or_default(),
            attempts,
            duration_secs: percentiles(duration),
            input_tokens: percentiles(input),
            output_tokens: percentiles(output),
        })
        .collect())
}
