//! The REST API for programs (and the browser's uploads): the same engine path and status
//! codes as the UI. Auth: `Authorization: Bearer <token>`, or the session cookie.

use axum::body::Bytes;
use axum::extract::{Multipart, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use tower_sessions::Session;

use app::errors::AppError;
use app::handlers::{session_user, visible_job};
use app::model::JobStatus;
use engine::accounts::User;
use engine::admission::{self, Admission, Submission};

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

/// An upload read from the multipart body: never buffered whole beyond the cap, hashed as it
/// streams.
struct Upload {
    name: Option<String>,
    size: u64,
    sha256: String,
    preset: String,
}

const PRESETS: [&str; 4] = ["summarize", "explain", "translate", "key_facts"];

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

async fn read_upload(mut multipart: Multipart, limit: u64) -> Result<Upload, ApiError> {
    let bad = |m: &str| ApiError(AppError::invalid(m));
    let mut file: Option<(Option<String>, u64, String)> = None;
    let mut preset = "summarize".to_string();
    while let Some(field) = multipart.next_field().await.map_err(|e| bad(&format!("malformed multipart body: {e}")))? {
        match field.name() {
            Some("file") => {
                let name = field.file_name().map(display_name);
                let mut hasher = Sha256::new();
                let mut size = 0u64;
                let mut stream = field.map_err(|e| e.to_string());
                while let Some(chunk) =
                    stream.try_next().await.map_err(|e| bad(&format!("the upload broke off: {e}")))?
                {
                    let chunk: Bytes = chunk;
                    size += chunk.len() as u64;
                    if size > limit {
                        return Err(ApiError(AppError::TooLarge { limit_bytes: limit }));
                    }
                    hasher.update(&chunk);
                }
                file = Some((name, size, hex::encode(hasher.finalize())));
            }
            Some("preset") => {
                let value = field.text().await.map_err(|e| bad(&e.to_string()))?;
                if !PRESETS.contains(&value.as_str()) {
                    return Err(bad(&format!("unknown preset {value:?}; use one of {}", PRESETS.join(", "))));
                }
                preset = value;
            }
            _ => {}
        }
    }
    let (name, size, sha256) = file.ok_or_else(|| bad("the form needs a `file` field"))?;
    if size == 0 {
        return Err(bad("the file is empty"));
    }
    Ok(Upload { name, size, sha256, preset })
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
    let upload = read_upload(multipart, state.ctx.settings.max_upload_bytes).await?;
    let content_key = format!("{}:{}", upload.sha256, upload.preset);
    let submission = Submission {
        user_id: user.id,
        payload: serde_json::json!({
            "document": { "sha256": upload.sha256, "size": upload.size, "name": upload.name },
            "preset": upload.preset,
        }),
        fingerprint: content_key.clone(),
        content_key,
        client_key,
    };
    let (status, job_id, duplicate) =
        match admission::submit(&state.ctx.pool, &state.ctx.settings.admission, &submission).await? {
            Admission::Accepted { job_id } => (StatusCode::ACCEPTED, job_id, false),
            Admission::Existing { job_id } => (StatusCode::OK, job_id, true),
            Admission::Refused(refusal) => return Err(AppError::from(refusal).into()),
        };
    let location = job_location(&job_id);
    let body = serde_json::json!({ "id": job_id.to_string(), "status_url": location, "duplicate": duplicate });
    Ok((status, [(header::LOCATION, location)], Json(body)).into_response())
}

/// `GET /api/v1/jobs/{id}`: the job's state; another user's job is 404.
pub async fn get_job(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let job = visible_job(&state.ctx.pool, &user, &id).await?;
    Ok(Json(JobStatus::from(&job)))
}

/// `GET /api/v1/jobs/{id}/result`: the result of a done job; 409 until then.
pub async fn get_result(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let job = visible_job(&state.ctx.pool, &user, &id).await?;
    match (job.state, job.result) {
        (engine::queue::JobState::Done, Some(result)) => Ok((
            [(header::X_CONTENT_TYPE_OPTIONS, "nosniff")],
            Json(serde_json::json!({ "id": job.id.to_string(), "result": result })),
        )
            .into_response()),
        (state, _) => {
            let state =
                serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            Err(AppError::NotReady { state }.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::display_name;

    #[test]
    fn file_names_are_display_text_only() {
        assert_eq!(display_name("../../etc/passwd"), "passwd");
        assert_eq!(display_name("C:\\Users\\me\\report.pdf"), "report.pdf");
        assert_eq!(display_name("a\u{0}b\nc.pdf"), "abc.pdf");
        assert_eq!(display_name("   "), "document");
    }
}
