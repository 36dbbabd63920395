//! Refuse state-changing requests that another site's page made (server functions included).

use axum::extract::Request;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use app::errors::AppError;

use super::error::ApiError;

/// Pure: is this request cross-site? `Sec-Fetch-Site` decides when the browser sends it;
/// otherwise the `Origin` must name the same host as `Host`. Programs that send neither
/// (curl, API clients) are not browsers acting for another site.
pub fn is_cross_site(method: &Method, sec_fetch_site: Option<&str>, origin: Option<&str>, host: Option<&str>) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    if let Some(site) = sec_fetch_site {
        return !matches!(site, "same-origin" | "none");
    }
    match (origin, host) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, rest)| rest) != Some(host),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Middleware: 403 for a cross-site write, before any handler runs.
pub async fn refuse_cross_site(request: Request, next: Next) -> Response {
    // Decided before awaiting anything: the request's body is not Sync.
    let cross = {
        let headers = request.headers();
        let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        is_cross_site(
            request.method(),
            value("sec-fetch-site"),
            value(header::ORIGIN.as_str()),
            value(header::HOST.as_str()),
        )
    };
    if cross {
        return ApiError(AppError::CrossSite).into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_rules() {
        let post = Method::POST;
        assert!(!is_cross_site(&Method::GET, Some("cross-site"), None, None));
        assert!(is_cross_site(&post, Some("cross-site"), None, None));
        assert!(is_cross_site(&post, Some("same-site"), None, None));
        assert!(!is_cross_site(&post, Some("same-origin"), Some("http://evil.test"), Some("a:1")));
        assert!(!is_cross_site(&post, None, Some("http://127.0.0.1:3000"), Some("127.0.0.1:3000")));
        assert!(is_cross_site(&post, None, Some("http://evil.test"), Some("127.0.0.1:3000")));
        assert!(is_cross_site(&post, None, Some("null"), Some("127.0.0.1:3000")));
        assert!(!is_cross_site(&post, None, None, Some("127.0.0.1:3000")));
    }
}
