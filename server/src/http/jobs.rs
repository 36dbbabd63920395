//! The REST API for programs (and the browser's uploads): the same engine path and status
//! codes as the UI. Auth: `Authorization: Bearer <token>`, or the session cookie. This module
//! only speaks HTTP: upload checks, storage and admission are the engine's intake.

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sqlx::PgConnection;
use tower_sessions::Session;

use app::errors::AppError;
use app::model::JobStatus;
use app::server::session::{cancel_visible_job, client_of, job_status, session_user, visible_job};
use app::server::upload;
use engine::accounts::User;
use engine::documents::processor::{DocumentJob, DocumentRef};
use engine::queue::JobView;
use engine::JobState;

use super::error::ApiError;
use super::AppState;

/// The caller from a bearer token or the session; 401 otherwise.
async fn caller(state: &AppState, headers: &HeaderMap, session: &Session) -> Result<User, ApiError> {
    Ok(caller_and_token(state, headers, session).await?.0)
}

/// The caller, and the id of the token they used (none with a session).
async fn caller_and_token(
    state: &AppState,
    headers: &HeaderMap,
    session: &Session,
) -> Result<(User, Option<i64>), ApiError> {
    match bearer_token(headers)? {
        Some(token) => {
            let mut conn = state.ctx.pool.acquire().await.map_err(engine::EngineError::from)?;
            let (user, token_id) = token_caller(&mut conn, token).await?;
            Ok((user, Some(token_id)))
        }
        None => Ok((session_caller(state, session).await?, None)),
    }
}

/// The bearer token of a request with an `Authorization` header (401 when it is malformed).
fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(auth) = headers.get(header::AUTHORIZATION) else { return Ok(None) };
    let token = auth.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).ok_or(AppError::Unauthenticated)?;
    Ok(Some(token.trim()))
}

/// A bearer token's user and token id, checked over `conn`, which the request may keep for its
/// next query (each hand-out and return of a pooled connection is a round trip of its own).
async fn token_caller(conn: &mut PgConnection, token: &str) -> Result<(User, i64), ApiError> {
    engine::accounts::tokens::authenticate_token(conn, token).await?.ok_or(ApiError(AppError::Unauthenticated))
}

/// The session's user; 401 without one. Reads through the pool (the session store takes a
/// connection of its own, so none may be held meanwhile).
async fn session_caller(state: &AppState, session: &Session) -> Result<User, ApiError> {
    session_user(&state.ctx, session).await?.ok_or(ApiError(AppError::Unauthenticated))
}

/// The job named in the path, when the caller may see it (their own; admins any). Anyone
/// else's job, or a malformed id, is 404.
pub struct VisibleJob(pub JobView, pub User);

impl FromRequestParts<AppState> for VisibleJob {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Path(id) =
            Path::<String>::from_request_parts(parts, state).await.map_err(|_| ApiError(AppError::NotFound))?;
        let session = Session::from_request_parts(parts, state).await.map_err(|_| ApiError(AppError::Internal))?;
        match bearer_token(&parts.headers)? {
            // One connection for the token and the job: a status poll is two queries, not two
            // trips through the pool. Returned before the handler runs (it may need one too).
            Some(token) => {
                let mut conn = state.ctx.pool.acquire().await.map_err(engine::EngineError::from)?;
                let (user, _) = token_caller(&mut conn, token).await?;
                Ok(VisibleJob(visible_job(&mut *conn, &user, &id).await?, user))
            }
            None => {
                let user = session_caller(state, &session).await?;
                Ok(VisibleJob(visible_job(&state.ctx.pool, &user, &id).await?, user))
            }
        }
    }
}

/// A done job's result, or 409 saying what state the job is in.
fn done_result(job: &JobView) -> Result<&serde_json::Value, ApiError> {
    match (&job.state, &job.result) {
        (JobState::Done, Some(result)) => Ok(result),
        (state, _) => Err(AppError::NotReady { state: state.as_str().to_string() }.into()),
    }
}

/// `POST /api/v1/jobs`: 202 with `Location` once the job is committed; 200 with the earlier
/// job for a duplicate; 402, 429, 503 (nothing stored), 413, 415, 422 otherwise. The same path
/// as the upload page's server function ([`upload::upload`]).
pub async fn create_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (user, token_id) = caller_and_token(&state, &headers, &session).await?;
    let client = match request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>() {
        Some(axum::extract::ConnectInfo(peer)) => client_of(*peer, &headers, &state.ctx.settings.trusted_proxies),
        None => "unknown".to_string(),
    };
    let body = request.into_body().into_data_stream();
    let uploaded = upload::upload(&state.ctx, &user, token_id, &client, &headers, body).await?;
    Ok(accepted(uploaded))
}

/// 202 with `Location` for a new job; 200 with the earlier job for a duplicate.
fn accepted(uploaded: upload::Uploaded) -> Response {
    let status = if uploaded.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
    (status, [(header::LOCATION, uploaded.status_url())], Json(uploaded.reply())).into_response()
}

/// The body of `POST /api/v1/jobs/{id}/run-again` (all optional).
#[derive(Default, serde::Deserialize)]
pub struct RunAgain {
    preset: Option<String>,
    language: Option<String>,
}

/// `POST /api/v1/jobs/{id}/run-again`: the same document as a new job and a new debit
/// (202 + `Location`), with another preset if given; 402/429/503 like an upload, 410 when the
/// document is no longer kept.
pub async fn run_again(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
    body: Option<Json<RunAgain>>,
) -> Result<Response, ApiError> {
    let Json(body) = body.unwrap_or_default();
    let id = job.id.to_string();
    let again = upload::run_again(&state.ctx, &caller, &id, body.preset.as_deref(), body.language.as_deref()).await?;
    Ok(accepted(again))
}

/// `POST /api/v1/jobs/{id}/cancel`: 200 with the job as it is now (`canceled`, or still
/// `running` with `cancel_requested` until its next safe point); 409 once it has ended; another
/// user's job is 404.
pub async fn cancel_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    Ok(Json(cancel_visible_job(&state.ctx, &user, &id).await?))
}

/// `GET /api/v1/jobs/{id}`: the job's state; another user's job is 404.
pub async fn get_job(
    State(state): State<AppState>,
    VisibleJob(job, _): VisibleJob,
) -> Result<Json<JobStatus>, ApiError> {
    Ok(Json(job_status(&state.ctx, &job).await?))
}

/// `GET /api/v1/jobs/{id}/result`: the result of a done job; 409 until then.
pub async fn get_result(VisibleJob(job, _): VisibleJob) -> Result<Response, ApiError> {
    let result = done_result(&job)?;
    let body = Json(serde_json::json!({ "id": job.id.to_string(), "result": result }));
    Ok(([(header::X_CONTENT_TYPE_OPTIONS, "nosniff")], body).into_response())
}

/// An ASCII-safe file name for `Content-Disposition`.
fn attachment(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') { c } else { '_' })
        .collect();
    format!("attachment; filename=\"{}\"", safe.trim())
}

fn download(content_type: &str, file_name: &str, body: impl Into<Body>) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CONTENT_DISPOSITION, attachment(file_name)),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        body.into(),
    )
        .into_response()
}

fn document_of(job: &JobView) -> Result<DocumentRef, ApiError> {
    serde_json::from_value::<DocumentJob>(job.payload.clone())
        .map(|d| d.document)
        .map_err(|_| ApiError(AppError::NotFound))
}

/// `GET /api/v1/jobs/{id}/original`: the uploaded document, as an attachment.
pub async fn get_original(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    let document = document_of(&job)?;
    if caller.id != job.owner_id {
        // An admin opening a user's document (to see why it failed) is on the record.
        let mut conn = state.ctx.pool.acquire().await.map_err(engine::EngineError::from)?;
        let subject = format!("job {}", job.id);
        engine::audit::audit(&mut conn, &caller.email, "download_original", Some(&subject), job.state.as_str(), "")
            .await?;
    }
    // Streamed from storage: memory per download is a chunk, not the document.
    let chunks = state.ctx.blobs.stream(&document.key).await?;
    let stem = document.name.clone().unwrap_or_else(|| format!("document.{}", document.doc_type.extension()));
    Ok(download(document.doc_type.mime(), &stem, Body::from_stream(chunks)))
}

/// `GET /api/v1/jobs/{id}/result.md`: a done job's result as a Markdown attachment.
pub async fn get_result_markdown(VisibleJob(job, _): VisibleJob) -> Result<Response, ApiError> {
    let markdown = done_result(&job)?["markdown"].as_str().unwrap_or_default().to_string();
    let stem = document_of(&job).ok().and_then(|d| d.name).unwrap_or_else(|| "document".into());
    let stem = stem.rsplit_once('.').map(|(s, _)| s.to_string()).unwrap_or(stem);
    Ok(download("text/markdown; charset=utf-8", &format!("{stem}-result.md"), markdown.into_bytes()))
}

/// The token a webhook request is about: it must come with one (a session has no token).
async fn calling_token(state: &AppState, headers: &HeaderMap, session: &Session) -> Result<(User, i64), ApiError> {
    match caller_and_token(state, headers, session).await? {
        (user, Some(token_id)) => Ok((user, token_id)),
        (_, None) => {
            Err(AppError::invalid("a completion webhook belongs to an API token: call with Authorization: Bearer")
                .into())
        }
    }
}

/// The body of `PUT /api/v1/webhook`.
#[derive(serde::Deserialize)]
pub struct WebhookRequest {
    url: String,
}

/// `PUT /api/v1/webhook`: register (or replace) the calling token's completion callback. The
/// answer holds the signing secret, shown this once (a new PUT makes a new one).
pub async fn put_webhook(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Json(request): Json<WebhookRequest>,
) -> Result<Response, ApiError> {
    let (user, token_id) = calling_token(&state, &headers, &session).await?;
    let policy = &state.ctx.settings.webhook_policy;
    let registered =
        engine::webhooks::completion::register(&state.ctx.pool, policy, user.id, token_id, &request.url).await?;
    Ok(Json(registered).into_response())
}

/// `DELETE /api/v1/webhook`: the calling token's job endings are no longer sent.
pub async fn delete_webhook(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let (user, token_id) = calling_token(&state, &headers, &session).await?;
    engine::webhooks::completion::unregister(&state.ctx.pool, user.id, token_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::attachment;

    #[test]
    fn attachment_names_are_ascii_and_quoted_safely() {
        assert_eq!(attachment("re\"port\r\n.pdf"), "attachment; filename=\"re_port__.pdf\"");
        assert_eq!(attachment("Grüße.md"), "attachment; filename=\"Gr__e.md\"");
    }
}
