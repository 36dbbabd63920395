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
