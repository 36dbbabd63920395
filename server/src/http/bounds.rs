//! Bodies are bounded before anything reads them: sessions, credentials and server functions
//! see at most [`MAX_BODY_BYTES`] (the upload paths and the estimate stream theirs under their own cap).
//! And a server function's argument error is the client's fault: 400/422 with our words,
//! never 500.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use app::errors::AppError;

use super::error::ApiError;

/// The most any request other than an upload may carry: forms and JSON of a few fields.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Pure: whether this request streams its body under its own cap (the uploads).
pub fn streams_its_body(method: &Method, path: &str) -> bool {
    *method == Method::POST && matches!(path, "/api/v1/jobs" | "/api/v1/estimate" | "/api/upload_document")
}

/// Middleware: read the body up to [`MAX_BODY_BYTES`], or answer 413 unread when its declared
/// length is over, and 413 as soon as the bytes pass it; then hand the request on. Server
/// functions' 500s that are argument errors get their own status.
pub async fn bound_body(request: Request, next: Next) -> Response {
    if streams_its_body(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    let declared =
        request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
        Err(_) => return ApiError(AppError::invalid("the request's body could not be read")).into_response(),
    };
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    with_the_errors_status(response).await
}

fn too_large() -> Response {
    ApiError(AppError::BodyTooLarge { limit_bytes: MAX_BODY_BYTES as u64 }).into_response()
}

/// A 500 whose body is one of our errors with a status of its own (a server function's
/// arguments that did not decode are 400, not 500) gets that status.
async fn with_the_errors_status(response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    // Only our errors are JSON of a few fields; anything else (a page) passes untouched.
    if response.status() != StatusCode::INTERNAL_SERVER_ERROR || !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    if let Ok(error) = serde_json::from_slice::<AppError>(&bytes) {
        if let Ok(status) = StatusCode::from_u16(error.status()) {
            parts.status = status;
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_uploads_stream_their_bodies() {
        assert!(streams_its_body(&Method::POST, "/api/v1/jobs"));
        assert!(streams_its_body(&Method::POST, "/api/upload_document"));
        assert!(streams_its_body(&Method::POST, "/api/v1/estimate"));
        assert!(!streams_its_body(&Method::PUT, "/api/v1/webhook"));
        assert!(!streams_its_body(&Method::POST, "/api/log_in"));
        assert!(!streams_its_body(&Method::GET, "/api/v1/jobs"));
    }
}
