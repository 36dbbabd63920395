//! Prices by size: the price table at each document's estimated tokens, settled once its bytes
//! are in (one debit), shown in the answer, refunded exactly; and texts longer than the
//! provider's context refused (413) before any debit.

use std::sync::Arc;

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::AccountHooks;
use engine::queue::policy::retry::ErrorClass;
use engine::queue::JobError;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

fn priced() -> WebSettings {
    WebSettings {
        admission: AdmissionConfig {
            prices: "1000:1,5000:3,20000:7".parse().unwrap(),
            max_document_tokens: Some(20_000),
            ..AdmissionConfig::default()
        },
        ..WebSettings::default()
    }
}

/// A text of about `tokens` tokens (" word" is one), unique per `n`: five bytes a token, so
/// four bytes a token would price it a quarter higher than the provider counts.
fn text(n: usize, tokens: usize) -> Vec<u8> {
    format!("document {n}:{}", " word".repeat(tokens)).into_bytes()
}

/// What admission should count: the text's tokens and the prompt's.
fn counted(text: &[u8]) -> i64 {
    engine::documents::tokens::count(std::str::from_utf8(text).unwrap()) as i64 + 40
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn uploads_cost_by_size_and_a_refund_returns_exactly_what_was_charged(pool: PgPool) {
    let app = TestApp::spawn(pool, priced()).await;
    let (user, token) = app.user_with_token("sizes@example.com", 100, 10).await;
    // About 60 tokens (1 credit), 2,000 (3), 10,000 (7), counted as the bytes stream in.
    let texts: Vec<Vec<u8>> = [60, 2_000, 10_000].into_iter().enumerate().map(|(n, t)| text(n, t)).collect();
    let mut charged = Vec::new();
    for t in &texts {
        let r = app.upload(&token, t.clone(), None).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let body: serde_json::Value = r.json().await.unwrap();
        charged.push(body["charged"].as_i64().unwrap());
    }
    assert_eq!(charged, [1, 3, 7], "the answer shows what was charged");
    assert_eq!(app.user_state(user).await, (89, 3, 89, 3), "one debit each, balance = ledger");
    let costs: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT j.cost, j.est_input_tokens, (SELECT sum(-l.amount) FROM ledger l WHERE l.job_id = j.id)::bigint
         FROM jobs j WHERE j.owner_id = $1 ORDER BY j.cost",
    )
    .bind(user)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let expected: Vec<(i32, i64, i64)> =
        texts.iter().zip([1, 3, 7]).map(|(t, cost)| (cost, counted(t), i64::from(cost))).collect();
    assert_eq!(costs, expected);
    assert!(counted(&texts[2]) < texts[2].len() as i64 / 4, "priced by the tokens counted, not four bytes a token");

    // Every job fails for good: each refund is exactly its charge, and the books balance.
    let rejected = |_| async { Err(JobError::new(ErrorClass::Rejected, "the provider refused it").with_status(400)) };
    let config = engine::testing::fast_worker("pricing", 3);
    engine::queue::worker::work_once(&app.pool, &config, Arc::new(rejected), Arc::new(AccountHooks), 3).await.unwrap();
    assert_eq!(app.user_state(user).await, (100, 0, 100, 0));
    let refunds: Vec<i64> =
        sqlx::query_scalar("SELECT amount FROM ledger WHERE user_id = $1 AND kind = 'refund' ORDER BY amount")
            .bind(user)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(refunds, [1, 3, 7]);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_text_longer_than_the_context_is_413_and_a_short_balance_402_with_nothing_charged(pool: PgPool) {
    let app = TestApp::spawn(pool, priced()).await;
    let (user, token) = app.user_with_token("long@example.com", 5, 10).await;
    // About 22,000 tokens, past the 20,000 the provider reads.
    let r = app.upload(&token, text(1, 22_000), None).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!((body["error"].as_str(), body["max_tokens"].as_u64()), (Some("too_many_tokens"), Some(20_000)));
    // About 10,000 tokens costs 7: the declared size let it be read (it could have been a PDF,
    // which costs less), its tokens settle the price, and 5 credits are not enough.
    let r = app.upload(&token, text(2, 10_000), None).await;
    assert_eq!(r.status(), StatusCode::PAYMENT_REQUIRED);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!((body["cost"].as_i64(), body["balance"].as_i64()), (Some(7), Some(5)));
    assert_eq!(app.user_state(user).await, (5, 0, 5, 0), "nothing charged, nothing queued");
    assert_eq!(app.stored_blobs(), 0, "nothing kept");
    // What fits is still accepted and charged its price.
    let r = app.upload(&token, text(3, 2_000), None).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(app.user_state(user).await, (2, 1, 2, 1));
}

/// The economy lane: where the provider has a batch API, `lane=economy` is charged the
/// operator's discount (half, rounded up) and its estimate says so; elsewhere, or with
/// `urgent` or a deadline, it is refused in words and nothing is charged.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_economy_lane_costs_its_discount_and_is_refused_where_it_cannot_be_kept(pool: PgPool) {
    let terms = engine::sizing::EconomyTerms { discount: 0.5, window_hours: 24.0 };
    let offered = WebSettings { admission: AdmissionConfig { economy: Some(terms), ..priced().admission }, ..priced() };
    let app = TestApp::spawn(pool.clone(), offered).await;
    let (user, token) = app.user_with_token("economy@example.com", 100, 10).await;
    let send = |path: &'static str, doc: Vec<u8>, fields: Vec<(&'static str, String)>| {
        let (app, token) = (&app, token.clone());
        async move {
            let mut form = reqwest::multipart::Form::new()
                .part("file", reqwest::multipart::Part::bytes(doc).file_name("report.txt"));
            for (name, value) in fields {
                form = form.text(name, value);
            }
            reqwest::Client::new().post(app.url(path)).bearer_auth(&token).multipart(form).send().await.unwrap()
        }
    };
    // 7 credits in the standard lane: 4 in the economy lane, as the estimate says first.
    let economy = || vec![("lane", "economy".to_string())];
    let estimate = send("/api/v1/estimate", text(1, 10_000), economy()).await;
    assert_eq!(estimate.status(), StatusCode::OK);
    assert_eq!(estimate.json::<serde_json::Value>().await.unwrap()["credits"], 4);
    let upload = send("/api/v1/jobs", text(1, 10_000), economy()).await;
    assert_eq!(upload.status(), StatusCode::ACCEPTED);
    let body: serde_json::Value = upload.json().await.unwrap();
    assert_eq!(body["charged"], 4);
    let job = app.get_json(&token, &format!("/api/v1/jobs/{}", body["id"].as_str().unwrap())).await;
    assert_eq!((job["economy"].as_bool(), job["cost"].as_i64()), (Some(true), Some(4)));
    assert_eq!(app.user_state(user).await.0, 96);

    let due_by = (chrono::Utc::now() + chrono::TimeDelta::days(2)).to_rfc3339();
    for (fields, says) in [
        ([economy(), vec![("urgent", "true".to_string())]].concat(), "urgent or in the economy lane"),
        ([economy(), vec![("due_by", due_by)]].concat(), "a deadline is for the standard lane"),
        (vec![("lane", "cheapest".to_string())], "lane is standard or economy"),
    ] {
        let refused = send("/api/v1/jobs", text(2, 100), fields).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let message = refused.json::<serde_json::Value>().await.unwrap()["message"].as_str().unwrap().to_string();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(app.user_state(user).await.0, 96, "nothing charged for a refusal");

    // Without a batch API it is not offered.
    let plain = TestApp::spawn(pool, priced()).await;
    let (_, token) = plain.user_with_token("plain@example.com", 100, 10).await;
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(text(3, 100)).file_name("report.txt"))
        .text("lane", "economy");
    let refused = reqwest::Client::new()
        .post(plain.url("/api/v1/jobs"))
        .bearer_auth(&token)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused.text().await.unwrap().contains("batch API"));
}
