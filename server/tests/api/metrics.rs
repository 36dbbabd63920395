//! `/metrics`: not served without configuration; with a token, 401 without it and the
//! Prometheus text with it: the queue's gauges read from Postgres, uploads by outcome, HTTP
//! requests by route pattern.

use app::server::session::WebSettings;
use sqlx::PgPool;

use crate::helpers::*;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn metrics_are_private_by_default_and_count_what_happened(pool: PgPool) {
    let closed = TestApp::spawn(pool.clone(), WebSettings::default()).await;
    assert_eq!(reqwest::get(closed.url("/metrics")).await.unwrap().status(), 404, "not public by default");

    let settings = WebSettings { metrics_token: Some("scrape-secret".into()), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let client = reqwest::Client::new();
    assert_eq!(client.get(app.url("/metrics")).send().await.unwrap().status(), 401);
    assert_eq!(client.get(app.url("/metrics")).bearer_auth("wrong").send().await.unwrap().status(), 401);

    let (_, token) = app.user_with_token("metrics@example.com", 1, 5).await;
    assert_eq!(app.upload(&token, doc(1), None).await.status(), 202);
    assert_eq!(app.upload(&token, doc(2), None).await.status(), 402);
    let job = app.url("/api/v1/jobs/00000000-0000-0000-0000-000000000000");
    assert_eq!(client.get(&job).bearer_auth(&token).send().await.unwrap().status(), 404);

    let scraped = client.get(app.url("/metrics")).bearer_auth("scrape-secret").send().await.unwrap();
    assert_eq!(scraped.status(), 200);
    assert!(scraped.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = scraped.text().await.unwrap();
    let has = |needle: &str| text.lines().any(|l| l.starts_with(needle));
    assert!(has("sluice_backlog_jobs 1"), "the waiting job, read from Postgres:\n{text}");
    assert!(has("sluice_processing_enabled 1") && has("sluice_gate_size "), "{text}");
    assert!(has("sluice_gate_effective "), "the gate in force: {text}");
    assert!(has("sluice_uploads_total{outcome=\"accepted\"}"), "{text}");
    assert!(has("sluice_uploads_total{outcome=\"402\"}"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("sluice_http_requests_total{")
            && l.contains("route=\"/api/v1/jobs/{id}\"")
            && l.contains("status=\"404\"")),
        "requests by route pattern, not by id:\n{text}"
    );
    assert!(!text.contains("00000000-0000-0000-0000-000000000000"), "no ids in labels");
    assert!(has("sluice_http_request_duration_seconds_bucket{"), "{text}");

    // The job done: acceptance to done lands in the histogram, in buckets up to a day.
    work(&app, 1).await;
    let text = client.get(app.url("/metrics")).bearer_auth("scrape-secret").send().await.unwrap().text().await.unwrap();
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_job_time_to_done_seconds_count "))
        .and_then(|n| n.trim().parse::<f64>().ok());
    assert!(count.is_some_and(|n| n >= 1.0), "{text}");
    assert!(text.contains("sluice_job_time_to_done_seconds_bucket{le=\"86400\"}"), "{text}");
}
