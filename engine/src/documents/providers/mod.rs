//! AI providers behind one trait. `local` (the default) needs no network; `anthropic` and
//! `openai` (any OpenAI-compatible server: Ollama, vLLM, llama.cpp) call HTTP APIs. Clients do
//! no retries of their own: they classify each failure, and the engine's policy decides.

pub mod batch;
pub mod deployments;
mod http;
pub mod local;
pub mod router;
pub mod routing;
mod sse;
pub mod vendor;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::queue::capacity::RateRemaining;
use crate::queue::JobError;
pub use crate::Preset;

pub use http::{classify_http_failure, HttpProvider};

/// A document's text and what to do with it.
#[derive(Clone, Debug)]
pub struct Task {
    pub preset: Preset,
    /// Target language for `translate`.
    pub language: Option<String>,
    pub text: String,
    pub pages: Option<u32>,
    /// Set when the text is one part of a longer document.
    pub part: Option<PartOf>,
    /// The prompt's tokens, once counted (the processor counts each prompt once, off the async
    /// runtime; the client's timeout reuses the count).
    pub prompt_tokens: Option<i64>,
    /// The answer's size to ask for (`max_tokens`), when the processor sized it; else the
    /// model's maximum.
    pub answer_tokens: Option<u32>,
    /// Told about how many tokens of the answer are written so far, as it streams.
    pub on_written: Option<OnWritten>,
    /// A translation's formality and the glossary entries whose terms occur in its text.
    pub guidance: crate::documents::glossary::Guidance,
    /// Not the preset's work: the key terms of the text (a translation's opening) and their
    /// translations, a line each, tab-separated.
    pub finds_terms: bool,
}

/// Called with about how many tokens of an answer are written so far.
#[derive(Clone)]
pub struct OnWritten(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for OnWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnWritten")
    }
}

/// Which part of a document a task's text is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PartOf {
    /// 1-based.
    pub number: u32,
    pub count: u32,
    /// 0: the document's own text; above: outputs of the level below, to combine.
    pub level: u32,
    /// The end of the part before, given as context only.
    pub overlap: String,
}

impl ProviderConfig {
    /// The timeout of a call carrying `input_tokens` whose answer is expected to hold
    /// `output_tokens`: a model writes at its own pace, so a long answer (a translation's) gets
    /// the time to be written at [`SLOW_OUTPUT_TOKENS_PER_SEC`].
    pub fn call_timeout(&self, input_tokens: i64, output_tokens: i64) -> Duration {
        let writing = output_tokens.max(0) as f64 / SLOW_OUTPUT_TOKENS_PER_SEC;
        Duration::from_secs_f64(sluice_types::capacity::scaled_secs(
            self.timeout.as_secs_f64() + writing,
            self.timeout_per_100k_tokens.as_secs_f64(),
            input_tokens as f64,
        ))
    }

    /// The timeout of a call for `task` (a ceiling: a streamed answer is given up sooner when
    /// nothing new comes for [`ProviderConfig::stall_timeout`]).
    pub fn task_timeout(&self, task: &Task) -> Duration {
        let input = task.estimated_tokens();
        // A translation writes about its text (at most what it asks for); anything else a
        // short answer.
        let asked = i64::from(task.answer_tokens.unwrap_or(self.max_tokens).min(self.max_tokens));
        let output = if task.preset.answer_grows_with_input() { input.min(asked) } else { 0 };
        self.call_timeout(input, output)
    }
}

impl Task {
    /// The request's input tokens as counted before the call: its whole prompt, by the
    /// tokenizer ([`crate::documents::tokens`]).
    pub fn estimated_tokens(&self) -> i64 {
        self.prompt_tokens.unwrap_or_else(|| crate::documents::tokens::count(&prompt(self)).min(i64::MAX as u64) as i64)
    }
}

/// What a provider answered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProviderOutput {
    /// The answer, as Markdown.
    pub text: String,
    /// Structured extras (statistics, facts, rate-limit headers).
    pub data: Value,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// What the provider's rate-limit headers say is left.
    #[serde(default)]
    pub remaining: RateRemaining,
    /// The answer stopped at its output limit (OpenAI `finish_reason: "length"`, Anthropic
    /// `stop_reason: "max_tokens"`): it is not the whole answer, and never a success.
    #[serde(default)]
    pub cut: bool,
    /// Of `input_tokens`, those read from the provider's prompt cache (Anthropic
    /// `cache_read_input_tokens`, OpenAI `prompt_tokens_details.cached_tokens`).
    #[serde(default)]
    pub cached_input_tokens: Option<i64>,
    /// Of `output_tokens`, a reasoning model's hidden reasoning (billed as output).
    #[serde(default)]
    pub reasoning_tokens: Option<i64>,
    /// The `max_tokens` the call asked for.
    #[serde(default)]
    pub asked_tokens: Option<i64>,
    /// The deployment that answered, when several are configured (the providers file).
    #[serde(default)]
    pub deployment: Option<String>,
    /// The deployments the call moved on from before it, and why.
    #[serde(default)]
    pub moved_on: Vec<(String, String)>,
}

/// An AI provider: one call per attempt, no retries of its own.
pub trait Provider: Send + Sync + 'static {
    /// Its name in results and logs.
    fn name(&self) -> &'static str;
    /// Whether it can do this preset (the local provider has no language model).
    fn supports(&self, preset: Preset) -> bool;
    /// The most output tokens an answer may have (`max_tokens`), when the provider caps it.
    fn max_output_tokens(&self) -> Option<u64> {
        None
    }
    /// Whether its model reasons before answering (its reasoning is billed as output, and an
    /// answer needs room for it).
    fn reasons(&self) -> bool {
        false
    }
    /// Its model's name, for what is learned of its tokenizer.
    fn model(&self) -> &str {
        ""
    }
    /// Run the task; a failure is classified so the engine's retry policy can decide.
    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<ProviderOutput, JobError>>;
    /// Its batch API (the economy lane's): the one to send a batch to (`deployment` none), or
    /// the one named (a batch's, to poll it), with the name it is kept under. None: it has none.
    fn batch_api(&self, _deployment: Option<&str>) -> Option<(String, &HttpProvider)> {
        None
    }
}

/// Which provider the server uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Local,
    Anthropic,
    Openai,
}

/// How to reach the provider. `Debug` leaves the key out.
#[derive(Clone)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// For anthropic: `https://api.anthropic.com`; for openai: the base ending in `/v1`.
    pub base_url: String,
    /// Never logged.
    pub api_key: Option<String>,
    pub model: String,
    pub max_tokens: u32,
    /// A call's timeout: this, plus `timeout_per_100k_tokens` for every 100K input tokens it
    /// carries (a long part takes the model longer).
    pub timeout: Duration,
    pub timeout_per_100k_tokens: Duration,
    /// Stream answers (server-sent events) as they are written: a long answer is not one
    /// silent request, and a call that writes nothing for `stall_timeout` is given up.
    pub stream: bool,
    pub stall_timeout: Duration,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("timeout_per_100k_tokens", &self.timeout_per_100k_tokens)
            .field("stream", &self.stream)
            .field("stall_timeout", &self.stall_timeout)
            .finish()
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            kind: ProviderKind::Local,
            base_url: String::new(),
            api_key: None,
            model: String::new(),
            max_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            timeout: Duration::from_secs(120),
            timeout_per_100k_tokens: Duration::ZERO,
            stream: true,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

/// How long a streamed answer may write nothing before the call is given up as stalled (a
/// transient failure): long enough for a long prompt's first token.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(90);

/// The slowest pace a hosted model writes at that a call's timeout allows for (tokens a second).
pub const SLOW_OUTPUT_TOKENS_PER_SEC: f64 = 40.0;

/// The answer limit for a model we know nothing of (Ollama's and llama.cpp's servers run many):
/// one a real deployment uses; `--provider-max-tokens` sets another.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 8_192;

/// The most output tokens `model` may write in one answer, as its maker documents it, so a
/// translation's parts are as large as an answer can hold (a 1,024-token answer is a page and
/// a half). Matched by prefix, newest names first; unknown models get
/// [`DEFAULT_MAX_OUTPUT_TOKENS`].
pub fn documented_max_output_tokens(kind: ProviderKind, model: &str) -> u32 {
    let model = model.trim().to_ascii_lowercase();
    // A router's `vendor/model` names the model after its slash.
    let model = model.rsplit('/').next().unwrap_or_default().to_string();
    let model = match (kind, model.as_str()) {
        (ProviderKind::Anthropic, "") => "claude-sonnet-4-5",
        (ProviderKind::Openai, "") => "gpt-4o-mini",
        (_, m) => m,
    };
    const KNOWN: &[(&str, u32)] = &[
        ("claude-opus-4-5", 64_000),
        ("claude-opus-4", 32_000),
        ("claude-sonnet-4", 64_000),
        ("claude-haiku-4", 64_000),
        ("claude-3-7-sonnet", 64_000),
        ("claude-3-5-haiku", 8_192),
        ("claude-3-5-sonnet", 8_192),
        ("claude-3-haiku", 4_096),
        ("gpt-4.1", 32_768),
        ("gpt-4o", 16_384),
        // Reasoning models: asked with `max_completion_tokens`, their reasoning included.
        ("gpt-5-chat", 16_384),
        ("gpt-5", 128_000),
        ("o1-preview", 32_768),
        ("o1-mini", 65_536),
        ("o1", 100_000),
        ("o3", 100_000),
        ("o4-mini", 100_000),
    ];
    KNOWN.iter().find(|(prefix, _)| model.starts_with(prefix)).map_or(DEFAULT_MAX_OUTPUT_TOKENS, |(_, n)| *n)
}

/// The provider `config` names.
pub fn build(config: &ProviderConfig) -> Arc<dyn Provider> {
    match config.kind {
        ProviderKind::Local => Arc::new(local::LocalProvider),
        ProviderKind::Anthropic | ProviderKind::Openai => Arc::new(HttpProvider::new(config)),
    }
}

/// What a translation's prompt says of inline tags, when its text has them.
pub const TAGS_INSTRUCTION: &str = " Words between numbered tags such as <b1> and </b1> are bold, italic, a link or \
     another look: keep each pair of tags, once, around the words that translate them (never one pair inside \
     another), and keep a tag such as <f2/> (a note's reference) after the words it follows.";

/// The instruction sent to a language model for a task.
pub fn prompt(task: &Task) -> String {
    let (instruction, rest) = prompt_parts(task);
    instruction + &rest
}

/// The prompt in two: the instruction every call for the document repeats (a cacheable
/// prefix: Anthropic's `cache_control`; OpenAI caches repeated prefixes itself), and the rest
/// (the part's place and its text).
pub fn prompt_parts(task: &Task) -> (String, String) {
    if task.finds_terms {
        let ask = format!(
            "List up to {} key terms of the document below (names, defined terms, technical words) that a \
             translation into {} must render the same way throughout, one a line as the term, a tab, and its \
             translation. Nothing else.\n",
            crate::documents::glossary::MAX_FOUND_TERMS,
            task.language.as_deref().unwrap_or("English")
        );
        return (ask, format!("<document>\n{}\n</document>", task.text));
    }
    let ask = match task.preset {
        Preset::Summarize => {
            "Summarize the document below in a short title and a few paragraphs, in Markdown.".to_string()
        }
        Preset::Explain => {
            "Explain the document below simply, for a reader without special knowledge, in Markdown.".to_string()
        }
        Preset::Translate => format!(
            "Translate the document below into {}. Keep its structure; answer in Markdown. Each paragraph \
             starts with a numbered marker such as ⟦1⟧: start each paragraph's translation with its marker, \
             exactly as given, one paragraph for each, in the same order, and write nothing before the first \
             marker.{}",
            task.language.as_deref().unwrap_or("English"),
            if crate::documents::inline::has_tags(&task.text) { TAGS_INSTRUCTION } else { "" }
        ),
        Preset::KeyFacts => {
            "List the key facts of the document below (dates, amounts, parties, obligations) as Markdown bullet points."
                .to_string()
        }
    };
    // What this text's translation keeps to (its terms vary from part to part: after the
    // cacheable instruction).
    let guidance = match task.guidance.prompt() {
        said if said.is_empty() || task.preset != Preset::Translate => String::new(),
        said => format!("\n{said}\n"),
    };
    let rest = guidance
        + &match &task.part {
            None => format!("\n<document>\n{}\n</document>", task.text),
            Some(part) if part.level == 0 => {
                let (note, context) = if part.overlap.is_empty() {
                    (String::new(), String::new())
                } else {
                    (
                    " Only the text inside <document> is yours to answer; <before> is the end of the part before, for context."
                        .to_string(),
                    format!("<before>\n{}\n</before>\n\n", part.overlap),
                )
                };
                format!(
                    "The document is long: below is part {} of {}.{note}\n\n{context}<document>\n{}\n</document>",
                    part.number, part.count, task.text
                )
            }
            Some(part) => format!(
                "The document was too long to read at once: below, between <document> tags, are the answers for its \
                 consecutive parts ({} of {} at this step). Combine them into one answer for the whole document.\n\n\
                 <document>\n{}\n</document>",
                part.number, part.count, task.text
            ),
        };
    (format!("{ask}\n"), rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_gets_its_makers_answer_limit() {
        let max = |kind, model| documented_max_output_tokens(kind, model);
        assert_eq!(max(ProviderKind::Anthropic, ""), 64_000);
        assert_eq!(max(ProviderKind::Anthropic, "claude-opus-4-1"), 32_000);
        assert_eq!(max(ProviderKind::Openai, "gpt-4o-mini"), 16_384);
        assert_eq!(max(ProviderKind::Openai, "gpt-5"), 128_000);
        assert_eq!(max(ProviderKind::Openai, "openai/gpt-5-mini"), 128_000, "a router's name");
        assert_eq!(max(ProviderKind::Openai, "gpt-5-chat-latest"), 16_384, "the chat model");
        assert_eq!(max(ProviderKind::Openai, "o3-mini"), 100_000);
        assert_eq!(max(ProviderKind::Openai, "o1-mini"), 65_536);
        assert_eq!(max(ProviderKind::Openai, "llama3.1:8b"), DEFAULT_MAX_OUTPUT_TOKENS);
    }
}
