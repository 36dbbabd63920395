//! The vendors' batch APIs (half the price, answered within a window of 24 hours): OpenAI's
//! (the requests as a JSONL file uploaded to `/v1/files`, a batch of it at `/v1/batches`,
//! polled, its output and error files read) and Anthropic's message batches (the requests
//! inline, polled, the `results_url` read). Each result is checked exactly as an interactive
//! answer is (cut, refused, empty, an unknown stop reason: never a success); a request the
//! batch did not answer (expired, canceled, errored) says so in the class the retry policy
//! knows. What a provider sends back is bounded: lines, their size, and only the requests
//! asked for are kept.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::http::{classify_http_failure, read_body, transport_failure, Api, HttpProvider};
use super::{ProviderOutput, Task};
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// The most requests one batch carries (both vendors allow far more; a batch of Sluice's is
/// the economy documents of one collection round, every part of each).
pub const MAX_BATCH_REQUESTS: usize = 10_000;
/// The longest one result line may be: an answer's most, and its envelope.
const MAX_RESULT_LINE_BYTES: usize = super::http::MAX_ANSWER_BYTES + (64 << 10);
/// Each request of a batch answers within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A request of a batch: its own id (unique in the batch, 1 to 64 of `[A-Za-z0-9_-]`) and its task.
pub struct BatchRequest<'a> {
    pub custom_id: String,
    pub task: &'a Task,
}

/// Where a batch stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchState {
    /// Still answering: how many of its requests are answered so far, of all.
    Running { answered: u64, total: u64 },
    /// Every request is answered, failed, expired or canceled: its results can be read.
    Ended,
    /// The provider refused the batch as a whole (OpenAI's `failed`: a malformed file).
    Refused(String),
}

fn unreadable(what: &str) -> JobError {
    JobError::new(ErrorClass::ServerError, format!("the provider's batch answer could not be read ({what})"))
}

/// What a provider's id for a batch or a file may be (it goes into a URL with the key).
fn is_provider_id(id: &str) -> bool {
    (1..=200).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
}

fn custom_id_ok(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl HttpProvider {
    async fn send_json(&self, request: reqwest::RequestBuilder) -> Result<Value, JobError> {
        let response =
            self.authorized(request.timeout(REQUEST_TIMEOUT)).send().await.map_err(|e| transport_failure(&e))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = read_body(response, status, REQUEST_TIMEOUT).await?;
        if !(200..300).contains(&status) {
            return Err(classify_http_failure(status, &body, &headers, std::time::SystemTime::now()));
        }
        serde_json::from_str(&body).map_err(|_| unreadable("not JSON"))
    }

    /// Submit `requests` as one batch; the provider's id for it.
    pub async fn submit_batch(&self, requests: &[BatchRequest<'_>]) -> Result<String, JobError> {
        if requests.is_empty()
            || requests.len() > MAX_BATCH_REQUESTS
            || !requests.iter().all(|r| custom_id_ok(&r.custom_id))
        {
            return Err(JobError::new(ErrorClass::Rejected, "a batch holds 1 to 10,000 requests with simple ids"));
        }
        let created = match self.api {
            Api::Messages => {
                let requests: Vec<Value> = requests
                    .iter()
                    .map(|r| serde_json::json!({ "custom_id": r.custom_id, "params": self.batch_body(r.task) }))
                    .collect();
                let url = format!("{}/v1/messages/batches", self.base);
                self.send_json(self.http().post(url).json(&serde_json::json!({ "requests": requests }))).await?
            }
            Api::ChatCompletions => {
                let mut file = String::new();
                for r in requests {
                    let line = serde_json::json!({
                        "custom_id": r.custom_id, "method": "POST", "url": "/v1/chat/completions",
                        "body": self.batch_body(r.task),
                    });
                    file.push_str(&line.to_string());
                    file.push('\n');
                }
                let form = reqwest::multipart::Form::new()
                    .text("purpose", "batch")
                    .part("file", reqwest::multipart::Part::text(file).file_name("batch.jsonl"));
                let uploaded = self.send_json(self.http().post(format!("{}/files", self.base)).multipart(form)).await?;
                let file_id = uploaded["id"].as_str().ok_or_else(|| unreadable("no file id"))?;
                let batch = serde_json::json!({
                    "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
                });
                self.send_json(self.http().post(format!("{}/batches", self.base)).json(&batch)).await?
            }
        };
        created["id"]
            .as_str()
            .filter(|id| is_provider_id(id))
            .map(str::to_string)
            .ok_or_else(|| unreadable("no batch id"))
    }

    /// Where batch `id` stands.
    pub async fn batch_state(&self, id: &str) -> Result<BatchState, JobError> {
        let url = match self.api {
            Api::Messages => format!("{}/v1/messages/batches/{id}", self.base),
            Api::ChatCompletions => format!("{}/batches/{id}", self.base),
        };
        let batch = self.send_json(self.http().get(url)).await?;
        let count = |pointer: &str| batch.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
        Ok(match self.api {
            Api::Messages => match batch["processing_status"].as_str() {
                Some("ended") => BatchState::Ended,
                Some("in_progress" | "canceling") => {
                    let answered = count("/request_counts/succeeded") + count("/request_counts/errored");
                    BatchState::Running { answered, total: answered + count("/request_counts/processing") }
                }
                _ => return Err(unreadable("an unknown processing status")),
            },
            Api::ChatCompletions => match batch["status"].as_str() {
                Some("completed" | "expired" | "cancelled") => BatchState::Ended,
                Some("failed") => BatchState::Refused(
                    batch
                        .pointer("/errors/data/0/message")
                        .and_then(Value::as_str)
                        .unwrap_or("the batch failed")
                        .chars()
                        .take(300)
                        .collect(),
                ),
                Some("validating" | "in_progress" | "finalizing" | "cancelling") => BatchState::Running {
                    answered: count("/request_counts/completed") + count("/request_counts/failed"),
                    total: count("/request_counts/total"),
                },
                _ => return Err(unreadable("an unknown status")),
            },
        })
    }

    /// Ask the provider to cancel batch `id` (what it has answered stays answered).
    pub async fn cancel_batch(&self, id: &str) -> Result<(), JobError> {
        let url = match self.api {
            Api::Messages => format!("{}/v1/messages/batches/{id}/cancel", self.base),
            Api::ChatCompletions => format!("{}/batches/{id}/cancel", self.base),
        };
        self.send_json(self.http().post(url)).await.map(|_| ())
    }

    /// An ended batch's results for the requests `asked` (custom id → the answer's size asked):
    /// each answer checked as an interactive one is; a request the results do not mention is
    /// unfinished.
    pub async fn batch_results(
        &self,
        id: &str,
        asked: &HashMap<String, u32>,
    ) -> Result<HashMap<String, Result<ProviderOutput, JobError>>, JobError> {
        let mut found: HashMap<String, Result<ProviderOutput, JobError>> = HashMap::new();
        let files: Vec<String> = match self.api {
            Api::Messages => vec![format!("{}/v1/messages/batches/{id}/results", self.base)],
            Api::ChatCompletions => {
                let batch = self.send_json(self.http().get(format!("{}/batches/{id}", self.base))).await?;
                ["output_file_id", "error_file_id"]
                    .iter()
                    .filter_map(|field| batch[*field].as_str())
                    // An id goes into a URL with the key: only what an id can be.
                    .filter(|file| is_provider_id(file))
                    .map(|file| format!("{}/files/{file}/content", self.base))
                    .collect()
            }
        };
        for url in files {
            let response = self
                .authorized(self.http().get(url).timeout(REQUEST_TIMEOUT * 5))
                .send()
                .await
                .map_err(|e| transport_failure(&e))?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let headers = response.headers().clone();
                let body = read_body(response, status, REQUEST_TIMEOUT).await?;
                return Err(classify_http_failure(status, &body, &headers, std::time::SystemTime::now()));
            }
            self.read_result_lines(response, asked, &mut found).await?;
        }
        for custom_id in asked.keys() {
            found.entry(custom_id.clone()).or_insert_with(|| {
                Err(JobError::new(ErrorClass::Unfinished, "the provider's batch ended without answering this request"))
            });
        }
        Ok(found)
    }

    /// Read a results file line by line, each line bounded, keeping the requests asked for
    /// (the first result of each).
    async fn read_result_lines(
        &self,
        mut response: reqwest::Response,
        asked: &HashMap<String, u32>,
        found: &mut HashMap<String, Result<ProviderOutput, JobError>>,
    ) -> Result<(), JobError> {
        let mut line: Vec<u8> = Vec::new();
        let mut lines = 0usize;
        loop {
            let chunk = tokio::time::timeout(REQUEST_TIMEOUT, response.chunk())
                .await
                .map_err(|_| JobError::new(ErrorClass::Timeout, "the provider stopped sending the batch's results"))?
                .map_err(|e| transport_failure(&e))?;
            let end = chunk.is_none();
            let bytes = chunk.unwrap_or_default();
            for piece in bytes.split_inclusive(|b| *b == b'\n') {
                line.extend_from_slice(piece);
                if line.len() > MAX_RESULT_LINE_BYTES {
                    return Err(unreadable("a result longer than any answer"));
                }
                if line.ends_with(b"\n") {
                    lines += 1;
                    self.read_result_line(&line, asked, found);
                    line.clear();
                }
            }
            if lines > asked.len() * 2 + 16 {
                return Err(unreadable("more results than requests"));
            }
            if end {
                self.read_result_line(&line, asked, found);
                return Ok(());
            }
        }
    }

    fn read_result_line(
        &self,
        line: &[u8],
        asked: &HashMap<String, u32>,
        found: &mut HashMap<String, Result<ProviderOutput, JobError>>,
    ) {
        let Ok(json) = serde_json::from_slice::<Value>(line) else { return };
        let Some(custom_id) = json["custom_id"].as_str() else { return };
        let Some(&answer_tokens) = asked.get(custom_id) else { return };
        if found.contains_key(custom_id) {
            return;
        }
        let outcome = match self.api {
            Api::Messages => match json.pointer("/result/type").and_then(Value::as_str) {
                Some("succeeded") => self.answer_of(&json["result"]["message"], answer_tokens),
                Some("errored") => Err(errored(&json["result"]["error"])),
                Some("expired") => Err(expired()),
                Some("canceled") => Err(canceled()),
                _ => Err(unreadable("an unknown result type")),
            },
            Api::ChatCompletions => match (json["response"]["status_code"].as_u64(), json["error"]["code"].as_str()) {
                (Some(200), _) => self.answer_of(&json["response"]["body"], answer_tokens),
                (Some(status), _) => Err(classify_http_failure(
                    status.min(599) as u16,
                    &json["response"]["body"].to_string(),
                    &reqwest::header::HeaderMap::new(),
                    std::time::SystemTime::now(),
                )),
                (None, Some("batch_expired")) => Err(expired()),
                (None, Some("batch_cancelled")) => Err(canceled()),
                (None, _) => Err(unreadable("a result with neither a response nor a known error")),
            },
        };
        found.insert(custom_id.to_string(), outcome);
    }
}

/// An Anthropic result's error, classified as the same error over HTTP would be.
fn errored(error: &Value) -> JobError {
    let status = match error.pointer("/error/type").and_then(Value::as_str) {
        Some("invalid_request_error") => 400,
        Some("authentication_error") => 401,
        Some("permission_error") => 403,
        Some("not_found_error") => 404,
        Some("request_too_large") => 413,
        Some("rate_limit_error") => 429,
        Some("overloaded_error") => 529,
        _ => 500,
    };
    classify_http_failure(status, &error.to_string(), &reqwest::header::HeaderMap::new(), std::time::SystemTime::now())
}

fn expired() -> JobError {
    JobError::new(ErrorClass::Timeout, "the provider's batch window ended before this request was answered")
}

fn canceled() -> JobError {
    JobError::new(ErrorClass::Overloaded, "the request was canceled inside the provider's batch")
}
