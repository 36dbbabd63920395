//! The AI provider and its limits: which one, its model and answer size, its prices, its
//! timeouts and its rate limits (turned into the provider's `ProviderConfig`, the budget's
//! `CapacityConfig` and the time limits).

use std::time::Duration;

use clap::Args;

use engine::documents::calls::CallLimits;
use engine::documents::providers::deployments::{self, Deployment};
use engine::documents::providers::routing::RestPolicy;
use engine::documents::providers::{self, Preset, ProviderConfig, ProviderKind};
use engine::queue::capacity::{CapacityConfig, ProviderLimits};
use engine::sizing::{ProviderPrices, TimeLimits};

use super::Secret;

/// Output tokens reserved from the budget per call until its usage is known, at most (a
/// translation's part reserves by its own size).
const OUTPUT_RESERVE: u32 = 4_096;

/// The `--provider` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderChoice {
    Local,
    Anthropic,
    Openai,
}

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Provider and its limits")]
pub struct ProviderArgs {
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
    /// What the provider charges per million input tokens read from its prompt cache (unset: a
    /// tenth of input for Anthropic, a half for OpenAI).
    #[arg(long, env = "SLUICE_PROVIDER_CACHED_INPUT_USD_PER_MTOK", global = true)]
    pub provider_cached_input_usd_per_mtok: Option<f64>,
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
    /// Stream answers as they are written (server-sent events; both APIs): `false` for a
    /// server that cannot.
    #[arg(long, env = "SLUICE_PROVIDER_STREAM", default_value_t = true, action = clap::ArgAction::Set, global = true)]
    pub provider_stream: bool,
    /// Seconds a streamed answer may write nothing before its call is given up (and retried).
    #[arg(long, env = "SLUICE_PROVIDER_STALL_SECS", default_value_t = 90.0, global = true)]
    pub provider_stall_secs: f64,
    /// The most input tokens one request may carry: longer documents are processed in parts
    /// that each fit. 0 = no limit.
    #[arg(long, env = "SLUICE_PROVIDER_CONTEXT_TOKENS", default_value_t = 200_000, global = true)]
    pub provider_context_tokens: u64,
    /// After a 429/529 the gate is halved; it grows back one slot per this many seconds.
    #[arg(long, env = "SLUICE_GATE_RECOVER_SECS", default_value_t = 10.0, global = true)]
    pub gate_recover_secs: f64,
    /// The provider has a batch API (OpenAI's `/v1/batches`, Anthropic's message batches): the
    /// economy lane is offered. With a providers file, each deployment's `batch` says so.
    #[arg(long, env = "SLUICE_PROVIDER_BATCH", default_value_t = false, action = clap::ArgAction::Set, global = true)]
    pub provider_batch: bool,
    /// Several provider deployments, tried in order with fallback (TOML; see the book's
    /// providers chapter). Set, it replaces the single-provider flags above (the timeouts,
    /// streaming and burst still apply to every deployment).
    #[arg(long, env = "SLUICE_PROVIDERS_FILE", global = true)]
    pub providers_file: Option<std::path::PathBuf>,
    /// Failures in a row (5xx, 529, timeouts, broken connections) that put a deployment of
    /// the providers file to rest: its calls go to the next one meanwhile.
    #[arg(long, env = "SLUICE_PROVIDER_FAILURES_TO_REST", default_value_t = 3, global = true)]
    pub provider_failures_to_rest: u32,
    /// Seconds a deployment first rests; each further failure in a row doubles it.
    #[arg(long, env = "SLUICE_PROVIDER_REST_SECS", default_value_t = 10.0, global = true)]
    pub provider_rest_secs: f64,
    /// The longest a deployment rests before a call tries it again.
    #[arg(long, env = "SLUICE_PROVIDER_LONGEST_REST_SECS", default_value_t = 300.0, global = true)]
    pub provider_longest_rest_secs: f64,
    /// The providers file, read once.
    #[arg(skip)]
    loaded: std::sync::OnceLock<Result<Vec<Deployment>, String>>,
}

impl ProviderArgs {
    /// The deployments of the providers file (none without one), read once: its refusal in
    /// words, naming the deployment and the field.
    pub fn deployments(&self) -> Result<Option<&[Deployment]>, String> {
        let Some(path) = &self.providers_file else { return Ok(None) };
        let loaded = self.loaded.get_or_init(|| {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(deployments::MAX_FILE_BYTES as u64 + 1).read_to_string(&mut text))
                .map_err(|e| format!("the providers file {}: {e}", path.display()))?;
            deployments::parse(&text, &self.single_provider_config(), |var| std::env::var(var).ok())
        });
        loaded.as_deref().map(Some).map_err(Clone::clone)
    }

    /// The file's deployments when it was read well (startup refuses it otherwise).
    fn file(&self) -> Option<&[Deployment]> {
        self.deployments().ok().flatten()
    }

    /// How failing deployments rest.
    pub fn rest_policy(&self) -> RestPolicy {
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.1).min(86_400.0));
        let first_rest = secs(self.provider_rest_secs);
        RestPolicy {
            failures_to_rest: self.provider_failures_to_rest.max(1),
            first_rest,
            longest_rest: secs(self.provider_longest_rest_secs).max(first_rest),
        }
    }

    /// The most input tokens one request may carry: the provider's context, and no more than
    /// one input-token bucket holds (a larger request could never pass the provider's limit).
    /// With a providers file, the least of every deployment's (a part may go to any), a
    /// deployment without its own context taking `--provider-context-tokens`.
    pub fn context_tokens(&self) -> Option<u64> {
        // None is no limit: the smaller of two limits, or the one there is.
        let least = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let burst = self.capacity_config().burst.as_secs_f64();
        let bucket = |per_min: Option<u64>| per_min.map(|per_min| (per_min as f64 * burst / 60.0) as u64);
        let flag = (self.provider_context_tokens > 0).then_some(self.provider_context_tokens);
        match self.file() {
            Some(file) => file
                .iter()
                .map(|d| least(d.limits.context_tokens.or(flag), bucket(d.limits.input_tokens_per_min)))
                .fold(None, least),
            None => least(flag, bucket(self.capacity_config().limits.input_tokens_per_min)),
        }
    }

    /// What one call carries: the context, and (a language model's) longest answer. The
    /// workers' processor reads the same from its provider; an upload's estimate reads this.
    pub fn call_limits(&self) -> CallLimits {
        let answers = self.provider_kind() != ProviderKind::Local;
        CallLimits {
            context_tokens: self.context_tokens(),
            max_output_tokens: answers.then(|| u64::from(self.max_output_tokens())),
            // Learned per model and language by the workers; an estimate leaves the room a
            // language may grow by.
            answer_growth: None,
        }
    }

    /// The provider's limits, the budget's burst and the adaptive gate's pace.
    pub fn capacity_config(&self) -> CapacityConfig {
        // With several deployments the claim's budget paces them together: their limits added.
        let limits = match self.file() {
            Some(file) => {
                let all = deployments::combined_limits(file);
                ProviderLimits {
                    requests_per_min: all.requests_per_min,
                    input_tokens_per_min: all.input_tokens_per_min,
                    output_tokens_per_min: all.output_tokens_per_min,
                }
            }
            None => ProviderLimits {
                requests_per_min: self.provider_requests_per_min.filter(|v| *v > 0),
                input_tokens_per_min: self.provider_input_tokens_per_min.filter(|v| *v > 0),
                output_tokens_per_min: self.provider_output_tokens_per_min.filter(|v| *v > 0),
            },
        };
        CapacityConfig {
            limits,
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
    /// With a providers file, the primary deployment's (the console's costs count every call at
    /// the primary's prices).
    pub fn provider_prices(&self) -> Option<ProviderPrices> {
        let price = |v: Option<f64>| v.filter(|p| p.is_finite() && *p >= 0.0);
        let (input, output, cached) = match self.file() {
            Some(file) => {
                let p = file[0].prices;
                (p.input_usd_per_mtok, p.output_usd_per_mtok, p.cached_input_usd_per_mtok)
            }
            None => (
                self.provider_input_usd_per_mtok,
                self.provider_output_usd_per_mtok,
                self.provider_cached_input_usd_per_mtok,
            ),
        };
        let (input, output) = (price(input), price(output));
        // Unset, cached input is at the vendor's documented share of input: Anthropic's cache
        // reads a tenth; OpenAI's a half (gpt-4o; newer models less: set it).
        let cached_share = if self.provider_kind() == ProviderKind::Anthropic { 0.1 } else { 0.5 };
        let cached = price(cached).unwrap_or(input.unwrap_or(0.0) * cached_share);
        (input.is_some() || output.is_some()).then(|| ProviderPrices {
            input_usd_per_mtok: input.unwrap_or(0.0),
            output_usd_per_mtok: output.unwrap_or(0.0),
            cached_input_usd_per_mtok: cached,
        })
    }

    /// The most output tokens one answer may have: as configured, or the model's documented
    /// maximum (with a providers file, the smallest of the deployments').
    pub fn max_output_tokens(&self) -> u32 {
        match self.file() {
            Some(file) => deployments::shortest_answer(file),
            None => self.single_max_output_tokens(),
        }
    }

    /// `--provider-max-tokens`, or the `--provider-model`'s documented maximum (never the file:
    /// reading it asks this).
    fn single_max_output_tokens(&self) -> u32 {
        let kind = self.single_provider_kind();
        self.provider_max_tokens
            .filter(|n| *n > 0)
            .unwrap_or_else(|| providers::documented_max_output_tokens(kind, &self.provider_model))
    }

    /// The primary deployment's kind (the file's first, or `--provider`).
    fn provider_kind(&self) -> ProviderKind {
        match self.file() {
            Some(file) => file[0].config.kind,
            None => self.single_provider_kind(),
        }
    }

    fn single_provider_kind(&self) -> ProviderKind {
        match self.provider {
            ProviderChoice::Local => ProviderKind::Local,
            ProviderChoice::Anthropic => ProviderKind::Anthropic,
            ProviderChoice::Openai => ProviderKind::Openai,
        }
    }

    /// The AI provider: the primary deployment's with a providers file.
    pub fn provider_config(&self) -> ProviderConfig {
        match self.file() {
            Some(file) => file[0].config.clone(),
            None => self.single_provider_config(),
        }
    }

    /// The provider the single-provider flags name (and what a file's deployments take from
    /// them: timeouts, streaming).
    fn single_provider_config(&self) -> ProviderConfig {
        ProviderConfig {
            kind: self.single_provider_kind(),
            base_url: self.provider_url.clone(),
            api_key: self.provider_api_key.as_ref().map(|k| k.expose().to_string()),
            model: self.provider_model.clone(),
            max_tokens: self.single_max_output_tokens(),
            timeout: Duration::from_secs_f64(self.provider_timeout_secs.max(0.1)),
            timeout_per_100k_tokens: self.per_100k_tokens(),
            stream: self.provider_stream,
            stall_timeout: Duration::from_secs_f64(self.provider_stall_secs.max(1.0).min(3600.0)),
        }
    }

    /// The time a provider call and an attempt are allowed per 100K input tokens, on top.
    pub fn per_100k_tokens(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_per_100k_tokens_secs.clamp(0.0, 86_400.0))
    }

    /// The provider timeout and an attempt's `deadline`, growing with a call's tokens.
    pub fn time_limits(&self, deadline: Duration) -> TimeLimits {
        TimeLimits {
            provider_secs: self.provider_timeout_secs.max(0.1),
            attempt_secs: deadline.as_secs_f64(),
            per_100k_tokens_secs: self.per_100k_tokens().as_secs_f64(),
        }
    }

    /// Whose learned tokenizer ratio applies (none for the local provider): the names the
    /// workers keep it under.
    pub fn tokenizer(&self) -> Option<engine::documents::ratio::Tokenizer> {
        let kind = self.provider_kind();
        let provider = providers::build(&self.provider_config());
        (kind != ProviderKind::Local).then(|| engine::documents::ratio::Tokenizer {
            provider: provider.name().to_string(),
            model: provider.model().to_string(),
            start: engine::documents::ratio::starting_ratio(kind),
        })
    }

    /// Whether a batch API is there to send economy documents to.
    pub fn offers_batches(&self) -> bool {
        match self.file() {
            Some(file) => file.iter().any(|d| d.batch && d.config.kind != ProviderKind::Local),
            None => self.provider_batch && self.provider_kind() != ProviderKind::Local,
        }
    }

    /// The presets this provider can do (every deployment, with a providers file).
    pub fn presets(&self) -> Vec<Preset> {
        let configs = match self.file() {
            Some(file) => file.iter().map(|d| d.config.clone()).collect(),
            None => vec![self.provider_config()],
        };
        let providers: Vec<_> = configs.iter().map(providers::build).collect();
        Preset::ALL.into_iter().filter(|p| providers.iter().all(|provider| provider.supports(*p))).collect()
    }
}
