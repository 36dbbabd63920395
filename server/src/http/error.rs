//! The HTTP layer's error response: an [`AppError`] with its status (mapped in one place,
//! [`AppError::status`]), `Retry-After` where waiting helps, and a JSON body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use app::errors::AppError;

/// An [`AppError`] as an HTTP response: its status, `Retry-After` where waiting helps, and
/// a JSON body `{ "error": code, "message": text, ...details }`.
pub struct ApiError(pub AppError);

impl From<AppError> for ApiError {
    fn from(e: AppError) -> Self {
        ApiError(e)
    }
}

impl From<engine::EngineError> for ApiError {
    fn from(e: engine::EngineError) -> Self {
        ApiError(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = serde_json::to_value(&self.0).unwrap_or_else(|_| serde_json::json!({}));
        if let Some(map) = body.as_object_mut() {
            map.insert("message".into(), self.0.to_string().into());
        }
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = self.0.retry_after() {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
