//! Pure: the providers file (`--providers-file`, TOML): the deployments a call may go to, in
//! the order it tries them, each with its own limits and prices. Keys never sit in the file:
//! each deployment names the environment variable that holds its key.
//!
//! ```toml
//! [[provider]]
//! name = "primary"
//! kind = "anthropic"
//! url = "https://api.anthropic.com"
//! api_key_env = "ANTHROPIC_API_KEY"
//! model = "claude-sonnet-4-5"
//! input_tokens_per_min = 2000000
//! input_usd_per_mtok = 3.0
//! output_usd_per_mtok = 15.0
//! ```

use serde::Deserialize;

use super::{documented_max_output_tokens, ProviderConfig, ProviderKind};

/// The file is read whole at start: more than this is not a providers file.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// More deployments than this is a mistake (each is tried in turn by a failing call).
pub const MAX_DEPLOYMENTS: usize = 16;

/// One deployment as the file gives it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub kind: ProviderKind,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub model: String,
    pub requests_per_min: Option<u64>,
    pub input_tokens_per_min: Option<u64>,
    pub output_tokens_per_min: Option<u64>,
    pub context_tokens: Option<u64>,
    /// The most output tokens one answer may have (unset: the model's documented maximum).
    pub max_tokens: Option<u32>,
    pub input_usd_per_mtok: Option<f64>,
    pub output_usd_per_mtok: Option<f64>,
    pub cached_input_usd_per_mtok: Option<f64>,
    /// It offers a batch API (OpenAI's `/v1/batches`, Anthropic's message batches).
    #[serde(default)]
    pub batch: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    provider: Vec<Entry>,
}

/// A deployment ready to call: how to reach it, and its own limits and prices.
#[derive(Clone, Debug)]
pub struct Deployment {
    pub name: String,
    pub config: ProviderConfig,
    pub limits: Limits,
    pub prices: Prices,
    pub batch: bool,
}

/// A deployment's own rate limits and context (`None`: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_min: Option<u64>,
    pub input_tokens_per_min: Option<u64>,
    pub output_tokens_per_min: Option<u64>,
    pub context_tokens: Option<u64>,
}

/// A deployment's prices per million tokens, in US dollars (`None`: not given).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prices {
    pub input_usd_per_mtok: Option<f64>,
    pub output_usd_per_mtok: Option<f64>,
    pub cached_input_usd_per_mtok: Option<f64>,
}

/// Read a providers file. `base` gives what the file does not (timeouts, streaming); `env`
/// looks up the environment variables the file names for keys. Every refusal names the
/// deployment and the field.
pub fn parse(
    text: &str,
    base: &ProviderConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Deployment>, String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!("the providers file is larger than {} KiB", MAX_FILE_BYTES / 1024));
    }
    let file: File = toml::from_str(text).map_err(|e| format!("the providers file: {}", e.message()))?;
    if file.provider.is_empty() {
        return Err("the providers file lists no [[provider]]".into());
    }
    if file.provider.len() > MAX_DEPLOYMENTS {
        return Err(format!("the providers file lists more than {MAX_DEPLOYMENTS} deployments"));
    }
    let mut deployments: Vec<Deployment> = Vec::new();
    for entry in file.provider {
        let name = entry.name.clone();
        let at = |what: &str| format!("provider {name:?}: {what}");
        let name_ok = (1..=40).contains(&name.len())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !name_ok {
            return Err(at("a name is 1 to 40 of a-z, 0-9, - and _"));
        }
        if deployments.iter().any(|d| d.name == name) {
            return Err(at("named twice"));
        }
        if entry.kind != ProviderKind::Local && !(entry.url.starts_with("http://") || entry.url.starts_with("https://"))
        {
            return Err(at("url must be an http:// or https:// address"));
        }
        let api_key = match &entry.api_key_env {
            Some(var)
                if var.is_empty() || !var.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                return Err(at("api_key_env names an environment variable (A-Z, 0-9 and _), not a key"));
            }
            Some(var) => Some(
                env(var)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| at(&format!("the environment variable {var} is not set")))?,
            ),
            None if entry.kind == ProviderKind::Anthropic => return Err(at("api_key_env is needed for anthropic")),
            None => None,
        };
        let positive = |field: &str, v: Option<u64>| match v {
            Some(0) => Err(at(&format!("{field} must be above 0 (leave it out for no limit)"))),
            v => Ok(v),
        };
        let limits = Limits {
            requests_per_min: positive("requests_per_min", entry.requests_per_min)?,
            input_tokens_per_min: positive("input_tokens_per_min", entry.input_tokens_per_min)?,
            output_tokens_per_min: positive("output_tokens_per_min", entry.output_tokens_per_min)?,
            context_tokens: positive("context_tokens", entry.context_tokens)?,
        };
        let price = |field: &str, v: Option<f64>| match v {
            Some(p) if !p.is_finite() || p < 0.0 => Err(at(&format!("{field} must be a price of 0 or more"))),
            v => Ok(v),
        };
        let prices = Prices {
            input_usd_per_mtok: price("input_usd_per_mtok", entry.input_usd_per_mtok)?,
            output_usd_per_mtok: price("output_usd_per_mtok", entry.output_usd_per_mtok)?,
            cached_input_usd_per_mtok: price("cached_input_usd_per_mtok", entry.cached_input_usd_per_mtok)?,
        };
        let max_tokens = match entry.max_tokens {
            Some(0) => return Err(at("max_tokens must be above 0")),
            Some(n) => n,
            None => documented_max_output_tokens(entry.kind, &entry.model),
        };
        let config = ProviderConfig {
            kind: entry.kind,
            base_url: entry.url.clone(),
            api_key,
            model: entry.model.clone(),
            max_tokens,
            ..base.clone()
        };
        deployments.push(Deployment { name, config, limits, prices, batch: entry.batch });
    }
    Ok(deployments)
}

/// The longest answer every deployment allows (a document's parts are sized once, and may go
/// to any).
pub fn shortest_answer(deployments: &[Deployment]) -> u32 {
    deployments.iter().map(|d| d.config.max_tokens).min().unwrap_or(super::DEFAULT_MAX_OUTPUT_TOKENS)
}

/// The deployments' per-minute limits added up (the claim's budget paces all of them
/// together); a dimension any deployment leaves unlimited is unlimited. (The context is each
/// deployment's own: a part must fit the smallest.)
pub fn combined_limits(deployments: &[Deployment]) -> Limits {
    let sum = |of: fn(&Limits) -> Option<u64>| -> Option<u64> {
        deployments.iter().map(|d| of(&d.limits)).try_fold(0u64, |total, v| v.map(|v| total.saturating_add(v)))
    };
    Limits {
        requests_per_min: sum(|l| l.requests_per_min),
        input_tokens_per_min: sum(|l| l.input_tokens_per_min),
        output_tokens_per_min: sum(|l| l.output_tokens_per_min),
        context_tokens: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
        [[provider]]
        name = "primary"
        kind = "anthropic"
        url = "https://api.anthropic.com"
        api_key_env = "PRIMARY_KEY"
        model = "claude-sonnet-4-5"
        input_tokens_per_min = 2000000
        output_tokens_per_min = 400000
        input_usd_per_mtok = 3.0
        batch = true

        [[provider]]
        name = "second"
        kind = "openai"
        url = "http://127.0.0.1:11434/v1"
        model = "llama3.1:8b"
        input_tokens_per_min = 30000
        context_tokens = 32000
    "#;

    fn env(var: &str) -> Option<String> {
        (var == "PRIMARY_KEY").then(|| "sk-test".to_string())
    }

    fn parsed(text: &str) -> Result<Vec<Deployment>, String> {
        parse(text, &ProviderConfig::default(), env)
    }

    #[test]
    fn a_file_lists_deployments_in_order_with_their_own_limits_prices_and_keys() {
        let d = parsed(TWO).unwrap();
        assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["primary", "second"]);
        assert_eq!(d[0].config.kind, ProviderKind::Anthropic);
        assert_eq!(d[0].config.api_key.as_deref(), Some("sk-test"));
        assert_eq!(d[0].config.max_tokens, 64_000, "the model's documented maximum");
        assert_eq!(d[0].limits.input_tokens_per_min, Some(2_000_000));
        assert_eq!(d[0].prices.input_usd_per_mtok, Some(3.0));
        assert!(d[0].batch && !d[1].batch);
        assert_eq!(d[1].config.api_key, None, "a local server needs no key");
        assert_eq!(d[1].config.max_tokens, crate::documents::providers::DEFAULT_MAX_OUTPUT_TOKENS);
        assert_eq!(shortest_answer(&d), 8_192);
        let combined = combined_limits(&d);
        assert_eq!(combined.input_tokens_per_min, Some(2_030_000));
        assert_eq!(combined.output_tokens_per_min, None, "the second has no output limit");
        assert_eq!(combined.requests_per_min, None);
    }

    #[test]
    fn every_mistake_is_refused_in_words_naming_the_deployment() {
        let with = |extra: &str| {
            parsed(&format!("[[provider]]\nname = \"a\"\nkind = \"openai\"\nurl = \"http://x/v1\"\n{extra}"))
        };
        assert!(with("").is_ok());
        let refused = |extra: &str, says: &str| {
            let said = with(extra).unwrap_err();
            assert!(said.contains(says), "{extra:?}: {said}");
        };
        refused("api_key = \"sk-live\"", "unknown field");
        refused("api_key_env = \"sk-live-123\"", "names an environment variable");
        refused("api_key_env = \"MISSING_KEY\"", "MISSING_KEY is not set");
        refused("input_tokens_per_min = 0", "input_tokens_per_min must be above 0");
        refused("input_usd_per_mtok = -1.0", "a price of 0 or more");
        refused("input_usd_per_mtok = nan", "a price of 0 or more");
        refused("max_tokens = 0", "max_tokens must be above 0");
        refused("[[provider]]\nname = \"a\"\nkind = \"local\"", "named twice");
        assert!(parsed("[[provider]]\nname = \"A b\"\nkind = \"local\"").unwrap_err().contains("a name is"));
        assert!(parsed("[[provider]]\nname = \"a\"\nkind = \"openai\"\nurl = \"file:///etc\"")
            .unwrap_err()
            .contains("url"));
        assert!(parsed("[[provider]]\nname = \"a\"\nkind = \"anthropic\"\nurl = \"https://x\"")
            .unwrap_err()
            .contains("api_key_env is needed"));
        assert!(parsed("[[provider]]\nname = \"a\"\nkind = \"gemini\"").unwrap_err().contains("the providers file"));
        assert!(parsed("").unwrap_err().contains("no [[provider]]"));
        assert!(parsed("provider = 3").is_err());
        let many: String = (0..17).map(|i| format!("[[provider]]\nname = \"p{i}\"\nkind = \"local\"\n")).collect();
        assert!(parsed(&many).unwrap_err().contains("more than 16"));
        let huge = format!("# {}\n{TWO}", "x".repeat(MAX_FILE_BYTES));
        assert!(parsed(&huge).unwrap_err().contains("larger than 64 KiB"));
        // Deeply nested TOML is refused by the parser, not a stack overflow.
        let deep = format!("x = {}1{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parsed(&deep).is_err());
    }
}
