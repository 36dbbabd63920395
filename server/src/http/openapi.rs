//! The REST API's contract: the OpenAPI document's own parts (its description, its security
//! schemes) and the schema types that only describe bodies. The handlers (`jobs`) use these;
//! `api` puts handlers and contract together. Nothing here knows a route.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Every error answer's body: a machine-readable code, the words to show, and the code's
/// details (e.g. `balance` and `cost` with `out_of_credits`, `retry_after_secs` where waiting
/// helps, also sent as `Retry-After`).
#[derive(ToSchema)]
#[allow(dead_code)] // Only its schema is used; the body is AppError's serialisation.
pub struct ErrorBody {
    /// The error's code, e.g. `out_of_credits`, `too_many_in_flight`, `not_found`.
    #[schema(pattern = "^[a-z_]+$")]
    error: String,
    /// What went wrong, in words a person can act on.
    message: String,
}

/// The upload form (`multipart/form-data`): the document first or last, with what to do with it.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UploadForm {
    /// The document: PDF, Markdown, HTML or plain text (UTF-8, UTF-16 with a BOM, or Latin-1).
    #[schema(format = Binary, content_media_type = "application/octet-stream")]
    file: String,
    /// What to do: summarize (default), translate, explain, key_facts.
    preset: Option<app::model::Preset>,
    /// The target language of a translation.
    language: Option<String>,
}

/// A done job's result.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ResultBody {
    id: String,
    /// The provider's answer: `markdown`, and the figures of the run.
    result: serde_json::Map<String, serde_json::Value>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sluice API",
        description = "Upload documents to be processed by AI providers behind a durable queue, and follow each job to its end. \
Authenticate with an API token (`Authorization: Bearer <token>`, made on the account page) or the browser's session. \
Uploads are admitted atomically: 402 when out of credits, 429 when over your limit of documents in progress; \
nothing is stored or charged when an upload is refused.",
    ),
    modifiers(&Security),
    security(("token" = []), ("session" = [])),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// The two ways to call the API.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API token from the account page."))
                    .build(),
            ),
        );
        components
            .add_security_scheme("session", SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new("sluice_session"))));
    }
}
