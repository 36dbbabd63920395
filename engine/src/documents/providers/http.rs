//! The HTTP providers: Anthropic's Messages API and OpenAI-compatible chat completions.

use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::vendor::{self, Stop};
use super::{prompt, prompt_parts, sse, Preset, Provider, ProviderConfig, ProviderKind, ProviderOutput, Task};
use crate::queue::capacity::RateRemaining;
use crate::queue::policy::retry::{parse_retry_after, ErrorClass};
use crate::queue::JobError;

/// Pure: what an HTTP failure means for retrying. A prompt longer than the provider's context
/// is `TooLong` (split and redone, never the job's failure); a spent quota or spend limit is
/// `QuotaExhausted` (processing waits; nobody fails); a content-policy 400 is the document's;
/// 429 is transient; 529 is overload; other 5xx are server errors; other 4xx (400, 401, 403,
/// 404, ...) are permanent. The wait before trying again comes from `Retry-After` (seconds or
/// HTTP-date), else from the rate limits' reset headers ([`vendor::reset_wait`]).
pub fn classify_http_failure(status: u16, body: &str, headers: &HeaderMap, now: SystemTime) -> JobError {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect());
    if let Some(too_long) = vendor::prompt_too_long(status, body) {
        let mut error = JobError::new(ErrorClass::TooLong, "the provider counted the prompt past its context")
            .with_status(status)
            .with_detail(&message);
        error.provider_counted_tokens = too_long.counted;
        return error;
    }
    let lower = body.to_lowercase();
    // OpenAI `insufficient_quota` (429) and `billing_hard_limit_reached`; Anthropic's spend
    // limit (429) and "credit balance is too low" (400).
    let quota = [
        "spend limit",
        "usage limit",
        "insufficient_quota",
        "billing_hard_limit",
        "credit balance is too low",
        "exceeded your current quota",
    ]
    .iter()
    .any(|needle| lower.contains(needle));
    // A 402 (Payment Required) says the same whatever its words (OpenRouter: "Insufficient
    // credits").
    if status == 402 || (quota && matches!(status, 400 | 403 | 429)) {
        return JobError::new(ErrorClass::QuotaExhausted, "the provider's quota or spend limit is reached")
            .with_status(status)
            .with_detail(&message);
    }
    // A content-policy refusal is about the document (Anthropic: "Output blocked by content
    // filtering policy"; OpenAI: `content_policy_violation`; Azure: `content_filter`,
    // `ResponsibleAIPolicyViolation`): settled as a declined answer, its answered parts kept.
    let content_policy = status == 400
        && ["content_filter", "content filter", "content_policy", "content policy", "responsibleaipolicyviolation"]
            .iter()
            .any(|needle| lower.contains(needle));
    if content_policy {
        return declined().with_status(status).with_detail(&message);
    }
    let class = match status {
        429 => ErrorClass::RateLimited,
        529 => ErrorClass::Overloaded,
        500..=599 => ErrorClass::ServerError,
        _ => ErrorClass::Rejected,
    };
    // Users read our words; the provider's own text (which may quote a key) goes, masked,
    // only to the attempt row for admins.
    let text = match class {
        ErrorClass::Rejected => format!("the provider refused the request ({status})"),
        ErrorClass::RateLimited => "the provider is rate limiting us".to_string(),
        ErrorClass::Overloaded => "the provider is overloaded".to_string(),
        _ => format!("the provider had an error ({status})"),
    };
    let mut error = JobError::new(class, text).with_status(status).with_detail(&message);
    let retry_after = headers.get("retry-after").and_then(|v| v.to_str().ok());
    let wait = retry_after.and_then(|v| parse_retry_after(v, now)).or_else(|| vendor::reset_wait(headers, now));
    if let Some(wait) = wait {
        error = error.with_retry_after(wait);
    }
    error
}

/// Pure: what the rate-limit headers say is left. Anthropic sends
/// `anthropic-ratelimit-{requests,input-tokens,output-tokens}-remaining`; OpenAI-compatible
/// servers `x-ratelimit-remaining-{requests,tokens}` (their tokens count input first).
/// Anything unreadable is ignored: a header is a hint, never a reason to fail.
pub fn remaining_from_headers(headers: &HeaderMap) -> RateRemaining {
    let number = |name: &str| {
        headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<i64>().ok()).filter(|n| *n >= 0)
    };
    RateRemaining {
        requests: number("anthropic-ratelimit-requests-remaining").or_else(|| number("x-ratelimit-remaining-requests")),
        input_tokens: number("anthropic-ratelimit-input-tokens-remaining")
            .or_else(|| number("x-ratelimit-remaining-tokens")),
        output_tokens: number("anthropic-ratelimit-output-tokens-remaining"),
    }
}

pub(super) fn transport_failure(e: &reqwest::Error) -> JobError {
    if e.is_timeout() {
        JobError::new(ErrorClass::Timeout, "the provider did not answer in time")
    } else {
        JobError::new(ErrorClass::Connection, "could not reach the provider")
    }
}

/// The client; each request sets its own timeout (growing with its tokens), and this one
/// bounds whatever does not.
fn client(timeout: Duration) -> reqwest::Client {
    // No retries here: the engine retries.
    reqwest::Client::builder().timeout(timeout).build().expect("an HTTP client")
}

/// The most of a provider's answer we read: an answer is Markdown for one document; a body
/// that goes on past this is broken or hostile.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// Read the body up to [`MAX_ANSWER_BYTES`] (the client's timeout bounds the time, and a body
/// that sends nothing for `stall` is given up).
pub(super) async fn read_body(
    mut response: reqwest::Response,
    status: u16,
    stall: Duration,
) -> Result<String, JobError> {
    let mut body = Vec::new();
    loop {
        let chunk = tokio::time::timeout(stall, response.chunk())
            .await
            .map_err(|_| JobError::new(ErrorClass::Timeout, "the provider stopped sending its answer"))?;
        let Some(chunk) = chunk.map_err(|e| transport_failure(&e))? else { break };
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(
                JobError::new(ErrorClass::ServerError, "the provider's answer was too large").with_status(status)
            );
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The model declined to answer (a refusal or a content filter): what came is not the answer,
/// and asking again would not change it. The document's failure, not ours: invalid input (it
/// keeps the share of its calls answered, `sluice_types::settlement::Fault::Document`).
fn declined() -> JobError {
    JobError::new(ErrorClass::InvalidInput, "the provider declined to answer this document")
}

fn or_default(value: &str, default: &str) -> String {
    if value.is_empty() { default } else { value.trim_end_matches('/') }.to_string()
}

/// Which API a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    /// Anthropic's Messages API.
    Messages,
    /// OpenAI-compatible chat completions (OpenAI, Ollama, vLLM, llama.cpp).
    ChatCompletions,
}

/// A hosted model behind Anthropic's Messages API or an OpenAI-compatible chat completions API.
pub struct HttpProvider {
    pub(super) api: Api,
    /// The API's base (Anthropic's without `/v1`; an OpenAI-compatible one ending in `/v1`).
    pub(super) base: String,
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: String,
    max_tokens: u32,
    reasoning: bool,
    config: ProviderConfig,
}

impl HttpProvider {
    /// A client for the configured API, base URL, key and model.
    pub fn new(config: &ProviderConfig) -> Self {
        let (api, base, model) = match config.kind {
            ProviderKind::Anthropic => (
                Api::Messages,
                or_default(&config.base_url, "https://api.anthropic.com"),
                or_default(&config.model, "claude-sonnet-4-5"),
            ),
            _ => (
                Api::ChatCompletions,
                or_default(&config.base_url, "https://api.openai.com/v1"),
                or_default(&config.model, "gpt-4o-mini"),
            ),
        };
        let url = match api {
            Api::Messages => format!("{base}/v1/messages"),
            Api::ChatCompletions => format!("{base}/chat/completions"),
        };
        HttpProvider {
            api,
            base,
            client: client(config.timeout),
            url,
            api_key: config.api_key.clone(),
            reasoning: vendor::is_reasoning_model(config.kind, &model),
            model,
            max_tokens: config.max_tokens,
            config: config.clone(),
        }
    }

    /// The request's body: the prompt (Anthropic: its instruction marked as a cacheable prefix),
    /// the answer's size asked for (a reasoning model's `max_completion_tokens`), and streaming.
    fn body(&self, task: &Task, asked: u32) -> Value {
        let stream = self.config.stream;
        match self.api {
            Api::Messages => {
                let (instruction, rest) = prompt_parts(task);
                serde_json::json!({
                    "model": self.model,
                    "max_tokens": asked,
                    "stream": stream,
                    "messages": [{ "role": "user", "content": [
                        { "type": "text", "text": instruction, "cache_control": { "type": "ephemeral" } },
                        { "type": "text", "text": rest },
                    ] }],
                })
            }
            Api::ChatCompletions => {
                let mut body = serde_json::json!({
                    "model": self.model,
                    "messages": [{ "role": "user", "content": prompt(task) }],
                    "stream": stream,
                });
                let field = if self.reasoning { "max_completion_tokens" } else { "max_tokens" };
                body[field] = Value::from(asked);
                if stream {
                    body["stream_options"] = serde_json::json!({ "include_usage": true });
                }
                body
            }
        }
    }

    /// The answer's size a task asks for: its own, within the model's maximum.
    pub(super) fn asked(&self, task: &Task) -> u32 {
        task.answer_tokens.unwrap_or(self.max_tokens).clamp(1, self.max_tokens.max(1))
    }

    /// A request to the API with its key (Anthropic's header, or a bearer token).
    pub(super) fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (self.api, &self.api_key) {
            (Api::Messages, key) => request
                .header("x-api-key", key.as_deref().unwrap_or_default())
                .header("anthropic-version", "2023-06-01"),
            (Api::ChatCompletions, Some(key)) => request.bearer_auth(key),
            (Api::ChatCompletions, None) => request,
        }
    }

    pub(super) fn http(&self) -> &reqwest::Client {
        &self.client
    }

    /// A task's request as a batch carries it: the same body, never streamed.
    pub(super) fn batch_body(&self, task: &Task) -> Value {
        let mut body = self.body(task, self.asked(task));
        body["stream"] = Value::Bool(false);
        if let Some(object) = body.as_object_mut() {
            object.remove("stream_options");
        }
        body
    }

    /// A whole answer's body (a batch's result) checked as an interactive answer is: cut,
    /// refused, empty or ended for an unknown reason is never a success.
    pub(super) fn answer_of(&self, json: &Value, asked: u32) -> Result<ProviderOutput, JobError> {
        let answer = match self.api {
            Api::Messages => Answer::from_message(json),
            Api::ChatCompletions => Answer::from_completion(json),
        };
        answer.into_output(self.api, &HeaderMap::new(), asked)
    }

    async fn call(&self, task: &Task) -> Result<ProviderOutput, JobError> {
        let asked = self.asked(task);
        let request = self.authorized(
            self.client.post(&self.url).timeout(self.config.task_timeout(task)).json(&self.body(task, asked)),
        );
        let response = request.send().await.map_err(|e| transport_failure(&e))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        if !(200..300).contains(&status) {
            let body = read_body(response, status, self.config.stall_timeout).await?;
            return Err(classify_http_failure(status, &body, &headers, SystemTime::now()));
        }
        let streamed = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let answer = if streamed {
            self.read_stream(response, task).await?
        } else {
            let body = read_body(response, status, self.config.stall_timeout).await?;
            let json: Value = serde_json::from_str(&body).map_err(|_| unreadable_answer(status))?;
            match self.api {
                Api::Messages => Answer::from_message(&json),
                Api::ChatCompletions => Answer::from_completion(&json),
            }
        };
        answer.into_output(self.api, &headers, asked)
    }

    /// The answer as it streams: text accumulated as it comes, the usage and stop reason from
    /// the final events; nothing new for the stall timeout gives the call up.
    async fn read_stream(&self, mut response: reqwest::Response, task: &Task) -> Result<Answer, JobError> {
        let mut reader = sse::EventReader::default();
        let mut answer = Answer::default();
        let mut bytes = 0usize;
        let mut told = 0u64;
        loop {
            // A reasoning model may send nothing while it reasons: until its first words, only
            // the call's own ceiling bounds it.
            let stall = if self.reasoning && answer.text.is_empty() {
                self.config.task_timeout(task)
            } else {
                self.config.stall_timeout
            };
            let chunk = tokio::time::timeout(stall, response.chunk()).await.map_err(|_| {
                answer.billed(JobError::new(
                    ErrorClass::Timeout,
                    format!("the provider wrote nothing for {} s, and the call was given up", stall.as_secs()),
                ))
            })?;
            let Some(chunk) = chunk.map_err(|e| answer.billed(transport_failure(&e)))? else { break };
            // The events' framing is many times their text (a token's event is some 250
            // bytes): the wire is bounded apart from the answer.
            bytes += chunk.len();
            if bytes > MAX_STREAM_BYTES {
                return Err(answer.billed(too_large()));
            }
            let events = reader.feed(&chunk).map_err(|_| answer.billed(unreadable_answer(200)))?;
            for event in events {
                let read = match self.api {
                    Api::Messages => answer.read_message_event(&event),
                    Api::ChatCompletions => answer.read_completion_event(&event),
                };
                read.map_err(|e| answer.billed(e))?;
            }
            if let Some(on_written) = &task.on_written {
                let written = answer.written_estimate();
                if written != told {
                    told = written;
                    (on_written.0)(written);
                }
            }
            if answer.ended {
                break;
            }
        }
        if !answer.ended {
            return Err(
                answer.billed(JobError::new(ErrorClass::Connection, "the provider's answer broke off before its end"))
            );
        }
        Ok(answer)
    }
}

/// The most bytes of a stream read for one answer (its framing included).
pub const MAX_STREAM_BYTES: usize = 64 << 20;

/// A streamed answer past its bounds: broken or hostile, tried once more, never kept.
fn too_large() -> JobError {
    JobError::new(ErrorClass::Unfinished, "the provider's answer was too large")
}

fn unreadable_answer(status: u16) -> JobError {
    JobError::new(ErrorClass::ServerError, "the provider sent an answer we could not read").with_status(status)
}

/// An answer as read from either API, whole or streamed.
#[derive(Debug, Default)]
struct Answer {
    text: String,
    /// The vendor's stop reason, as sent.
    stop_reason: Option<String>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    cached_input_tokens: Option<i64>,
    reasoning_tokens: Option<i64>,
    model: Value,
    /// The stream's last event came (`message_stop`, `[DONE]`).
    ended: bool,
    /// OpenAI's `refusal` came instead of content (its finish reason still says `stop`).
    refused: bool,
}

/// A number in `json` at `pointer`, when it is one.
fn int(json: &Value, pointer: &str) -> Option<i64> {
    json.pointer(pointer).and_then(Value::as_i64).filter(|n| *n >= 0)
}

impl Answer {
    /// Anthropic's usage: `input_tokens` leaves out the tokens written to and read from the
    /// cache, which are input all the same.
    fn read_anthropic_usage(&mut self, usage: &Value) {
        let (fresh, written, read) = (
            int(usage, "/input_tokens"),
            int(usage, "/cache_creation_input_tokens"),
            int(usage, "/cache_read_input_tokens"),
        );
        if fresh.is_some() || written.is_some() || read.is_some() {
            let total = [fresh, written, read].iter().flatten().fold(0i64, |a, b| a.saturating_add(*b));
            self.input_tokens = Some(total);
            self.cached_input_tokens = read.or(self.cached_input_tokens);
        }
        if let Some(out) = int(usage, "/output_tokens") {
            self.output_tokens = Some(out);
        }
    }

    /// OpenAI's usage: `prompt_tokens` counts the cached ones, `completion_tokens` the reasoning.
    fn read_openai_usage(&mut self, usage: &Value) {
        self.input_tokens = int(usage, "/prompt_tokens").or(self.input_tokens);
        self.output_tokens = int(usage, "/completion_tokens").or(self.output_tokens);
        self.cached_input_tokens = int(usage, "/prompt_tokens_details/cached_tokens").or(self.cached_input_tokens);
        self.reasoning_tokens = int(usage, "/completion_tokens_details/reasoning_tokens").or(self.reasoning_tokens);
    }

    fn from_message(json: &Value) -> Answer {
        let mut answer = Answer {
            text: json["content"]
                .as_array()
                .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"))
                .unwrap_or_default(),
            stop_reason: json["stop_reason"].as_str().map(str::to_string),
            model: json["model"].clone(),
            ended: true,
            ..Answer::default()
        };
        answer.read_anthropic_usage(&json["usage"]);
        answer
    }

    fn from_completion(json: &Value) -> Answer {
        let mut answer = Answer {
            text: json.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or_default().to_string(),
            stop_reason: json.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_string),
            model: json["model"].clone(),
            ended: true,
            refused: json
                .pointer("/choices/0/message/refusal")
                .and_then(Value::as_str)
                .is_some_and(|r| !r.trim().is_empty()),
            ..Answer::default()
        };
        answer.read_openai_usage(&json["usage"]);
        answer
    }

    /// One event of Anthropic's stream: `message_start` (input usage), `content_block_start`
    /// and `content_block_delta` (text), `message_delta` (stop reason, output usage),
    /// `message_stop`, and `error` (an overload or a limit met mid-answer).
    fn read_message_event(&mut self, event: &sse::Event) -> Result<(), JobError> {
        let Ok(json) = serde_json::from_str::<Value>(&event.data) else {
            return if event.name == "ping" || event.data.is_empty() { Ok(()) } else { Err(unreadable_answer(200)) };
        };
        match json["type"].as_str().unwrap_or(event.name.as_str()) {
            "message_start" => {
                self.model = json.pointer("/message/model").cloned().unwrap_or(Value::Null);
                self.read_anthropic_usage(&json["message"]["usage"]);
            }
            "content_block_start" => {
                if let Some(text) = json.pointer("/content_block/text").and_then(Value::as_str) {
                    self.push_text(text)?;
                }
            }
            "content_block_delta" if json.pointer("/delta/type").and_then(Value::as_str) == Some("text_delta") => {
                self.push_text(json.pointer("/delta/text").and_then(Value::as_str).unwrap_or_default())?;
            }
            "message_delta" => {
                if let Some(reason) = json.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                self.read_anthropic_usage(&json["usage"]);
            }
            "message_stop" => self.ended = true,
            "error" => return Err(stream_error(&json)),
            _ => {}
        }
        Ok(())
    }

    /// One chunk of an OpenAI-compatible stream: `choices[0].delta.content` (text),
    /// `finish_reason`, `usage` (in the last chunk, asked for with `include_usage`), `[DONE]`.
    fn read_completion_event(&mut self, event: &sse::Event) -> Result<(), JobError> {
        if event.data.trim() == "[DONE]" {
            self.ended = true;
            return Ok(());
        }
        let json: Value = serde_json::from_str(&event.data).map_err(|_| unreadable_answer(200))?;
        if json.get("error").is_some_and(|e| !e.is_null()) {
            return Err(stream_error(&json));
        }
        if let Some(text) = json.pointer("/choices/0/delta/content").and_then(Value::as_str) {
            self.push_text(text)?;
        }
        if json.pointer("/choices/0/delta/refusal").and_then(Value::as_str).is_some_and(|r| !r.trim().is_empty()) {
            self.refused = true;
        }
        if let Some(reason) = json.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
            self.stop_reason = Some(reason.to_string());
        }
        if json["usage"].is_object() {
            self.read_openai_usage(&json["usage"]);
        }
        if self.model.is_null() {
            self.model = json["model"].clone();
        }
        Ok(())
    }

    fn push_text(&mut self, text: &str) -> Result<(), JobError> {
        if self.text.len() + text.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        self.text.push_str(text);
        Ok(())
    }

    /// About how many tokens are written so far (four characters a token: for display).
    fn written_estimate(&self) -> u64 {
        (self.text.len() as u64).div_ceil(4)
    }

    /// `error` for an answer the provider gave, or began, and Sluice did not keep: it was
    /// billed all the same, so it carries what the provider said it used (else what was seen
    /// of its answer; a prompt it did not count is 0, for the caller to put its own count).
    fn billed(&self, error: JobError) -> JobError {
        if self.input_tokens.is_none() && self.output_tokens.is_none() && self.text.is_empty() {
            // Nothing came: nothing known to be billed.
            return error;
        }
        let written = self.written_estimate().min(i64::MAX as u64) as i64;
        error.with_usage_added(self.input_tokens.unwrap_or(0), self.output_tokens.unwrap_or(written))
    }

    /// What the answer is worth: only a known complete stop reason with some text is a whole
    /// answer; a cut one is marked cut; a refusal is the document's; anything else (an unknown
    /// reason, none, an empty text) is unfinished, never a success.
    fn into_output(self, api: Api, headers: &HeaderMap, asked: u32) -> Result<ProviderOutput, JobError> {
        let stop = match api {
            Api::Messages => vendor::anthropic_stop(self.stop_reason.as_deref()),
            Api::ChatCompletions => vendor::openai_stop(self.stop_reason.as_deref()),
        };
        let cut = match stop {
            _ if self.refused => return Err(self.billed(declined())),
            Stop::Declined => return Err(self.billed(declined())),
            Stop::Unknown(reason) => {
                return Err(self.billed(JobError::new(
                    ErrorClass::Unfinished,
                    format!("the provider's answer ended for a reason Sluice does not take as finished ({reason}), so it was not kept"),
                )))
            }
            Stop::Cut => true,
            Stop::Whole if vendor::is_empty_answer(&self.text) => {
                return Err(self.billed(JobError::new(
                    ErrorClass::Unfinished,
                    "the provider's answer was empty, so it was not kept",
                )))
            }
            Stop::Whole => false,
        };
        let (provider, limits) = match api {
            Api::Messages => {
                let limits: serde_json::Map<String, Value> = headers
                    .iter()
                    .filter(|(name, _)| name.as_str().starts_with("anthropic-ratelimit-"))
                    .filter_map(|(name, value)| Some((name.to_string(), Value::from(value.to_str().ok()?))))
                    .collect();
                ("anthropic", Value::Object(limits))
            }
            Api::ChatCompletions => ("openai", Value::Null),
        };
        let mut data = serde_json::json!({ "provider": provider, "model": self.model });
        if !limits.is_null() {
            data["rate_limits"] = limits;
        }
        if let Some(reasoning) = self.reasoning_tokens {
            data["reasoning_tokens"] = Value::from(reasoning);
        }
        if let Some(cached) = self.cached_input_tokens {
            data["cached_input_tokens"] = Value::from(cached);
        }
        Ok(ProviderOutput {
            text: self.text,
            data,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            remaining: remaining_from_headers(headers),
            cut,
            cached_input_tokens: self.cached_input_tokens,
            reasoning_tokens: self.reasoning_tokens,
            asked_tokens: Some(i64::from(asked)),
            ..Default::default()
        })
    }
}

/// An error event inside a stream (a 200 whose answer then fails): Anthropic's
/// `overloaded_error`, `rate_limit_error`, `api_error`; OpenAI's `error` object.
fn stream_error(json: &Value) -> JobError {
    let kind =
        json.pointer("/error/type").or_else(|| json.pointer("/error/code")).and_then(Value::as_str).unwrap_or("");
    let message = json.pointer("/error/message").and_then(Value::as_str).unwrap_or(kind);
    let error = match kind {
        "overloaded_error" => JobError::new(ErrorClass::Overloaded, "the provider is overloaded"),
        "rate_limit_error" | "rate_limit_exceeded" => {
            JobError::new(ErrorClass::RateLimited, "the provider is rate limiting us")
        }
        "insufficient_quota" => {
            JobError::new(ErrorClass::QuotaExhausted, "the provider's quota or spend limit is reached")
        }
        _ => JobError::new(ErrorClass::ServerError, "the provider had an error while answering"),
    };
    error.with_detail(message)
}

impl Provider for HttpProvider {
    fn name(&self) -> &'static str {
        match self.api {
            Api::Messages => "anthropic",
            Api::ChatCompletions => "openai",
        }
    }

    fn supports(&self, _preset: Preset) -> bool {
        true
    }

    fn max_output_tokens(&self) -> Option<u64> {
        Some(u64::from(self.max_tokens))
    }

    fn reasons(&self) -> bool {
        self.reasoning
    }

    fn batch_api(&self, deployment: Option<&str>) -> Option<(String, &HttpProvider)> {
        deployment.is_none_or(str::is_empty).then(|| (String::new(), self))
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<ProviderOutput, JobError>> {
        Box::pin(self.call(task))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_failures_are_classified_as_the_design_says() {
        let now = SystemTime::now();
        let none = HeaderMap::new();
        let c = |status, body: &str| classify_http_failure(status, body, &none, now).class;
        assert_eq!(c(429, r#"{"error":{"message":"slow down"}}"#), ErrorClass::RateLimited);
        assert_eq!(c(429, r#"{"error":{"message":"You have reached your spend limit"}}"#), ErrorClass::QuotaExhausted);
        assert_eq!(c(429, r#"{"error":{"code":"insufficient_quota"}}"#), ErrorClass::QuotaExhausted);
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#
            ),
            ErrorClass::QuotaExhausted
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 201000 tokens > 200000 maximum"}}"#
            ),
            ErrorClass::TooLong
        );
        assert_eq!(c(529, "{}"), ErrorClass::Overloaded);
        assert_eq!(c(500, "oops"), ErrorClass::ServerError);
        assert_eq!(c(503, ""), ErrorClass::ServerError);
        for status in [400, 401, 403, 404] {
            assert_eq!(c(status, "{}"), ErrorClass::Rejected, "{status}");
        }
        // Content-policy refusals as the vendors send them are the document's: declined.
        for body in [
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"}}"#,
            r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","code":"content_policy_violation"}}"#,
            r#"{"error":{"code":"content_filter","message":"The response was filtered","innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#,
        ] {
            assert_eq!(c(400, body), ErrorClass::InvalidInput, "{body}");
        }
        assert_eq!(
            c(403, r#"{"error":{"message":"content policy"}}"#),
            ErrorClass::Rejected,
            "only a 400 is the document's"
        );
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "7".parse().unwrap());
        let e = classify_http_failure(429, "{}", &headers, now);
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(e.provider_status, Some(429));
        // Without `retry-after`, the spent limit's reset header says how long.
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining-tokens", "0".parse().unwrap());
        headers.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
        let e = classify_http_failure(429, r#"{"error":{"code":"rate_limit_exceeded"}}"#, &headers, now);
        assert_eq!((e.class, e.retry_after), (ErrorClass::RateLimited, Some(Duration::from_secs(360))));
    }

    #[test]
    fn remaining_limits_are_read_from_either_family_of_headers_and_garbage_is_ignored() {
        let mut h = HeaderMap::new();
        h.insert("anthropic-ratelimit-input-tokens-remaining", "1200".parse().unwrap());
        h.insert("anthropic-ratelimit-requests-remaining", " 7 ".parse().unwrap());
        h.insert("anthropic-ratelimit-output-tokens-remaining", "-5".parse().unwrap());
        let r = remaining_from_headers(&h);
        assert_eq!((r.requests, r.input_tokens, r.output_tokens), (Some(7), Some(1200), None));
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining-tokens", "99999999999999999999999".parse().unwrap());
        h.insert("x-ratelimit-remaining-requests", "3".parse().unwrap());
        let r = remaining_from_headers(&h);
        assert_eq!((r.requests, r.input_tokens), (Some(3), None));
    }
}
