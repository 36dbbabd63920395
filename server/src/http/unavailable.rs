//! A 500 while Postgres does not answer is a restart, not a bug: say so with 503 and
//! `Retry-After`. Errors the engine classifies become 503 where they arise; this catches the
//! rest (the session layer saving a session, a page's render).

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;

use app::errors::AppError;

use super::error::ApiError;

/// How long the check that the database answers may take before it counts as "no".
const PING_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn restarting_is_not_an_internal_error(State(pool): State<PgPool>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status() != StatusCode::INTERNAL_SERVER_ERROR {
        return response;
    }
    let answers = tokio::time::timeout(PING_TIMEOUT, engine::db::server_version(&pool)).await.is_ok_and(|r| r.is_ok());
    if answers {
        return response;
    }
    ApiError(AppError::unavailable()).into_response()
}
