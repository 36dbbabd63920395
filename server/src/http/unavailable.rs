//! A 500 while Postgres does not answer is a restart, not a bug: say so with 503 and
//! `Retry-After`. Errors the engine classifies become 503 where they arise; this catches the
//! rest (the session layer saving a session, a page's render).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;

use app::errors::AppError;

use super::error::ApiError;

/// How long the check that the database answers may take before it counts as "no".
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one ping's answer stands for every 500 (so a burst of them costs one ping).
const PING_FOR: Duration = Duration::from_secs(1);

/// Whether the database answered lately, shared by every request.
#[derive(Clone, Default)]
pub struct DatabasePing(Arc<Mutex<Option<(Instant, bool)>>>);

impl DatabasePing {
    async fn answers(&self, pool: &PgPool) -> bool {
        if let Some((at, answered)) = *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < PING_FOR {
                return answered;
            }
        }
        let answered =
            tokio::time::timeout(PING_TIMEOUT, engine::db::server_version(pool)).await.is_ok_and(|r| r.is_ok());
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), answered));
        answered
    }
}

pub async fn restarting_is_not_an_internal_error(
    State((pool, ping)): State<(PgPool, DatabasePing)>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    if response.status() != StatusCode::INTERNAL_SERVER_ERROR || ping.answers(&pool).await {
        return response;
    }
    ApiError(AppError::unavailable()).into_response()
}
