use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Sluice: documents through slow AI providers, behind a durable queue.
#[derive(Debug, Parser)]
#[command(name = "server", version)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the web app and run the workers (the default).
    Serve,
}

#[derive(Clone, Debug, Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(
        long,
        env = "SLUICE_BIND",
        default_value = "127.0.0.1:3000",
        global = true
    )]
    pub bind: SocketAddr,
    /// Postgres to use. When unset, a private cluster is started in <data-dir>/postgres.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Folder for the embedded Postgres cluster and local blobs.
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = ".data", global = true)]
    pub data_dir: PathBuf,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(
        long,
        env = "SLUICE_LOG",
        default_value = "info,sqlx=warn",
        global = true
    )]
    pub log: String,
    /// Where cargo-leptos put the site (JS, WASM, CSS, assets).
    #[arg(
        long,
        env = "LEPTOS_SITE_ROOT",
        default_value = "target/site",
        global = true
    )]
    pub site_root: String,
    /// Worker tasks in this process (0 = web only).
    #[arg(long, env = "SLUICE_WORKERS", default_value_t = 24, global = true)]
    pub workers: usize,
    /// Seconds a worker's lease lasts without a heartbeat.
    #[arg(long, env = "SLUICE_LEASE_SECS", default_value_t = 60.0, global = true)]
    pub lease_secs: f64,
    /// Seconds between heartbeats.
    #[arg(
        long,
        env = "SLUICE_HEARTBEAT_SECS",
        default_value_t = 15.0,
        global = true
    )]
    pub heartbeat_secs: f64,
    /// Seconds to wait before attempts 2, 3, ... (comma-separated; the last repeats).
    #[arg(
        long,
        env = "SLUICE_RETRY_DELAYS",
        default_value = "30,60",
        value_delimiter = ',',
        global = true
    )]
    pub retry_delays: Vec<f64>,
    /// Upper bound of any scheduled retry delay, in seconds.
    #[arg(
        long,
        env = "SLUICE_RETRY_MAX_DELAY",
        default_value_t = 120.0,
        global = true
    )]
    pub retry_max_delay: f64,
    /// Attempts in all, the first included.
    #[arg(long, env = "SLUICE_MAX_ATTEMPTS", default_value_t = 3, global = true)]
    pub max_attempts: u32,
    /// Days to keep done jobs.
    #[arg(
        long,
        env = "SLUICE_KEEP_DONE_DAYS",
        default_value_t = 30,
        global = true
    )]
    pub keep_done_days: u64,
    /// Days to keep failed jobs.
    #[arg(
        long,
        env = "SLUICE_KEEP_FAILED_DAYS",
        default_value_t = 90,
        global = true
    )]
    pub keep_failed_days: u64,
}

impl Config {
    pub fn retry_policy(&self) -> engine::retry::RetryPolicy {
        engine::retry::RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            delays: self
                .retry_delays
                .iter()
                .map(|s| Duration::from_secs_f64(s.max(0.0)))
                .collect(),
            max_delay: Duration::from_secs_f64(self.retry_max_delay.max(0.0)),
            ..engine::retry::RetryPolicy::default()
        }
    }

    pub fn retention(&self) -> engine::maintenance::Retention {
        engine::maintenance::Retention {
            done: Duration::from_secs(self.keep_done_days * 86_400),
            failed: Duration::from_secs(self.keep_failed_days * 86_400),
        }
    }
}
