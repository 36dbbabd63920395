//! The REST API's contract: an OpenAPI 3.1 document generated from the handlers' own types and
//! annotations. The API's routes are registered through [`api_routes`], which describes each
//! route as it adds it, so no route can be served undescribed. Served at
//! `/api/v1/openapi.json`, with Swagger UI (its files vendored in the binary) at `/api/v1/docs`.

use std::sync::OnceLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{jobs, AppState};

/// Where the document and the docs page are served.
pub const DOCUMENT_PATH: &str = "/api/v1/openapi.json";
pub const DOCS_PATH: &str = "/api/v1/docs";

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
struct ApiDoc;

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

/// The API's routes, each described as it is added.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::create_job))
        .routes(routes!(jobs::get_job, jobs::delete_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(jobs::run_again))
        .routes(routes!(jobs::get_result))
        .routes(routes!(jobs::get_result_markdown))
        .routes(routes!(jobs::get_original))
        .routes(routes!(jobs::put_webhook, jobs::delete_webhook))
}

/// The whole document (built once).
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(|| api_routes().split_for_parts().1)
}

/// `/api/v1/openapi.json` and the docs page. Swagger UI runs its own script and styles, so the
/// docs page gets a policy of its own (scripts and styles from this origin only).
pub fn docs_routes() -> Router<AppState> {
    let swagger: Router<AppState> =
        utoipa_swagger_ui::SwaggerUi::new(DOCS_PATH).url(DOCUMENT_PATH, document().clone()).into();
    swagger.layer(axum::middleware::map_response(docs_policy))
}

async fn docs_policy(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; \
             base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    response.into_response()
}

#[cfg(test)]
mod tests {
    use super::document;

    /// Each operation names its answers, and every error answer is the one error body.
    #[test]
    fn every_operation_describes_its_answers_and_errors_share_one_body() {
        let doc = serde_json::to_value(document()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        let mut operations = 0;
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                operations += 1;
                let responses = operation["responses"].as_object().unwrap();
                assert!(responses.contains_key("401"), "{method} {path} does not describe 401");
                for (status, response) in responses {
                    if status.starts_with('4') || status.starts_with('5') {
                        assert_eq!(
                            response["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                            "{method} {path} {status}"
                        );
                    }
                }
            }
        }
        assert_eq!(operations, 10, "{}", serde_json::to_string_pretty(paths).unwrap());
    }
}
