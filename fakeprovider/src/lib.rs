//! A scripted fake AI provider: a real HTTP server on loopback.
//!
//! It answers `POST /v1/messages` (Anthropic shape) and `POST /v1/chat/completions` (OpenAI
//! shape). Each request takes the next scripted [`Reply`] (a queue); with the queue empty it
//! succeeds. Tests script it in-process ([`FakeProvider::push`]); a separate process (the
//! end-to-end run) is scripted over HTTP: `POST /_script` with a JSON list of replies,
//! `GET /_calls` for the number of provider calls so far.
//!
//! It can also hold callers to an input-tokens-per-minute limit the way Anthropic does
//! ([`FakeProvider::limit_input_tokens`]): a token bucket holding `burst` of the rate, refilled
//! continuously; a request whose prompt (counted with `o200k_base`, as a hosted model counts)
//! does not fit gets 429 with `Retry-After` and the tokens left, and uses nothing.
//!
//! And it can behave like a hosted model ([`FakeProvider::behave_like`], or `POST /_model`
//! with a [`HostedModel`]): with the script empty it answers the prompt's document (a
//! translation: the text itself, each paragraph marked; anything else: a short summary), takes
//! time to do it (first-token latency, prefill, time per output token), keeps input and output
//! token buckets per minute (429 with `Retry-After` when one is short), and cuts an answer at the
//! request's `max_tokens` with the provider's own stop reason (`finish_reason: "length"`,
//! `stop_reason: "max_tokens"`), as real providers do.

mod batches;
pub use batches::BatchTiming;
#[cfg(feature = "mail")]
pub mod mailbox;
pub mod receiver;
#[cfg(feature = "s3")]
pub mod s3;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

/// One scripted answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// 200 with this text and usage.
    Success { text: String, input_tokens: u64, output_tokens: u64 },
    /// 429 with `Retry-After` in seconds.
    RateLimitedSeconds { seconds: u64 },
    /// 429 with `Retry-After` as an HTTP-date this many seconds ahead.
    RateLimitedDate { seconds_ahead: u64 },
    /// 429 saying the account's spend limit is reached (permanent).
    SpendLimit,
    /// 529 (Anthropic's "overloaded").
    Overloaded,
    /// 500.
    ServerError,
    /// 400 invalid request (permanent).
    BadRequest,
    /// `then`, after `delay_ms` (a failure that comes late, while other calls are answered).
    Later { delay_ms: u64, then: Box<Reply> },
    /// 400 refusing the content, as each vendor words it (Anthropic's content filtering
    /// policy; OpenAI's `content_policy_violation`): the document's, not ours. After `delay_ms`.
    ContentPolicy { delay_ms: u64 },
    /// Wait this long before answering 200 (to exceed a client's timeout).
    Hang { millis: u64 },
    /// 429 with this exact `Retry-After` value (hostile ones: huge numbers, far dates).
    RateLimitedRaw { retry_after: String },
    /// 200 whose body never ends (spaces, as fast as the client reads).
    EndlessBody,
    /// 401 whose message quotes part of the key, as OpenAI's does.
    Unauthorized,
    /// 400 refusing a prompt past the context, each vendor's way.
    TooLong { counted: u64, maximum: u64 },
    /// This status, headers and body, verbatim (a vendor's documented answer, replayed).
    Raw { status: u16, headers: Vec<(String, String)>, body: String },
    /// 200 `text/event-stream` with these events verbatim (each a whole `event:`/`data:`
    /// block), `gap_ms` apart; then, with `stall_ms`, nothing more for that long before the
    /// body ends (a stream that stalls).
    RawStream { events: Vec<String>, gap_ms: u64, stall_ms: u64 },
    /// 200 with this text, stop reason and usage, in the request's API and mode (streamed
    /// when it asked to stream).
    Finished { text: String, stop_reason: String, input_tokens: u64, output_tokens: u64 },
    /// What the hosted model answers (not scripted: made by [`HostedModel`]), after `delay_ms`.
    Modelled {
        text: String,
        input_tokens: u64,
        output_tokens: u64,
        cut: bool,
        delay_ms: u64,
        /// The model's `only_for` (none: the default model).
        #[serde(default)]
        model: Option<String>,
        /// Output tokens asked of its bucket and not written: given back when the answer ends.
        #[serde(default)]
        unused_ask: u64,
    },
}

/// How a hosted model behaves, for tests and benchmarks of long documents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostedModel {
    /// Before the first output token.
    pub first_token_ms: u64,
    /// Prompt tokens read per second.
    pub prefill_tokens_per_sec: f64,
    /// Output tokens written per second, per call.
    pub output_tokens_per_sec: f64,
    /// Input tokens per minute (0: no limit); the bucket holds a minute's worth.
    pub input_tokens_per_min: u64,
    /// Output tokens per minute (0: no limit). As Anthropic and OpenAI document it, a request
    /// counts its `max_tokens` against the limit when it comes (refused while the bucket holds
    /// less), and what it did not write is given back when its answer ends.
    pub output_tokens_per_min: u64,
    /// How many times its text a translation's paragraph comes back (1: as long as its input;
    /// more: a language that writes longer, 1.35 as English into German, so answers meet
    /// `max_tokens` sooner).
    pub translation_growth: f64,
    /// The next this many translations of two paragraphs or more come back flawed this way
    /// (one marker's paragraph merged into the one before, or left out, or a preface put
    /// before the first), as models do now and then.
    pub flaw: Option<Flaw>,
    pub flawed_answers: u32,
    /// Only for prompts holding this text (which it then answers before any script): a
    /// browser flow's own document beside other flows' scripts on one shared fake.
    pub only_for: Option<String>,
    /// How many times `o200k_base`'s count its tokenizer counts (1.15: 15 % more, as
    /// Anthropic's counts English prose); its usage reports its own count.
    pub token_inflation: f64,
    /// The most input tokens a prompt may have by its count (0: no limit); past it the
    /// request is refused the vendor's way ("prompt is too long", `context_length_exceeded`).
    pub context_tokens: u64,
}

impl Default for HostedModel {
    fn default() -> Self {
        HostedModel {
            first_token_ms: 300,
            prefill_tokens_per_sec: 50_000.0,
            output_tokens_per_sec: 1_000.0,
            input_tokens_per_min: 0,
            output_tokens_per_min: 0,
            translation_growth: 1.0,
            flaw: None,
            flawed_answers: 0,
            only_for: None,
            token_inflation: 1.0,
            context_tokens: 0,
        }
    }
}

/// How a translation's answer comes back wrong ([`HostedModel::flaw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flaw {
    /// The second paragraph's words run on in the first's, its marker gone.
    Merge,
    /// The last paragraph left out.
    Drop,
    /// "Here is the translation:" before the first paragraph.
    Preface,
    /// Every inline tag (`<b1>`, `</b1>`, `<f2/>`) left out.
    LoseTags,
    /// The agreed terms the prompt gives not used.
    IgnoreGlossary,
}

/// What the hosted model did: its calls' overlap and the tokens it read and wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    pub calls: u64,
    /// The most calls it was answering at once.
    pub most_at_once: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The longest prompt it was sent, and the longest answer it wrote, in tokens.
    pub largest_prompt: u64,
    pub largest_answer: u64,
    /// Answers cut at `max_tokens`.
    pub cut: u64,
    /// Requests refused by a bucket (429).
    pub refused: u64,
    /// Prompts refused as longer than its context.
    pub too_long: u64,
    /// The answer sizes asked for (`max_tokens`/`max_completion_tokens`): in all, and the largest.
    pub asked_tokens: u64,
    pub largest_ask: u64,
    /// The most a call's prompt and its ask came to together (what a context must hold).
    pub largest_call: u64,
}

struct Model {
    behaviour: HostedModel,
    input: Option<TokenBucket>,
    output: Option<TokenBucket>,
    at_once: u64,
    report: ModelReport,
}

impl Model {
    fn new(behaviour: HostedModel) -> Model {
        let bucket = |per_min: u64| {
            (per_min > 0).then(|| {
                let per_sec = per_min as f64 / 60.0;
                TokenBucket { per_sec, capacity: per_sec * 60.0, level: per_sec * 60.0, at: Instant::now() }
            })
        };
        Model {
            input: bucket(behaviour.input_tokens_per_min),
            output: bucket(behaviour.output_tokens_per_min),
            behaviour,
            at_once: 0,
            report: ModelReport::default(),
        }
    }
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    /// Replies kept for requests whose prompt holds a text (checked before `replies`).
    matching: Vec<(String, VecDeque<Reply>)>,
    calls: u64,
    last_request: Option<serde_json::Value>,
    limit: Option<TokenBucket>,
    /// Requests refused by the limit.
    refused_by_limit: u64,
    /// When each request within the limit came, and its input tokens.
    accepted: Vec<(Instant, u64)>,
    /// Hosted models: at most one default (`only_for` none), and one per `only_for` text.
    models: Vec<Model>,
    /// Every request's prompt, for tests asking which parts were called (at most 10,000 kept).
    prompts: Vec<String>,
    /// Requests being answered now, and the most at once so far (every kind of reply).
    answering: u64,
    most_answering: u64,
    /// Until then every request is refused for a spent quota.
    quota_spent_until: Option<Instant>,
    /// The batch APIs' files and batches.
    batches: batches::Batches,
}

/// Serve the fake's routes on `listener`, each connection a task of the returned one's (so
/// aborting it ends them all: a killed server).
fn serve(listener: tokio::net::TcpListener, script: Shared) -> tokio::task::JoinHandle<()> {
    let app = Router::new()
        .route("/v1/messages", post(anthropic))
        .route("/v1/chat/completions", post(openai))
        .route("/_script", post(set_script))
        .route("/_calls", get(calls))
        .route("/_model", post(set_model).get(model_report))
        .route("/v1/files", post(batches::upload_file))
        .route("/v1/files/{id}/content", get(batches::file_content))
        .route("/v1/batches", post(batches::openai_create))
        .route("/v1/batches/{id}", get(batches::openai_get))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route("/v1/messages/batches", post(batches::anthropic_create))
        .route("/v1/messages/batches/{id}", get(batches::anthropic_get))
        .route("/v1/messages/batches/{id}/results", get(batches::anthropic_results))
        .route("/v1/messages/batches/{id}/cancel", post(batches::cancel))
        .with_state(script);
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            connections.spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection_with_upgrades(io, service)
                    .await;
            });
            // Finished connections are reaped as new ones come.
            while connections.try_join_next().is_some() {}
        }
    })
}

/// Counts a request while it is answered; a client that hangs up ends it (its handler is dropped).
struct Answering(Shared);

impl Answering {
    fn start(script: &Shared) -> Answering {
        let mut s = script.lock().unwrap();
        s.answering += 1;
        s.most_answering = s.most_answering.max(s.answering);
        Answering(script.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap();
        s.answering = s.answering.saturating_sub(1);
    }
}

/// An input-token bucket: holds at most `capacity`, refills at `per_sec`.
struct TokenBucket {
    per_sec: f64,
    capacity: f64,
    level: f64,
    at: Instant,
}

impl TokenBucket {
    fn refill(&mut self) {
        let now = Instant::now();
        self.level = (self.level + self.per_sec * (now - self.at).as_secs_f64()).min(self.capacity);
        self.at = now;
    }

    fn take(&mut self, tokens: u64) -> Result<f64, Duration> {
        self.refill();
        if tokens as f64 > self.level {
            let short = tokens as f64 - self.level;
            return Err(Duration::from_secs_f64(short / self.per_sec));
        }
        self.level -= tokens as f64;
        Ok(self.level)
    }
}

/// What the limit saw: requests let through (with their tokens and times) and refused.
#[derive(Clone, Debug, Default)]
pub struct LimitReport {
    pub accepted: Vec<(Instant, u64)>,
    pub refused: u64,
}

impl LimitReport {
    /// Input tokens a second between the first and the last request let through, not counting
    /// the `initial` tokens the full bucket held at the start (a burst, not a rate).
    pub fn tokens_per_sec(&self, initial: f64) -> f64 {
        let (Some(first), Some(last)) = (self.accepted.first(), self.accepted.last()) else { return 0.0 };
        let secs = (last.0 - first.0).as_secs_f64();
        let tokens: u64 = self.accepted.iter().map(|(_, t)| t).sum();
        if secs > 0.0 {
            (tokens as f64 - initial).max(0.0) / secs
        } else {
            0.0
        }
    }
}

/// Tokens in `text`, as a hosted model counts them (`o200k_base`).
pub fn count_tokens(text: &str) -> u64 {
    bpe_openai::o200k_base().count(text) as u64
}

/// The prompt of a request: its messages' text (a message's content is a string, or text
/// blocks, as Anthropic's cacheable prefix is sent).
fn prompt_of(body: &serde_json::Value) -> String {
    let content = |m: &serde_json::Value| match &m["content"] {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Array(blocks) => Some(blocks.iter().filter_map(|b| b["text"].as_str()).collect::<String>()),
        _ => None,
    };
    body["messages"]
        .as_array()
        .map(|messages| messages.iter().filter_map(content).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// The answer size a request asked for (`max_completion_tokens` for reasoning models).
fn asked_of(body: &serde_json::Value) -> u64 {
    body["max_tokens"].as_u64().or_else(|| body["max_completion_tokens"].as_u64()).unwrap_or(4_096)
}

/// What a hosted model answers to `prompt`: a translation is the document itself with each
/// paragraph marked `[translated]` and its words `growth` times as many (as long as its
/// input, as a real one is, or longer), its paragraph markers (`⟦1⟧`) kept in front, or
/// flawed as `flaw` says; anything else a short summary (the first words of each paragraph, at
/// most a tenth of the text).
pub fn model_answer(prompt: &str, growth: f64, flaw: Option<Flaw>) -> String {
    let document = prompt
        .rsplit_once("<document>\n")
        .map(|(_, rest)| rest.rsplit_once("\n</document>").map_or(rest, |(doc, _)| doc))
        .unwrap_or(prompt);
    let paragraphs = document.split("\n\n").filter(|p| !p.trim().is_empty());
    if prompt.starts_with("List up to") {
        // Key terms: its capitalised words of four letters or more, the first five, each kept
        // as it is (as names are).
        let mut terms: Vec<&str> = Vec::new();
        for word in document.split(|c: char| !c.is_alphanumeric()) {
            let capital = word.chars().next().is_some_and(char::is_uppercase);
            if capital && word.chars().count() >= 4 && !terms.contains(&word) && terms.len() < 5 {
                terms.push(word);
            }
        }
        return terms.iter().map(|t| format!("{t}\t{t}")).collect::<Vec<_>>().join("\n");
    }
    if prompt.starts_with("Translate") {
        // The terms agreed in the prompt, used as a model uses them (unless told to forget).
        let agreed = if flaw == Some(Flaw::IgnoreGlossary) { Vec::new() } else { agreed_terms(prompt) };
        let with_terms =
            |p: &str| agreed.iter().fold(p.to_string(), |p, (term, translation)| p.replace(term, translation));
        let grown = |p: &str| {
            let words: Vec<&str> = p.split(' ').collect();
            let want = ((words.len() as f64) * growth.clamp(0.1, 20.0)).ceil().max(1.0) as usize;
            words.iter().cycle().take(want).copied().collect::<Vec<_>>().join(" ")
        };
        // The paragraph's marker, and a heading's or a list item's Markdown marker, stay in
        // front, as a model keeps them.
        let marked = |p: &str| {
            let text = p.trim_start();
            let text = match text.strip_prefix('⟦').and_then(|t| t.split_once('⟧')) {
                Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) => rest.trim_start(),
                _ => text,
            };
            let text = text.trim_start_matches('#').trim_start_matches("- ").trim_start();
            let marker = &p[..p.len() - text.len()];
            format!("{marker}[translated] {}", grown(text))
        };
        let mut answers: Vec<String> = paragraphs.map(|p| with_terms(&marked(p))).collect();
        match flaw {
            Some(Flaw::Merge) if answers.len() > 1 => {
                let second = answers.remove(1);
                let words = second.split_once('⟧').map_or(second.as_str(), |(_, rest)| rest).trim();
                answers[0] = format!("{} {words}", answers[0]);
            }
            Some(Flaw::Drop) if answers.len() > 1 => {
                answers.pop();
            }
            Some(Flaw::Preface) => answers.insert(0, "Here is the translation:".into()),
            Some(Flaw::LoseTags) => {
                for answer in &mut answers {
                    *answer = without_inline_tags(answer);
                }
            }
            _ => {}
        }
        return answers.join("\n\n");
    }
    let budget = (document.len() / 10).max(200);
    let mut summary = String::from("## Summary\n");
    for p in paragraphs {
        let words: Vec<&str> = p.split_whitespace().take(8).collect();
        if summary.len() + 60 > budget {
            break;
        }
        summary.push_str(&format!("- {}\n", words.join(" ")));
    }
    summary
}

/// The glossary a translation's prompt gives: `"Supplier" as "Lieferant"` pairs.
fn agreed_terms(prompt: &str) -> Vec<(String, String)> {
    let Some((_, line)) = prompt.split_once("Translate these terms as agreed: ") else { return Vec::new() };
    let line = line.lines().next().unwrap_or_default().trim_end_matches('.');
    line.split("; ")
        .filter_map(|pair| {
            let (term, translation) = pair.split_once("\" as \"")?;
            Some((term.trim_start_matches('"').to_string(), translation.trim_end_matches('"').to_string()))
        })
        .collect()
}

/// `text` without tags such as `<b1>`, `</b1>` and `<f2/>`.
fn without_inline_tags(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 1..];
        let end = tail.find('>').filter(|e| {
            let inner = tail[..*e].trim_start_matches('/').trim_end_matches('/');
            // The letter first: slicing after it is then at a character's boundary.
            inner.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && inner.len() >= 2
                && inner[1..].chars().all(|c| c.is_ascii_digit())
        });
        match end {
            Some(end) => rest = &tail[end + 1..],
            None => {
                out.push('<');
                rest = tail;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The longest start of `answer` that holds at most `max_tokens` tokens (by bisection).
fn cut_to_tokens(answer: &str, max_tokens: u64) -> String {
    let (mut fits, mut over) = (0usize, answer.len());
    while over - fits > 1 {
        let mid = answer.floor_char_boundary(fits + (over - fits) / 2);
        if mid <= fits {
            break;
        }
        if count_tokens(&answer[..mid]) <= max_tokens {
            fits = mid;
        } else {
            over = mid;
        }
    }
    answer[..fits].to_string()
}

/// A running fake provider.
#[derive(Clone)]
pub struct FakeProvider {
    pub addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// The server's accept loop and its connections, ended by [`FakeProvider::kill`].
    serving: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl FakeProvider {
    /// Start on a random loopback port.
    pub async fn start() -> FakeProvider {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> FakeProvider {
        let script = Arc::new(Mutex::new(Script::default()));
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind the fake provider");
        let addr = listener.local_addr().unwrap();
        let serving = Arc::new(Mutex::new(Some(serve(listener, script.clone()))));
        FakeProvider { addr, script, serving }
    }

    /// How long its batches take and how long their window is (past it, they expire).
    pub fn batch_timing(&self, timing: BatchTiming) {
        self.script.lock().unwrap().batches.timing = timing;
    }

    /// Serve this body as every Anthropic batch's results from now on (a provider answering
    /// more, or longer, than it was asked).
    pub fn batch_results_instead(&self, body: String) {
        self.script.lock().unwrap().batches.results_instead = Some(body);
    }

    /// Requests submitted in batches so far, and the batches made.
    pub fn batch_requests(&self) -> u64 {
        self.script.lock().unwrap().batches.requests
    }

    /// Kill it, as a deployment goes down: its port refuses connections, and the calls it was
    /// answering break off.
    pub fn kill(&self) {
        if let Some(serving) = self.serving.lock().unwrap().take() {
            serving.abort();
        }
    }

    /// Bring a killed one back on its port, its script and counts as they were.
    pub async fn revive(&self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.expect("bind the fake provider again");
        *self.serving.lock().unwrap() = Some(serve(listener, self.script.clone()));
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.script.lock().unwrap().replies.extend(replies);
    }

    /// Replies for the requests whose prompt contains `needle` only (e.g. "part 2 of"), in
    /// order; other requests take the common script. Parts run side by side, so which request
    /// comes first is not known.
    pub fn push_matching(&self, needle: &str, replies: impl IntoIterator<Item = Reply>) {
        self.script.lock().unwrap().matching.push((needle.to_string(), replies.into_iter().collect()));
    }

    /// Requests so far whose prompt contained `needle`.
    pub fn calls_matching(&self, needle: &str) -> u64 {
        self.script.lock().unwrap().prompts.iter().filter(|p| p.contains(needle)).count() as u64
    }

    pub fn calls(&self) -> u64 {
        self.script.lock().unwrap().calls
    }

    /// The most requests it was answering at once: the provider calls a gate lets through.
    pub fn most_at_once(&self) -> u64 {
        self.script.lock().unwrap().most_answering
    }

    pub fn last_request(&self) -> Option<serde_json::Value> {
        self.script.lock().unwrap().last_request.clone()
    }

    /// Enforce an input-tokens-per-minute limit from now on; the bucket starts full and holds
    /// `burst` worth of the rate.
    pub fn limit_input_tokens(&self, per_minute: u64, burst: Duration) {
        let per_sec = per_minute as f64 / 60.0;
        let capacity = per_sec * burst.as_secs_f64();
        let mut s = self.script.lock().unwrap();
        s.limit = Some(TokenBucket { per_sec, capacity, level: capacity, at: Instant::now() });
        s.refused_by_limit = 0;
        s.accepted.clear();
    }

    /// From now on, with the script empty, answer like a hosted model (see the crate's docs).
    pub fn behave_like(&self, model: HostedModel) {
        self.script.lock().unwrap().set_model(model);
    }

    /// What the default hosted model (no `only_for`) did so far.
    pub fn model_report(&self) -> ModelReport {
        self.script.lock().unwrap().report_of(None)
    }

    /// Refuse every request for a spent quota (OpenAI's 429 `insufficient_quota`, Anthropic's
    /// spend limit) for `how_long` from now.
    pub fn spend_quota_for(&self, how_long: Duration) {
        self.script.lock().unwrap().quota_spent_until = Some(Instant::now() + how_long);
    }

    /// What the limit let through and refused so far.
    pub fn limit_report(&self) -> LimitReport {
        let s = self.script.lock().unwrap();
        LimitReport { accepted: s.accepted.clone(), refused: s.refused_by_limit }
    }
}

type Shared = Arc<Mutex<Script>>;

/// The reply to a request: refused by the limit, or the next scripted one (by default a
/// success, counting the request's real input tokens when a limit is on). With a limit, the
/// tokens left ride along as `anthropic-ratelimit-input-tokens-remaining`.
fn next_reply(script: &Shared, body: serde_json::Value) -> (Reply, Option<u64>) {
    let mut s = script.lock().unwrap();
    s.calls += 1;
    let prompt = prompt_of(&body);
    let tokens = count_tokens(&prompt);
    let max_tokens = asked_of(&body);
    s.last_request = Some(body);
    if s.prompts.len() < 10_000 {
        s.prompts.push(prompt.clone());
    }
    if s.quota_spent_until.is_some_and(|until| Instant::now() < until) {
        return (Reply::SpendLimit, None);
    }
    let mut remaining = None;
    if let Some(bucket) = s.limit.as_mut() {
        match bucket.take(tokens) {
            Ok(left) => {
                remaining = Some(left as u64);
                s.accepted.push((Instant::now(), tokens));
            }
            Err(wait) => {
                let left = bucket.level as u64;
                s.refused_by_limit += 1;
                let seconds = wait.as_secs_f64().ceil() as u64;
                return (Reply::RateLimitedSeconds { seconds }, Some(left));
            }
        }
    }
    let matched = s.matching.iter_mut().find(|(needle, r)| !r.is_empty() && prompt.contains(needle.as_str()));
    if let Some(reply) = matched.and_then(|(_, r)| r.pop_front()) {
        return (reply, remaining);
    }
    let script_empty = s.replies.is_empty();
    let model =
        s.models.iter_mut().position(|m| m.behaviour.only_for.as_ref().is_some_and(|n| prompt.contains(n.as_str())));
    let model = model.or_else(|| s.models.iter().position(|m| m.behaviour.only_for.is_none()).filter(|_| script_empty));
    if let Some(i) = model {
        return modelled(&mut s.models[i], &prompt, tokens, max_tokens);
    }
    let counted = if s.limit.is_some() { tokens } else { 120 };
    let reply = s.replies.pop_front().unwrap_or(Reply::Success {
        text: "## Summary\nA scripted answer from the fake provider.".into(),
        input_tokens: counted,
        output_tokens: 30,
    });
    (reply, remaining)
}

/// The hosted model's reply to a prompt of `tokens`: refused while a bucket is short, else its
/// answer, cut at `max_tokens`, and how long writing it takes.
fn modelled(model: &mut Model, prompt: &str, tokens: u64, max_tokens: u64) -> (Reply, Option<u64>) {
    let refuse = |model: &mut Model, wait: f64| {
        model.report.refused += 1;
        (Reply::RateLimitedSeconds { seconds: wait.ceil().max(1.0) as u64 }, None)
    };
    let mut asked_of_bucket = 0.0;
    if let Some(output) = model.output.as_mut() {
        output.refill();
        asked_of_bucket = (max_tokens as f64).min(output.capacity);
        if output.level < asked_of_bucket {
            let wait = (asked_of_bucket - output.level) / output.per_sec;
            return refuse(model, wait);
        }
    }
    // Its own tokenizer's count of the prompt.
    let tokens = (tokens as f64 * model.behaviour.token_inflation.max(0.01)).round() as u64;
    if model.behaviour.context_tokens > 0 && tokens > model.behaviour.context_tokens {
        model.report.too_long += 1;
        return (Reply::TooLong { counted: tokens, maximum: model.behaviour.context_tokens }, None);
    }
    if let Some(input) = model.input.as_mut() {
        if let Err(wait) = input.take(tokens) {
            return refuse(model, wait.as_secs_f64());
        }
    }
    let two_paragraphs = prompt.rsplit_once("<document>").is_some_and(|(_, d)| d.trim().contains("\n\n"));
    let flaw = model.behaviour.flaw.filter(|_| model.behaviour.flawed_answers > 0 && two_paragraphs);
    if flaw.is_some() {
        model.behaviour.flawed_answers -= 1;
    }
    let answer = model_answer(prompt, model.behaviour.translation_growth, flaw);
    // Its own tokenizer counts its answer as it counts its prompt.
    let inflation = model.behaviour.token_inflation.max(0.01);
    let whole = (count_tokens(&answer) as f64 * inflation).round() as u64;
    let (text, written, cut) = if whole > max_tokens {
        (cut_to_tokens(&answer, (max_tokens as f64 / inflation) as u64), max_tokens, true)
    } else {
        (answer, whole, false)
    };
    // The ask is held until the answer ends; what was not written comes back then.
    let unused_ask = if let Some(output) = model.output.as_mut() {
        output.level -= asked_of_bucket;
        (asked_of_bucket - written as f64).max(0.0) as u64
    } else {
        0
    };
    let b = &model.behaviour;
    let secs = tokens as f64 / b.prefill_tokens_per_sec.max(1.0) + written as f64 / b.output_tokens_per_sec.max(1.0);
    let delay_ms = b.first_token_ms + (secs * 1000.0) as u64;
    let r = &mut model.report;
    r.calls += 1;
    r.asked_tokens += max_tokens;
    r.largest_ask = r.largest_ask.max(max_tokens);
    r.largest_call = r.largest_call.max(tokens + max_tokens);
    r.input_tokens += tokens;
    r.output_tokens += written;
    r.largest_prompt = r.largest_prompt.max(tokens);
    r.largest_answer = r.largest_answer.max(written);
    r.cut += u64::from(cut);
    let model = model.behaviour.only_for.clone();
    (Reply::Modelled { text, input_tokens: tokens, output_tokens: written, cut, delay_ms, model, unused_ask }, None)
}

/// Counts the hosted model's calls in progress while it writes an answer, and gives back the
/// output tokens its request asked of the bucket and did not write when it ends.
struct Writing(Shared, Option<String>, u64);

impl Writing {
    fn start(script: &Shared, key: Option<String>, unused_ask: u64) -> Writing {
        let mut s = script.lock().unwrap();
        if let Some(model) = s.model_mut(key.as_deref()) {
            model.at_once += 1;
            model.report.most_at_once = model.report.most_at_once.max(model.at_once);
        }
        Writing(script.clone(), key, unused_ask)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(model) = self.0.lock().unwrap().model_mut(self.1.as_deref()) {
            model.at_once = model.at_once.saturating_sub(1);
            if let Some(output) = model.output.as_mut() {
                output.refill();
                output.level = (output.level + self.2 as f64).min(output.capacity);
            }
        }
    }
}

impl Script {
    /// The model with this `only_for`.
    fn model_mut(&mut self, key: Option<&str>) -> Option<&mut Model> {
        self.models.iter_mut().find(|m| m.behaviour.only_for.as_deref() == key)
    }

    /// Start (or start again) the model with this behaviour's `only_for`.
    fn set_model(&mut self, behaviour: HostedModel) {
        self.models.retain(|m| m.behaviour.only_for != behaviour.only_for);
        self.models.push(Model::new(behaviour));
    }

    fn report_of(&mut self, key: Option<&str>) -> ModelReport {
        self.model_mut(key).map(|m| m.report.clone()).unwrap_or_default()
    }
}

fn with_remaining(mut response: Response, remaining: Option<u64>) -> Response {
    if let Some(left) = remaining {
        let value = HeaderValue::from_str(&left.to_string()).unwrap();
        response.headers_mut().insert("anthropic-ratelimit-input-tokens-remaining", value);
    }
    response
}

#[derive(Clone, Copy)]
enum Shape {
    Anthropic,
    OpenAi,
}

fn error(shape: Shape, status: u16, kind: &str, message: &str) -> Response {
    let body = match shape {
        Shape::Anthropic => serde_json::json!({ "type": "error", "error": { "type": kind, "message": message } }),
        Shape::OpenAi => serde_json::json!({ "error": { "type": kind, "code": kind, "message": message } }),
    };
    (StatusCode::from_u16(status).unwrap(), Json(body)).into_response()
}

/// A successful answer's parts, rendered in either API, whole or streamed.
struct Done<'a> {
    text: &'a str,
    /// The stop reason as the vendor words it.
    stop: &'a str,
    input_tokens: u64,
    output_tokens: u64,
}

/// Each vendor's words for a whole or a cut answer.
fn stop_word(shape: Shape, cut: bool) -> &'static str {
    match (shape, cut) {
        (Shape::Anthropic, false) => "end_turn",
        (Shape::Anthropic, true) => "max_tokens",
        (Shape::OpenAi, false) => "stop",
        (Shape::OpenAi, true) => "length",
    }
}

async fn answer(script: &Shared, shape: Shape, stream: bool, reply: Reply) -> Response {
    let render = |done: Done, writing: Option<Writing>, pace: Duration| {
        if stream {
            streamed(shape, &done, writing, pace)
        } else {
            success(shape, &done)
        }
    };
    match reply {
        Reply::Success { text, input_tokens, output_tokens } => render(
            Done { text: &text, stop: stop_word(shape, false), input_tokens, output_tokens },
            None,
            Duration::ZERO,
        ),
        Reply::Finished { text, stop_reason, input_tokens, output_tokens } => {
            render(Done { text: &text, stop: &stop_reason, input_tokens, output_tokens }, None, Duration::ZERO)
        }
        Reply::Modelled { text, input_tokens, output_tokens, cut, delay_ms, model, unused_ask } => {
            let writing = Writing::start(script, model, unused_ask);
            let done = Done { text: &text, stop: stop_word(shape, cut), input_tokens, output_tokens };
            if stream {
                // Written as it goes: the answer's time is spent between its events.
                return render(done, Some(writing), Duration::from_millis(delay_ms));
            }
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            render(done, Some(writing), Duration::ZERO)
        }
        Reply::Hang { millis } => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            render(Done { text: "late", stop: stop_word(shape, false), input_tokens: 1, output_tokens: 1 }, None, Duration::ZERO)
        }
        Reply::TooLong { counted, maximum } => match shape {
            Shape::Anthropic => error(
                shape,
                400,
                "invalid_request_error",
                &format!("prompt is too long: {counted} tokens > {maximum} maximum"),
            ),
            Shape::OpenAi => error(
                shape,
                400,
                "context_length_exceeded",
                &format!(
                    "This model's maximum context length is {maximum} tokens. However, your messages resulted in {counted} tokens. Please reduce the length of the messages."
                ),
            ),
        },
        Reply::Raw { status, headers, body } => {
            let mut response = (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body).into_response();
            for (name, value) in headers {
                if let (Ok(name), Ok(value)) =
                    (axum::http::HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value))
                {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
        Reply::RawStream { events, gap_ms, stall_ms } => {
            event_stream(events, Duration::from_millis(gap_ms), Duration::from_millis(stall_ms), None)
        }
        Reply::RateLimitedSeconds { seconds } => {
            with_retry_after(error(shape, 429, "rate_limit_error", "rate limited"), seconds.to_string())
        }
        Reply::RateLimitedDate { seconds_ahead } => {
            let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(seconds_ahead));
            with_retry_after(error(shape, 429, "rate_limit_error", "rate limited"), date)
        }
        Reply::SpendLimit => match shape {
            Shape::Anthropic => {
                error(shape, 429, "rate_limit_error", "You have reached your specified API usage limits (spend limit).")
            }
            Shape::OpenAi => error(shape, 429, "insufficient_quota", "You exceeded your current quota."),
        },
        Reply::Overloaded => error(shape, 529, "overloaded_error", "Overloaded"),
        Reply::ServerError => error(shape, 500, "api_error", "internal error"),
        Reply::RateLimitedRaw { retry_after } => {
            with_retry_after(error(shape, 429, "rate_limit_error", "rate limited"), retry_after)
        }
        Reply::EndlessBody => {
            let spaces = axum::body::Bytes::from(vec![b' '; 64 * 1024]);
            let endless = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(spaces.clone()));
            (StatusCode::OK, axum::body::Body::from_stream(endless)).into_response()
        }
        Reply::Unauthorized => error(
            shape,
            401,
            "invalid_api_key",
            "Incorrect API key provided: sk-proj-Ab12********************Xy89Qw7. You can find your API key at https://platform.openai.com/account/api-keys.",
        ),
        Reply::BadRequest => {
            error(shape, 400, "invalid_request_error", "messages: text content blocks must be non-empty")
        }
        Reply::Later { delay_ms, then } => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            Box::pin(answer(script, shape, stream, *then)).await
        }
        Reply::ContentPolicy { delay_ms } => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            content_policy(shape)
        }

    }
}

fn content_policy(shape: Shape) -> Response {
    match shape {
        Shape::Anthropic => error(shape, 400, "invalid_request_error", "Output blocked by content filtering policy"),
        Shape::OpenAi => {
            error(shape, 400, "content_policy_violation", "Your request was rejected as a result of our safety system.")
        }
    }
}

fn with_retry_after(mut response: Response, value: String) -> Response {
    response.headers_mut().insert("retry-after", HeaderValue::from_str(&value).unwrap());
    response
}

/// 200 `text/event-stream`: `events` (whole blocks) with `gap` between them, then `stall`
/// of nothing before the body ends; `writing` is held until the last event is sent.
fn event_stream(events: Vec<String>, gap: Duration, stall: Duration, writing: Option<Writing>) -> Response {
    let state = (events.into_iter(), gap, stall, writing, true);
    let body = futures::stream::unfold(state, |(mut events, gap, stall, writing, first)| async move {
        if !first && !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        match events.next() {
            Some(event) => Some((Ok::<_, std::io::Error>(event), (events, gap, stall, writing, false))),
            None => {
                drop(writing);
                if !stall.is_zero() {
                    tokio::time::sleep(stall).await;
                }
                None
            }
        }
    });
    let mut response = (StatusCode::OK, axum::body::Body::from_stream(body)).into_response();
    response.headers_mut().insert("content-type", HeaderValue::from_static("text/event-stream"));
    response
}

/// The answer as each vendor streams it, its text in pieces `pace` spread over the events
/// (the vendors' documented event shapes: Anthropic's `message_start` ... `message_stop`;
/// OpenAI's chunks, the usage in the last, then `[DONE]`).
fn streamed(shape: Shape, done: &Done, writing: Option<Writing>, pace: Duration) -> Response {
    let chars: Vec<char> = done.text.chars().collect();
    let pieces: Vec<String> = chars.chunks(chars.len().div_ceil(64).max(16)).map(|c| c.iter().collect()).collect();
    let sse = |name: Option<&str>, data: serde_json::Value| match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    let mut events = Vec::new();
    match shape {
        Shape::Anthropic => {
            events.push(sse(
                Some("message_start"),
                serde_json::json!({ "type": "message_start", "message": {
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": [],
                "stop_reason": null, "usage": { "input_tokens": done.input_tokens, "output_tokens": 1 } } }),
            ));
            events.push(sse(
                Some("content_block_start"),
                serde_json::json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "text", "text": "" } }),
            ));
            events.push(sse(Some("ping"), serde_json::json!({ "type": "ping" })));
            for piece in &pieces {
                events.push(sse(
                    Some("content_block_delta"),
                    serde_json::json!({ "type": "content_block_delta", "index": 0,
                    "delta": { "type": "text_delta", "text": piece } }),
                ));
            }
            events
                .push(sse(Some("content_block_stop"), serde_json::json!({ "type": "content_block_stop", "index": 0 })));
            events.push(sse(Some("message_delta"), serde_json::json!({ "type": "message_delta",
                "delta": { "stop_reason": done.stop, "stop_sequence": null }, "usage": { "output_tokens": done.output_tokens } })));
            events.push(sse(Some("message_stop"), serde_json::json!({ "type": "message_stop" })));
        }
        Shape::OpenAi => {
            let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                serde_json::json!({
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake",
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] })
            };
            events.push(sse(None, chunk(serde_json::json!({ "role": "assistant", "content": "" }), None)));
            for piece in &pieces {
                events.push(sse(None, chunk(serde_json::json!({ "content": piece }), None)));
            }
            events.push(sse(None, chunk(serde_json::json!({}), Some(done.stop))));
            events.push(sse(
                None,
                serde_json::json!({ "id": "chatcmpl-fake", "object": "chat.completion.chunk",
                "model": "fake", "choices": [], "usage": { "prompt_tokens": done.input_tokens,
                "completion_tokens": done.output_tokens, "total_tokens": done.input_tokens + done.output_tokens } }),
            ));
            events.push("data: [DONE]\n\n".to_string());
        }
    }
    let gap = pace / (events.len() as u32).max(1);
    let mut response = event_stream(events, gap, Duration::ZERO, writing);
    if let Shape::Anthropic = shape {
        response.headers_mut().extend(anthropic_limits());
    }
    response
}

/// The rate-limit headers Anthropic sends with an answer.
fn anthropic_limits() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("anthropic-ratelimit-requests-remaining", HeaderValue::from_static("49"));
    headers.insert("anthropic-ratelimit-tokens-remaining", HeaderValue::from_static("39000"));
    headers
}

/// 200 with the whole answer, its stop reason the vendor's.
fn success(shape: Shape, done: &Done) -> Response {
    let Done { text, stop, input_tokens, output_tokens } = *done;
    match shape {
        Shape::Anthropic => {
            let headers = anthropic_limits();
            let body = serde_json::json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
                "content": [{ "type": "text", "text": text }],
                "stop_reason": stop,
                "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
            });
            (headers, Json(body)).into_response()
        }
        Shape::OpenAi => Json(serde_json::json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": stop }],
            "usage": { "prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens },
        }))
        .into_response(),
    }
}

async fn anthropic(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    respond(script, Shape::Anthropic, body).await
}

async fn openai(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    respond(script, Shape::OpenAi, body).await
}

async fn respond(script: Shared, shape: Shape, body: serde_json::Value) -> Response {
    let answering = Answering::start(&script);
    let stream = body["stream"].as_bool().unwrap_or(false);
    let (reply, remaining) = next_reply(&script, body);
    holding(with_remaining(answer(&script, shape, stream, reply).await, remaining), answering)
}

/// `response`, with `guard` held until its body is sent (a stream is answered long after its
/// handler returns) or its client hangs up.
fn holding<T: Send + 'static>(response: Response, guard: T) -> Response {
    use futures::StreamExt;
    let (parts, body) = response.into_parts();
    let guarded = futures::stream::unfold((body.into_data_stream(), Some(guard)), |(mut body, guard)| async move {
        let item = body.next().await?;
        Some((item, (body, guard)))
    });
    Response::from_parts(parts, axum::body::Body::from_stream(guarded))
}

async fn set_script(State(script): State<Shared>, Json(replies): Json<Vec<Reply>>) -> StatusCode {
    script.lock().unwrap().replies.extend(replies);
    StatusCode::NO_CONTENT
}

async fn set_model(State(script): State<Shared>, Json(model): Json<HostedModel>) -> StatusCode {
    script.lock().unwrap().set_model(model);
    StatusCode::NO_CONTENT
}

/// `GET /_model?only_for=TEXT`: what that model did (without it: the default model).
async fn model_report(
    State(script): State<Shared>,
    Query(which): Query<std::collections::HashMap<String, String>>,
) -> Json<ModelReport> {
    Json(script.lock().unwrap().report_of(which.get("only_for").map(String::as_str)))
}

async fn calls(State(script): State<Shared>) -> Json<serde_json::Value> {
    let s = script.lock().unwrap();
    Json(serde_json::json!({ "calls": s.calls, "queued": s.replies.len() }))
}
