//! The API's answers checked against its OpenAPI document while tests run: a layer around the
//! test app that looks up each `/api/v1` answer's operation and status in the document, checks
//! the content type, and validates JSON bodies against their schema. What does not match is
//! kept, and the test app fails its test with it.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::http::api::{document, DOCS_PATH, DOCUMENT_PATH};

/// JSON answers larger than this are not buffered to be checked (none of the API's are).
const MAX_CHECKED_BODY: usize = 4 << 20;

/// What the checked answers broke of the contract, and how many were checked.
#[derive(Clone, Default)]
pub struct ContractCheck {
    inner: Arc<Mutex<Record>>,
}

#[derive(Default)]
struct Record {
    checked: usize,
    violations: Vec<String>,
}

impl ContractCheck {
    /// `router` with every `/api/v1` answer checked.
    pub fn around(&self, router: Router) -> Router {
        let check = self.clone();
        router.layer(middleware::from_fn(move |request, next| check_answer(check.clone(), request, next)))
    }

    /// Answers that broke the contract, each in words.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().unwrap().violations.clone()
    }

    /// How many answers were checked.
    pub fn checked(&self) -> usize {
        self.inner.lock().unwrap().checked
    }

    fn record(&self, violation: Option<String>) {
        let mut record = self.inner.lock().unwrap();
        record.checked += 1;
        record.violations.extend(violation);
    }
}

async fn check_answer(check: ContractCheck, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if !path.starts_with("/api/v1/") || path == DOCUMENT_PATH || path.starts_with(DOCS_PATH) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(media_type);
    let encoded = parts.headers.contains_key(header::CONTENT_ENCODING);
    // Only JSON is read here (downloads stream as they are, at the client's pace).
    let (body, json) = if content_type.as_deref() == Some("application/json") && !encoded {
        match http_body_util::Limited::new(body, MAX_CHECKED_BODY).collect().await {
            Ok(collected) => {
                let bytes: Bytes = collected.to_bytes();
                let json = serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string());
                (Body::from(bytes), Some(json))
            }
            Err(e) => {
                check.record(Some(format!("{method} {path}: the JSON answer could not be read: {e}")));
                return Response::from_parts(parts, Body::empty());
            }
        }
    } else {
        (body, None)
    };
    check.record(violation(&method, &path, parts.status, content_type.as_deref(), json).err());
    Response::from_parts(parts, body)
}

/// `text/plain; charset=utf-8` -> `text/plain`.
fn media_type(value: &str) -> String {
    value.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// Whether one answer is what the document describes for its operation and status.
pub fn violation(
    method: &Method,
    path: &str,
    status: StatusCode,
    content_type: Option<&str>,
    json: Option<Result<Value, String>>,
) -> Result<(), String> {
    let doc = serde_json::to_value(document()).map_err(|e| e.to_string())?;
    let what = format!("{method} {path} answered {status}");
    let operation =
        operation_for(&doc, method, path).ok_or_else(|| format!("{what}: no such operation is described"))?;
    let response = operation["responses"]
        .get(status.as_str())
        .or_else(|| operation["responses"].get("default"))
        .ok_or_else(|| format!("{what}: this status is not described"))?;
    let Some(content) = response.get("content").and_then(Value::as_object) else {
        return match content_type {
            None => Ok(()),
            Some(t) => Err(format!("{what} with a {t} body, but no body is described")),
        };
    };
    let content_type = content_type.ok_or_else(|| format!("{what} without a Content-Type"))?;
    let media = content
        .get(content_type)
        .ok_or_else(|| format!("{what} as {content_type}; described: {:?}", content.keys().collect::<Vec<_>>()))?;
    let (Some(schema), Some(json)) = (media.get("schema"), json) else { return Ok(()) };
    let body = json.map_err(|e| format!("{what}: the body is not JSON: {e}"))?;
    // The schema with the document's components beside it, so its `$ref`s resolve.
    let mut root = schema.clone();
    if let Some(object) = root.as_object_mut() {
        object.insert("components".into(), doc["components"].clone());
    }
    let validator = jsonschema::draft202012::new(&root).map_err(|e| format!("{what}: its schema is invalid: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(&body).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: the body does not match its schema: {}; body: {body}", errors.join("; ")))
    }
}

/// The operation whose path template matches `path` (`{id}` takes one segment).
fn operation_for<'d>(doc: &'d Value, method: &Method, path: &str) -> Option<&'d Value> {
    let segments: Vec<&str> = path.split('/').collect();
    let (_, item) = doc["paths"].as_object()?.iter().find(|(template, _)| {
        let parts: Vec<&str> = template.split('/').collect();
        parts.len() == segments.len()
            && parts.iter().zip(&segments).all(|(t, s)| (t.starts_with('{') && !s.is_empty()) || t == s)
    })?;
    item.get(method.as_str().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job_status() -> Value {
        json!({
            "id": "0b6c5f0e-1f1e-4a51-9f0e-0d3c1a2b3c4d", "state": "queued", "file_name": "a.txt",
            "preset": "summarize", "attempts": 0, "max_attempts": 3,
            "accepted_at": "2026-12-01T00:00:00Z", "run_at": "2026-12-01T00:00:00Z", "started_at": null,
            "finished_at": null, "last_error": null, "failure_kind": null, "failure_reason": null, "cost": 1,
            "has_result": false, "paused": false, "jobs_ahead": 0, "starts_in_secs": null, "stage": null,
            "stage_since": null, "pages": null, "refunded": 0, "cancel_requested": false, "cancel_kept": 0,
            "input_tokens": null, "output_tokens": null, "parts": null
        })
    }

    #[test]
    fn answers_as_described_pass_and_others_are_named() {
        let get = Method::GET;
        let path = "/api/v1/jobs/0b6c5f0e-1f1e-4a51-9f0e-0d3c1a2b3c4d";
        let json = |v: Value| Some(Ok(v));
        assert_eq!(violation(&get, path, StatusCode::OK, Some("application/json"), json(job_status())), Ok(()));
        let mut wrong_state = job_status();
        wrong_state["state"] = json!("sleeping");
        assert!(violation(&get, path, StatusCode::OK, Some("application/json"), json(wrong_state))
            .unwrap_err()
            .contains("does not match"));
        let mut missing = job_status();
        missing.as_object_mut().unwrap().remove("cost");
        assert!(violation(&get, path, StatusCode::OK, Some("application/json"), json(missing)).is_err());
        // A 500 is never part of the contract, nor a status an operation does not name.
        let error = json!({ "error": "internal", "message": "something went wrong on our side" });
        assert!(violation(
            &get,
            path,
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("application/json"),
            json(error.clone())
        )
        .unwrap_err()
        .contains("not described"));
        assert!(violation(&get, path, StatusCode::PAYMENT_REQUIRED, Some("application/json"), json(error)).is_err());
        // An error body needs its code and its words.
        let no_words = json!({ "error": "not_found" });
        assert!(violation(&get, path, StatusCode::NOT_FOUND, Some("application/json"), json(no_words)).is_err());
        let not_found = json!({ "error": "not_found", "message": "not found" });
        assert_eq!(violation(&get, path, StatusCode::NOT_FOUND, Some("application/json"), json(not_found)), Ok(()));
        // The wrong content type, and routes that are not in the document.
        assert!(violation(&get, path, StatusCode::OK, Some("text/html"), None).is_err());
        assert!(violation(&get, "/api/v1/jobs/x/y/z", StatusCode::OK, None, None).is_err());
        assert!(violation(&Method::DELETE, path, StatusCode::OK, None, None).is_err());
        assert_eq!(
            violation(&Method::GET, &format!("{path}/result.md"), StatusCode::OK, Some("text/markdown"), None),
            Ok(())
        );
    }
}
