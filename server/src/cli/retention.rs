//! How long what ended is kept: jobs, failed jobs' documents, evidence and webhook deliveries
//! (turned into the upkeep's `MaintenanceConfig`).

use std::time::Duration;

use clap::Args;

use engine::maintenance::MaintenanceConfig;
use engine::queue::retention::Retention;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Retention and upkeep")]
pub struct RetentionArgs {
    /// Days to keep done jobs.
    #[arg(long, env = "SLUICE_KEEP_DONE_DAYS", default_value_t = 30, global = true)]
    pub keep_done_days: u64,
    /// Days to keep failed jobs.
    #[arg(long, env = "SLUICE_KEEP_FAILED_DAYS", default_value_t = 90, global = true)]
    pub keep_failed_days: u64,
    /// Days a failed job's document is kept for the admins to inspect and replay; then it is
    /// deleted (the job stays). A canceled job's document is deleted at once.
    #[arg(long, env = "SLUICE_KEEP_FAILED_DOCUMENTS_DAYS", default_value_t = 7.0, global = true)]
    pub keep_failed_documents_days: f64,
    /// Days reconciliation reports, resolved alert firings, audit entries and users' notices
    /// are kept (the newest report always is).
    #[arg(long, env = "SLUICE_KEEP_EVIDENCE_DAYS", default_value_t = 90.0, global = true)]
    pub keep_evidence_days: f64,
    /// Days delivered and given-up webhook deliveries are kept (they name the job and its file).
    #[arg(long, env = "SLUICE_KEEP_WEBHOOK_DELIVERIES_DAYS", default_value_t = 7.0, global = true)]
    pub keep_webhook_deliveries_days: f64,
}

impl RetentionArgs {
    /// Upkeep schedules and retention; the login throttle's window and the idempotency keys'
    /// lifetime say when their rows may go.
    pub fn maintenance_config(&self, login_window: Duration, client_key_lifetime: Duration) -> MaintenanceConfig {
        MaintenanceConfig {
            retention: Retention {
                done: Duration::from_secs(self.keep_done_days * 86_400),
                failed: Duration::from_secs(self.keep_failed_days * 86_400),
                failed_documents: days(self.keep_failed_documents_days),
            },
            login_window,
            evidence_retention: days(self.keep_evidence_days),
            webhook_retention: days(self.keep_webhook_deliveries_days),
            client_key_lifetime,
            ..MaintenanceConfig::default()
        }
    }
}

/// A number of days (0 to 10 years) as a duration.
fn days(days: f64) -> Duration {
    Duration::from_secs_f64(if days.is_finite() { days.clamp(0.0, 3650.0) } else { 0.0 } * 86_400.0)
}
