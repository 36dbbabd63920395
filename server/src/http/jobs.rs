//! The REST API for programs (and the browser's uploads): the same engine path and status
//! codes as the UI. Auth: `Authorization: Bearer <token>`, or the session cookie. This module
//! only speaks HTTP: upload checks, storage and admission are the engine's intake.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sqlx::PgConnection;
use tower_sessions::Session;

use app::errors::AppError;
use app::model::JobStatus;
use app::server::session::{cancel_visible_job, client_of, job_status, session_user, visible_job, AuthCache};
use app::server::upload;
use engine::accounts::User;
use engine::documents::payload::{DocumentJob, DocumentRef};
use engine::queue::JobView;
use engine::JobState;

use super::error::ApiError;
use super::openapi::{callback_url, ErrorBody, ResultBody, RunAgainBody, UploadForm};
use super::AppState;

/// The caller from a bearer token or the session; 401 otherwise.
pub(super) async fn caller(state: &AppState, headers: &HeaderMap, session: &Session) -> Result<User, ApiError> {
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
            let (user, token_id) = token_caller(&mut conn, &state.ctx.auth, token).await?;
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
async fn token_caller(conn: &mut PgConnection, cache: &AuthCache, token: &str) -> Result<(User, i64), ApiError> {
    let found = engine::accounts::tokens::authenticate_cached(conn, cache, token).await?;
    found.ok_or(ApiError(AppError::Unauthenticated))
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
            // One connection for the token and the job: a status poll is one or two queries (the
            // token is usually known to this process), not two trips through the pool. Returned
            // before the handler runs (it may need one too).
            Some(token) => {
                let mut conn = state.ctx.pool.acquire().await.map_err(engine::EngineError::from)?;
                let (user, _) = token_caller(&mut conn, &state.ctx.auth, token).await?;
                Ok(VisibleJob(visible_job(&mut *conn, &user, &id).await?, user))
            }
            None => {
                let user = session_caller(state, &session).await?;
                Ok(VisibleJob(visible_job(&state.ctx.pool, &user, &id).await?, user))
            }
        }
    }
}

/// A JSON body, read once the caller is known (so a stranger gets 401, not a parse error);
/// one that does not decode is 422 in the API's error shape.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError(AppError::invalid(format!("the JSON body does not decode: {e}"))))
}

/// A done job's result, or 409 saying what state the job is in.
fn done_result(job: &JobView) -> Result<&serde_json::Value, ApiError> {
    if job.deleted_at.is_some() {
        return Err(AppError::Deleted.into());
    }
    match (&job.state, &job.result) {
        (JobState::Done, Some(result)) => Ok(result),
        (state, _) => Err(AppError::NotReady { state: state.as_str().to_string() }.into()),
    }
}

/// Answers any call may get: no valid token or session, a body over what the route takes, the
/// database restarting (nothing was changed; `Retry-After` says when to try again).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Common {
    #[response(status = 401, description = "No valid token or session")]
    Unauthenticated(ErrorBody),
    #[response(status = 403, description = "A browser's request from another site")]
    CrossSite(ErrorBody),
    #[response(status = 413, description = "The request is larger than this route takes")]
    TooLarge(ErrorBody),
    #[response(status = 503, description = "Unavailable for a moment (Retry-After): nothing was stored or changed")]
    Unavailable(ErrorBody),
}

/// The answer of every route with a job id for a job the caller may not see.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum NotYours {
    #[response(status = 404, description = "No such job of yours")]
    NotFound(ErrorBody),
}

/// The path's job id.
const JOB_ID: &str = "The job's id (a UUID); anyone else's job is 404";

/// `POST /api/v1/jobs`: 202 with `Location` once the job is committed; 200 with the earlier
/// job for a duplicate; 402, 429, 503, 507 (nothing stored), 413, 415, 422 otherwise. The same path
/// as the upload page's server function ([`upload::upload`]).
#[utoipa::path(
    post,
    path = "/api/v1/jobs",
    tag = "jobs",
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200, pattern = r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
        description = "Repeat an upload safely: the same key (1 to 200 visible ASCII characters) answers the first job (200) for 24 h")),
    responses(
        (status = 202, description = "Accepted and charged; `Location` is the job's status URL", body = app::model::UploadReply,
            headers(("Location" = String, description = "The job's status URL"))),
        (status = 200, description = "A repeated Idempotency-Key: the earlier job, not charged again", body = app::model::UploadReply),
        (status = 402, description = "Out of credits (nothing stored)", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key names another upload", body = ErrorBody),
        (status = 413, description = "Too large: bytes, tokens or your storage quota (nothing stored)", body = ErrorBody),
        (status = 415, description = "Not a document type Sluice reads", body = ErrorBody),
        (status = 422, description = "A malformed form, preset or language", body = ErrorBody),
        (status = 429, description = "Too many documents or uploads in progress (Retry-After)", body = ErrorBody),
        (status = 507, description = "The document store is full (Retry-After): nothing stored or charged", body = ErrorBody),
        Common,
    )
)]
pub async fn create_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (user, token_id) = caller_and_token(&state, &headers, &session).await?;
    let client = client_of_request(&state, &request);
    let body = request.into_body().into_data_stream();
    let uploaded = upload::upload(&state.ctx, &user, token_id, &client, &headers, body).await?;
    Ok(accepted(uploaded))
}

/// `POST /api/v1/estimate`: what an upload of the same form would cost and when it should be
/// done, its file read through the same checks and not stored; nothing is charged. Refused as
/// the upload would be. The upload page asks it before the user confirms.
#[utoipa::path(
    post,
    path = "/api/v1/estimate",
    tag = "jobs",
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The price, the parts and the time; nothing stored or charged", body = app::model::Estimate),
        (status = 402, description = "Out of credits for it", body = ErrorBody),
        (status = 413, description = "Too large: bytes, tokens or your storage quota", body = ErrorBody),
        (status = 415, description = "Not a document type Sluice reads", body = ErrorBody),
        (status = 422, description = "A malformed form, preset or language", body = ErrorBody),
        (status = 429, description = "Too many documents or estimates in progress, or more than 60 estimates a minute (Retry-After)", body = ErrorBody),
        Common,
    )
)]
pub async fn estimate_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    request: Request,
) -> Result<Json<app::model::Estimate>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let body = request.into_body().into_data_stream();
    Ok(Json(upload::estimate(&state.ctx, &user, &headers, body).await?))
}

/// The address an upload is counted against (the proxy's client when trusted).
fn client_of_request(state: &AppState, request: &Request) -> String {
    match request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>() {
        Some(axum::extract::ConnectInfo(peer)) => {
            client_of(*peer, request.headers(), &state.ctx.settings.trusted_proxies)
        }
        None => "unknown".to_string(),
    }
}

/// 202 with `Location` for a new job; 200 with the earlier job for a duplicate.
fn accepted(uploaded: upload::Uploaded) -> Response {
    let status = if uploaded.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
    (status, [(header::LOCATION, uploaded.status_url())], Json(uploaded.reply())).into_response()
}

/// The body of `POST /api/v1/jobs/{id}/run-again` (all optional; its contract is
/// [`RunAgainBody`]).
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAgain {
    preset: Option<String>,
    language: Option<String>,
}

/// `POST /api/v1/jobs/{id}/run-again`: the same document as a new job and a new debit
/// (202 + `Location`), with another preset if given; 402/429/503 like an upload, 410 when the
/// document is no longer kept.
#[utoipa::path(
    post,
    path = "/api/v1/jobs/{id}/run-again",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    request_body(content = Option<RunAgainBody>, content_type = "application/json"),
    responses(
        (status = 202, description = "A new job for the same document, charged", body = app::model::UploadReply,
            headers(("Location" = String, description = "The new job's status URL"))),
        (status = 402, description = "Out of credits", body = ErrorBody),
        (status = 410, description = "The document is no longer kept", body = ErrorBody),
        (status = 422, description = "A body that does not decode, or an unknown preset or language", body = ErrorBody),
        (status = 429, description = "Too many documents in progress (Retry-After)", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn run_again(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: RunAgain = if body.is_empty() { RunAgain::default() } else { json_body(&body)? };
    let id = job.id.to_string();
    let again = upload::run_again(&state.ctx, &caller, &id, body.preset.as_deref(), body.language.as_deref()).await?;
    Ok(accepted(again))
}

/// `POST /api/v1/jobs/{id}/cancel`: 200 with the job as it is now (`canceled`, or still
/// `running` with `cancel_requested` until its next safe point); 409 once it has ended; another
/// user's job is 404.
#[utoipa::path(
    post,
    path = "/api/v1/jobs/{id}/cancel",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "Canceled, or `cancel_requested` while it reaches a safe point", body = JobStatus),
        (status = 409, description = "The job has already ended", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn cancel_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    Ok(Json(cancel_visible_job(&state.ctx, &user, &id).await?))
}

/// `GET /api/v1/jobs/{id}`: the job's state; 410 once its owner deleted it; another user's
/// job is 404.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The job as it is now", body = JobStatus),
        (status = 410, description = "Deleted by its owner", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_job(
    State(state): State<AppState>,
    VisibleJob(job, _): VisibleJob,
) -> Result<Json<JobStatus>, ApiError> {
    // Deleted is gone for the API (its credit line stays on the account page).
    if job.deleted_at.is_some() {
        return Err(AppError::Deleted.into());
    }
    Ok(Json(job_status(&state.ctx, &job).await?))
}

/// `DELETE /api/v1/jobs/{id}`: delete an ended job's document and result (the job stays as a
/// line of the credit history, `deleted: true`); 409 while it has not ended; another user's
/// job is 404.
#[utoipa::path(
    delete,
    path = "/api/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "Deleted: the document, result and file name are gone; the job stays", body = JobStatus),
        (status = 409, description = "The job has not ended: cancel it first", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn delete_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    Ok(Json(app::server::session::delete_own_job(&state.ctx, &user, &id).await?))
}

/// `GET /api/v1/jobs/{id}/result`: the result of a done job; 409 until then.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/result",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The result", body = ResultBody),
        (status = 409, description = "Not done (yet)", body = ErrorBody),
        (status = 410, description = "Deleted by its owner", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_result(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    let result = done_result(&job)?;
    audit_if_not_the_owner(&state, &caller, &job, "read_result").await?;
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
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/original",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The uploaded document, as an attachment", content(
            ("application/pdf"), ("application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
            ("application/vnd.oasis.opendocument.text"), ("text/markdown"), ("text/html"), ("text/plain"),
            ("image/png"), ("image/jpeg"), ("image/tiff"),
        )),
        (status = 410, description = "The document is no longer kept, or was deleted by its owner", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_original(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    if job.deleted_at.is_some() {
        return Err(AppError::Deleted.into());
    }
    let document = document_of(&job)?;
    audit_if_not_the_owner(&state, &caller, &job, "download_original").await?;
    // Streamed from storage: memory per download is a chunk, not the document.
    let chunks = state.ctx.blobs.stream(&document.key).await?;
    let stem = document.name.clone().unwrap_or_else(|| format!("document.{}", document.doc_type.extension()));
    Ok(download(document.doc_type.mime(), &stem, Body::from_stream(RateFloor::new(chunks))))
}

/// `GET /api/v1/jobs/{id}/result.md`: a done job's result as a Markdown attachment.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/result.md",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The result as a Markdown attachment", content_type = "text/markdown"),
        (status = 409, description = "Not done (yet)", body = ErrorBody),
        (status = 410, description = "Deleted by its owner", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_result_markdown(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    let markdown = done_result(&job)?["markdown"].as_str().unwrap_or_default().to_string();
    audit_if_not_the_owner(&state, &caller, &job, "read_result").await?;
    let stem = name_stem(document_of(&job).ok().and_then(|d| d.name));
    Ok(download("text/markdown; charset=utf-8", &format!("{stem}-result.md"), markdown.into_bytes()))
}

/// `GET /api/v1/jobs/{id}/translated`: a done translation of a Word or OpenDocument file as a
/// file of the same format, every paragraph's text translated in place (rebuilt once, in the
/// sandboxed reader from the original and the translation, kept in the document store beside
/// the original and streamed from there; gone with the job).
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/translated",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The translated document, in its own format, as an attachment", content(
            ("application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
            ("application/vnd.oasis.opendocument.text"),
            ("text/html"),
        )),
        (status = 409, description = "Not done (yet), not a translation of a Word or OpenDocument file or a web page, or its translation's paragraphs do not line up with the document's", body = ErrorBody),
        (status = 410, description = "Deleted by its owner, or the original is no longer kept", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_translated_file(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    let result = done_result(&job)?;
    let spec = serde_json::from_value::<DocumentJob>(job.payload.clone()).map_err(|_| ApiError(AppError::NotFound))?;
    if spec.translated_file_type().is_none() {
        let message =
            "only a translation of a Word or OpenDocument file or a web page comes back in its format; download the Markdown";
        return Err(AppError::CannotDownload { message: message.into() }.into());
    }
    let document = spec.document;
    audit_if_not_the_owner(&state, &caller, &job, "download_translated").await?;
    let name = format!("{}-translated.{}", name_stem(document.name.clone()), document.doc_type.extension());
    let key = engine::documents::Blobs::translated_key(job.id);
    if !state.ctx.blobs.exists(&key).await? {
        refused_before(&state, job.id).await?;
        build_translated_file(&state, &job, &document, &result, &key).await?;
    }
    // Streamed from storage, held to the download rate floor: a slow reader holds a chunk,
    // not the file, and not for hours.
    let chunks = state.ctx.blobs.stream(&key).await?;
    Ok(download(document.doc_type.mime(), &name, Body::from_stream(RateFloor::new(chunks))))
}

/// Rebuild a done translation's file in the sandboxed reader and keep it under `key`: once per
/// job (a download after the first streams what is kept), a few at once per process, the
/// rest told to come back before their document is read.
async fn build_translated_file(
    state: &AppState,
    job: &JobView,
    document: &DocumentRef,
    result: &serde_json::Value,
    key: &str,
) -> Result<(), ApiError> {
    let reader = state.ctx.settings.document_reader.clone().ok_or_else(AppError::unavailable)?;
    // Taken before the document is read into memory: a flood of first downloads waits outside.
    let _turn = state.ctx.rebuilds.clone().try_acquire_owned().map_err(|_| AppError::Busy { retry_after_secs: 5 })?;
    if state.ctx.blobs.exists(key).await? {
        return Ok(()); // built while this request waited for its turn
    }
    let original = match state.ctx.blobs.get(&document.key).await {
        Ok(bytes) => bytes,
        Err(engine::EngineError::NotFound) => return Err(AppError::Gone.into()),
        Err(e) => return Err(AppError::from(e).into()),
    };
    // The tagged text, where the translation kept inline formatting: its runs are rebuilt.
    let paragraphs: Vec<String> = result["tagged"]
        .as_str()
        .or(result["markdown"].as_str())
        .unwrap_or_default()
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(str::to_string)
        .collect();
    let built = engine::documents::sandbox::rebuild_in_child(&reader, document.doc_type, original, &paragraphs).await;
    let file = match built {
        Ok(file) => file,
        Err(e) if e.class == engine::queue::policy::retry::ErrorClass::InvalidInput => {
            // The same document and translation give the same answer: kept, not read again.
            let refusal = engine::documents::Blobs::translated_refusal_key(job.id);
            state.ctx.blobs.put(&refusal, e.message.clone().into_bytes().into()).await?;
            return Err(AppError::CannotDownload { message: e.message }.into());
        }
        Err(_) => return Err(AppError::Internal.into()),
    };
    tracing::debug!(job = %job.id, bytes = file.len(), "translated file built and kept");
    state.ctx.blobs.put(key, file.into()).await?;
    // Deleted (or pruned) while it was built: its deletion may have run before the file was
    // there, so the file goes now.
    let still_kept: Option<bool> = sqlx::query_scalar("SELECT deleted_at IS NULL FROM jobs WHERE id = $1")
        .bind(job.id)
        .fetch_optional(&state.ctx.pool)
        .await
        .map_err(engine::EngineError::from)?;
    if still_kept != Some(true) {
        engine::documents::sweep::forget_translated_file(&state.ctx.blobs, job.id).await?;
        return Err(AppError::Gone.into());
    }
    Ok(())
}

/// A translated file that could not be built before answers the same, without reading its
/// document again.
async fn refused_before(state: &AppState, job: uuid::Uuid) -> Result<(), ApiError> {
    match state.ctx.blobs.get(&engine::documents::Blobs::translated_refusal_key(job)).await {
        Ok(reason) => {
            let message = String::from_utf8_lossy(&reason).into_owned();
            Err(AppError::CannotDownload { message }.into())
        }
        Err(engine::EngineError::NotFound) => Ok(()),
        Err(e) => Err(AppError::from(e).into()),
    }
}

/// A download's body held to the uploads' rate floor (`app::server::upload::too_slow`): once
/// it has run a minute, a client that has taken less than 10 KB a second on average is cut
/// off. Judged when the client makes room for the next chunk; a client that takes nothing
/// at all is cut off by the connection's own stall bound (`serve.rs`).
struct RateFloor<S> {
    inner: S,
    started: std::time::Instant,
    sent: u64,
}

impl<S> RateFloor<S> {
    fn new(inner: S) -> Self {
        RateFloor::started_at(inner, std::time::Instant::now())
    }

    fn started_at(inner: S, started: std::time::Instant) -> Self {
        RateFloor { inner, started, sent: 0 }
    }
}

impl<S> futures::Stream for RateFloor<S>
where
    S: futures::Stream<Item = Result<Bytes, engine::EngineError>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if upload::too_slow(self.sent, self.started.elapsed()) {
            let slow = std::io::Error::new(std::io::ErrorKind::TimedOut, "the client takes the download too slowly");
            return Poll::Ready(Some(Err(slow)));
        }
        match std::pin::Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                self.sent += chunk.len() as u64;
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(std::io::Error::other(e.to_string())))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// `GET /api/v1/jobs/{id}/parts.md`: what is answered so far of a document done in parts, as
/// a Markdown attachment: while the rest runs (a translation's first chapters), or after it
/// failed (until its replay window ends), each part not done marked in its place.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/parts.md",
    tag = "jobs",
    params(("id" = String, Path, description = JOB_ID)),
    responses(
        (status = 200, description = "The parts answered so far, in order, as a Markdown attachment", content_type = "text/markdown"),
        (status = 409, description = "Not done in parts, no part answered yet, or refunded in full", body = ErrorBody),
        (status = 410, description = "Deleted by its owner", body = ErrorBody),
        NotYours,
        Common,
    )
)]
pub async fn get_parts_so_far(
    State(state): State<AppState>,
    VisibleJob(job, caller): VisibleJob,
) -> Result<Response, ApiError> {
    if job.deleted_at.is_some() {
        return Err(AppError::Deleted.into());
    }
    audit_if_not_the_owner(&state, &caller, &job, "read_parts").await?;
    let so_far = engine::queue::parts::answered_so_far(&state.ctx.pool, job.id).await?;
    if so_far.answered.is_empty() {
        let why = if so_far.total == 0 { "it is not done in parts" } else { "no part is done yet" };
        return Err(AppError::CannotDownload { message: format!("nothing to download: {why}") }.into());
    }
    // Parts the owner reads are paid for: a failure after this keeps their share, even one
    // that is ours. Staff reading a user's parts (audited above) charge the owner nothing.
    let served = if caller.id == job.owner_id {
        engine::queue::parts::mark_parts_read(&state.ctx.pool, job.id).await?
    } else {
        engine::settlement::answered_parts_served(i64::from(job.cost), job.refunded)
    };
    if !served {
        let message = "nothing to download: the document was refunded in full, so its parts are not served".into();
        return Err(AppError::CannotDownload { message }.into());
    }
    let stem = name_stem(document_of(&job).ok().and_then(|d| d.name));
    Ok(download("text/markdown; charset=utf-8", &format!("{stem}-parts-so-far.md"), so_far.markdown().into_bytes()))
}

/// Staff opening a user's document (to see why it failed, or its translated file) is on the
/// record, and only a role that may open documents can: support sees the job, not its text.
async fn audit_if_not_the_owner(state: &AppState, caller: &User, job: &JobView, action: &str) -> Result<(), ApiError> {
    if caller.id != job.owner_id {
        if !caller.may(engine::accounts::users::Permission::OpenDocuments) {
            return Err(AppError::NotFound.into());
        }
        let mut conn = state.ctx.pool.acquire().await.map_err(engine::EngineError::from)?;
        let subject = format!("job {}", job.id);
        engine::audit::audit(&mut conn, &caller.email, action, Some(&subject), job.state.as_str(), "").await?;
    }
    Ok(())
}

/// A download's name without its extension: the user's file name's, or "document".
fn name_stem(name: Option<String>) -> String {
    let name = name.unwrap_or_else(|| "document".into());
    name.rsplit_once('.').map(|(stem, _)| stem.to_string()).unwrap_or(name)
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
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    #[schema(schema_with = callback_url)]
    url: String,
}

/// `PUT /api/v1/webhook`: register (or replace) the calling token's completion callback. The
/// answer holds the signing secret, shown this once (a new PUT makes a new one).
#[utoipa::path(
    put,
    path = "/api/v1/webhook",
    tag = "webhook",
    request_body = WebhookRequest,
    responses(
        (status = 200, description = "Registered; the signing secret is shown this once", body = engine::webhooks::completion::Registered),
        (status = 422, description = "A body that does not decode, a URL Sluice may not call, or a call without a token", body = ErrorBody),
        Common,
    )
)]
pub async fn put_webhook(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (user, token_id) = calling_token(&state, &headers, &session).await?;
    let request: WebhookRequest = json_body(&body)?;
    let policy = &state.ctx.settings.webhook_policy;
    let registered =
        engine::webhooks::completion::register(&state.ctx.pool, policy, user.id, token_id, &request.url).await?;
    Ok(Json(registered).into_response())
}

/// `DELETE /api/v1/webhook`: the calling token's job endings are no longer sent.
#[utoipa::path(
    delete,
    path = "/api/v1/webhook",
    tag = "webhook",
    responses(
        (status = 204, description = "Job endings are no longer sent"),
        (status = 422, description = "Called without a token", body = ErrorBody),
        Common,
    )
)]
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
    use super::{attachment, RateFloor};
    use futures::StreamExt;

    #[tokio::test]
    async fn a_download_taken_below_the_floor_is_cut_off_and_one_above_it_is_not() {
        let chunks = |n: usize| futures::stream::iter((0..n).map(|_| Ok(axum::body::Bytes::from(vec![0u8; 100_000]))));
        let two_minutes_ago = std::time::Instant::now() - std::time::Duration::from_secs(120);
        // Two minutes in with nothing taken: 1.2 MB was owed, so the next chunk is refused.
        let mut slow = RateFloor::started_at(chunks(20), two_minutes_ago);
        let refused = slow.next().await.expect("an answer").expect_err("cut off");
        assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut);
        // Past the floor (2 MB sent in those two minutes), it goes on.
        let mut fast = RateFloor::started_at(chunks(20), two_minutes_ago);
        fast.sent = 2_000_000;
        assert!(fast.next().await.expect("an answer").is_ok());
        let fresh = RateFloor::new(chunks(20));
        let all: Vec<_> = fresh.collect().await;
        assert!(all.iter().all(Result::is_ok), "a minute's grace, and a fast client, are never cut off");
    }

    #[test]
    fn attachment_names_are_ascii_and_quoted_safely() {
        assert_eq!(attachment("re\"port\r\n.pdf"), "attachment; filename=\"re_port__.pdf\"");
        assert_eq!(attachment("Grüße.md"), "attachment; filename=\"Gr__e.md\"");
    }
}
