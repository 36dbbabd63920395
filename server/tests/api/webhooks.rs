//! Completion webhooks through the REST API, with a real HTTP receiver: a token registers a
//! callback (the answer holds the signing secret), its jobs' endings (done, canceled) are
//! POSTed there signed, once each; a callback sent with one upload overrides it; callbacks
//! need a token, and private addresses are refused unless the admin allows them, with nothing
//! stored or charged.

use std::time::Duration;

use app::server::session::WebSettings;
use engine::webhooks::outbox::{deliver_due, DeliveryConfig};
use engine::webhooks::signing::verify;
use engine::webhooks::TargetPolicy;
use fakeprovider::receiver::{Received, WebhookReceiver};
use sqlx::PgPool;

use crate::helpers::*;

fn lab() -> TargetPolicy {
    TargetPolicy { allow_private: true, ..TargetPolicy::default() }
}

async fn put_webhook(app: &TestApp, token: &str, url: &str) -> reqwest::Response {
    reqwest::Client::new()
        .put(app.url("/api/v1/webhook"))
        .bearer_auth(token)
        .json(&serde_json::json!({ "url": url }))
        .send()
        .await
        .unwrap()
}

async fn upload_with_callback(app: &TestApp, token: &str, n: usize, callback: &str) -> reqwest::Response {
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(doc(n)).file_name("doc.txt"))
        .text("callback_url", callback.to_string());
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
}

fn assert_signed(received: &Received, secret: &str) -> serde_json::Value {
    let now = chrono::Utc::now().timestamp();
    assert_eq!(verify(secret, &received.header("sluice-signature"), &received.body, now, 300), Ok(()));
    let body = received.json();
    assert_eq!(body["event"], "job.ended");
    body
}

async fn id_of(response: reqwest::Response) -> String {
    let body: serde_json::Value = response.json().await.unwrap();
    body["id"].as_str().expect("a job id").to_string()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn job_endings_reach_the_tokens_callback_signed_and_once(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings { webhook_policy: lab(), ..WebSettings::default() }).await;
    let receiver = WebhookReceiver::start().await;
    let (_, token) = app.user_with_token("hooks@example.com", 10, 5).await;
    let delivery = DeliveryConfig { policy: lab(), ..DeliveryConfig::default() };

    let registered = put_webhook(&app, &token, &receiver.url("/done")).await;
    assert_eq!(registered.status(), 200);
    let registered: serde_json::Value = registered.json().await.unwrap();
    let secret = registered["secret"].as_str().unwrap().to_string();

    let done = id_of(app.upload(&token, doc(1), None).await).await;
    let other = id_of(upload_with_callback(&app, &token, 2, &receiver.url("/this-one")).await).await;
    work(&app, 2).await;
    let canceled = id_of(app.upload(&token, doc(3), None).await).await;
    let answer = reqwest::Client::new()
        .post(app.url(&format!("/api/v1/jobs/{canceled}/cancel")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    while deliver_due(&app.pool, &delivery, 10).await.unwrap() > 0 {}
    let received = receiver.wait_for(3, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 3, "one delivery per ending");
    let by_job = |id: &str| received.iter().find(|r| r.json()["job"]["id"] == id).expect("delivered").clone();
    let body = assert_signed(&by_job(&done), &secret);
    assert_eq!((body["job"]["state"].as_str(), by_job(&done).path.as_str()), (Some("done"), "/done"));
    assert_eq!(body["job"]["result_url"], format!("/api/v1/jobs/{done}/result"));
    let body = assert_signed(&by_job(&other), &secret);
    assert_eq!((body["job"]["state"].as_str(), by_job(&other).path.as_str()), (Some("done"), "/this-one"));
    let body = assert_signed(&by_job(&canceled), &secret);
    assert_eq!(body["job"]["state"], "canceled");
    assert!(body["job"]["result_url"].is_null());

    // Nothing more goes out: each ending is delivered once.
    sqlx::query("UPDATE webhook_deliveries SET next_attempt_at = now()").execute(&app.pool).await.unwrap();
    assert_eq!(deliver_due(&app.pool, &delivery, 10).await.unwrap(), 0);
    // A secret never sits in the outbox.
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT body::text || url FROM webhook_deliveries").fetch_all(&app.pool).await.unwrap();
    assert!(stored.iter().all(|row| !row.contains(&secret)));

    // Unregistered: later endings are not sent.
    let removed = reqwest::Client::new().delete(app.url("/api/v1/webhook")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(removed.status(), 204);
    app.upload(&token, doc(4), None).await;
    work(&app, 1).await;
    while deliver_due(&app.pool, &delivery, 10).await.unwrap() > 0 {}
    assert_eq!(receiver.received().len(), 3);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn refused_callbacks_store_and_charge_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user_id, token) = app.user_with_token("ssrf@example.com", 5, 5).await;
    for url in ["http://127.0.0.1:9/x", "http://169.254.169.254/latest", "http://[::1]/x", "file:///etc/passwd"] {
        let answer = put_webhook(&app, &token, url).await;
        assert_eq!(answer.status(), 422, "{url}");
        // The token has no secret yet, so even a public callback with one upload is refused;
        // a private one is refused for its address.
        let answer = upload_with_callback(&app, &token, 1, url).await;
        assert_eq!(answer.status(), 422, "{url}");
    }
    let answer = put_webhook(&app, &token, "https://hooks.example.com/sluice").await;
    assert_eq!(answer.status(), 200, "a public host is fine");
    // A callback field far past a URL's length is refused unread past its bound.
    let answer =
        upload_with_callback(&app, &token, 1, &format!("https://hooks.example.com/{}", "a".repeat(100_000))).await;
    assert_eq!(answer.status(), 422);
    let message: serde_json::Value = answer.json().await.unwrap();
    assert!(message["message"].as_str().unwrap().contains("too long"), "{message}");
    let answer = upload_with_callback(&app, &token, 1, "http://10.1.2.3/x").await;
    assert_eq!(answer.status(), 422);
    let message: serde_json::Value = answer.json().await.unwrap();
    assert!(message["message"].as_str().unwrap().contains("non-public address"), "{message}");
    assert_eq!(app.stored_blobs(), 0, "no refused upload left its file");
    assert_eq!(app.user_state(user_id).await, (5, 0, 5, 0), "nothing charged, nothing queued");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_callback_needs_a_token(pool: PgPool) {
    let settings = WebSettings { webhook_policy: lab(), require_email_verification: false, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let client = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up =
        call(&client, &app, "sign_up", &[("email", "browser@example.com"), ("password", "long password")]).await;
    assert!(signed_up.status().is_success() || signed_up.status().is_redirection(), "{}", signed_up.status());
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(doc(1)).file_name("doc.txt"))
        .text("callback_url", "http://127.0.0.1:9/x");
    let answer = client
        .post(app.url("/api/v1/jobs"))
        .header("Origin", format!("http://{}", app.addr))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 422);
    let answer = client
        .put(app.url("/api/v1/webhook"))
        .header("Origin", format!("http://{}", app.addr))
        .json(&serde_json::json!({"url": "http://127.0.0.1:9/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 422);
    assert_eq!(app.stored_blobs(), 0);
}
