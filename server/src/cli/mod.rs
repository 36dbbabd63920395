//! The command line: `server [serve]` and the operator commands, and the configuration: flags
//! with `SLUICE_*` environment variables, one `Args` struct per concern (each file here, shown
//! as its own section of `server --help`), each turning into the settings of the module that
//! uses it. What needs two concerns at once (the web layer's settings, the upkeep's) is put
//! together here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use app::server::session::WebSettings;
use engine::maintenance::MaintenanceConfig;
use engine::queue::worker::WorkerConfig;

mod accounts;
mod admission;
mod alerts;
mod documents;
mod lanes;
mod mail;
mod provider;
mod retention;
mod scans;
mod server;
mod telemetry;
mod web;
mod workers;

pub use accounts::AccountArgs;
pub use admission::AdmissionArgs;
pub use alerts::AlertArgs;
pub use documents::DocumentArgs;
pub use lanes::LaneArgs;
pub use mail::MailArgs;
pub use provider::{ProviderArgs, ProviderChoice};
pub use retention::RetentionArgs;
pub use scans::ScanArgs;
pub use server::ServerArgs;
pub use telemetry::{LogFormat, TelemetryArgs};
pub use web::WebArgs;
pub use workers::WorkerArgs;

/// Sluice: documents through slow AI providers, behind a durable queue.
#[derive(Debug, Parser)]
#[command(
    name = "server",
    version,
    after_help = "Every option is also an environment variable (shown beside it) and applies to every \
                  command. What each does, and why: the book's Configuration chapter \
                  (docs/src/configuration.md)."
)]
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
    /// Create an administrator (password from SLUICE_ADMIN_PASSWORD, else prompted). An address
    /// that already has an account is refused: anyone may have signed up with it first.
    CreateAdmin {
        #[arg(long)]
        email: String,
        /// Make the existing account at this address the admin instead: only a verified
        /// account (its age and verification are printed); its password becomes the one given
        /// here, and its sessions and tokens end.
        #[arg(long)]
        promote_existing: bool,
    },
    /// Grant credits to a user (a negative amount takes them back).
    GrantCredits {
        #[arg(long)]
        email: String,
        #[arg(long, allow_hyphen_values = true)]
        amount: i64,
    },
    /// Give an account a role: `user`, `support` (reads the console, marks jobs for review),
    /// `operator` (also acts on jobs and pauses processing) or `admin` (also the gate, credits
    /// and users). Audited; every process honours it on the next request.
    SetRole {
        #[arg(long)]
        email: String,
        #[arg(long, value_parser = parse_role)]
        role: engine::accounts::Role,
    },
    /// Put an account's documents in the urgent lane (`--urgent true`), whatever their size, or
    /// back to the lane their size gives (`--urgent false`), from its next upload on.
    SetLane {
        #[arg(long)]
        email: String,
        #[arg(long, action = clap::ArgAction::Set)]
        urgent: bool,
    },
    /// Put a waiting document at the front of the line (a deadline at risk, say): due at once and
    /// first in its lane; the gate, the lanes and the kill switch still decide when it starts.
    /// Audited.
    RunNext {
        #[arg(long)]
        job: uuid::Uuid,
    },
    /// List users with their balance and jobs in flight.
    ListUsers,
    /// The sandboxed document reader the workers start (document on stdin, text on stdout).
    #[command(hide = true)]
    Extract {
        /// The user to become before reading (`uid:gid`).
        #[arg(long)]
        run_as: Option<String>,
        /// The type, as its file extension: pdf, txt, md, docx, odt or html
        doc_type: String,
    },
}

fn parse_role(text: &str) -> Result<engine::accounts::Role, String> {
    engine::accounts::Role::parse(text).ok_or_else(|| "a role is one of: user, support, operator, admin".into())
}

fn parse_pause_length(text: &str) -> Result<u32, String> {
    engine::queue::switches::parse_pause(text)
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

/// Every setting, from flags or their environment variables, by concern.
#[derive(Clone, Debug, Args)]
pub struct Config {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub lanes: LaneArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
    #[command(flatten)]
    pub admission: AdmissionArgs,
    #[command(flatten)]
    pub documents: DocumentArgs,
    #[command(flatten)]
    pub scans: ScanArgs,
    #[command(flatten)]
    pub web: WebArgs,
    #[command(flatten)]
    pub accounts: AccountArgs,
    #[command(flatten)]
    pub mail: MailArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub alerts: AlertArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl Config {
    /// This process's worker pool (its attempts' deadlines grow as the provider's timeouts do).
    pub fn worker_config(&self) -> WorkerConfig {
        self.workers.worker_config(self.provider.per_100k_tokens())
    }

    /// Upkeep schedules and retention.
    pub fn maintenance_config(&self) -> MaintenanceConfig {
        self.retention.maintenance_config(self.accounts.login_limits().window, self.admission.client_key_lifetime())
    }

    /// Mail: SMTP or the outbox folder under the data folder, links under the public address.
    pub fn mail_config(&self) -> engine::mail::MailConfig {
        self.mail.mail_config(&self.server.data_dir, self.server.bind)
    }

    /// Blob storage: a folder under the data folder, or the configured URL.
    pub fn blobs(&self) -> anyhow::Result<engine::documents::Blobs> {
        self.documents.blobs(&self.server.data_dir)
    }

    /// The economy lane's terms, when the provider has a batch API to offer it through.
    pub fn economy_terms(&self) -> Option<engine::sizing::EconomyTerms> {
        self.provider.offers_batches().then(|| self.admission.economy_terms())
    }

    /// What the web layer charges, limits and offers.
    pub fn web_settings(&self) -> WebSettings {
        let (web, documents, accounts) = (&self.web, &self.documents, &self.accounts);
        WebSettings {
            admission: engine::accounts::admission::AdmissionConfig {
                economy: self.economy_terms(),
                ..self.admission.admission_config(self.provider.context_tokens(), self.workers.max_attempts)
            },
            signup_grant: accounts.signup_grant.max(0),
            require_email_verification: self.mail.require_email_verification,
            secure_cookies: accounts.secure_cookies,
            login_limits: accounts.login_limits(),
            signup_limits: accounts.signup_limits(),
            trusted_proxies: web.trusted_proxies.clone(),
            max_upload_bytes: documents.max_upload_bytes,
            max_concurrent_uploads: documents.max_concurrent_uploads,
            max_uploads_per_address: documents.max_uploads_per_address.max(1),
            request_timeout: web.request_timeout(),
            header_read_timeout: web.header_read_timeout(),
            stalled_write_timeout: web.stalled_write_timeout(),
            max_connections: web.max_connections.max(1),
            max_connections_per_address: web.max_connections_per_address.max(1),
            metrics_token: self.telemetry.metrics_token.as_ref().map(|t| t.expose().to_string()),
            webhook_policy: self.alerts.webhook_policy(),
            alert_webhook: self.alerts.alert_webhook_url.is_some(),
            bulk_action_cap: web.bulk_action_cap.clamp(1, 100_000),
            auth_cache_lifetime: accounts.auth_cache_lifetime(),
            time_limits: self.provider.time_limits(self.workers.attempt_deadline()),
            call_limits: self.provider.call_limits(),
            tokenizer: self.provider.tokenizer(),
            provider_prices: self.provider.provider_prices(),
            presets: self.provider.presets(),
            ..WebSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;
    use engine::sizing::PriceTable;

    use super::*;

    #[test]
    fn the_context_is_no_larger_than_one_input_bucket_and_odd_numbers_are_tamed() {
        let config = |args: &[&str]| Cli::parse_from([&["server"], args].concat()).config;
        assert_eq!(config(&[]).provider.context_tokens(), Some(200_000));
        assert_eq!(config(&["--provider-context-tokens", "0"]).provider.context_tokens(), None);
        // 30,000 input tokens a minute in a bucket holding a minute: a 200K request never passes.
        let small = config(&["--provider-input-tokens-per-min", "30000"]);
        assert_eq!(small.provider.context_tokens(), Some(30_000));
        assert_eq!(small.web_settings().admission.max_document_tokens, Some(2_000_000));
        let burst = config(&["--provider-input-tokens-per-min", "600000", "--provider-burst-secs", "1"]);
        assert_eq!(burst.provider.context_tokens(), Some(10_000));
        let odd = config(&["--provider-burst-secs", "NaN", "--gate-recover-secs=-3", "--provider-limit-share", "7"]);
        let capacity = odd.provider.capacity_config();
        assert_eq!(capacity.burst, Duration::from_secs_f64(0.01));
        assert_eq!(capacity.recover_step, Duration::from_secs_f64(0.01));
        assert_eq!(capacity.share, 1.0);
        assert!("25000:1,100000:2".parse::<PriceTable>().is_ok() && "1:99999999999".parse::<PriceTable>().is_err());
    }

    /// A providers file replaces the single-provider flags: the claim's budget is the
    /// deployments' limits added up, parts fit the smallest context and answer, the prices are
    /// the primary's; a key comes from the environment variable it names, never printed.
    #[test]
    fn a_providers_file_sizes_the_budget_and_the_parts_and_names_what_is_wrong() {
        let folder = std::env::temp_dir().join(format!("sluice-providers-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let file = folder.join("providers.toml");
        std::env::set_var("SLUICE_TEST_PRIMARY_KEY", "sk-live-primary-secret");
        std::fs::write(
            &file,
            "[[provider]]\nname = \"primary\"\nkind = \"anthropic\"\nurl = \"https://api.anthropic.com\"\n\
             api_key_env = \"SLUICE_TEST_PRIMARY_KEY\"\nmodel = \"claude-sonnet-4-5\"\ninput_tokens_per_min = 2000000\n\
             input_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n\n\
             [[provider]]\nname = \"second\"\nkind = \"openai\"\nurl = \"http://127.0.0.1:1/v1\"\nmodel = \"gpt-4o\"\n\
             input_tokens_per_min = 100000\ncontext_tokens = 128000\n",
        )
        .unwrap();
        let cli =
            Cli::parse_from(["server", "--providers-file", file.to_str().unwrap(), "--provider-api-key", "ignored"]);
        let provider = &cli.config.provider;
        let deployments = provider.deployments().unwrap().unwrap();
        assert_eq!(deployments.len(), 2);
        assert_eq!(provider.capacity_config().limits.input_tokens_per_min, Some(2_100_000));
        // The second's own bucket (100,000 a minute) holds less than its context.
        assert_eq!(provider.context_tokens(), Some(100_000));
        assert_eq!(provider.max_output_tokens(), 16_384, "gpt-4o's answer is the shorter");
        assert_eq!(provider.provider_prices().unwrap().output_usd_per_mtok, 15.0);
        assert_eq!(provider.provider_config().api_key.as_deref(), Some("sk-live-primary-secret"));
        let printed = format!("{cli:?}");
        assert!(!printed.contains("sk-live-primary-secret"), "{printed}");

        std::fs::write(&file, "[[provider]]\nname = \"p\"\nkind = \"anthropic\"\nurl = \"https://x\"\napi_key_env = \"SLUICE_TEST_UNSET_KEY\"\n").unwrap();
        let cli = Cli::parse_from(["server", "--providers-file", file.to_str().unwrap()]);
        let refused = cli.config.provider.deployments().unwrap_err();
        assert!(
            refused.contains("provider \"p\"") && refused.contains("SLUICE_TEST_UNSET_KEY is not set"),
            "{refused}"
        );
        let cli = Cli::parse_from(["server", "--providers-file", folder.join("absent.toml").to_str().unwrap()]);
        assert!(cli.config.provider.deployments().unwrap_err().contains("absent.toml"));
        std::fs::remove_dir_all(&folder).unwrap();
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
        let printed = format!("{cli:?} {:?}", cli.config.provider.provider_config());
        assert!(!printed.contains("hunter2") && !printed.contains("sk-live"), "{printed}");
        assert_eq!(cli.config.server.database_url.unwrap().expose(), "postgres://sluice:hunter2@db.internal/sluice");
    }

    /// `server --help` reads in sections, one per concern, and the book's configuration chapter
    /// lists the same flags under the same headings (with their environment variables).
    #[test]
    fn help_reads_in_sections_and_the_configuration_chapter_follows_them() {
        let command = Cli::command();
        let mut by_heading: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
        for arg in command.get_arguments() {
            let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else { continue };
            let heading = arg.get_help_heading().unwrap_or("(none)").to_string();
            by_heading.entry(heading).or_default().push((format!("--{long}"), env.to_string_lossy().into_owned()));
        }
        assert!(!by_heading.contains_key("(none)"), "settings outside any section: {:?}", by_heading.get("(none)"));
        assert_eq!(by_heading.len(), 13, "{:?}", by_heading.keys());
        let help = command.clone().render_long_help().to_string();
        for heading in by_heading.keys() {
            assert!(help.contains(&format!("{heading}:")), "`server --help` has no section {heading:?}");
        }

        assert!(help.contains("docs/src/configuration.md"), "`server --help` does not say where the book explains it");
        let configuration = read_doc("docs/src/configuration.md");
        let mut documented: std::collections::BTreeMap<String, Vec<(String, String)>> = Default::default();
        for section in configuration.split("\n## ").skip(1) {
            let heading = section.lines().next().unwrap().trim().to_string();
            for row in section.lines().filter(|l| l.starts_with("| `--")) {
                let cells: Vec<&str> = row.split(" | ").collect();
                let names = |cell: &str| -> Vec<String> {
                    cell.split('`')
                        .filter(|w| {
                            w.starts_with("--")
                                || w.starts_with("SLUICE_")
                                || w.ends_with("_URL")
                                || w.starts_with("LEPTOS_")
                        })
                        .map(String::from)
                        .collect()
                };
                let (flags, envs) = (names(cells[0].trim_start_matches("| ")), names(cells[1]));
                assert_eq!(flags.len(), envs.len(), "{row}");
                documented.entry(heading.clone()).or_default().extend(flags.into_iter().zip(envs));
            }
        }
        for list in by_heading.values_mut().chain(documented.values_mut()) {
            list.sort();
        }
        assert_eq!(documented, by_heading, "the book's configuration chapter differs from `server --help`");
    }

    fn read_doc(path: &str) -> String {
        std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    /// Every `--flag` the README names is one `server` takes (for any command), or one `cargo
    /// xtask` reads; and the README's table of main flags gives their real environment names.
    #[test]
    fn every_flag_the_readme_names_exists() {
        fn flags_of(command: &clap::Command, into: &mut std::collections::BTreeMap<String, Option<String>>) {
            for arg in command.get_arguments() {
                if let Some(long) = arg.get_long() {
                    into.insert(format!("--{long}"), arg.get_env().map(|e| e.to_string_lossy().into_owned()));
                }
            }
            for sub in command.get_subcommands() {
                flags_of(sub, into);
            }
        }
        let mut known = Default::default();
        // Built, the command has clap's own `--help` and `--version` as well.
        let mut command = Cli::command();
        command.build();
        flags_of(&command, &mut known);
        let xtask = read_doc("xtask/src/main.rs");
        let readme = read_doc("README.md");
        let mut named = 0;
        for (at, _) in readme.match_indices("--") {
            let flag: String = readme[at + 2..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-' || c.is_ascii_digit())
                .collect();
            let before = readme[..at].chars().next_back().unwrap_or(' ');
            if flag.len() < 2 || !(before == ' ' || before == '`' || before == '(') {
                continue;
            }
            let flag = format!("--{flag}");
            named += 1;
            assert!(
                known.contains_key(&flag) || xtask.contains(&format!("\"{flag}\"")),
                "the README names {flag}, which neither `server` nor `cargo xtask` takes"
            );
        }
        assert!(named >= 15, "the README names {named} flags");
        for row in readme.lines().filter(|l| l.starts_with("| `--")) {
            let cells: Vec<&str> = row.split('`').collect();
            assert_eq!(known.get(cells[1]).cloned().flatten().as_deref(), Some(cells[3]), "{row}");
        }
    }
}
