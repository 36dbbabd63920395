//! The REST API for programs (and the browser's uploads): the same engine path and status
//! codes as the UI. Auth: `Authorization: Bearer <token>`, or the session cookie. This module
//! only speaks HTTP: upload checks, storage and admission are the engine's intake.

use axum::body::Body;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Multipart, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use tower_sessions::Session;

use app::errors::AppError;
use app::model::JobStatus;
use app::server::session::{job_status, session_user, visible_job};
use axum::extract::multipart::Field;
use engine::accounts::admission::{self, Admission};
use engine::accounts::User;
use engine::documents::intake::{self, Intake, StoredUpload, UploadOptions};
use engine::documents::processor::{DocumentJob, DocumentRef};
use engine::documents::Blobs;
use engine::queue::JobView;
use engine::{JobState, Preset};

use super::error::ApiError;
use super::AppState;

/// The caller from a bearer token or the session; 401 otherwise.
async fn caller(state: &AppState, headers: &HeaderMap, session: &Session) -> Result<User, ApiError> {
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        let token = auth.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).ok_or(AppError::Unauthenticated)?;
        return engine::accounts::tokens::authenticate(&state.ctx.pool, token.trim())
            .await?
            .ok_or(ApiError(AppError::Unauthenticated));
    }
    session_user(&state.ctx.pool, session).await?.ok_or(ApiError(AppError::Unauthenticated))
}

/// The job named in the path, when the caller may see it (their own; admins any). Anyone
/// else's job, or a malformed id, is 404.
pub struct VisibleJob(pub JobView);

impl FromRequestParts<AppState> for VisibleJob {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Path(id) =
            Path::<String>::from_request_parts(parts, state).await.map_err(|_| ApiError(AppError::NotFound))?;
        let session = Session::from_request_parts(parts, state).await.map_err(|_| ApiError(AppError::Internal))?;
        let user = caller(state, &parts.headers, &session).await?;
        Ok(VisibleJob(visible_job(&state.ctx.pool, &user, &id).await?))
    }
}

/// A done job's result, or 409 saying what state the job is in.
fn done_result(job: &JobView) -> Result<&serde_json::Value, ApiError> {
    match (&job.state, &job.result) {
        (JobState::Done, Some(result)) => Ok(result),
        (state, _) => Err(AppError::NotReady { state: state.as_str().to_string() }.into()),
    }
}

/// The multipart parser (multer) pulls everything the connection has ready into its buffer
/// each time it is polled; when the network is faster than storage, that buffer would grow
/// towards the whole file. Handing it one chunk per poll keeps it to a chunk.
///
/// It also bounds what the parser may buffer outside a field's data (the preamble and part
/// headers, where it looks for a boundary): past [`MAX_OUTSIDE_FIELDS`] bytes the body fails.
struct OneChunkPerPoll<S> {
    inner: S,
    just_yielded: bool,
    /// Set while a field's data is being read (see [`FieldGate`]).
    in_field: Arc<AtomicBool>,
    /// Bytes handed over since the last field data.
    outside: usize,
}

/// Bytes handed to the parser while no field's data is being read: the preamble, boundaries
/// and part headers, plus the start of a field's data that arrives in the same network chunk
/// (a chunk can be a few hundred KiB). What the parser may buffer looking for a boundary.
const MAX_OUTSIDE_FIELDS: usize = 4 << 20;

/// Marks the stretch where a field's data is read, so the pacing wrapper counts the rest.
#[derive(Clone)]
struct FieldGate(Arc<AtomicBool>);

impl FieldGate {
    async fn reading<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        self.0.store(true, Ordering::Relaxed);
        let out = work.await;
        self.0.store(false, Ordering::Relaxed);
        out
    }
}

impl<S, E> Stream for OneChunkPerPoll<S>
where
    S: Stream<Item = Result<axum::body::Bytes, E>> + Unpin,
    E: Into<axum::BoxError>,
{
    type Item = Result<axum::body::Bytes, axum::BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.just_yielded {
            self.just_yielded = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        self.just_yielded = next.is_ready();
        match next {
            Poll::Ready(Some(Ok(chunk))) => {
                if self.in_field.load(Ordering::Relaxed) {
                    self.outside = 0;
                } else {
                    self.outside += chunk.len();
                    if self.outside > MAX_OUTSIDE_FIELDS {
                        return Poll::Ready(Some(Err("too much data outside the form's fields".into())));
                    }
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            other => other.map(|_| None),
        }
    }
}

/// The request's multipart body, fed to the parser a chunk at a time, and the gate that
/// tells the pacing which bytes are field data.
async fn paced_multipart(request: Request, state: &AppState) -> Result<(Multipart, FieldGate), ApiError> {
    let (parts, body) = request.into_parts();
    let gate = FieldGate(Arc::new(AtomicBool::new(false)));
    let paced =
        OneChunkPerPoll { inner: body.into_data_stream(), just_yielded: false, in_field: gate.0.clone(), outside: 0 };
    let request = Request::from_parts(parts, Body::from_stream(paced));
    let multipart =
        Multipart::from_request(request, state).await.map_err(|e| invalid(format!("malformed multipart body: {e}")))?;
    Ok((multipart, gate))
}

/// A field's chunks, each within `idle` of the last: a client that stops sending loses its
/// slot instead of holding it.
fn with_idle_timeout(field: Field<'_>, idle: Duration) -> impl Stream<Item = Result<axum::body::Bytes, String>> + '_ {
    Box::pin(futures::stream::unfold(Some(field), move |field| async move {
        let mut field = field?;
        match tokio::time::timeout(idle, field.chunk()).await {
            Ok(Ok(Some(chunk))) => Some((Ok(chunk), Some(field))),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(e.to_string()), None)),
            Err(_) => Some((Err(format!("nothing arrived for {} s", idle.as_secs())), None)),
        }
    }))
}

/// The longest a client may pause while sending a file.
const UPLOAD_IDLE: Duration = Duration::from_secs(30);
/// The longest one upload may take in all (50 MiB at under 100 KB/s is not a client we serve).
const UPLOAD_DEADLINE: Duration = Duration::from_secs(600);

/// Side fields (`preset`, `language`) are short words: longer ones are refused unread.
const MAX_FIELD_BYTES: usize = 200;
/// A form is a file and two options; a form with more parts is refused.
const MAX_PARTS: usize = 8;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError(AppError::invalid(message))
}

/// A side field's text, read up to [`MAX_FIELD_BYTES`].
async fn read_short_field(field: Field<'_>) -> Result<String, ApiError> {
    let name = field.name().unwrap_or("").to_string();
    let mut chunks = with_idle_timeout(field, UPLOAD_IDLE);
    let mut value = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| invalid(format!("the upload broke off: {e}")))?;
        if value.len() + chunk.len() > MAX_FIELD_BYTES {
            return Err(invalid(format!("the `{name}` field is too long")));
        }
        value.extend_from_slice(&chunk);
    }
    String::from_utf8(value).map_err(|_| invalid(format!("the `{name}` field is not UTF-8")))
}

/// Read the form: the file streams through the engine's checks into blob storage, the options
/// are short words. Unknown or surplus parts are refused. If anything is wrong after the file
/// was stored, its blob is deleted again.
async fn read_upload(
    (mut multipart, gate): (Multipart, FieldGate),
    blobs: &Blobs,
    limit: u64,
    presets: &[Preset],
) -> Result<(StoredUpload, UploadOptions), ApiError> {
    let mut stored: Option<StoredUpload> = None;
    let mut options = UploadOptions::default();
    let read = async {
        let mut parts = 0;
        while let Some(field) =
            multipart.next_field().await.map_err(|e| invalid(format!("malformed multipart body: {e}")))?
        {
            parts += 1;
            if parts > MAX_PARTS {
                return Err(invalid("the form has too many parts"));
            }
            match field.name() {
                Some("file") if stored.is_none() => {
                    let name = field.file_name().map(str::to_string);
                    let chunks = with_idle_timeout(field, UPLOAD_IDLE);
                    stored = Some(gate.reading(intake::receive(blobs, name.as_deref(), limit, chunks)).await?);
                }
                Some("file") => return Err(invalid("send one file per upload")),
                Some("preset") => {
                    options.preset = intake::parse_preset(&gate.reading(read_short_field(field)).await?)?;
                }
                Some("language") => {
                    options.language = intake::parse_language(&gate.reading(read_short_field(field)).await?)?;
                }
                other => {
                    let name = other.unwrap_or("").chars().take(40).collect::<String>();
                    return Err(invalid(format!("unknown form field {name:?}; send `file`, `preset` and `language`")));
                }
            }
        }
        options.check(presets)?;
        Ok::<_, ApiError>(())
    }
    .await;
    match (read, stored) {
        (Ok(()), Some(stored)) => Ok((stored, options)),
        (Ok(()), None) => Err(invalid("the form needs a `file` field")),
        (Err(e), stored) => {
            if let Some(stored) = stored {
                let _ = blobs.delete(&stored.key).await;
            }
            Err(e)
        }
    }
}

fn job_location(id: &uuid::Uuid) -> String {
    format!("/api/v1/jobs/{id}")
}

/// `POST /api/v1/jobs`: 202 with `Location` once the job is committed; 200 with the earlier
/// job for a duplicate; 402, 429, 503 (nothing stored), 413, 422 otherwise.
pub async fn create_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let client_key = match headers.get("idempotency-key") {
        Some(v) => {
            let key = v.to_str().map_err(|_| AppError::invalid("the Idempotency-Key must be visible ASCII"))?.trim();
            if key.is_empty() || key.len() > 200 {
                return Err(AppError::invalid("the Idempotency-Key must have 1 to 200 characters").into());
            }
            Some(key.to_string())
        }
        None => None,
    };
    let ctx = &state.ctx;
    let settings = &ctx.settings;
    // One user's uploads at once are bounded too, so one account cannot take every slot: an
    // upload past it waits its turn (unread) like any other, then gets 429.
    let waiting_since = tokio::time::Instant::now();
    let _mine = loop {
        if let Some(mine) = ctx.begin_upload(user.id) {
            break mine;
        }
        if waiting_since.elapsed() >= settings.busy_uploads_wait {
            return Err(AppError::TooManyUploads {
                limit: settings.max_uploads_per_user,
                retry_after_secs: settings.busy_uploads_wait.as_secs().max(1),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Uploads read at once are bounded: a request waits a little for its turn (reading
    // nothing meanwhile), then gets 503.
    let slot = tokio::time::timeout(settings.busy_uploads_wait, ctx.uploads.clone().acquire_owned()).await;
    let Ok(Ok(_slot)) = slot else {
        return Err(AppError::Overloaded { retry_after_secs: settings.busy_uploads_wait.as_secs().max(1) }.into());
    };
    // Refuse before reading the file: a refused upload costs its headers, nothing more.
    let retried = match &client_key {
        Some(key) => admission::client_key_used(&ctx.pool, user.id, key).await?,
        None => false,
    };
    if !retried {
        if let Some(refusal) = admission::precheck(&ctx.pool, &settings.admission, user.id).await? {
            return Err(AppError::from(refusal).into());
        }
    }
    let form = paced_multipart(request, &state).await?;
    let reading = read_upload(form, &ctx.blobs, settings.max_upload_bytes, &settings.presets);
    let (stored, options) = tokio::time::timeout(UPLOAD_DEADLINE, reading)
        .await
        .map_err(|_| invalid("the upload took too long; try again on a faster connection"))??;
    let submission = Intake { user_id: user.id, stored, options, client_key, admission: &settings.admission };
    let admitted = intake::submit(&ctx.pool, &ctx.blobs, submission).await;
    let (status, job_id, duplicate) = match admitted? {
        Admission::Accepted { job_id } => (StatusCode::ACCEPTED, job_id, false),
        Admission::Existing { job_id } => (StatusCode::OK, job_id, true),
        Admission::Refused(refusal) => return Err(AppError::from(refusal).into()),
    };
    let location = job_location(&job_id);
    let body = serde_json::json!({ "id": job_id.to_string(), "status_url": location, "duplicate": duplicate });
    Ok((status, [(header::LOCATION, location)], Json(body)).into_response())
}

/// `GET /api/v1/jobs/{id}`: the job's state; another user's job is 404.
pub async fn get_job(State(state): State<AppState>, VisibleJob(job): VisibleJob) -> Result<Json<JobStatus>, ApiError> {
    Ok(Json(job_status(&state.ctx.pool, &job).await?))
}

/// `GET /api/v1/jobs/{id}/result`: the result of a done job; 409 until then.
pub async fn get_result(VisibleJob(job): VisibleJob) -> Result<Response, ApiError> {
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
pub async fn get_original(State(state): State<AppState>, VisibleJob(job): VisibleJob) -> Result<Response, ApiError> {
    let document = document_of(&job)?;
    // Streamed from storage: memory per download is a chunk, not the document.
    let chunks = state.ctx.blobs.stream(&document.key).await?;
    let stem = document.name.clone().unwrap_or_else(|| format!("document.{}", document.doc_type.extension()));
    Ok(download(document.doc_type.mime(), &stem, Body::from_stream(chunks)))
}

/// `GET /api/v1/jobs/{id}/result.md`: a done job's result as a Markdown attachment.
pub async fn get_result_markdown(VisibleJob(job): VisibleJob) -> Result<Response, ApiError> {
    let markdown = done_result(&job)?["markdown"].as_str().unwrap_or_default().to_string();
    let stem = document_of(&job).ok().and_then(|d| d.name).unwrap_or_else(|| "document".into());
    let stem = stem.rsplit_once('.').map(|(s, _)| s.to_string()).unwrap_or(stem);
    Ok(download("text/markdown; charset=utf-8", &format!("{stem}-result.md"), markdown.into_bytes()))
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
