//! The lanes and deadlines an operator sets (kept in the settings row every claim reads; see
//! `20261219000001_lanes_and_deadlines.sql`), and an account's lane.

use std::time::Duration;

use sqlx::PgPool;

use super::policy::lanes::{LaneShares, DEFAULT_BULK_FLOOR, DEFAULT_URGENT_SHARE};
use crate::error::Result;

/// Documents of at most this many tokens are urgent work (a page or two; seed 000's median
/// document is about 8K tokens).
pub const DEFAULT_URGENT_MAX_TOKENS: i64 = 16_000;
/// Share of each provider token bucket the bulk lane leaves for small documents. It costs
/// large documents a bucket's share once per busy spell (a bucket refills at the same pace
/// whoever draws it), unlike a share of the gate, which they lose for as long as they run;
/// measured in `cargo xtask bench lanes` (docs/src/lanes.md).
pub const DEFAULT_URGENT_BUDGET_SHARE: f64 = 0.5;
/// Work whose latest start is within this of now is taken before the line's order.
pub const DEFAULT_DEADLINE_LEAD: Duration = Duration::from_secs(300);
/// ...if its tag is within this many token weights (25K tokens each) of the line's front.
pub const DEFAULT_DEADLINE_FAIR_WINDOW: i64 = 8;

/// How the gate is split between the lanes, and how deadlines are kept.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneConfig {
    pub shares: LaneShares,
    /// The share of each token bucket (0 to 0.95) the bulk lane leaves for the urgent lane.
    pub urgent_budget_share: f64,
    /// Documents of at most this many tokens go in the urgent lane.
    pub urgent_max_tokens: i64,
    pub deadline_lead: Duration,
    pub deadline_fair_window: i64,
}

impl Default for LaneConfig {
    fn default() -> Self {
        LaneConfig {
            shares: LaneShares { urgent_share: DEFAULT_URGENT_SHARE, bulk_floor: DEFAULT_BULK_FLOOR },
            urgent_budget_share: DEFAULT_URGENT_BUDGET_SHARE,
            urgent_max_tokens: DEFAULT_URGENT_MAX_TOKENS,
            deadline_lead: DEFAULT_DEADLINE_LEAD,
            deadline_fair_window: DEFAULT_DEADLINE_FAIR_WINDOW,
        }
    }
}

/// Store the lanes for every process (the last process to start with other settings wins).
pub async fn configure(pool: &PgPool, config: &LaneConfig) -> Result<()> {
    // `max`/`min` first: they turn NaN into a bound.
    let share = |s: f64| s.max(0.0).min(0.9);
    sqlx::query(
        "UPDATE queue_settings SET urgent_share = $1, bulk_floor = $2, urgent_max_tokens = $3,
             deadline_lead_secs = $4, deadline_fair_window = $5, urgent_budget_share = $6
         WHERE id = 1",
    )
    .bind(share(config.shares.urgent_share))
    .bind(share(config.shares.bulk_floor))
    .bind(config.urgent_max_tokens.max(0))
    .bind(config.deadline_lead.as_secs_f64())
    .bind(config.deadline_fair_window.max(0))
    .bind(config.urgent_budget_share.max(0.0).min(0.95))
    .execute(pool)
    .await?;
    Ok(())
}

/// Put an account's documents in the urgent lane (or take them out), from the next upload on.
pub async fn set_account_urgent(pool: &PgPool, user_id: i64, urgent: bool) -> Result<bool> {
    let done =
        sqlx::query("UPDATE users SET urgent_lane = $2 WHERE id = $1").bind(user_id).bind(urgent).execute(pool).await?;
    Ok(done.rows_affected() == 1)
}
