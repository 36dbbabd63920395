//! The REST API for programs (and the browser's uploads): the same engine path and status
//! codes as the UI. Auth: `Authorization: Bearer <token>`, or the session cookie.

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Multipart, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sha2::{Digest, Sha256};
use tower_sessions::Session;

use app::errors::AppError;
use app::handlers::{session_user, visible_job};
use app::model::JobStatus;
use engine::accounts::User;
use engine::admission::{self, Admission, Submission};
use engine::blobs::Blobs;
use engine::documents::{sniff, DocType, Utf8Stream, SNIFF_BYTES};
use engine::processing::{DocumentJob, DocumentRef};
use engine::providers::Preset;

use crate::AppState;

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

/// The caller from a bearer token or the session; 401 otherwise.
async fn caller(state: &AppState, headers: &HeaderMap, session: &Session) -> Result<User, ApiError> {
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        let token = auth.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).ok_or(AppError::Unauthenticated)?;
        return engine::tokens::authenticate(&state.ctx.pool, token.trim())
            .await?
            .ok_or(ApiError(AppError::Unauthenticated));
    }
    session_user(&state.ctx.pool, session).await?.ok_or(ApiError(AppError::Unauthenticated))
}

/// The job named in the path, when the caller may see it (their own; admins any). Anyone
/// else's job, or a malformed id, is 404.
pub struct VisibleJob(pub engine::queue::JobView);

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
fn done_result(job: &engine::queue::JobView) -> Result<&serde_json::Value, ApiError> {
    match (&job.state, &job.result) {
        (engine::queue::JobState::Done, Some(result)) => Ok(result),
        (state, _) => Err(AppError::NotReady { state: state.as_str().to_string() }.into()),
    }
}

/// An upload read from the multipart body: checked while it streams (size cap, type by
/// content, UTF-8 for text), hashed, and only then stored under a server-generated key.
struct Upload {
    name: Option<String>,
    size: u64,
    sha256: String,
    doc_type: DocType,
    preset: Preset,
    language: Option<String>,
    chunks: Vec<Bytes>,
}

/// Keep a user's file name only as display text: no paths, no control characters, short.
fn display_name(raw: &str) -> String {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    if clean.trim().is_empty() {
        "document".into()
    } else {
        clean.trim().to_string()
    }
}

fn unsupported(reason: String) -> ApiError {
    ApiError(AppError::UnsupportedType { message: reason })
}

async fn read_file_field(mut field: axum::extract::multipart::Field<'_>, limit: u64) -> Result<Upload, ApiError> {
    let bad = |m: String| ApiError(AppError::invalid(m));
    let name = field.file_name().map(display_name);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut head: Vec<u8> = Vec::new();
    let mut doc_type: Option<DocType> = None;
    let mut utf8 = Utf8Stream::default();
    loop {
        let chunk = field.chunk().await.map_err(|e| bad(format!("the upload broke off: {e}")))?;
        let done = chunk.is_none();
        if let Some(chunk) = chunk {
            size += chunk.len() as u64;
            if size > limit {
                return Err(ApiError(AppError::TooLarge { limit_bytes: limit }));
            }
            hasher.update(&chunk);
            if doc_type.is_none() && head.len() < SNIFF_BYTES {
                head.extend_from_slice(&chunk[..chunk.len().min(SNIFF_BYTES - head.len())]);
            }
            chunks.push(chunk);
        }
        // Decide the type as soon as enough is here; refuse before reading on.
        if doc_type.is_none() && (head.len() >= SNIFF_BYTES || done) && !head.is_empty() {
            let decided = sniff(&head).map_err(unsupported)?;
            if decided != DocType::Pdf {
                for c in &chunks {
                    utf8.push(c).map_err(unsupported)?;
                }
            }
            doc_type = Some(decided);
        } else if let (Some(t), Some(last)) = (doc_type, chunks.last()) {
            if t != DocType::Pdf && !done {
                utf8.push(last).map_err(unsupported)?;
            }
        }
        if done {
            break;
        }
    }
    if size == 0 {
        return Err(bad("the file is empty".into()));
    }
    let doc_type = doc_type.expect("decided once bytes arrived");
    if doc_type != DocType::Pdf {
        utf8.finish().map_err(unsupported)?;
    }
    Ok(Upload {
        name,
        size,
        sha256: hex::encode(hasher.finalize()),
        doc_type,
        preset: Preset::Summarize,
        language: None,
        chunks,
    })
}

async fn read_upload(mut multipart: Multipart, limit: u64, presets: &[Preset]) -> Result<Upload, ApiError> {
    let bad = |m: String| ApiError(AppError::invalid(m));
    let mut upload: Option<Upload> = None;
    let mut preset = Preset::Summarize;
    let mut language: Option<String> = None;
    while let Some(field) = multipart.next_field().await.map_err(|e| bad(format!("malformed multipart body: {e}")))? {
        match field.name() {
            Some("file") if upload.is_none() => upload = Some(read_file_field(field, limit).await?),
            Some("preset") => {
                let value = field.text().await.map_err(|e| bad(e.to_string()))?;
                preset = Preset::parse(value.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Preset::ALL.iter().map(|p| p.as_str()).collect();
                    bad(format!("unknown preset {value:?}; use one of {}", names.join(", ")))
                })?;
            }
            Some("language") => {
                let value = field.text().await.map_err(|e| bad(e.to_string()))?;
                let value = value.trim();
                if value.chars().count() > 40 || value.chars().any(|c| c.is_control()) {
                    return Err(bad("the language should be a name like \"German\"".into()));
                }
                language = (!value.is_empty()).then(|| value.to_string());
            }
            _ => {}
        }
    }
    let mut upload = upload.ok_or_else(|| bad("the form needs a `file` field".into()))?;
    if !presets.contains(&preset) {
        return Err(bad(format!("\"{}\" needs a language model, and this server has none configured", preset.label())));
    }
    if preset == Preset::Translate && language.is_none() {
        return Err(bad("say which language to translate into".into()));
    }
    upload.preset = preset;
    upload.language = language;
    Ok(upload)
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
    multipart: Multipart,
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
    let settings = &state.ctx.settings;
    let upload = read_upload(multipart, settings.max_upload_bytes, &settings.presets).await?;
    let content_key =
        format!("{}:{}:{}", upload.sha256, upload.preset.as_str(), upload.language.as_deref().unwrap_or(""));
    let key = Blobs::new_key();
    let payload = serde_json::to_value(DocumentJob {
        document: DocumentRef {
            key: key.clone(),
            doc_type: upload.doc_type,
            sha256: upload.sha256.clone(),
            size: upload.size,
            name: upload.name.clone(),
        },
        preset: upload.preset,
        language: upload.language.clone(),
    })
    .map_err(|_| AppError::Internal)?;
    state.ctx.blobs.put_chunks(&key, upload.chunks).await?;
    let submission =
        Submission { user_id: user.id, payload, fingerprint: content_key.clone(), content_key, client_key };
    let admitted = admission::submit(&state.ctx.pool, &settings.admission, &submission).await;
    if !matches!(admitted, Ok(Admission::Accepted { .. })) {
        // Refused, failed or a duplicate: this upload's bytes are not needed.
        let _ = state.ctx.blobs.delete(&key).await;
    }
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
    Ok(Json(app::handlers::job_status(&state.ctx.pool, &job).await?))
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

fn download(content_type: &str, file_name: &str, body: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CONTENT_DISPOSITION, attachment(file_name)),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        body,
    )
        .into_response()
}

fn document_of(job: &engine::queue::JobView) -> Result<DocumentRef, ApiError> {
    serde_json::from_value::<DocumentJob>(job.payload.clone())
        .map(|d| d.document)
        .map_err(|_| ApiError(AppError::NotFound))
}

/// `GET /api/v1/jobs/{id}/original`: the uploaded document, as an attachment.
pub async fn get_original(State(state): State<AppState>, VisibleJob(job): VisibleJob) -> Result<Response, ApiError> {
    let document = document_of(&job)?;
    let bytes = state.ctx.blobs.get(&document.key).await?;
    let stem = document.name.clone().unwrap_or_else(|| format!("document.{}", document.doc_type.extension()));
    Ok(download(document.doc_type.mime(), &stem, bytes.to_vec()))
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
    use super::{attachment, display_name};

    #[test]
    fn attachment_names_are_ascii_and_quoted_safely() {
        assert_eq!(attachment("re\"port\r\n.pdf"), "attachment; filename=\"re_port__.pdf\"");
        assert_eq!(attachment("Grüße.md"), "attachment; filename=\"Gr__e.md\"");
    }

    #[test]
    fn file_names_are_display_text_only() {
        assert_eq!(display_name("../../etc/passwd"), "passwd");
        assert_eq!(display_name("C:\\Users\\me\\report.pdf"), "report.pdf");
        assert_eq!(display_name("a\u{0}b\nc.pdf"), "abc.pdf");
        assert_eq!(display_name("   "), "document");
    }
}
