//! Lanes and deadlines: which documents are urgent work, the share of the gate kept for them,
//! the floor kept for large ones, and how near a deadline is taken first (turned into the
//! queue's `LaneConfig`).

use std::time::Duration;

use clap::Args;

use engine::queue::lanes::{
    LaneConfig, DEFAULT_DEADLINE_FAIR_WINDOW, DEFAULT_DEADLINE_LEAD, DEFAULT_URGENT_BUDGET_SHARE,
    DEFAULT_URGENT_MAX_TOKENS,
};
use engine::queue::policy::lanes::{LaneShares, DEFAULT_BULK_FLOOR, DEFAULT_URGENT_SHARE};

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Lanes and deadlines")]
pub struct LaneArgs {
    /// Share of the gate (0 to 0.9) large documents may never take: small and urgent documents
    /// start there at once, whatever large ones hold. Size it to the bursts of small work.
    #[arg(long, env = "SLUICE_URGENT_SHARE", default_value_t = DEFAULT_URGENT_SHARE, global = true)]
    pub urgent_share: f64,
    /// Share of each of the provider's token buckets (0 to 0.95) large documents leave for
    /// small and urgent ones: small documents behind a large one wait for tokens more than for
    /// slots. Large documents lose it once per busy spell, not for as long as they run.
    #[arg(long, env = "SLUICE_URGENT_BUDGET_SHARE", default_value_t = DEFAULT_URGENT_BUDGET_SHARE, global = true)]
    pub urgent_budget_share: f64,
    /// Share of the gate (0 to 0.9) small documents leave large ones while those have work.
    #[arg(long, env = "SLUICE_BULK_FLOOR", default_value_t = DEFAULT_BULK_FLOOR, global = true)]
    pub bulk_floor: f64,
    /// Documents of at most this many tokens are urgent work; an upload's `urgent` flag makes
    /// those up to four times as large so, an account's lane (`set-lane`) any.
    #[arg(long, env = "SLUICE_URGENT_MAX_TOKENS", default_value_t = DEFAULT_URGENT_MAX_TOKENS, global = true)]
    pub urgent_max_tokens: i64,
    /// Seconds before its latest start that a document with a deadline is taken ahead of the
    /// line (and its deadline is called at risk).
    #[arg(long, env = "SLUICE_DEADLINE_LEAD_SECS", default_value_t = DEFAULT_DEADLINE_LEAD.as_secs_f64(), global = true)]
    pub deadline_lead_secs: f64,
    /// How far behind the line's front (in 25K-token weights of fair share) a document with a
    /// near deadline may still be taken ahead: a deadline never buys more than this.
    #[arg(long, env = "SLUICE_DEADLINE_FAIR_WINDOW", default_value_t = DEFAULT_DEADLINE_FAIR_WINDOW, global = true)]
    pub deadline_fair_window: i64,
}

impl LaneArgs {
    pub fn lane_config(&self) -> LaneConfig {
        LaneConfig {
            shares: LaneShares { urgent_share: self.urgent_share, bulk_floor: self.bulk_floor },
            urgent_budget_share: self.urgent_budget_share,
            urgent_max_tokens: self.urgent_max_tokens.max(0),
            // `max` first: it turns NaN into the floor.
            deadline_lead: Duration::from_secs_f64(self.deadline_lead_secs.max(0.0).min(86_400.0)),
            deadline_fair_window: self.deadline_fair_window.max(0),
        }
    }
}
