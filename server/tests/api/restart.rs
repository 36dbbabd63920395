//! While Postgres restarts, requests are told to wait (503 with `Retry-After` and a plain
//! message), not that something broke (500), and everything works again once it is back.

use app::server::session::WebSettings;

use crate::helpers::{call, TestApp};

async fn status_and_retry(response: reqwest::Response) -> (u16, Option<String>, String) {
    let status = response.status().as_u16();
    let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    (status, retry, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn requests_during_a_postgres_restart_get_503_with_retry_after_then_work_again() {
    // This test stops its own cluster, so it cannot share the suite's.
    let mut temp =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-restart")).await.unwrap().unwrap();
    temp.cluster.create_database("sluice").unwrap();
    let pool = engine::db::connect(&temp.cluster.url("sluice"), 20).await.unwrap();
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("restart@example.com", 5, 2).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in =
        call(&browser, &app, "log_in", &[("email", "restart@example.com"), ("password", "password123")]).await;
    assert_eq!(logged_in.status(), 200);
    let job_url = app.url("/api/v1/jobs/00000000-0000-0000-0000-000000000000");
    let before = reqwest::Client::new().get(&job_url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(before.status(), 404, "the API answers while the database is up");

    temp = tokio::task::spawn_blocking(move || {
        temp.cluster.stop().unwrap();
        temp
    })
    .await
    .unwrap();

    let (status, retry, body) =
        status_and_retry(reqwest::Client::new().get(&job_url).bearer_auth(&token).send().await.unwrap()).await;
    assert_eq!((status, retry.as_deref()), (503, Some("5")), "REST while Postgres is down: {body}");
    assert!(body.contains("restarting"), "a plain message: {body}");

    let (status, retry, body) = status_and_retry(call(&browser, &app, "list_jobs", &[]).await).await;
    assert_eq!((status, retry.as_deref()), (503, Some("5")), "server function while Postgres is down: {body}");
    assert!(body.contains("\"error\":\"unavailable\""), "the UI can tell a restart from a failure: {body}");

    let (status, _, body) = status_and_retry(browser.get(app.url("/jobs")).send().await.unwrap()).await;
    assert_ne!(status, 500, "a page while Postgres is down: {body}");

    temp = tokio::task::spawn_blocking(move || {
        temp.cluster.restart().unwrap();
        temp
    })
    .await
    .unwrap();
    let after = reqwest::Client::new().get(&job_url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(after.status(), 404, "the API works again once Postgres is back");
    let jobs = call(&browser, &app, "list_jobs", &[]).await;
    assert_eq!(jobs.status(), 200, "the session survived the restart");
    drop(temp);
}
