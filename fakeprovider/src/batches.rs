//! The vendors' batch APIs, as they document them. OpenAI: a JSONL file of requests uploaded to
//! `/v1/files`, a batch made of it at `/v1/batches`, polled, its output and error files read
//! from `/v1/files/{id}/content`. Anthropic: `/v1/messages/batches` with the requests inline,
//! polled, its `results_url` read as JSONL. Either can be canceled. Each request is answered as
//! an interactive one is (the script, the hosted model and its flaws), after the fake's batch
//! delay; a batch still waiting at its window's end expires, its requests unanswered. The time
//! scale makes a "24-hour" window seconds long in tests.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Multipart, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{respond, Shape, Shared};

/// How long a batch takes, and how long its window is (past it, what is left expires).
#[derive(Clone, Copy, Debug)]
pub struct BatchTiming {
    pub delay: Duration,
    pub window: Duration,
}

impl Default for BatchTiming {
    fn default() -> Self {
        BatchTiming { delay: Duration::from_millis(150), window: Duration::from_secs(30) }
    }
}

#[derive(Default)]
pub(crate) struct Batches {
    pub timing: BatchTiming,
    files: HashMap<String, Vec<u8>>,
    batches: HashMap<String, Batch>,
    made: u64,
    /// Requests submitted in batches, over all batches.
    pub requests: u64,
    /// A results body served instead of the batch's own (a hostile or broken provider's).
    pub results_instead: Option<String>,
}

struct Batch {
    shape: Shape,
    created: u64,
    started: Instant,
    requests: Vec<(String, Value)>,
    status: Status,
    /// OpenAI: the output and error files; Anthropic: the results, one JSONL line each.
    output: Vec<String>,
    errors: Vec<String>,
    succeeded: u64,
    failed: u64,
    canceled: u64,
    expired: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum Status {
    InProgress,
    Canceling,
    Ended,
    Expired,
    Canceled,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn rfc3339(unix: u64) -> String {
    chrono::DateTime::from_timestamp(unix as i64, 0).unwrap_or_default().to_rfc3339()
}

fn next_id(script: &Shared, prefix: &str) -> String {
    let mut s = script.lock().unwrap();
    s.batches.made += 1;
    format!("{prefix}{:08}", s.batches.made)
}

fn not_found(shape: Shape) -> Response {
    super::error(shape, 404, "not_found_error", "no such batch or file")
}

/// Start answering a batch's requests after the delay (or let them expire at the window).
fn run(script: Shared, id: String) {
    tokio::spawn(async move {
        let timing = script.lock().unwrap().batches.timing;
        tokio::time::sleep(timing.delay.min(timing.window)).await;
        let (shape, requests) = {
            let s = script.lock().unwrap();
            let Some(b) = s.batches.batches.get(&id) else { return };
            (b.shape, b.requests.clone())
        };
        for (custom_id, body) in requests {
            let state = script.lock().unwrap().batches.batches.get(&id).map(|b| (b.status, b.started));
            let Some((status, started)) = state else { return };
            let expired = timing.delay >= timing.window || started.elapsed() >= timing.window;
            let line = if status == Status::Canceling {
                None
            } else if expired {
                Some(Err("expired"))
            } else {
                Some(Ok(()))
            };
            let (outcome, line) = match line {
                None => ("canceled", ended_line(shape, &custom_id, "canceled")),
                Some(Err(_)) => ("expired", ended_line(shape, &custom_id, "expired")),
                Some(Ok(())) => {
                    let mut body = body;
                    body["stream"] = Value::Bool(false);
                    let response = respond(script.clone(), shape, body).await;
                    let status = response.status().as_u16();
                    let bytes = axum::body::to_bytes(response.into_body(), 64 << 20).await.unwrap_or_default();
                    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    let ok = (200..300).contains(&status);
                    (if ok { "succeeded" } else { "errored" }, answered_line(shape, &custom_id, status, answer))
                }
            };
            let mut s = script.lock().unwrap();
            let Some(b) = s.batches.batches.get_mut(&id) else { return };
            match outcome {
                "succeeded" => {
                    b.succeeded += 1;
                    b.output.push(line);
                }
                "errored" => {
                    b.failed += 1;
                    b.errors.push(line);
                }
                "canceled" => {
                    b.canceled += 1;
                    b.errors.push(line);
                }
                _ => {
                    b.expired += 1;
                    b.errors.push(line);
                }
            }
        }
        let mut s = script.lock().unwrap();
        if let Some(b) = s.batches.batches.get_mut(&id) {
            b.status = match b.status {
                Status::Canceling => Status::Canceled,
                _ if b.expired > 0 => Status::Expired,
                _ => Status::Ended,
            };
        }
    });
}

/// One request's line once it was answered (an answer or an error, as the vendor words it).
fn answered_line(shape: Shape, custom_id: &str, status: u16, body: Value) -> String {
    match shape {
        Shape::OpenAi => json!({
            "id": format!("batch_req_{custom_id}"), "custom_id": custom_id,
            "response": { "status_code": status, "request_id": format!("req_{custom_id}"), "body": body },
            "error": null,
        }),
        Shape::Anthropic if (200..300).contains(&status) => {
            json!({ "custom_id": custom_id, "result": { "type": "succeeded", "message": body } })
        }
        Shape::Anthropic => json!({ "custom_id": custom_id, "result": { "type": "errored", "error": body } }),
    }
    .to_string()
}

/// One request's line when it was never answered: canceled, or its batch expired.
fn ended_line(shape: Shape, custom_id: &str, how: &str) -> String {
    match shape {
        Shape::OpenAi => json!({
            "id": format!("batch_req_{custom_id}"), "custom_id": custom_id, "response": null,
            "error": { "code": if how == "expired" { "batch_expired" } else { "batch_cancelled" },
                       "message": format!("This request was {how} before it was executed.") },
        }),
        Shape::Anthropic => json!({ "custom_id": custom_id, "result": { "type": how } }),
    }
    .to_string()
}

fn create(script: &Shared, shape: Shape, requests: Vec<(String, Value)>) -> String {
    let id = next_id(script, if matches!(shape, Shape::OpenAi) { "batch_" } else { "msgbatch_" });
    let mut s = script.lock().unwrap();
    s.batches.requests += requests.len() as u64;
    let batch = Batch {
        shape,
        created: unix_now(),
        started: Instant::now(),
        requests,
        status: Status::InProgress,
        output: Vec::new(),
        errors: Vec::new(),
        succeeded: 0,
        failed: 0,
        canceled: 0,
        expired: 0,
    };
    s.batches.batches.insert(id.clone(), batch);
    id
}

fn openai_object(id: &str, b: &Batch, window: Duration) -> Value {
    let status = match b.status {
        Status::InProgress => "in_progress",
        Status::Canceling => "cancelling",
        Status::Ended => "completed",
        Status::Expired => "expired",
        Status::Canceled => "cancelled",
    };
    let ended = matches!(b.status, Status::Ended | Status::Expired | Status::Canceled);
    json!({
        "id": id, "object": "batch", "endpoint": "/v1/chat/completions", "errors": null,
        "input_file_id": format!("file-in-{id}"), "completion_window": "24h", "status": status,
        "output_file_id": (ended && !b.output.is_empty()).then(|| format!("file-out-{id}")),
        "error_file_id": (ended && !b.errors.is_empty()).then(|| format!("file-err-{id}")),
        "created_at": b.created, "in_progress_at": b.created, "expires_at": b.created + window.as_secs(),
        "completed_at": (b.status == Status::Ended).then_some(unix_now()),
        "request_counts": { "total": b.requests.len(), "completed": b.succeeded, "failed": b.failed + b.expired + b.canceled },
        "metadata": null,
    })
}

fn anthropic_object(id: &str, b: &Batch, base: &str, window: Duration) -> Value {
    let ended = matches!(b.status, Status::Ended | Status::Expired | Status::Canceled);
    let done = b.succeeded + b.failed + b.canceled + b.expired;
    json!({
        "id": id, "type": "message_batch",
        "processing_status": match b.status { Status::InProgress => "in_progress", Status::Canceling => "canceling", _ => "ended" },
        "request_counts": {
            "processing": b.requests.len() as u64 - done, "succeeded": b.succeeded, "errored": b.failed,
            "canceled": b.canceled, "expired": b.expired,
        },
        "created_at": rfc3339(b.created), "expires_at": rfc3339(b.created + window.as_secs()),
        "ended_at": ended.then(|| rfc3339(unix_now())), "cancel_initiated_at": null, "archived_at": null,
        "results_url": ended.then(|| format!("{base}/v1/messages/batches/{id}/results")),
    })
}

/// `POST /v1/files`: a batch's input, `purpose=batch`, as a multipart upload.
pub(crate) async fn upload_file(State(script): State<Shared>, mut form: Multipart) -> Response {
    let (mut purpose, mut file) = (String::new(), None);
    while let Ok(Some(field)) = form.next_field().await {
        match field.name() {
            Some("purpose") => purpose = field.text().await.unwrap_or_default(),
            Some("file") => file = field.bytes().await.ok(),
            _ => {}
        }
    }
    let Some(file) = file.filter(|_| purpose == "batch") else {
        return super::error(
            Shape::OpenAi,
            400,
            "invalid_request_error",
            "a batch file needs purpose=batch and a file",
        );
    };
    let id = next_id(&script, "file-");
    let bytes = file.len();
    script.lock().unwrap().batches.files.insert(id.clone(), file.to_vec());
    Json(json!({ "id": id, "object": "file", "bytes": bytes, "created_at": unix_now(), "filename": "batch.jsonl", "purpose": "batch" }))
        .into_response()
}

/// `GET /v1/files/{id}/content`: an uploaded file, or a batch's output or error file.
pub(crate) async fn file_content(State(script): State<Shared>, Path(id): Path<String>) -> Response {
    let s = script.lock().unwrap();
    let lines = |batch: &str, errors: bool| {
        s.batches.batches.get(batch).map(|b| if errors { b.errors.join("\n") } else { b.output.join("\n") })
    };
    let content = if let Some(batch) = id.strip_prefix("file-out-") {
        lines(batch, false).map(String::into_bytes)
    } else if let Some(batch) = id.strip_prefix("file-err-") {
        lines(batch, true).map(String::into_bytes)
    } else {
        s.batches.files.get(&id).cloned()
    };
    match content {
        Some(bytes) => ([("content-type", "application/octet-stream")], bytes).into_response(),
        None => not_found(Shape::OpenAi),
    }
}

/// `POST /v1/batches`: a batch of the requests in an uploaded JSONL file.
pub(crate) async fn openai_create(State(script): State<Shared>, Json(body): Json<Value>) -> Response {
    let bad = |message: &str| super::error(Shape::OpenAi, 400, "invalid_request_error", message);
    if body["endpoint"] != "/v1/chat/completions" || body["completion_window"] != "24h" {
        return bad("endpoint must be /v1/chat/completions and completion_window 24h");
    }
    let file = body["input_file_id"].as_str().and_then(|id| script.lock().unwrap().batches.files.get(id).cloned());
    let Some(file) = file else { return bad("no such input file") };
    let mut requests = Vec::new();
    for line in String::from_utf8_lossy(&file).lines().filter(|l| !l.trim().is_empty()) {
        let Ok(request) = serde_json::from_str::<Value>(line) else { return bad("a line is not JSON") };
        let (Some(custom_id), true, true) =
            (request["custom_id"].as_str(), request["method"] == "POST", request["url"] == "/v1/chat/completions")
        else {
            return bad("each line needs custom_id, method POST and url /v1/chat/completions");
        };
        if requests.iter().any(|(id, _)| id == custom_id) {
            return bad("custom_id values must be unique");
        }
        requests.push((custom_id.to_string(), request["body"].clone()));
    }
    let id = create(&script, Shape::OpenAi, requests);
    run(script.clone(), id.clone());
    let s = script.lock().unwrap();
    Json(openai_object(&id, &s.batches.batches[&id], s.batches.timing.window)).into_response()
}

pub(crate) async fn openai_get(State(script): State<Shared>, Path(id): Path<String>) -> Response {
    let s = script.lock().unwrap();
    match s.batches.batches.get(&id) {
        Some(b) => Json(openai_object(&id, b, s.batches.timing.window)).into_response(),
        None => not_found(Shape::OpenAi),
    }
}

/// `POST /v1/messages/batches`: the requests inline, each `{custom_id, params}`.
pub(crate) async fn anthropic_create(
    State(script): State<Shared>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let mut requests = Vec::new();
    for request in body["requests"].as_array().into_iter().flatten() {
        let Some(custom_id) = request["custom_id"].as_str().filter(|id| (1..=64).contains(&id.len())) else {
            return super::error(Shape::Anthropic, 400, "invalid_request_error", "custom_id: 1 to 64 characters");
        };
        requests.push((custom_id.to_string(), request["params"].clone()));
    }
    if requests.is_empty() {
        return super::error(Shape::Anthropic, 400, "invalid_request_error", "requests: at least one");
    }
    let id = create(&script, Shape::Anthropic, requests);
    run(script.clone(), id.clone());
    let base = base_of(&headers);
    let s = script.lock().unwrap();
    Json(anthropic_object(&id, &s.batches.batches[&id], &base, s.batches.timing.window)).into_response()
}

fn base_of(headers: &axum::http::HeaderMap) -> String {
    format!("http://{}", headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1"))
}

pub(crate) async fn anthropic_get(
    State(script): State<Shared>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let s = script.lock().unwrap();
    match s.batches.batches.get(&id) {
        Some(b) => Json(anthropic_object(&id, b, &base_of(&headers), s.batches.timing.window)).into_response(),
        None => not_found(Shape::Anthropic),
    }
}

pub(crate) async fn anthropic_results(State(script): State<Shared>, Path(id): Path<String>) -> Response {
    let s = script.lock().unwrap();
    match s.batches.batches.get(&id) {
        Some(b) if matches!(b.status, Status::InProgress | Status::Canceling) => {
            super::error(Shape::Anthropic, 400, "invalid_request_error", "the batch is still processing")
        }
        Some(b) => {
            let lines: Vec<&String> = b.output.iter().chain(&b.errors).collect();
            let own = lines.iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n");
            let body = s.batches.results_instead.clone().unwrap_or(own);
            ([("content-type", "application/binary")], body).into_response()
        }
        None => not_found(Shape::Anthropic),
    }
}

/// Cancel a batch (either vendor's route): what is not answered yet is canceled.
pub(crate) async fn cancel(State(script): State<Shared>, Path(id): Path<String>) -> Response {
    let mut s = script.lock().unwrap();
    let window = s.batches.timing.window;
    match s.batches.batches.get_mut(&id) {
        Some(b) => {
            if b.status == Status::InProgress {
                b.status = Status::Canceling;
            }
            let object = match b.shape {
                Shape::OpenAi => openai_object(&id, b, window),
                Shape::Anthropic => anthropic_object(&id, b, "", window),
            };
            Json(object).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such batch").into_response(),
    }
}
