//! `/api/v1/glossaries`: the caller's saved glossaries (DeepL's CSV or TSV in, entries out),
//! reused by name in an upload's `glossary_name`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use tower_sessions::Session;

use app::errors::AppError;
use engine::documents::glossaries::{self, Saved};
use engine::documents::glossary::{self, Entry};

use super::error::ApiError;
use super::jobs::{caller, Common};
use super::openapi::ErrorBody;
use super::AppState;

/// A saved glossary: its name and entries.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct GlossaryBody {
    name: String,
    entries: Vec<Entry>,
}

/// The glossary's name in the path.
const NAME: &str = "The glossary's name: 1 to 60 characters, no control characters, not blank";

/// `GET /api/v1/glossaries`: the caller's saved glossaries, by name.
#[utoipa::path(
    get,
    path = "/api/v1/glossaries",
    tag = "glossaries",
    responses((status = 200, description = "The caller's glossaries, by name", body = Vec<Saved>), Common)
)]
pub async fn list_glossaries(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
) -> Result<Json<Vec<Saved>>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    Ok(Json(glossaries::list(&state.ctx.pool, user.id).await?))
}

/// `GET /api/v1/glossaries/{name}`: one saved glossary's entries.
#[utoipa::path(
    get,
    path = "/api/v1/glossaries/{name}",
    tag = "glossaries",
    params(("name" = String, Path, min_length = 1, max_length = 60, pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$", description = NAME)),
    responses(
        (status = 200, description = "Its entries", body = GlossaryBody),
        (status = 404, description = "No glossary of yours so named", body = ErrorBody),
        (status = 422, description = "A name that is no glossary's name", body = ErrorBody),
        Common,
    )
)]
pub async fn get_glossary(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<GlossaryBody>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let entries = glossaries::get(&state.ctx.pool, user.id, &name).await?;
    Ok(Json(GlossaryBody { name: glossaries::check_name(&name)?, entries }))
}

/// `PUT /api/v1/glossaries/{name}`: save (or replace) a glossary from its text in DeepL's
/// format: a term and its translation a line, comma- or tab-separated (two language columns
/// after them are allowed and ignored). At most 1,000 entries, 60 KB and 50 glossaries.
#[utoipa::path(
    put,
    path = "/api/v1/glossaries/{name}",
    tag = "glossaries",
    params(("name" = String, Path, min_length = 1, max_length = 60, pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$", description = NAME)),
    request_body(content = String, content_type = "text/csv", description = "DeepL's glossary format: `term,translation` (or tab-separated) a line"),
    responses(
        (status = 200, description = "Saved", body = GlossaryBody),
        (status = 422, description = "A line that is no entry (named), a bad name, or too many glossaries", body = ErrorBody),
        Common,
    )
)]
pub async fn put_glossary(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<GlossaryBody>, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    let name = glossaries::check_name(&name)?;
    let text = std::str::from_utf8(&body).map_err(|_| AppError::invalid("the glossary is not UTF-8 text"))?;
    let entries = glossary::parse(text).map_err(AppError::invalid)?;
    glossaries::save(&state.ctx.pool, user.id, &name, &entries).await?;
    Ok(Json(GlossaryBody { name, entries }))
}

/// `DELETE /api/v1/glossaries/{name}`.
#[utoipa::path(
    delete,
    path = "/api/v1/glossaries/{name}",
    tag = "glossaries",
    params(("name" = String, Path, min_length = 1, max_length = 60, pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$", description = NAME)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No glossary of yours so named", body = ErrorBody),
        (status = 422, description = "A name that is no glossary's name", body = ErrorBody),
        Common,
    )
)]
pub async fn delete_glossary(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let user = caller(&state, &headers, &session).await?;
    match glossaries::delete(&state.ctx.pool, user.id, &name).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(AppError::NotFound.into()),
    }
}
