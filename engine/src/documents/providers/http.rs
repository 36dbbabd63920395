//! The HTTP providers: Anthropic's Messages API and OpenAI-compatible chat completions.

use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::{prompt, Preset, Provider, ProviderConfig, ProviderOutput, Task};
use crate::queue::capacity::RateRemaining;
use crate::queue::policy::retry::{parse_retry_after, ErrorClass};
use crate::queue::JobError;

/// Pure: what an HTTP failure means for retrying. 429 is transient unless it says a spend
/// limit or quota is exhausted; 529 is overload; other 5xx are server errors; other 4xx
/// (400, 401, 403, 404, ...) are permanent. `Retry-After` (seconds or HTTP-date) is kept.
pub fn classify_http_failure(status: u16, body: &str, retry_after: Option<&str>, now: SystemTime) -> JobError {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect());
    let lower = body.to_lowercase();
    let spend_limit = lower.contains("spend limit")
        || lower.contains("usage limit")
        || lower.contains("insufficient_quota")
        || lower.contains("credit balance is too low");
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
        429 if spend_limit => ErrorClass::Rejected,
        429 => ErrorClass::RateLimited,
        529 => ErrorClass::Overloaded,
        500..=599 => ErrorClass::ServerError,
        _ => ErrorClass::Rejected,
    };
    // Users read our words; the provider's own text (which may quote a key) goes, masked,
    // only to the attempt row for admins.
    let text = match class {
        ErrorClass::Rejected if spend_limit => "the provider's spend limit is reached".to_string(),
        ErrorClass::Rejected => format!("the provider refused the request ({status})"),
        ErrorClass::RateLimited => "the provider is rate limiting us".to_string(),
        ErrorClass::Overloaded => "the provider is overloaded".to_string(),
        _ => format!("the provider had an error ({status})"),
    };
    let mut error = JobError::new(class, text).with_status(status).with_detail(&message);
    if let Some(wait) = retry_after.and_then(|v| parse_retry_after(v, now)) {
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

fn transport_failure(e: &reqwest::Error) -> JobError {
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

/// Read the body up to [`MAX_ANSWER_BYTES`] (the client's timeout bounds the time).
async fn read_body(mut response: reqwest::Response, status: u16) -> Result<String, JobError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_failure(&e))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(
                JobError::new(ErrorClass::ServerError, "the provider's answer was too large").with_status(status)
            );
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

async fn post(request: reqwest::RequestBuilder) -> Result<(HeaderMap, Value), JobError> {
    let response = request.send().await.map_err(|e| transport_failure(&e))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = read_body(response, status).await?;
    if !(200..300).contains(&status) {
        let retry_after = headers.get("retry-after").and_then(|v| v.to_str().ok());
        return Err(classify_http_failure(status, &body, retry_after, SystemTime::now()));
    }
    let json = serde_json::from_str(&body).map_err(|_| {
        JobError::new(ErrorClass::ServerError, "the provider sent an answer we could not read").with_status(status)
    })?;
    Ok((headers, json))
}

/// The model declined to answer (a refusal or a content filter): what came is not the answer,
/// and asking again would not change it. The document's failure, not ours: invalid input (it
/// keeps the share of its calls answered, `sluice_types::settlement::Fault::Document`).
fn declined() -> JobError {
    JobError::new(ErrorClass::InvalidInput, "the provider declined to answer this document")
}

/// The request body both APIs share: one user message with the task's prompt.
fn chat_body(model: &str, max_tokens: u32, task: &Task) -> Value {
    serde_json::json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{ "role": "user", "content": prompt(task) }],
    })
}

fn or_default(value: &str, default: &str) -> String {
    if value.is_empty() { default } else { value.trim_end_matches('/') }.to_string()
}

/// Anthropic's Messages API.
pub struct AnthropicProvider {
    client: reqwest::Client,
    url: String,
    api_key: String,
    model: String,
    max_tokens: u32,
    config: ProviderConfig,
}

impl AnthropicProvider {
    /// A client for the configured base URL, key and model.
    pub fn new(config: &ProviderConfig) -> Self {
        AnthropicProvider {
            client: client(config.timeout),
            url: format!("{}/v1/messages", or_default(&config.base_url, "https://api.anthropic.com")),
            api_key: config.api_key.clone().unwrap_or_default(),
            model: or_default(&config.model, "claude-sonnet-4-5"),
            max_tokens: config.max_tokens,
            config: config.clone(),
        }
    }
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn supports(&self, _preset: Preset) -> bool {
        true
    }

    fn max_output_tokens(&self) -> Option<u64> {
        Some(u64::from(self.max_tokens))
    }

    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<ProviderOutput, JobError>> {
        Box::pin(async move {
            let body = chat_body(&self.model, self.max_tokens, task);
            let request = self
                .client
                .post(&self.url)
                .header("x-api-key", &self.api_key)
                .header("anthropic-version", "2023-06-01")
                .timeout(self.config.task_timeout(task))
                .json(&body);
            let (headers, json) = post(request).await?;
            if json["stop_reason"].as_str() == Some("refusal") {
                return Err(declined());
            }
            let text = json["content"]
                .as_array()
                .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"))
                .unwrap_or_default();
            let limits: serde_json::Map<String, Value> = headers
                .iter()
                .filter(|(name, _)| name.as_str().starts_with("anthropic-ratelimit-"))
                .filter_map(|(name, value)| Some((name.to_string(), Value::from(value.to_str().ok()?))))
                .collect();
            Ok(ProviderOutput {
                text,
                data: serde_json::json!({ "provider": "anthropic", "model": json["model"], "rate_limits": limits }),
                input_tokens: json.pointer("/usage/input_tokens").and_then(Value::as_i64),
                output_tokens: json.pointer("/usage/output_tokens").and_then(Value::as_i64),
                remaining: remaining_from_headers(&headers),
                cut: json["stop_reason"].as_str() == Some("max_tokens"),
            })
        })
    }
}

/// An OpenAI-compatible chat completions API (OpenAI, Ollama, vLLM, llama.cpp).
pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: String,
    max_tokens: u32,
    config: ProviderConfig,
}

impl OpenAiProvider {
    /// A client for the configured base URL, key and model.
    pub fn new(config: &ProviderConfig) -> Self {
        OpenAiProvider {
            client: client(config.timeout),
            url: format!("{}/chat/completions", or_default(&config.base_url, "https://api.openai.com/v1")),
            api_key: config.api_key.clone(),
            model: or_default(&config.model, "gpt-4o-mini"),
            max_tokens: config.max_tokens,
            config: config.clone(),
        }
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn supports(&self, _preset: Preset) -> bool {
        true
    }

    fn max_output_tokens(&self) -> Option<u64> {
        Some(u64::from(self.max_tokens))
    }

    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<ProviderOutput, JobError>> {
        Box::pin(async move {
            let body = chat_body(&self.model, self.max_tokens, task);
            let mut request = self.client.post(&self.url).timeout(self.config.task_timeout(task)).json(&body);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let (headers, json) = post(request).await?;
            if json.pointer("/choices/0/finish_reason").and_then(Value::as_str) == Some("content_filter") {
                return Err(declined());
            }
            Ok(ProviderOutput {
                text: json
                    .pointer("/choices/0/message/content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                data: serde_json::json!({ "provider": "openai", "model": json["model"] }),
                input_tokens: json.pointer("/usage/prompt_tokens").and_then(Value::as_i64),
                output_tokens: json.pointer("/usage/completion_tokens").and_then(Value::as_i64),
                remaining: remaining_from_headers(&headers),
                cut: json.pointer("/choices/0/finish_reason").and_then(Value::as_str) == Some("length"),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_failures_are_classified_as_the_design_says() {
        let now = SystemTime::now();
        let c = |status, body: &str| classify_http_failure(status, body, None, now).class;
        assert_eq!(c(429, r#"{"error":{"message":"slow down"}}"#), ErrorClass::RateLimited);
        assert_eq!(c(429, r#"{"error":{"message":"You have reached your spend limit"}}"#), ErrorClass::Rejected);
        assert_eq!(c(429, r#"{"error":{"code":"insufficient_quota"}}"#), ErrorClass::Rejected);
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
        let e = classify_http_failure(429, "{}", Some("7"), now);
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(e.provider_status, Some(429));
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
