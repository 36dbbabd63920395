//! Issue 58: with every connection of the web requests' pool taken, requests are answered 503
//! with `Retry-After` within about a second (not after the workers' 10 s, never 500), nothing
//! is stored or charged, the health check still answers on connections of its own, and
//! everything works again once connections are free.

use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_full_pool_answers_503_within_a_second_and_health_still_answers(pool: PgPool) {
    let options = (*pool.connect_options()).clone();
    let requests = engine::db::open_pool(options.clone(), 3, engine::db::REQUEST_ACQUIRE).await.unwrap();
    let reserved = engine::db::open_pool(options, 1, engine::db::REQUEST_ACQUIRE).await.unwrap();
    let blob_dir = std::env::temp_dir().join(format!("sluice-test-pool-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&blob_dir);
    let app =
        TestApp::spawn_with_pools(pool.clone(), requests.clone(), reserved, WebSettings::default(), blob_dir).await;
    let (user, token) = app.user_with_token("busy@example.com", 10, 5).await;
    let client = reqwest::Client::new();
    let before = app.user_state(user).await;

    // Every request connection is taken (a burst of slow queries, say): as many as the pool
    // gives (the app may keep one of them, e.g. to listen).
    let mut held = Vec::new();
    while let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_millis(1_500), requests.acquire()).await {
        held.push(conn);
    }
    assert!(!held.is_empty() && held.len() <= 3, "{} held", held.len());
    let started = Instant::now();
    let health = client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK, "the health check has connections of its own");
    assert!(started.elapsed() < Duration::from_millis(900), "health answered in {:?}", started.elapsed());

    for (what, request) in [
        ("a poll", client.get(app.url(&format!("/api/v1/jobs/{}", uuid::Uuid::nil()))).bearer_auth(&token)),
        (
            "an upload",
            client.post(app.url("/api/v1/jobs")).bearer_auth(&token).multipart(
                reqwest::multipart::Form::new()
                    .part("file", reqwest::multipart::Part::bytes(doc(1)).file_name("doc.txt")),
            ),
        ),
    ] {
        let started = Instant::now();
        let response = request.send().await.unwrap();
        let took = started.elapsed();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
        assert!(response.headers().contains_key("retry-after"), "{what}: says when to come back");
        assert!(took < Duration::from_millis(2_500), "{what} answered in {took:?}, not after 10 s");
    }
    drop(held);
    assert_eq!(app.user_state(user).await, before, "nothing was charged");
    assert_eq!(app.stored_blobs(), 0, "nothing was stored");

    // Connections free again: the same requests work.
    let polled =
        client.get(app.url(&format!("/api/v1/jobs/{}", uuid::Uuid::nil()))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(polled.status(), StatusCode::NOT_FOUND, "answered again: no such job of theirs");
    assert_eq!(app.upload(&token, doc(2), None).await.status(), StatusCode::ACCEPTED);
}
