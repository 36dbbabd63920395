//! The HTTP layer every response goes through: security headers with a per-page script nonce,
//! caching rules, compression, request ids, and a timeout for slow clients that spares uploads.

use std::io::Write;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use sqlx::PgPool;

use crate::helpers::*;
use server::testing::{file_part, multipart_type, open_upload, status_within, BOUNDARY};

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn pages_carry_a_nonce_csp_and_the_security_headers(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let page = reqwest::get(app.url("/")).await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = header(&page, "content-security-policy").to_string();
    let nonce = csp.split("'nonce-").nth(1).and_then(|s| s.split('\'').next()).expect("a nonce in the page's CSP");
    assert!(nonce.len() >= 16, "a real nonce: {nonce}");
    assert!(csp.contains("script-src 'self' 'nonce-") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).unwrap();
    assert!(!script_src.contains("unsafe-inline"), "no inline scripts but the nonce's: {csp}");
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
    assert_eq!(header(&page, "referrer-policy"), "same-origin");
    assert_eq!(header(&page, "x-frame-options"), "DENY");
    assert_eq!(header(&page, "cache-control"), "no-store", "pages are never cached");
    assert!(uuid::Uuid::parse_str(header(&page, "x-request-id")).is_ok(), "each request gets an id");
    let nonce = nonce.to_string();
    let body = page.text().await.unwrap();
    assert!(body.contains(&format!("nonce=\"{nonce}\"")), "the hydration script carries the header's nonce");

    // A second page gets another nonce; a request id sent by a proxy is kept.
    let again = reqwest::Client::new().get(app.url("/")).header("x-request-id", "from-the-proxy").send().await.unwrap();
    assert!(!header(&again, "content-security-policy").contains(&nonce), "nonces are not reused");
    assert_eq!(header(&again, "x-request-id"), "from-the-proxy");
    let forged = reqwest::Client::new().get(app.url("/")).header("x-request-id", "x".repeat(500)).send().await.unwrap();
    assert!(uuid::Uuid::parse_str(header(&forged, "x-request-id")).is_ok(), "an unusable id is replaced");

    // API answers get the strict policy and are not stored either.
    let api = reqwest::get(app.url("/api/v1/jobs/00000000-0000-0000-0000-000000000000")).await.unwrap();
    assert!(header(&api, "content-security-policy").starts_with("default-src 'none'"));
    assert_eq!(header(&api, "x-content-type-options"), "nosniff");
    assert_eq!(header(&api, "cache-control"), "no-store");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn answers_are_compressed_for_clients_that_accept_it(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let client = reqwest::Client::new();
    for encoding in ["br", "gzip"] {
        let page = client.get(app.url("/")).header("accept-encoding", encoding).send().await.unwrap();
        assert_eq!(header(&page, "content-encoding"), encoding);
    }
    let plain = client.get(app.url("/")).send().await.unwrap();
    assert_eq!(header(&plain, "content-encoding"), "", "no encoding the client did not ask for");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_slow_client_times_out_but_a_slow_upload_does_not(pool: PgPool) {
    let settings = WebSettings { request_timeout: Duration::from_secs(1), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("slow@example.com", 5, 5).await;
    let addr = app.addr;
    tokio::task::spawn_blocking(move || {
        // A log-in whose body never comes: 408 after the timeout, not a held connection.
        let started = Instant::now();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "POST /api/log_in HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nemail="
        )
        .unwrap();
        assert_eq!(status_within(&mut stream, Duration::from_secs(20)), 408);
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

        // An upload that takes longer than the timeout is still accepted.
        let opening =
            format!("--{BOUNDARY}\r\n{}\r\n\r\n", file_part("slow.txt").replace("application/pdf", "text/plain"));
        let content = b"a document that arrives slowly\n";
        let closing = format!("\r\n--{BOUNDARY}--\r\n");
        let length = opening.len() + content.len() + closing.len();
        let mut upload = open_upload(addr, &token, &multipart_type(), length, opening.as_bytes());
        std::thread::sleep(Duration::from_millis(1500));
        upload.write_all(content).unwrap();
        upload.write_all(closing.as_bytes()).unwrap();
        assert_eq!(
            status_within(&mut upload, Duration::from_secs(20)),
            202,
            "uploads are bounded by their own idle timeout instead"
        );
    })
    .await
    .unwrap();
}
