//! The REST API: its routes, each described as it is added (so no route can be served
//! undescribed), and the OpenAPI 3.1 document they make. Served at `/api/v1/openapi.json`, with
//! Swagger UI (its files vendored in the binary) at `/api/v1/docs`.

use std::sync::OnceLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::openapi::ApiDoc;
use super::{glossaries, jobs, AppState};

/// Where the document and the docs page are served.
pub const DOCUMENT_PATH: &str = "/api/v1/openapi.json";
pub const DOCS_PATH: &str = "/api/v1/docs";

/// The API's routes, each described as it is added.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::create_job))
        .routes(routes!(jobs::estimate_job))
        .routes(routes!(jobs::get_job, jobs::delete_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(jobs::run_again))
        .routes(routes!(jobs::get_result))
        .routes(routes!(jobs::get_result_markdown))
        .routes(routes!(jobs::get_translated_file))
        .routes(routes!(jobs::get_parts_so_far))
        .routes(routes!(jobs::get_original))
        .routes(routes!(jobs::put_webhook, jobs::delete_webhook))
        .routes(routes!(glossaries::list_glossaries))
        .routes(routes!(glossaries::get_glossary, glossaries::put_glossary, glossaries::delete_glossary))
}

/// The whole document (built once), with its links.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(|| with_job_links(api_routes().split_for_parts().1))
}

/// Where a new job is made: its answer's `id` names it for every job route.
const MAKES_A_JOB: [(&str, &str); 2] = [("/api/v1/jobs", "post"), ("/api/v1/jobs/{id}/run-again", "post")];

/// Links from each answer that names a new job (an upload, a run again) to every operation on
/// `/api/v1/jobs/{id}...`, its `id` taken from the answer: a client, or a fuzzer, follows a job
/// from its upload to its end without guessing ids.
fn with_job_links(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::link::LinkBuilder;
    use utoipa::openapi::RefOr;
    let targets: Vec<String> = doc
        .paths
        .paths
        .iter()
        .filter(|(path, _)| path.starts_with("/api/v1/jobs/{id}"))
        .flat_map(|(_, item)| operations(item))
        .filter_map(|operation| operation.operation_id.clone())
        .collect();
    for (path, method) in MAKES_A_JOB {
        let Some(operation) = doc.paths.paths.get_mut(path).and_then(|item| operation_mut(item, method)) else {
            continue;
        };
        for (status, response) in operation.responses.responses.iter_mut() {
            let RefOr::T(response) = response else { continue };
            if !matches!(status.as_str(), "200" | "202") {
                continue;
            }
            for target in &targets {
                let link = LinkBuilder::new()
                    .operation_id(target.clone())
                    .parameter("id", "$response.body#/id")
                    .description(format!("`{target}` for the job this answer names"))
                    .build();
                response.links.insert(target.clone(), RefOr::T(link));
            }
        }
    }
    doc
}

fn operations(item: &utoipa::openapi::PathItem) -> impl Iterator<Item = &utoipa::openapi::path::Operation> {
    [&item.get, &item.put, &item.post, &item.delete, &item.patch].into_iter().flatten()
}

fn operation_mut<'a>(
    item: &'a mut utoipa::openapi::PathItem,
    method: &str,
) -> Option<&'a mut utoipa::openapi::path::Operation> {
    match method {
        "post" => item.post.as_mut(),
        "put" => item.put.as_mut(),
        _ => None,
    }
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
        assert_eq!(operations, 17, "{}", serde_json::to_string_pretty(paths).unwrap());
    }

    /// An upload's answer links to every job route, the job's id taken from the answer.
    #[test]
    fn a_new_jobs_answer_links_to_every_job_route() {
        let doc = serde_json::to_value(document()).unwrap();
        let job_routes: usize = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(path, _)| path.starts_with("/api/v1/jobs/{id}"))
            .map(|(_, item)| item.as_object().unwrap().len())
            .sum();
        assert_eq!(job_routes, 9);
        for (path, status) in [("/api/v1/jobs", "202"), ("/api/v1/jobs", "200"), ("/api/v1/jobs/{id}/run-again", "202")]
        {
            let links = doc["paths"][path]["post"]["responses"][status]["links"].as_object().unwrap();
            assert_eq!(links.len(), job_routes, "{path} {status}");
            assert_eq!(links["get_job"]["parameters"]["id"], "$response.body#/id");
        }
    }
}
