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
//! continuously; a request whose prompt (counted as [`sluice_types::capacity::tokens_in_chars`])
//! does not fit gets 429 with `Retry-After` and the tokens left, and uses nothing.

pub mod receiver;
#[cfg(feature = "s3")]
pub mod s3;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
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
    /// Wait this long before answering 200 (to exceed a client's timeout).
    Hang { millis: u64 },
    /// 429 with this exact `Retry-After` value (hostile ones: huge numbers, far dates).
    RateLimitedRaw { retry_after: String },
    /// 200 whose body never ends (spaces, as fast as the client reads).
    EndlessBody,
    /// 401 whose message quotes part of the key, as OpenAI's does.
    Unauthorized,
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    calls: u64,
    last_request: Option<serde_json::Value>,
    limit: Option<TokenBucket>,
    /// Requests refused by the limit.
    refused_by_limit: u64,
    /// When each request within the limit came, and its input tokens.
    accepted: Vec<(Instant, u64)>,
}

/// An input-token bucket: holds at most `capacity`, refills at `per_sec`.
struct TokenBucket {
    per_sec: f64,
    capacity: f64,
    level: f64,
    at: Instant,
}

impl TokenBucket {
    fn take(&mut self, tokens: u64) -> Result<f64, Duration> {
        let now = Instant::now();
        self.level = (self.level + self.per_sec * (now - self.at).as_secs_f64()).min(self.capacity);
        self.at = now;
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

/// The input tokens of a request, counted from its messages' text.
fn input_tokens_of(body: &serde_json::Value) -> u64 {
    let chars: usize = body["messages"]
        .as_array()
        .map(|messages| messages.iter().filter_map(|m| m["content"].as_str()).map(|c| c.chars().count()).sum())
        .unwrap_or(0);
    sluice_types::capacity::tokens_in_chars(chars as u64)
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

    pub fn calls(&self) -> u64 {
        self.script.lock().unwrap().calls
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
    let tokens = input_tokens_of(&body);
    s.last_request = Some(body);
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
    let counted = if s.limit.is_some() { tokens } else { 120 };
    let reply = s.replies.pop_front().unwrap_or(Reply::Success {
        text: "## Summary\nA scripted answer from the fake provider.".into(),
        input_tokens: counted,
        output_tokens: 30,
    });
    (reply, remaining)
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

async fn answer(shape: Shape, reply: Reply) -> Response {
    match reply {
        Reply::Success { text, input_tokens, output_tokens } => success(shape, &text, input_tokens, output_tokens),
        Reply::Hang { millis } => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            success(shape, "late", 1, 1)
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
    }
}

fn with_retry_after(mut response: Response, value: String) -> Response {
    response.headers_mut().insert("retry-after", HeaderValue::from_str(&value).unwrap());
    response
}

fn success(shape: Shape, text: &str, input_tokens: u64, output_tokens: u64) -> Response {
    match shape {
        Shape::Anthropic => {
            let mut headers = HeaderMap::new();
            headers.insert("anthropic-ratelimit-requests-remaining", HeaderValue::from_static("49"));
            headers.insert("anthropic-ratelimit-tokens-remaining", HeaderValue::from_static("39000"));
            let body = serde_json::json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
                "content": [{ "type": "text", "text": text }],
                "stop_reason": "end_turn",
                "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
            });
            (headers, Json(body)).into_response()
        }
        Shape::OpenAi => Json(serde_json::json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": "stop" }],
            "usage": { "prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens },
        }))
        .into_response(),
    }
}

async fn anthropic(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    let (reply, remaining) = next_reply(&script, body);
    with_remaining(answer(Shape::Anthropic, reply).await, remaining)
}

async fn openai(State(script): State<Shared>, Json(body): Json<serde_json::Value>) -> Response {
    let (reply, remaining) = next_reply(&script, body);
    with_remaining(answer(Shape::OpenAi, reply).await, remaining)
}

async fn set_script(State(script): State<Shared>, Json(replies): Json<Vec<Reply>>) -> StatusCode {
    script.lock().unwrap().replies.extend(replies);
    StatusCode::NO_CONTENT
}

async fn calls(State(script): State<Shared>) -> Json<serde_json::Value> {
    let s = script.lock().unwrap();
    Json(serde_json::json!({ "calls": s.calls, "queued": s.replies.len() }))
}
