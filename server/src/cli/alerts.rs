//! Alerts (their thresholds and the operator's receiver) and completion webhooks (where they
//! may go, how long one may take): turned into `AlertConfig` and `DeliveryConfig`.

use std::time::Duration;

use clap::Args;

use engine::alerts::{AlertConfig, Thresholds};
use engine::webhooks::{DeliveryConfig, TargetPolicy};

use super::Secret;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Alerts and webhooks")]
pub struct AlertArgs {
    /// Where alerts are sent (POST, JSON, signed with --alert-webhook-secret): once when one
    /// fires and once when it resolves. Unset: alerts show on the admin page and in /metrics only.
    #[arg(long, env = "SLUICE_ALERT_WEBHOOK_URL", global = true)]
    pub alert_webhook_url: Option<String>,
    /// The HMAC secret alert deliveries are signed with (required with --alert-webhook-url).
    #[arg(long, env = "SLUICE_ALERT_WEBHOOK_SECRET", hide_env_values = true, global = true)]
    pub alert_webhook_secret: Option<Secret>,
    /// Alert: the oldest waiting job has waited longer than this many seconds (paused time not counted).
    #[arg(long, env = "SLUICE_ALERT_OLDEST_WAIT_SECS", default_value_t = 900.0, global = true)]
    pub alert_oldest_wait_secs: f64,
    /// Alert: a backlog and no job finished for this many minutes (while processing is on).
    #[arg(long, env = "SLUICE_ALERT_NOT_DRAINING_MINS", default_value_t = 10.0, global = true)]
    pub alert_not_draining_mins: f64,
    /// Alert: more jobs than this in the dead-letter queue.
    #[arg(long, env = "SLUICE_ALERT_DLQ_DEPTH", default_value_t = 100, global = true)]
    pub alert_dlq_depth: i64,
    /// Alert: more jobs than this entered the dead-letter queue in the last hour.
    #[arg(long, env = "SLUICE_ALERT_DLQ_GROWTH_PER_HOUR", default_value_t = 20, global = true)]
    pub alert_dlq_growth_per_hour: i64,
    /// Alert: more than this share (0 to 1) of the last 15 minutes' provider calls failed
    /// (counted from 20 calls on).
    #[arg(long, env = "SLUICE_ALERT_PROVIDER_FAILURE_RATIO", default_value_t = 0.5, global = true)]
    pub alert_provider_failure_ratio: f64,
    /// Seconds between alert evaluations.
    #[arg(long, env = "SLUICE_ALERT_EVERY_SECS", default_value_t = 30.0, global = true)]
    pub alert_every_secs: f64,
    /// Hosts completion callbacks may go to: `*` (any public host), `hooks.example.com`,
    /// `*.example.com` (comma-separated).
    #[arg(long, env = "SLUICE_WEBHOOK_ALLOW_HOSTS", default_value = "*", value_delimiter = ',', global = true)]
    pub webhook_allow_hosts: Vec<String>,
    /// Let completion callbacks reach loopback and private addresses (a lab; never on a
    /// server that shares a network with anything you care about).
    #[arg(long, env = "SLUICE_WEBHOOK_ALLOW_PRIVATE", default_value_t = false, global = true)]
    pub webhook_allow_private: bool,
    /// Seconds one webhook POST may take.
    #[arg(long, env = "SLUICE_WEBHOOK_TIMEOUT_SECS", default_value_t = 10.0, global = true)]
    pub webhook_timeout_secs: f64,
}

impl AlertArgs {
    /// Alert rules, their thresholds and the operator's receiver.
    pub fn alert_config(&self) -> anyhow::Result<AlertConfig> {
        if self.alert_webhook_url.is_some() && self.alert_webhook_secret.is_none() {
            anyhow::bail!("--alert-webhook-url needs --alert-webhook-secret (receivers check the signature)");
        }
        Ok(AlertConfig {
            thresholds: Thresholds {
                oldest_wait_secs: self.alert_oldest_wait_secs,
                not_draining_mins: self.alert_not_draining_mins,
                dlq_depth: self.alert_dlq_depth,
                dlq_growth_per_hour: self.alert_dlq_growth_per_hour,
                provider_failure_ratio: self.alert_provider_failure_ratio,
                ..Thresholds::default()
            },
            every: Duration::from_secs_f64(self.alert_every_secs.max(0.1)),
            webhook_url: self.alert_webhook_url.clone(),
        })
    }

    /// How webhooks are delivered, and where callbacks may go.
    pub fn delivery_config(&self) -> DeliveryConfig {
        DeliveryConfig {
            policy: self.webhook_policy(),
            alert_secret: self.alert_webhook_secret.as_ref().map(|s| s.expose().to_string()),
            timeout: Duration::from_secs_f64(self.webhook_timeout_secs.max(0.1)),
            ..DeliveryConfig::default()
        }
    }

    /// Where completion callbacks may go.
    pub fn webhook_policy(&self) -> TargetPolicy {
        TargetPolicy { allow_hosts: self.webhook_allow_hosts.clone(), allow_private: self.webhook_allow_private }
    }
}
