//! What every response goes through (tower-http where it has the piece): a request id and a
//! tracing span per request, compression, caching rules, security headers, and a timeout for
//! slow clients (set where the routes are put together, so uploads and downloads go without).

use axum::extract::{MatchedPath, Request};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY, STRICT_TRANSPORT_SECURITY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::{HeaderName, HeaderValue};
use std::time::Duration;

use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::compression::predicate::{DefaultPredicate, NotForContentType, Predicate};
use tower_http::compression::{CompressionLayer, CompressionLevel};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::Span;

/// `Cache-Control` for a path: content-named assets are kept for a year (a new build has new
/// names), other assets are revalidated, and pages and API answers are never stored (they
/// carry a user's data and change as jobs move).
pub fn cache_control_for(path: &str) -> &'static str {
    let Some(file) = path.strip_prefix("/pkg/") else {
        // Not by the look of the path (`/jobs/x.css` is a page): only the few public files.
        return if PUBLIC_FILES.contains(&path) { "public, max-age=3600" } else { "no-store" };
    };
    if is_content_named(file) {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    }
}

/// The files in `public/` (the rest of a site's paths are pages or the API).
const PUBLIC_FILES: [&str; 1] = ["/favicon.svg"];

/// cargo-leptos' `hash-files` names assets `<name>.<hash>.<ext>`.
fn is_content_named(file: &str) -> bool {
    let parts: Vec<&str> = file.split('.').collect();
    parts.len() >= 3
        && parts[parts.len() - 2].len() >= 8
        && parts[parts.len() - 2].chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The page policy: scripts only from this origin or with this response's nonce (Leptos'
/// inline hydration script), WASM allowed to compile, nothing from other origins, no framing.
pub fn page_csp(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
         style-src-attr 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// For everything that is not a rendered page (API answers, files, the 404 page).
const STRICT_CSP: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Called while a page renders (Leptos context): its CSP names the nonce Leptos put on the
/// hydration script.
pub fn page_security_policy() {
    use leptos::prelude::use_context;
    let (Some(nonce), Some(options)) = (leptos::nonce::use_nonce(), use_context::<leptos_axum::ResponseOptions>())
    else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&page_csp(&nonce)) {
        options.insert_header(CONTENT_SECURITY_POLICY, value);
    }
}

/// Security and caching headers on every response (a page's own CSP is kept).
pub async fn security_and_cache_headers(secure: bool, request: Request, next: Next) -> Response {
    let cache = cache_control_for(request.uri().path());
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.entry(CACHE_CONTROL).or_insert(HeaderValue::from_static(cache));
    headers.entry(CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(STRICT_CSP));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    if secure {
        headers.insert(STRICT_TRANSPORT_SECURITY, HeaderValue::from_static("max-age=31536000"));
    }
    response
}

/// Uploads and downloads take as long as their bytes take (they bound idleness and their
/// total time themselves); every other request is bounded by the request timeout.
pub fn is_transfer(path: &str) -> bool {
    path == "/api/v1/jobs"
        || path == "/api/v1/estimate"
        || path == "/api/upload_document"
        || (path.starts_with("/api/v1/jobs/")
            && ["/result", "/result.md", "/translated", "/parts.md", "/original"].iter().any(|end| path.ends_with(end)))
}

/// 408 for a request (a slow client's included) that takes longer than `timeout`, except
/// transfers ([`is_transfer`]).
pub async fn timeout_unless_transfer(timeout: Duration, request: Request, next: Next) -> Response {
    if is_transfer(request.uri().path()) {
        return next.run(request).await;
    }
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let mut response = Response::new(axum::body::Body::from("the request took too long"));
            *response.status_mut() = axum::http::StatusCode::REQUEST_TIMEOUT;
            response
        }
    }
}

/// The outer layers, around everything `router` serves (outermost last): the request id is
/// set first, so the span and the response carry it.
pub fn around_every_request(router: Router, secure: bool) -> Router {
    router
        .layer(middleware::from_fn(move |request, next| security_and_cache_headers(secure, request, next)))
        // Level 4 keeps brotli and gzip cheap per request. PDFs and Word and OpenDocument files
        // (already compressed, up to 50 MiB as downloads) are sent as they are; built assets
        // come precompressed.
        .layer(
            CompressionLayer::new().quality(CompressionLevel::Precise(4)).compress_when(
                DefaultPredicate::new()
                    .and(NotForContentType::const_new("application/pdf"))
                    .and(NotForContentType::const_new("application/vnd.openxmlformats"))
                    .and(NotForContentType::const_new("application/vnd.oasis.opendocument")),
            ),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(|response: &Response, latency: Duration, span: &Span| {
                    span.record("status", response.status().as_u16());
                    span.record("latency_ms", latency.as_secs_f64() * 1000.0);
                    tracing::debug!(parent: span, "answered");
                })
                .on_failure(|failure: ServerErrorsFailureClass, _latency: Duration, span: &Span| {
                    tracing::warn!(parent: span, %failure, "request failed");
                }),
        )
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(middleware::from_fn(drop_unusable_request_id))
}

/// A proxy's request id is kept only when it looks like one (up to 64 letters, digits, `-`
/// and `_`); anything else is replaced by our own, so clients cannot bloat or forge log lines.
async fn drop_unusable_request_id(mut request: Request, next: Next) -> Response {
    let usable = request.headers().get("x-request-id").map(|v| is_usable_request_id(v.as_bytes()));
    if usable == Some(false) {
        request.headers_mut().remove("x-request-id");
    }
    next.run(request).await
}

/// Pure: whether a client's request id may be kept.
pub fn is_usable_request_id(id: &[u8]) -> bool {
    (1..=64).contains(&id.len()) && id.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
}

/// A span per request with its method, route (the pattern, not the ids in it) and request id;
/// the status and latency are recorded on it when the response is ready.
fn request_span(request: &Request) -> Span {
    let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or("(other)");
    let id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
    tracing::info_span!(
        "request",
        otel.name = format!("{} {route}", request.method()),
        otel.kind = "server",
        method = %request.method(),
        route,
        request_id = id,
        status = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    )
}

/// The admin area's server functions (`/api/admin/...`) answer "not found" to anyone but staff
/// (support, operators, admins) before their arguments are decoded: the area does not admit it
/// exists, and a stranger learns nothing from which arguments it refuses. Each function checks
/// the role for what it does itself.
pub async fn admin_area_only_for_admins(
    axum::extract::State(ctx): axum::extract::State<app::server::session::ServerContext>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !request.uri().path().starts_with(ADMIN_AREA) {
        return next.run(request).await;
    }
    app::server::session::as_console_request(async move {
        let session = request.extensions().get::<tower_sessions::Session>().cloned();
        let admin = match session {
            Some(session) => app::server::session::session_user(&ctx, &session).await,
            None => Ok(None),
        };
        match admin {
            Ok(Some(user)) if user.role.is_staff() => next.run(request).await,
            Ok(_) => super::error::ApiError(app::errors::AppError::NotFound).into_response(),
            Err(e) => super::error::ApiError(e).into_response(),
        }
    })
    .await
}

/// Where the admin area's server functions are served.
pub const ADMIN_AREA: &str = "/api/admin/";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_assets_are_immutable_and_pages_are_never_stored() {
        assert_eq!(cache_control_for("/pkg/sluice.a1B2c3D4e5F6.wasm"), "public, max-age=31536000, immutable");
        assert_eq!(cache_control_for("/pkg/sluice.wasm"), "no-cache");
        assert_eq!(cache_control_for("/pkg/sluice_bg.wasm"), "no-cache");
        assert_eq!(cache_control_for("/"), "no-store");
        assert_eq!(cache_control_for("/jobs/0b6e3c1a-1111-2222-3333-444455556666"), "no-store");
        assert_eq!(cache_control_for("/api/v1/jobs/x/result.md"), "no-store");
        assert_eq!(cache_control_for("/favicon.svg"), "public, max-age=3600");
        assert_eq!(cache_control_for("/jobs/x.css"), "no-store", "a page is a page whatever its path looks like");
    }

    #[test]
    fn only_short_plain_request_ids_are_kept() {
        assert!(is_usable_request_id(b"from-the-proxy_01"));
        assert!(!is_usable_request_id(b""));
        assert!(!is_usable_request_id(&[b'a'; 65]));
        assert!(!is_usable_request_id(b"id with spaces"));
        assert!(!is_usable_request_id(b"id\"quote"));
    }

    #[test]
    fn only_uploads_and_downloads_escape_the_request_timeout() {
        assert!(is_transfer("/api/v1/jobs"));
        assert!(is_transfer("/api/upload_document"));
        assert!(is_transfer("/api/v1/jobs/abc/original"));
        assert!(is_transfer("/api/v1/jobs/abc/result.md"));
        assert!(!is_transfer("/api/v1/jobs/abc"));
        assert!(!is_transfer("/api/log_in"));
        assert!(!is_transfer("/jobs/abc/original"));
    }

    #[test]
    fn the_page_policy_allows_only_this_origin_and_the_nonce() {
        let csp = page_csp("abc123");
        assert!(csp.contains("script-src 'self' 'nonce-abc123' 'wasm-unsafe-eval';"));
        assert!(csp.contains("frame-ancestors 'none'"));
        let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).unwrap();
        assert!(!script_src.contains("unsafe-inline") && !script_src.contains(" 'unsafe-eval'"));
    }
}
