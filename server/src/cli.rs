//! The command line: `server [serve]` and the operator commands, and the configuration (flags
//! with `SLUICE_*` environment variables) turned into the engine's and the web layer's configs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::login::LoginLimits;
use engine::accounts::users::SignupLimits;
use engine::alerts::{AlertConfig, Thresholds};
use engine::documents::providers::{self, Preset, ProviderConfig, ProviderKind};
use engine::documents::sandbox::{RunAs, SandboxConfig};
use engine::documents::Blobs;
use engine::maintenance::MaintenanceConfig;
use engine::queue::capacity::{CapacityConfig, ProviderLimits};
use engine::queue::policy::retry::RetryPolicy;
use engine::queue::retention::Retention;
use engine::queue::worker::WorkerConfig;
use engine::sizing::PriceTable;
use engine::sizing::TimeLimits;

/// Output tokens reserved from the budget per call until its usage is known, at most (a
/// translation's part reserves by its own size).
const OUTPUT_RESERVE: u32 = 4_096;
use engine::webhooks::{DeliveryConfig, TargetPolicy};

/// Sluice: documents through slow AI providers, behind a durable queue.
#[derive(Debug, Parser)]
#[command(name = "server", version)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What to do (`serve` when none is given).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the web app and run the workers (the default).
    Serve,
    /// Serve the web app only (no workers); run workers elsewhere with `worker`.
    Web,
    /// Run the workers only; HTTP answers just `/healthz` (for the orchestrator's probes).
    Worker,
    /// Run the database migrations and exit (before rolling out new processes).
    Migrate,
    /// Back up the database (pg_dump) and every stored document a job names into a new
    /// folder, consistently: no job in the backup lacks its document. The queue keeps running.
    Backup {
        #[arg(long)]
        to: PathBuf,
    },
    /// Restore a backup into an empty database and blob store; then start the server (running
    /// jobs of the backup are rescued when their leases run out).
    Restore {
        #[arg(long)]
        from: PathBuf,
    },
    /// Pause processing (the kill switch): running jobs finish or are handed back, nothing new
    /// starts, uploads are still accepted. Audited with the reason. `--for 10m` (or `2h`,
    /// `1d`) resumes by itself when the time is up, even across restarts.
    Pause {
        #[arg(long)]
        reason: String,
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_pause_length)]
        for_minutes: Option<u32>,
    },
    /// Resume processing. Audited with the reason.
    Resume {
        #[arg(long)]
        reason: String,
    },
    /// Set the global concurrency gate (jobs running at once across every process, 1 to 70).
    Gate { size: i32 },
    /// The dead-letter queue: `dlq list`, or `dlq replay KIND REASON` for one group.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// Check that money and jobs add up, store the report, and print it (exit status 1 when
    /// something does not add up). Fixes nothing.
    Reconcile,
    /// Explicit repairs (audited): `repair counters` sets balances to their ledgers and
    /// in-flight counts to the open jobs; `repair orphans` deletes stored documents no job
    /// points at (older than an hour).
    Repair {
        #[command(subcommand)]
        action: RepairAction,
    },
    /// The alerts firing now, and the latest resolved ones.
    Alerts,
    /// The capacity planner: duration and token percentiles of the last days' attempts, the
    /// safe concurrency each provider limit allows, the binding one, and a recommended gate.
    /// Limits default to the configured ones; give others to ask "what if".
    Capacity {
        /// Days of attempts to measure.
        #[arg(long, default_value_t = 7)]
        days: u32,
        #[arg(long)]
        requests_per_min: Option<u64>,
        #[arg(long)]
        input_tokens_per_min: Option<u64>,
        #[arg(long)]
        output_tokens_per_min: Option<u64>,
    },
    /// Cancel a job (waiting: at once, refunded; running: at its next safe point). Audited.
    Cancel { id: String },
    /// Jobs: `jobs show ID`.
    Jobs {
        #[command(subcommand)]
        action: JobsAction,
    },
    /// Create an administrator (password from SLUICE_ADMIN_PASSWORD, else prompted).
    CreateAdmin {
        #[arg(long)]
        email: String,
    },
    /// Grant credits to a user (a negative amount takes them back).
    GrantCredits {
        #[arg(long)]
        email: String,
        #[arg(long, allow_hyphen_values = true)]
        amount: i64,
    },
    /// List users with their balance and jobs in flight.
    ListUsers,
    /// The sandboxed document reader the workers start (document on stdin, text on stdout).
    #[command(hide = true)]
    Extract {
        /// The user to become before reading (`uid:gid`).
        #[arg(long)]
        run_as: Option<String>,
        /// pdf, text or markdown
        doc_type: String,
    },
}

fn parse_pause_length(text: &str) -> Result<u32, String> {
    engine::queue::switches::parse_pause(text)
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// The failed jobs grouped by kind and reason, with counts.
    List,
    /// Replay one group (its kind and reason as `dlq list` prints them). Audited.
    Replay { kind: String, reason: String },
}

#[derive(Debug, Subcommand)]
pub enum RepairAction {
    /// Set each user's balance to the sum of their ledger and their in-flight count to their
    /// jobs not yet ended. Audited; prints every change.
    Counters,
    /// Delete stored documents that no job points at and that are older than an hour. Audited.
    Orphans,
}

#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// One job: its state, owner, cost and every attempt.
    Show { id: String },
}

/// A setting that must never be printed (a database URL with its password, an API key):
/// `Debug` shows only that it is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The `--provider` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderChoice {
    Local,
    Anthropic,
    Openai,
}

/// Every setting, from flags or their environment variables.
#[derive(Clone, Debug, Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "SLUICE_BIND", default_value = "127.0.0.1:3000", global = true)]
    pub bind: SocketAddr,
    /// Postgres to use. When unset, a private cluster is started in <data-dir>/postgres.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<Secret>,
    /// Folder for the embedded Postgres cluster and local blobs.
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = ".data", global = true)]
    pub data_dir: PathBuf,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "SLUICE_LOG", default_value = "info,sqlx=warn", global = true)]
    pub log: String,
    /// Where cargo-leptos put the site (JS, WASM, CSS, assets).
    #[arg(long, env = "LEPTOS_SITE_ROOT", default_value = "target/site", global = true)]
    pub site_root: String,
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
    /// Days to keep done jobs.
    #[arg(long, env = "SLUICE_KEEP_DONE_DAYS", default_value_t = 30, global = true)]
    pub keep_done_days: u64,
    /// Credits a new account starts with.
    #[arg(long, env = "SLUICE_SIGNUP_GRANT", default_value_t = 20, global = true)]
    pub signup_grant: i64,
    /// Credits by a document's estimated input tokens, as steps `TOKENS:CREDITS,...` (the first
    /// step a document fits in is its price; past the last, the last). A bare number is a flat price.
    #[arg(long, env = "SLUICE_PRICES", default_value = "25000:1,100000:2,200000:4", global = true)]
    pub prices: PriceTable,
    /// Largest upload accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_UPLOAD_BYTES", default_value_t = 50 * 1024 * 1024, global = true)]
    pub max_upload_bytes: u64,
    /// Uploads read at once; more get 503 with Retry-After before their body is read.
    #[arg(long, env = "SLUICE_MAX_CONCURRENT_UPLOADS", default_value_t = 32, global = true)]
    pub max_concurrent_uploads: usize,
    /// Uploads one client address may have in progress at once, whatever the accounts (several
    /// free accounts on one address share it); past it, 429.
    #[arg(long, env = "SLUICE_MAX_UPLOADS_PER_ADDRESS", default_value_t = 16, global = true)]
    pub max_uploads_per_address: usize,
    /// Seconds a request other than an upload or a download may take (slow clients too); 408 past it.
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_SECS", default_value_t = 30, global = true)]
    pub request_timeout_secs: u64,
    /// Seconds a request's headers may take to arrive, and a kept-alive connection may sit idle.
    #[arg(long, env = "SLUICE_HEADER_READ_TIMEOUT_SECS", default_value_t = 10.0, global = true)]
    pub header_read_timeout_secs: f64,
    /// Seconds a client may take to read 16 KiB of an answer waiting for it (a download's
    /// minimum rate); past it the connection is closed.
    #[arg(long, env = "SLUICE_STALLED_WRITE_TIMEOUT_SECS", default_value_t = 30.0, global = true)]
    pub stalled_write_timeout_secs: f64,
    /// Connections open at once; past it a new one is answered 503 and closed.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 4096, global = true)]
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv4, IPv6 /64; trusted proxies
    /// aside); past it a new one may still ask for /healthz, anything else is answered 503.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 256, global = true)]
    pub max_connections_per_address: usize,
    /// Intake bound: refuse uploads (503) past this many waiting jobs.
    #[arg(long, env = "SLUICE_MAX_BACKLOG", default_value_t = 10_000, global = true)]
    pub max_backlog: i64,
    /// Intake bound: refuse uploads (503) while the oldest waiting job has waited this long.
    #[arg(long, env = "SLUICE_MAX_OLDEST_WAIT_SECS", default_value_t = 1800, global = true)]
    pub max_oldest_wait_secs: u64,
    /// Hours a client's `Idempotency-Key` names its job; after that it is forgotten (a repeat
    /// makes a new job). Uploads' answers say when (`idempotency_key_expires_at`).
    #[arg(long, env = "SLUICE_IDEMPOTENCY_KEY_HOURS", default_value_t = 24.0, global = true)]
    pub idempotency_key_hours: f64,
    /// Failed logins per account within 15 minutes before 429.
    #[arg(long, env = "SLUICE_LOGIN_FAILURES_PER_ACCOUNT", default_value_t = 5, global = true)]
    pub login_failures_per_account: i64,
    /// Failed logins per client address within 15 minutes before 429.
    #[arg(long, env = "SLUICE_LOGIN_FAILURES_PER_ADDRESS", default_value_t = 20, global = true)]
    pub login_failures_per_address: i64,
    /// Accounts one client address may make per hour.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_ADDRESS", default_value_t = 10, global = true)]
    pub signups_per_address: i64,
    /// Accounts one network (an IPv4 /24, an IPv6 /48) may make per hour.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_NETWORK", default_value_t = 30, global = true)]
    pub signups_per_network: i64,
    /// Accounts that may be made per hour in all.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_HOUR", default_value_t = 300, global = true)]
    pub signups_per_hour: i64,
    /// Reverse proxies (IP addresses, comma-separated) whose X-Forwarded-For is believed for
    /// the throttles; by default none is, and the peer address counts.
    #[arg(long, env = "SLUICE_TRUSTED_PROXIES", value_delimiter = ',', global = true)]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Mark the session cookie `Secure` (serve over HTTPS when you set this).
    #[arg(long, env = "SLUICE_SECURE_COOKIES", default_value_t = false, global = true)]
    pub secure_cookies: bool,
    /// Serve `/metrics` (Prometheus) on this separate address, without a token (bind it where
    /// only the scraper reaches). Off by default.
    #[arg(long, env = "SLUICE_METRICS_BIND", global = true)]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Serve `/metrics` on the main address to requests with `Authorization: Bearer <this>`.
    /// Off by default: `/metrics` is never public unless you set one of the two.
    #[arg(long, env = "SLUICE_METRICS_TOKEN", global = true)]
    pub metrics_token: Option<Secret>,
    /// Log lines as text (for people) or JSON (for log collectors; worker lines carry the
    /// job id, the attempt and the user id).
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Export traces over OTLP/HTTP (JSON) to this collector, e.g. `http://127.0.0.1:4318`
    /// (spans are posted to `<url>/v1/traces`). Off when unset. An upload's trace is stored
    /// with its job, and each attempt and provider call joins it.
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// The AI provider: local (built in, no network), anthropic, or openai (any
    /// OpenAI-compatible server: Ollama, vLLM, llama.cpp).
    #[arg(long, env = "SLUICE_PROVIDER", value_enum, default_value = "local", global = true)]
    pub provider: ProviderChoice,
    /// The provider's base URL (anthropic: https://api.anthropic.com; openai: ending in /v1).
    #[arg(long, env = "SLUICE_PROVIDER_URL", default_value = "", global = true)]
    pub provider_url: String,
    /// The provider's API key (never logged).
    #[arg(long, env = "SLUICE_PROVIDER_API_KEY", hide_env_values = true, global = true)]
    pub provider_api_key: Option<Secret>,
    /// The model to ask.
    #[arg(long, env = "SLUICE_PROVIDER_MODEL", default_value = "", global = true)]
    pub provider_model: String,
    /// The most output tokens one answer may have (`max_tokens`). Unset: the model's documented
    /// maximum (claude-sonnet-4-5 64,000; gpt-4o 16,384; unknown models 8,192). A translation's
    /// parts are sized so their answers fit it; an answer cut at it is redone in halves.
    #[arg(long, env = "SLUICE_PROVIDER_MAX_TOKENS", global = true)]
    pub provider_max_tokens: Option<u32>,
    /// What the provider charges per million input tokens, in US dollars (unset: the console
    /// shows outcomes in tokens and credits only).
    #[arg(long, env = "SLUICE_PROVIDER_INPUT_USD_PER_MTOK", global = true)]
    pub provider_input_usd_per_mtok: Option<f64>,
    /// What the provider charges per million output tokens, in US dollars.
    #[arg(long, env = "SLUICE_PROVIDER_OUTPUT_USD_PER_MTOK", global = true)]
    pub provider_output_usd_per_mtok: Option<f64>,
    /// Seconds before a provider call counts as timed out (plus the allowance per 100K tokens).
    #[arg(long, env = "SLUICE_PROVIDER_TIMEOUT_SECS", default_value_t = 120.0, global = true)]
    pub provider_timeout_secs: f64,
    /// Seconds added to the provider timeout and the attempt deadline per 100K input tokens of
    /// the call (a long part takes the model longer).
    #[arg(long, env = "SLUICE_TIMEOUT_PER_100K_TOKENS_SECS", default_value_t = 300.0, global = true)]
    pub timeout_per_100k_tokens_secs: f64,
    /// The provider's request limit per minute (unset: unlimited). Claims keep within it.
    #[arg(long, env = "SLUICE_PROVIDER_REQUESTS_PER_MIN", global = true)]
    pub provider_requests_per_min: Option<u64>,
    /// The provider's input-token limit per minute (unset: unlimited): the token budget.
    #[arg(long, env = "SLUICE_PROVIDER_INPUT_TOKENS_PER_MIN", global = true)]
    pub provider_input_tokens_per_min: Option<u64>,
    /// The provider's output-token limit per minute (unset: unlimited).
    #[arg(long, env = "SLUICE_PROVIDER_OUTPUT_TOKENS_PER_MIN", global = true)]
    pub provider_output_tokens_per_min: Option<u64>,
    /// Seconds of its rate each budget holds at most (60: a full minute's worth, as Anthropic's).
    #[arg(long, env = "SLUICE_PROVIDER_BURST_SECS", default_value_t = 60.0, global = true)]
    pub provider_burst_secs: f64,
    /// The share of each provider limit the budget plans to use (the rest absorbs the jitter
    /// between a claim and its request).
    #[arg(long, env = "SLUICE_PROVIDER_LIMIT_SHARE", default_value_t = 0.95, global = true)]
    pub provider_limit_share: f64,
    /// The most input tokens one request may carry: longer documents are processed in parts
    /// that each fit. 0 = no limit.
    #[arg(long, env = "SLUICE_PROVIDER_CONTEXT_TOKENS", default_value_t = 200_000, global = true)]
    pub provider_context_tokens: u64,
    /// The most estimated tokens one document may have: longer texts are refused at upload
    /// (413, before their bytes are stored), longer PDFs fail once read (refunded). 0 = no limit.
    #[arg(long, env = "SLUICE_MAX_DOCUMENT_TOKENS", default_value_t = 2_000_000, global = true)]
    pub max_document_tokens: u64,
    /// After a 429/529 the gate is halved; it grows back one slot per this many seconds.
    #[arg(long, env = "SLUICE_GATE_RECOVER_SECS", default_value_t = 10.0, global = true)]
    pub gate_recover_secs: f64,
    /// Blob storage: unset = a folder under the data folder; or a URL like s3://bucket/prefix
    /// (credentials and endpoint from AWS_* variables).
    #[arg(long, env = "SLUICE_BLOB_STORE", global = true)]
    pub blob_store: Option<String>,
    /// Address space of the sandboxed document reader, in MiB.
    #[arg(long, env = "SLUICE_EXTRACT_MEMORY_MIB", default_value_t = 1024, global = true)]
    pub extract_memory_mib: u64,
    /// CPU seconds the document reader may use per document.
    #[arg(long, env = "SLUICE_EXTRACT_CPU_SECS", default_value_t = 30, global = true)]
    pub extract_cpu_secs: u64,
    /// Wall-clock seconds the document reader may take per document.
    #[arg(long, env = "SLUICE_EXTRACT_WALL_SECS", default_value_t = 60, global = true)]
    pub extract_wall_secs: u64,
    /// Document readers running at once per process (0: one per core).
    #[arg(long, env = "SLUICE_EXTRACT_READERS", default_value_t = 0, global = true)]
    pub extract_readers: usize,
    /// Address space of all document readers running at once, in MiB.
    #[arg(long, env = "SLUICE_EXTRACT_MEMORY_BUDGET_MIB", default_value_t = 4096, global = true)]
    pub extract_memory_budget_mib: u64,
    /// The unprivileged user the document reader becomes when the server runs as root.
    #[arg(long, env = "SLUICE_EXTRACT_USER", default_value = "nobody", global = true)]
    pub extract_user: String,
    /// Days to keep failed jobs.
    #[arg(long, env = "SLUICE_KEEP_FAILED_DAYS", default_value_t = 90, global = true)]
    pub keep_failed_days: u64,
    /// Days a failed job's document is kept for the admins to inspect and replay; then it is
    /// deleted (the job stays). A canceled job's document is deleted at once.
    #[arg(long, env = "SLUICE_KEEP_FAILED_DOCUMENTS_DAYS", default_value_t = 7.0, global = true)]
    pub keep_failed_documents_days: f64,
    /// Days reconciliation reports and resolved alert firings are kept (the newest report
    /// always is).
    #[arg(long, env = "SLUICE_KEEP_EVIDENCE_DAYS", default_value_t = 90.0, global = true)]
    pub keep_evidence_days: f64,
    /// Days delivered and given-up webhook deliveries are kept (they name the job and its file).
    #[arg(long, env = "SLUICE_KEEP_WEBHOOK_DELIVERIES_DAYS", default_value_t = 7.0, global = true)]
    pub keep_webhook_deliveries_days: f64,
    /// Storage per user, in MiB: the documents of their jobs that keep them (shared ones once).
    /// Uploads past it get 413 `storage_full` before their body is read. 0 = none.
    #[arg(long, env = "SLUICE_STORAGE_QUOTA_MIB", default_value_t = 1024, global = true)]
    pub storage_quota_mib: u64,
    /// Seconds a process keeps who a token or a session belongs to, so polls need not ask
    /// Postgres (0 to 5; 0 asks every time). Revoking a token, logging out and deleting an
    /// account reach every process at once through LISTEN/NOTIFY; this is the backstop.
    #[arg(long, env = "SLUICE_AUTH_CACHE_SECS", default_value_t = 5.0, global = true)]
    pub auth_cache_secs: f64,
    /// The most jobs one bulk action of the console (cancel, replay or discard what a search
    /// matches) may take; a search matching more is refused with "narrow it".
    #[arg(long, env = "SLUICE_BULK_ACTION_CAP", default_value_t = 10_000, global = true)]
    pub bulk_action_cap: i64,
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

impl Config {
    /// Attempts and backoff.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            delays: self.retry_delays.iter().map(|s| Duration::from_secs_f64(s.max(0.0))).collect(),
            max_delay: Duration::from_secs_f64(self.retry_max_delay.max(0.0)),
            total_budget: Duration::from_secs_f64(self.retry_budget_hours.max(0.0) * 3600.0),
            ..RetryPolicy::default()
        }
    }

    /// This process's worker pool.
    pub fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            name: format!("{}-{}", hostname(), std::process::id()),
            concurrency: self.workers,
            lease: Duration::from_secs_f64(self.lease_secs),
            heartbeat: Duration::from_secs_f64(self.heartbeat_secs),
            attempt_deadline: Duration::from_secs_f64(self.attempt_deadline_secs.max(1.0)),
            deadline_per_100k_tokens: Duration::from_secs_f64(self.timeout_per_100k_tokens_secs.clamp(0.0, 86_400.0)),
            policy: self.retry_policy(),
            ..WorkerConfig::default()
        }
    }

    /// How long a client's `Idempotency-Key` names its job (1 minute to 30 days).
    pub fn client_key_lifetime(&self) -> Duration {
        let hours = if self.idempotency_key_hours.is_finite() { self.idempotency_key_hours } else { 24.0 };
        Duration::from_secs_f64(hours.clamp(1.0 / 60.0, 720.0) * 3600.0)
    }

    /// Upkeep schedules and retention.
    pub fn maintenance_config(&self) -> MaintenanceConfig {
        MaintenanceConfig {
            retention: Retention {
                done: Duration::from_secs(self.keep_done_days * 86_400),
                failed: Duration::from_secs(self.keep_failed_days * 86_400),
                failed_documents: days(self.keep_failed_documents_days),
            },
            login_window: self.web_settings().login_limits.window,
            evidence_retention: days(self.keep_evidence_days),
            webhook_retention: days(self.keep_webhook_deliveries_days),
            client_key_lifetime: self.client_key_lifetime(),
            ..MaintenanceConfig::default()
        }
    }

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

    /// What the web layer charges, limits and offers.
    pub fn web_settings(&self) -> WebSettings {
        WebSettings {
            admission: AdmissionConfig {
                prices: self.prices.clone(),
                max_document_tokens: self.document_ceiling(),
                max_call_tokens: self.context_tokens(),
                max_backlog: self.max_backlog,
                max_oldest_wait: Duration::from_secs(self.max_oldest_wait_secs),
                max_attempts: self.max_attempts.max(1) as i32,
                storage_quota_bytes: (self.storage_quota_mib > 0)
                    .then(|| self.storage_quota_mib.saturating_mul(1 << 20)),
                client_key_lifetime: self.client_key_lifetime(),
                ..Default::default()
            },
            signup_grant: self.signup_grant.max(0),
            secure_cookies: self.secure_cookies,
            login_limits: LoginLimits {
                per_account: self.login_failures_per_account,
                per_address: self.login_failures_per_address,
                ..Default::default()
            },
            signup_limits: SignupLimits {
                per_address: self.signups_per_address,
                per_network: self.signups_per_network,
                overall: self.signups_per_hour,
                ..SignupLimits::default()
            },
            trusted_proxies: self.trusted_proxies.clone(),
            max_upload_bytes: self.max_upload_bytes,
            max_concurrent_uploads: self.max_concurrent_uploads,
            max_uploads_per_address: self.max_uploads_per_address.max(1),
            request_timeout: Duration::from_secs(self.request_timeout_secs.max(1)),
            header_read_timeout: Duration::from_secs_f64(self.header_read_timeout_secs.clamp(0.1, 3600.0)),
            stalled_write_timeout: Duration::from_secs_f64(self.stalled_write_timeout_secs.clamp(0.1, 3600.0)),
            max_connections: self.max_connections.max(1),
            max_connections_per_address: self.max_connections_per_address.max(1),
            metrics_token: self.metrics_token.as_ref().map(|t| t.expose().to_string()),
            webhook_policy: self.webhook_policy(),
            alert_webhook: self.alert_webhook_url.is_some(),
            bulk_action_cap: self.bulk_action_cap.clamp(1, 100_000),
            auth_cache_lifetime: Duration::from_secs_f64(if self.auth_cache_secs.is_finite() {
                self.auth_cache_secs.clamp(0.0, 5.0)
            } else {
                5.0
            }),
            time_limits: self.time_limits(),
            provider_prices: self.provider_prices(),
            presets: {
                let provider = providers::build(&self.provider_config());
                Preset::ALL.into_iter().filter(|p| provider.supports(*p)).collect()
            },
            ..WebSettings::default()
        }
    }

    /// The most estimated tokens one document may have (None: no ceiling).
    pub fn document_ceiling(&self) -> Option<u64> {
        (self.max_document_tokens > 0).then_some(self.max_document_tokens)
    }

    /// The most input tokens one request may carry: the provider's context, and no more than
    /// one input-token bucket holds (a larger request could never pass the provider's limit).
    pub fn context_tokens(&self) -> Option<u64> {
        let context = (self.provider_context_tokens > 0).then_some(self.provider_context_tokens);
        let capacity = self.capacity_config();
        let bucket = capacity
            .limits
            .input_tokens_per_min
            .map(|per_min| (per_min as f64 * capacity.burst.as_secs_f64() / 60.0) as u64);
        match (context, bucket) {
            (Some(c), Some(b)) => Some(c.min(b)),
            (c, b) => c.or(b),
        }
    }

    /// The provider's limits, the budget's burst and the adaptive gate's pace.
    pub fn capacity_config(&self) -> CapacityConfig {
        CapacityConfig {
            limits: ProviderLimits {
                requests_per_min: self.provider_requests_per_min.filter(|v| *v > 0),
                input_tokens_per_min: self.provider_input_tokens_per_min.filter(|v| *v > 0),
                output_tokens_per_min: self.provider_output_tokens_per_min.filter(|v| *v > 0),
            },
            // `max` first: it turns NaN into the floor.
            burst: Duration::from_secs_f64(self.provider_burst_secs.max(0.01).min(3600.0)),
            // What a call's answer is expected to hold until its usage is known: a translation
            // reserves by its own size; other answers are short (a summary), not `max_tokens`.
            output_reserve: i64::from(self.max_output_tokens().min(OUTPUT_RESERVE)),
            recover_step: Duration::from_secs_f64(self.gate_recover_secs.max(0.01).min(3600.0)),
            share: self.provider_limit_share.max(0.01).min(1.0),
        }
    }

    /// The provider's prices per million tokens, when either is given.
    pub fn provider_prices(&self) -> Option<engine::sizing::ProviderPrices> {
        let price = |v: Option<f64>| v.filter(|p| p.is_finite() && *p >= 0.0);
        let (input, output) = (price(self.provider_input_usd_per_mtok), price(self.provider_output_usd_per_mtok));
        (input.is_some() || output.is_some()).then(|| engine::sizing::ProviderPrices {
            input_usd_per_mtok: input.unwrap_or(0.0),
            output_usd_per_mtok: output.unwrap_or(0.0),
        })
    }

    /// The most output tokens one answer may have: as configured, or the model's documented
    /// maximum.
    pub fn max_output_tokens(&self) -> u32 {
        let kind = self.provider_kind();
        self.provider_max_tokens
            .filter(|n| *n > 0)
            .unwrap_or_else(|| providers::documented_max_output_tokens(kind, &self.provider_model))
    }

    fn provider_kind(&self) -> ProviderKind {
        match self.provider {
            ProviderChoice::Local => ProviderKind::Local,
            ProviderChoice::Anthropic => ProviderKind::Anthropic,
            ProviderChoice::Openai => ProviderKind::Openai,
        }
    }

    /// The AI provider.
    pub fn provider_config(&self) -> ProviderConfig {
        ProviderConfig {
            kind: self.provider_kind(),
            base_url: self.provider_url.clone(),
            api_key: self.provider_api_key.as_ref().map(|k| k.expose().to_string()),
            model: self.provider_model.clone(),
            max_tokens: self.max_output_tokens(),
            timeout: Duration::from_secs_f64(self.provider_timeout_secs.max(0.1)),
            timeout_per_100k_tokens: Duration::from_secs_f64(self.timeout_per_100k_tokens_secs.clamp(0.0, 86_400.0)),
        }
    }

    /// The provider timeout and the attempt deadline, growing with a call's tokens.
    pub fn time_limits(&self) -> TimeLimits {
        TimeLimits {
            provider_secs: self.provider_timeout_secs.max(0.1),
            attempt_secs: self.attempt_deadline_secs.max(1.0),
            per_100k_tokens_secs: self.timeout_per_100k_tokens_secs.clamp(0.0, 86_400.0),
        }
    }

    /// The document reader: this same binary's hidden `extract` command, with the configured limits.
    pub fn sandbox_config(&self) -> anyhow::Result<SandboxConfig> {
        let program = std::env::current_exe().context("finding this program to start the document reader")?;
        let mut sandbox = SandboxConfig::new(program, vec!["extract".into()]);
        sandbox.memory_bytes = self.extract_memory_mib << 20;
        sandbox.cpu_secs = self.extract_cpu_secs;
        sandbox.wall_clock = Duration::from_secs(self.extract_wall_secs);
        let readers = match self.extract_readers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        };
        sandbox.limit_readers(readers, self.extract_memory_budget_mib << 20);
        if engine::documents::sandbox::running_as_root() {
            // Root: never let a document be parsed by uid 0; no such user is no start.
            let user = RunAs::lookup(&self.extract_user).with_context(|| {
                format!("the document reader's user {:?} does not exist (--extract-user)", self.extract_user)
            })?;
            anyhow::ensure!(user.uid != 0 && user.gid != 0, "--extract-user must not be root");
            sandbox.run_as = Some(user);
        }
        Ok(sandbox)
    }

    /// Blob storage: a folder under the data folder, or the configured URL.
    pub fn blobs(&self) -> anyhow::Result<Blobs> {
        Ok(match &self.blob_store {
            Some(url) => Blobs::from_url(url)?,
            None => Blobs::local(&self.data_dir.join("blobs"))?,
        })
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}

/// A number of days (0 to 10 years) as a duration.
fn days(days: f64) -> Duration {
    Duration::from_secs_f64(if days.is_finite() { days.clamp(0.0, 3650.0) } else { 0.0 } * 86_400.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_is_no_larger_than_one_input_bucket_and_odd_numbers_are_tamed() {
        let config = |args: &[&str]| Cli::parse_from([&["server"], args].concat()).config;
        assert_eq!(config(&[]).context_tokens(), Some(200_000));
        assert_eq!(config(&["--provider-context-tokens", "0"]).context_tokens(), None);
        // 30,000 input tokens a minute in a bucket holding a minute: a 200K request never passes.
        let small = config(&["--provider-input-tokens-per-min", "30000"]);
        assert_eq!(small.context_tokens(), Some(30_000));
        assert_eq!(small.web_settings().admission.max_document_tokens, Some(2_000_000));
        let burst = config(&["--provider-input-tokens-per-min", "600000", "--provider-burst-secs", "1"]);
        assert_eq!(burst.context_tokens(), Some(10_000));
        let odd = config(&["--provider-burst-secs", "NaN", "--gate-recover-secs=-3", "--provider-limit-share", "7"]);
        let capacity = odd.capacity_config();
        assert_eq!(capacity.burst, Duration::from_secs_f64(0.01));
        assert_eq!(capacity.recover_step, Duration::from_secs_f64(0.01));
        assert_eq!(capacity.share, 1.0);
        assert!("25000:1,100000:2".parse::<PriceTable>().is_ok() && "1:99999999999".parse::<PriceTable>().is_err());
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let cli = Cli::parse_from([
            "server",
            "--database-url",
            "postgres://sluice:hunter2@db.internal/sluice",
            "--provider-api-key",
            "sk-live-abcdef123456",
        ]);
        let printed = format!("{cli:?} {:?}", cli.config.provider_config());
        assert!(!printed.contains("hunter2") && !printed.contains("sk-live"), "{printed}");
        assert_eq!(cli.config.database_url.unwrap().expose(), "postgres://sluice:hunter2@db.internal/sluice");
    }
}
