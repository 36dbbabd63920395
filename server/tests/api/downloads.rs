//! Reading jobs back: state, results and originals for their owners, 404 for anyone else.

use app::server::session::WebSettings;
use engine::queue;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn another_users_job_is_404_and_revoked_tokens_stop_working(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, alice) = app.user_with_token("alice@example.com", 5, 5).await;
    let (bob_id, bob) = app.user_with_token("bob@example.com", 5, 5).await;
    let job: serde_json::Value = app.upload(&alice, doc(1), None).await.json().await.unwrap();
    let path = format!("/api/v1/jobs/{}", job["id"].as_str().unwrap());
    let client = reqwest::Client::new();
    let own = client.get(app.url(&path)).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    assert_eq!(own.json::<serde_json::Value>().await.unwrap()["state"], "queued");
    assert_eq!(client.get(app.url(&path)).bearer_auth(&bob).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let result = client.get(app.url(&format!("{path}/result"))).bearer_auth(&bob).send().await.unwrap();
    assert_eq!(result.status(), StatusCode::NOT_FOUND);
    let not_ready = client.get(app.url(&format!("{path}/result"))).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(not_ready.status(), StatusCode::CONFLICT);
    let garbage = client.get(app.url("/api/v1/jobs/not-a-uuid")).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(garbage.status(), StatusCode::NOT_FOUND);

    let bobs_token = engine::accounts::tokens::list(&app.pool, bob_id).await.unwrap().remove(0);
    engine::accounts::tokens::revoke(&app.pool, bob_id, bobs_token.id).await.unwrap();
    assert_eq!(client.get(app.url(&path)).bearer_auth(&bob).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn owners_download_the_original_and_the_result_and_nobody_else_can(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("owner@example.com", 5, 5).await;
    let (_, other) = app.user_with_token("other@example.com", 5, 5).await;
    let pdf = engine::testing::pdf_with_text(&["Rental contract", "Rent is 900 EUR, due on 2026-02-01."]);
    let job: serde_json::Value =
        upload_file(&app, &token, "../../contract \"final\".pdf", pdf.clone(), "key_facts").await.json().await.unwrap();
    let id = job["id"].as_str().unwrap();
    let client = reqwest::Client::new();
    let original =
        client.get(app.url(&format!("/api/v1/jobs/{id}/original"))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(original.status(), StatusCode::OK);
    assert_eq!(original.headers()["content-type"], "application/pdf");
    assert_eq!(original.headers()["x-content-type-options"], "nosniff");
    assert_eq!(original.headers()["content-disposition"], "attachment; filename=\"contract _final_.pdf\"");
    assert_eq!(original.bytes().await.unwrap().to_vec(), pdf);
    for path in [format!("/api/v1/jobs/{id}/original"), format!("/api/v1/jobs/{id}/result.md")] {
        assert_eq!(
            client.get(app.url(&path)).bearer_auth(&other).send().await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
    }

    // Process it with the built-in local provider, then fetch the result.
    let reports = work(&app, 1).await;
    assert_eq!(reports[0].recorded, queue::Recorded::Done);
    let md = client.get(app.url(&format!("/api/v1/jobs/{id}/result.md"))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(md.status(), StatusCode::OK);
    assert_eq!(md.headers()["content-disposition"], "attachment; filename=\"contract _final_-result.md\"");
    let text = md.text().await.unwrap();
    assert!(text.contains("900 EUR") && text.contains("2026-02-01"), "{text}");
    let json: serde_json::Value = client
        .get(app.url(&format!("/api/v1/jobs/{id}/result")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(json["result"]["provider"], "local");
}
