//! The upload page's server function (`/api/upload_document`): the same admission and intake
//! as the REST API, with the status on the response (202, 200, 402, 429, 413, 415, 401).

use app::server::session::WebSettings;
use sqlx::PgPool;

use crate::helpers::*;

const URL: &str = "/api/upload_document";

/// A browser session for `email` (made with `balance` credits and `limit` in flight).
async fn browser_for(app: &TestApp, email: &str, balance: i64, limit: i32) -> (i64, reqwest::Client) {
    let (user_id, _) = app.user_with_token(email, balance, limit).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let login = call(&browser, app, "log_in", &[("email", email), ("password", "password123")]).await;
    assert_eq!(login.status(), 200);
    (user_id, browser)
}

async fn send(app: &TestApp, browser: &reqwest::Client, name: &str, bytes: Vec<u8>) -> reqwest::Response {
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()))
        .text("preset", "summarize");
    browser.post(app.url(URL)).header("Origin", format!("http://{}", app.addr)).multipart(form).send().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_upload_function_admits_and_refuses_like_the_api(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user_id, browser) = browser_for(&app, "page@example.com", 2, 1).await;

    let accepted = send(&app, &browser, "first.txt", doc(1)).await;
    assert_eq!(accepted.status(), 202);
    let location = accepted.headers().get("location").unwrap().to_str().unwrap().to_string();
    let body: serde_json::Value = accepted.json().await.unwrap();
    assert_eq!(location, format!("/api/v1/jobs/{}", body["id"].as_str().unwrap()));
    assert_eq!(body["duplicate"], false);
    let (balance, in_flight, ledger, live) = app.user_state(user_id).await;
    assert_eq!((balance, in_flight, ledger, live), (1, 1, 1, 1), "one debit, one job");

    // The in-flight limit (1): 429 with Retry-After, before the body is read; nothing stored.
    let blobs_before = app.stored_blobs();
    let busy = send(&app, &browser, "second.txt", doc(2)).await;
    assert_eq!(busy.status(), 429);
    assert!(busy.headers().get("retry-after").is_some());
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["error"], "too_many_in_flight");
    assert_eq!(app.stored_blobs(), blobs_before);

    // Out of credits: 402.
    let (broke_id, broke) = browser_for(&app, "broke@example.com", 0, 5).await;
    let refused = send(&app, &broke, "third.txt", doc(3)).await;
    assert_eq!(refused.status(), 402);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!((body["error"].as_str(), body["balance"].as_i64()), (Some("out_of_credits"), Some(0)));
    assert_eq!(app.user_state(broke_id).await, (0, 0, 0, 0), "nothing charged, nothing queued");
    assert_eq!(app.stored_blobs(), blobs_before);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_upload_function_checks_the_bytes_and_the_session(pool: PgPool) {
    let settings = WebSettings { max_upload_bytes: 1024, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (user_id, browser) = browser_for(&app, "bytes@example.com", 5, 5).await;
    assert_eq!(send(&app, &browser, "big.txt", vec![b'a'; 4096]).await.status(), 413);
    assert_eq!(send(&app, &browser, "logo.svg", b"<svg><script>x()</script></svg>".to_vec()).await.status(), 415);
    assert_eq!(app.user_state(user_id).await, (5, 0, 5, 0), "refused uploads cost nothing");
    assert_eq!(app.stored_blobs(), 0, "and leave nothing behind");

    let stranger = reqwest::Client::new();
    assert_eq!(send(&app, &stranger, "doc.txt", doc(1)).await.status(), 401);
}
