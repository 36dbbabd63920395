//! Cancellation through the REST API (the jobs pages use the same path through a server
//! function): a waiting job is canceled and refunded at once, exactly once; another user's job
//! is not found; an admin may cancel anyone's job, and the audit log says so.

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use sqlx::PgPool;

use crate::helpers::*;

async fn cancel(app: &TestApp, token: &str, id: &str) -> reqwest::Response {
    reqwest::Client::new().post(app.url(&format!("/api/v1/jobs/{id}/cancel"))).bearer_auth(token).send().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_waiting_job_is_canceled_and_refunded_once_and_only_by_its_owner_or_an_admin(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    // No workers run here: uploaded jobs stay queued.
    let (user_id, token) = app.user_with_token("owner@example.com", 3, 5).await;
    let first: serde_json::Value = app.upload(&token, doc(1), None).await.json().await.unwrap();
    let first = first["id"].as_str().unwrap().to_string();
    assert_eq!(app.user_state(user_id).await, (2, 1, 2, 1));

    let (_, stranger) = app.user_with_token("stranger@example.com", 3, 5).await;
    assert_eq!(cancel(&app, &stranger, &first).await.status(), 404, "another user's job does not exist for them");

    let canceled = cancel(&app, &token, &first).await;
    assert_eq!(canceled.status(), 200);
    let job: serde_json::Value = canceled.json().await.unwrap();
    assert_eq!((job["state"].as_str(), job["refunded"].as_i64()), (Some("canceled"), Some(1)));
    assert_eq!(app.user_state(user_id).await, (3, 0, 3, 0), "refunded, out of flight, ledger agrees");

    let again = cancel(&app, &token, &first).await;
    assert_eq!(again.status(), 409, "an ended job cannot be canceled");
    assert_eq!(app.user_state(user_id).await, (3, 0, 3, 0), "and is not refunded twice");

    // The same document again is a new job, charged again.
    let reupload: serde_json::Value = app.upload(&token, doc(1), None).await.json().await.unwrap();
    assert_ne!(reupload["id"].as_str().unwrap(), first);
    let second = reupload["id"].as_str().unwrap().to_string();

    // An admin cancels someone else's job: allowed, and audited.
    let admin = users::create_user(&app.pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let (_, admin_token) = engine::accounts::tokens::create(&app.pool, admin.id, "ops").await.unwrap();
    assert_eq!(cancel(&app, &admin_token, &second).await.status(), 200);
    let audited: (String, String) = sqlx::query_as("SELECT actor, action FROM audit_log WHERE subject = $1")
        .bind(&second)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(audited, ("ops@example.com".to_string(), "cancel".to_string()));
    assert_eq!(app.user_state(user_id).await, (3, 0, 3, 0));
}
