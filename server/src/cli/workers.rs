//! This process's workers: how many, their leases and heartbeats, and how failed attempts are
//! retried (turned into the queue's `WorkerConfig` and `RetryPolicy`).

use std::time::Duration;

use clap::Args;

use engine::queue::policy::retry::RetryPolicy;
use engine::queue::worker::WorkerConfig;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Workers and retries")]
pub struct WorkerArgs {
    /// Worker slots in this process, the most jobs it runs at once (0 = web only). The gate
    /// (24 by default, 1 to 70) decides how many run across all processes; the default follows
    /// any gate on one process.
    #[arg(long, env = "SLUICE_WORKERS", default_value_t = 70, global = true)]
    pub workers: usize,
    /// Seconds a worker's lease lasts without a heartbeat.
    #[arg(long, env = "SLUICE_LEASE_SECS", default_value_t = 60.0, global = true)]
    pub lease_secs: f64,
    /// Seconds one attempt may run before it is stopped as a timeout (and retried).
    #[arg(long, env = "SLUICE_ATTEMPT_DEADLINE_SECS", default_value_t = 600.0, global = true)]
    pub attempt_deadline_secs: f64,
    /// Seconds between heartbeats.
    #[arg(long, env = "SLUICE_HEARTBEAT_SECS", default_value_t = 15.0, global = true)]
    pub heartbeat_secs: f64,
    /// Seconds to wait before attempts 2, 3, ... (comma-separated; the last repeats).
    #[arg(long, env = "SLUICE_RETRY_DELAYS", default_value = "30,60", value_delimiter = ',', global = true)]
    pub retry_delays: Vec<f64>,
    /// Upper bound of any scheduled retry delay, in seconds.
    #[arg(long, env = "SLUICE_RETRY_MAX_DELAY", default_value_t = 120.0, global = true)]
    pub retry_max_delay: f64,
    /// Hours after acceptance past which a job is not retried again (it fails and is refunded).
    #[arg(long, env = "SLUICE_RETRY_BUDGET_HOURS", default_value_t = 6.0, global = true)]
    pub retry_budget_hours: f64,
    /// Attempts in all, the first included.
    #[arg(long, env = "SLUICE_MAX_ATTEMPTS", default_value_t = 3, global = true)]
    pub max_attempts: u32,
    /// Seconds processing is held after the provider says its quota or spend limit is reached,
    /// before one call tries again (documents wait meanwhile; none fails).
    #[arg(long, env = "SLUICE_QUOTA_HOLD_SECS", default_value_t = 60.0, global = true)]
    pub quota_hold_secs: f64,
}

impl WorkerArgs {
    /// Attempts and backoff.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            delays: self.retry_delays.iter().map(|s| Duration::from_secs_f64(s.max(0.0))).collect(),
            max_delay: Duration::from_secs_f64(self.retry_max_delay.max(0.0)),
            total_budget: Duration::from_secs_f64(self.retry_budget_hours.max(0.0) * 3600.0),
            // `max` first: it turns NaN into the floor.
            quota_hold: Duration::from_secs_f64(self.quota_hold_secs.max(1.0).min(86_400.0)),
            ..RetryPolicy::default()
        }
    }

    /// This process's worker pool; an attempt's deadline grows by `per_100k_tokens` (the
    /// provider's allowance for long calls).
    pub fn worker_config(&self, per_100k_tokens: Duration) -> WorkerConfig {
        WorkerConfig {
            name: engine::queue::worker::unique_name(&hostname()),
            concurrency: self.workers,
            lease: Duration::from_secs_f64(self.lease_secs),
            heartbeat: Duration::from_secs_f64(self.heartbeat_secs),
            attempt_deadline: self.attempt_deadline(),
            deadline_per_100k_tokens: per_100k_tokens,
            policy: self.retry_policy(),
            ..WorkerConfig::default()
        }
    }

    /// How long one attempt may run (at least a second).
    pub fn attempt_deadline(&self) -> Duration {
        Duration::from_secs_f64(self.attempt_deadline_secs.max(1.0))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}
