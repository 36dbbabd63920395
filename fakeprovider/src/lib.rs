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
    /// Output tokens per minute (0: no limit); a request is refused while the bucket is empty,
    /// and its answer is taken from it.
    pub output_tokens_per_min: u64,
    /// How many times its text a translation's paragraph comes back (1: as long as its input;
    /// more: a language that takes more tokens, so answers meet `max_tokens` sooner).
    pub translation_growth: u32,
    /// Only for prompts holding this text (which it then answers before any script): a
    /// browser flow's own document beside other flows' scripts on one shared fake.
    pub only_for: Option<String>,
}

impl Default for HostedModel {
    fn default() -> Self {
        HostedModel {
            first_token_ms: 300,
            prefill_tokens_per_sec: 50_000.0,
            output_tokens_per_sec: 1_000.0,
            input_tokens_per_min: 0,
            output_tokens_per_min: 0,
            translation_growth: 1,
            only_for: None,
        }
    }
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

/// The prompt of a request: its messages' text.
fn prompt_of(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .map(|messages| messages.iter().filter_map(|m| m["content"].as_str()).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

/// What a hosted model answers to `prompt`: a translation is the document itself with each
/// paragraph marked (as long as its input, as a real one is); anything else a short summary
/// (the first words of each paragraph, at most a tenth of the text).
pub fn model_answer(prompt: &str, growth: u32) -> String {
    let document = prompt
        .rsplit_once("<document>\n")
        .map(|(_, rest)| rest.rsplit_once("\n</document>").map_or(rest, |(doc, _)| doc))
        .unwrap_or(prompt);
    let paragraphs = document.split("\n\n").filter(|p| !p.trim().is_empty());
    if prompt.starts_with("Translate") {
        let grown = |p: &str| vec![p; growth.max(1) as usize].join(" ");
        // A heading's or a list item's Markdown marker stays in front, as a model keeps it.
        let marked = |p: &str| {
            let text = p.trim_start_matches('#').trim_start_matches("- ").trim_start();
            let marker = &p[..p.len() - text.len()];
            format!("{marker}[translated] {}", grown(text))
        };
        return paragraphs.map(marked).collect::<Vec<_>>().join("\n\n");
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
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .route("/_script", post(set_script))
            .route("/_calls", get(calls))
            .route("/_model", post(set_model).get(model_report))
            .with_state(script.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { addr, script }
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
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(4_096);
    s.last_request = Some(body);
    if s.prompts.len() < 10_000 {
        s.prompts.push(prompt.clone());
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
    if let Some(output) = model.output.as_mut() {
        output.refill();
        if output.level <= 0.0 {
            let wait = -output.level / output.per_sec + 1.0;
            return refuse(model, wait);
        }
    }
    if let Some(input) = model.input.as_mut() {
        if let Err(wait) = input.take(tokens) {
            return refuse(model, wait.as_secs_f64());
        }
    }
    let answer = model_answer(prompt, model.behaviour.translation_growth);
    let whole = count_tokens(&answer);
    let (text, written, cut) = if whole > max_tokens {
        (cut_to_tokens(&answer, max_tokens), max_tokens, true)
    } else {
        (answer, whole, false)
    };
    if let Some(output) = model.output.as_mut() {
        output.level -= written as f64;
    }
    let b = &model.behaviour;
    let secs = tokens as f64 / b.prefill_tokens_per_sec.max(1.0) + written as f64 / b.output_tokens_per_sec.max(1.0);
    let delay_ms = b.first_token_ms + (secs * 1000.0) as u64;
    let r = &mut model.report;
    r.calls += 1;
    r.input_tokens += tokens;
    r.output_tokens += written;
    r.largest_prompt = r.largest_prompt.max(tokens);
    r.largest_answer = r.largest_answer.max(written);
    r.cut += u64::from(cut);
    let model = model.behaviour.only_for.clone();
    (Reply::Modelled { text, input_tokens: tokens, output_tokens: written, cut, delay_ms, model }, None)
}

/// Counts the hosted model's calls in progress while it writes an answer.
struct Writing(Shared, Option<String>);

impl Writing {
    fn start(script: &Shared, key: Option<String>) -> Writing {
        let mut s = script.lock().unwrap();
        if let Some(model) = s.model_mut(key.as_deref()) {
            model.at_once += 1;
            model.report.most_at_once = model.report.most_at_once.max(model.at_once);
        }
        Writing(script.clone(), key)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(model) = self.0.lock().unwrap().model_mut(self.1.as_deref()) {
            model.at_once = model.at_once.saturating_sub(1);
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

async fn answer(script: &Shared, shape: Shape, reply: Reply) -> Response {
    match reply {
        Reply::Success { text, input_tokens, output_tokens } => {
            success(shape, &text, input_tokens, output_tokens, false)
        }
        Reply::Modelled { text, input_tokens, output_tokens, cut, delay_ms, model } => {
            let _writing = Writing::start(script, model);
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            success(shape, &text, input_tokens, output_tokens, cut)
        }
        Reply::Hang { millis } => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            success(shape, "late", 1, 1, false)
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
            Box::pin(answer(script, shape, *then)).await
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

/// 200 with the answer; `cut`: it stopped at `max_tokens`, said the provider's way.
fn success(shape: Shape, text: &str, input_tokens: u64, output_tokens: u64, cut: bool) -> Response {
    match shape {
        Shape::Anthropic => {
            let mut headers = HeaderMap::new();
            headers.insert("anthropic-ratelimit-requests-remaining", HeaderValue::from_static("49"));
            headers.insert("anthropic-ratelimit-tokens-remaining", HeaderValue::from_static("39000"));
            let body = serde_json::json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
                "content": [{ "type": "text", "text": text }],
                "stop_reason": if cut { "max_tokens" } else { "end_turn" },
                "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
            });
            (headers, Json(body)).into_response()
        }
        Shape::OpenAi => Json(serde_json::json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": if cut { "length" } else { "stop" } }],
            "usage": { "prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens },
        }))
        .into_response(),
    }
}

async fn anthropic(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    let _answering = Answering::start(&script);
    let (reply, remaining) = next_reply(&script, body);
    with_remaining(answer(&script, Shape::Anthropic, reply).await, remaining)
}

async fn openai(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    let _answering = Answering::start(&script);
    let (reply, remaining) = next_reply(&script, body);
    with_remaining(answer(&script, Shape::OpenAi, reply).await, remaining)
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
