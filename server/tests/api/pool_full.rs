//! Issue 58: with every connection of the web requests' pool taken, requests are answered 503
//! with `Retry-After` within about a second (not after the workers' 10 s, never 500), nothing
//! is stored or charged, the health check and the console (its overview and kill switch, the
//! operator's session and account included) still answer on connections of their own, and
//! everything works again once connections are free.

use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
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
    // Nothing kept in memory: the operator's session and account are read from the database.
    let settings = WebSettings { auth_cache_lifetime: Duration::ZERO, ..WebSettings::default() };
    let app = TestApp::spawn_with_pools(pool.clone(), requests.clone(), reserved, settings, blob_dir).await;
    let (user, token) = app.user_with_token("busy@example.com", 10, 5).await;
    let client = reqwest::Client::new();
    let before = app.user_state(user).await;
    users::create_user(&app.pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let operator = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&operator, &app, "log_in", &[("email", "ops@example.com"), ("password", "password123")]);
    assert_eq!(logged_in.await.status(), StatusCode::OK);

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

    // The operator reaches the console and stops processing: their session and account are
    // read on the reserved connections, as are the overview and the switch.
    let started = Instant::now();
    let overview = call(&operator, &app, "admin/overview", &[]).await;
    assert_eq!(overview.status(), StatusCode::OK, "the console answers: {}", overview.text().await.unwrap());
    assert!(started.elapsed() < Duration::from_millis(900), "the console answered in {:?}", started.elapsed());
    let stopped = call(&operator, &app, "admin/set_processing", &[("enabled", "false")]).await;
    assert_eq!(stopped.status(), StatusCode::OK, "the kill switch answers: {}", stopped.text().await.unwrap());
    assert!(!engine::queue::switches::read(&pool).await.unwrap().processing_enabled, "processing stopped");

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
