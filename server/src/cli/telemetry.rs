//! What the server tells its operators: log lines, traces and metrics.

use clap::Args;

use super::Secret;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Logs, metrics and traces")]
pub struct TelemetryArgs {
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "SLUICE_LOG", default_value = "info,sqlx=warn", global = true)]
    pub log: String,
    /// Log lines as text (for people) or JSON (for log collectors; worker lines carry the
    /// job id, the attempt and the user id).
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Export traces over OTLP/HTTP (JSON) to this collector, e.g. `http://127.0.0.1:4318`
    /// (spans are posted to `<url>/v1/traces`). Off when unset. An upload's trace is stored
    /// with its job, and each attempt and provider call joins it.
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// Serve `/metrics` (Prometheus) on this separate address, without a token (bind it where
    /// only the scraper reaches). Off by default.
    #[arg(long, env = "SLUICE_METRICS_BIND", global = true)]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Serve `/metrics` on the main address to requests with `Authorization: Bearer <this>`.
    /// Off by default: `/metrics` is never public unless you set one of the two.
    #[arg(long, env = "SLUICE_METRICS_TOKEN", global = true)]
    pub metrics_token: Option<Secret>,
}
