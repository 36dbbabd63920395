//! `POST /api/v1/estimate`: an upload's price, parts and time before it is sent for good, read
//! through the upload's own checks, stored nowhere and charged nothing; refused as the upload
//! would be.

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::documents::calls::CallLimits;
use engine::Preset;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::*;

/// Prices by size, a hosted model's call limits, and the presets a language model does.
fn hosted() -> WebSettings {
    WebSettings {
        admission: AdmissionConfig {
            prices: "1000:1,5000:3,20000:7".parse().unwrap(),
            max_document_tokens: Some(500_000),
            ..AdmissionConfig::default()
        },
        call_limits: CallLimits { context_tokens: Some(200_000), max_output_tokens: Some(8_192), answer_growth: None },
        presets: vec![Preset::Summarize, Preset::Translate, Preset::KeyFacts],
        ..WebSettings::default()
    }
}

/// A text of about `tokens` tokens (" word" is one), unique per `n`.
fn text(n: usize, tokens: usize) -> Vec<u8> {
    format!("document {n}:{}", " word".repeat(tokens)).into_bytes()
}

fn form(name: &str, bytes: Vec<u8>, fields: &[(&str, &str)]) -> reqwest::multipart::Form {
    let mut form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()));
    for (key, value) in fields {
        form = form.text(key.to_string(), value.to_string());
    }
    form
}

async fn estimate(
    app: &TestApp,
    token: &str,
    name: &str,
    bytes: Vec<u8>,
    fields: &[(&str, &str)],
) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(app.url("/api/v1/estimate"))
        .bearer_auth(token)
        .multipart(form(name, bytes, fields))
        .send()
        .await
        .unwrap();
    (response.status(), response.json().await.unwrap())
}

async fn jobs_of(app: &TestApp, user: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE owner_id = $1").bind(user).fetch_one(&app.pool).await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_estimate_prices_and_times_an_upload_stores_nothing_and_the_upload_then_costs_what_it_said(pool: PgPool) {
    let app = TestApp::spawn(pool, hosted()).await;
    let (user, token) = app.user_with_token("estimate@example.com", 100, 10).await;
    let doc = text(1, 10_000);
    let (status, said) = estimate(&app, &token, "report.txt", doc.clone(), &[("preset", "summarize")]).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!(said["doc_type"], "txt");
    let counted = engine::documents::tokens::count(std::str::from_utf8(&doc).unwrap());
    assert_eq!(said["counted_tokens"], counted, "the tokens are counted, not guessed from the size");
    assert_eq!((said["credits"].as_i64(), said["held"].as_bool()), (Some(7), Some(false)));
    assert_eq!(said["parts"], 1, "it fits one call");
    // Nothing has run here yet: the time is the attempt's deadline at its size, an upper bound,
    // and with the gate free it starts at once.
    assert_eq!(said["run_time_basis"], "deadline");
    assert_eq!(said["starts_in_secs"], 0);
    assert_eq!(said["jobs_ahead"], 0);
    let deadline = WebSettings::default().time_limits.attempt_secs(said["input_tokens"].as_u64().unwrap() as f64);
    assert_eq!(said["runs_for_secs"].as_u64().unwrap(), deadline.ceil() as u64);
    assert_eq!(said["done_in_secs"], said["runs_for_secs"]);
    // Nothing stored, charged or queued.
    assert_eq!((app.stored_blobs(), jobs_of(&app, user).await), (0, 0));
    assert_eq!(app.user_state(user).await, (100, 0, 100, 0));

    let uploaded: Value = app.upload(&token, doc, None).await.json().await.unwrap();
    assert_eq!(uploaded["charged"], said["credits"], "the upload costs what its estimate said");

    // Once something has finished, the time goes by the measured pace.
    let reports = work(&app, 1).await;
    assert_eq!(reports.len(), 1);
    let (_, timed) = estimate(&app, &token, "next.txt", text(2, 3_000), &[("preset", "summarize")]).await;
    assert_eq!(timed["run_time_basis"], "measured", "{timed}");
    assert!(timed["runs_for_secs"].as_u64().unwrap() < deadline as u64, "{timed}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_long_translation_is_counted_in_the_parts_it_will_run_in_and_a_word_file_is_a_hold(pool: PgPool) {
    let app = TestApp::spawn(pool, hosted()).await;
    let (_, token) = app.user_with_token("parts@example.com", 1_000, 10).await;
    // Seed 000: 50K tokens under one context, translated: parts whose answers fit `max_tokens`.
    let fields = [("preset", "translate"), ("language", "German")];
    let (status, said) = estimate(&app, &token, "book.txt", text(3, 50_000), &fields).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    let parts = engine::documents::calls::expected_parts(
        Preset::Translate,
        said["input_tokens"].as_u64().unwrap(),
        hosted().call_limits,
    );
    assert_eq!(said["parts"], parts);
    assert!(parts >= 8, "{said}");
    // The same text summarized fits one call.
    let (_, summary) = estimate(&app, &token, "book.txt", text(3, 50_000), &[("preset", "summarize")]).await;
    assert_eq!(summary["parts"], 1);
    assert!(said["credits"].as_i64() > summary["credits"].as_i64(), "a translation's answer is billed too");

    let word = engine::testing::docx_with_paragraphs(&["Service agreement", "The parties agree."]);
    let (status, said) = estimate(&app, &token, "contract.docx", word, &[("preset", "summarize")]).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!((said["doc_type"].as_str(), said["held"].as_bool()), (Some("docx"), Some(true)));
    assert_eq!(said["counted_tokens"], Value::Null, "a Word file's text is read later");
    assert!(said["least_credits"].as_i64() <= said["credits"].as_i64());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_estimate_is_refused_as_the_upload_would_be_and_leaves_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool, hosted()).await;
    let (poor, poor_token) = app.user_with_token("poor@example.com", 0, 10).await;
    let (status, body) = estimate(&app, &poor_token, "a.txt", text(4, 100), &[]).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::PAYMENT_REQUIRED, Some("out_of_credits")));
    assert_eq!(body["cost"], 1);
    let (_, token) = app.user_with_token("rich@example.com", 10_000, 10).await;
    let svg = b"<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>".to_vec();
    let (status, _) = estimate(&app, &token, "image.pdf", svg, &[]).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, body) = estimate(&app, &token, "long.txt", text(5, 600_000), &[]).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_many_tokens")));
    let (status, _) = estimate(&app, &token, "a.txt", text(6, 100), &[("preset", "poetry")]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = estimate(&app, &token, "a.txt", text(6, 100), &[("language", "\u{7}German")]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "a language is a name, no control characters");
    let bomb = engine::testing::docx_zip_bomb(64 << 20);
    // An estimate never opens a Word file (the sandboxed reader does, once it is a job): a
    // bomb costs its bytes here.
    let (status, body) = estimate(&app, &token, "bomb.docx", bomb, &[]).await;
    assert_eq!((status, body["doc_type"].as_str()), (StatusCode::OK, Some("docx")), "{body}");
    assert_eq!(app.stored_blobs(), 0);
    assert_eq!(jobs_of(&app, poor).await, 0);
    // A paused queue says so, and tells no start.
    engine::queue::switches::set_processing(&app.pool, false, "operator@example.com").await.unwrap();
    let (_, paused) = estimate(&app, &token, "a.txt", text(7, 100), &[]).await;
    assert_eq!((paused["processing_paused"].as_bool(), &paused["starts_in_secs"]), (Some(true), &Value::Null));
}

/// Issue 55, item 5: estimates have a rate and slots of their own. One account's estimates past
/// 60 a minute get 429 with `Retry-After`, and its uploads (another account's too) are not
/// held up by them: an estimate never takes an upload's slot.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn estimates_have_their_own_rate_and_never_take_an_uploads_slot(pool: PgPool) {
    let settings = WebSettings { max_concurrent_uploads: 1, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("estimator@example.com", 10, 5).await;
    let (_, other) = app.user_with_token("uploader@example.com", 10, 5).await;
    let per_minute = app::server::session::ESTIMATES_PER_MINUTE as usize;
    let mut statuses = Vec::new();
    for n in 0..per_minute + 1 {
        statuses.push(estimate(&app, &token, "a.txt", text(n, 100), &[]).await.0);
    }
    assert!(statuses[..per_minute].iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    assert_eq!(statuses[per_minute], StatusCode::TOO_MANY_REQUESTS);
    // An estimate whose body trickles in holds its own slot, not the process's one upload
    // slot: uploads still go through at once.
    use tokio::io::AsyncWriteExt;
    let mut slow = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/estimate HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {other}\r\n\
         Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 100000\r\n\r\n\
         --xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nsome words",
        app.addr
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    assert_eq!(app.upload(&token, doc(1), None).await.status(), StatusCode::ACCEPTED);
    assert_eq!(app.upload(&other, doc(2), None).await.status(), StatusCode::ACCEPTED);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "uploads waited for an estimate's slot");
    drop(slow);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn parts_are_estimated_by_the_providers_count_of_tokens_as_learned(pool: PgPool) {
    let tokenizer = engine::documents::ratio::Tokenizer {
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        start: 1.0,
    };
    let settings = WebSettings { tokenizer: Some(tokenizer), ..hosted() };
    let app = TestApp::spawn(pool.clone(), settings).await;
    let (_, token) = app.user_with_token("ratio@example.com", 1_000, 10).await;
    // 150K tokens by our count fit one call of a 200K context...
    let summary = [("preset", "summarize")];
    let (status, said) = estimate(&app, &token, "long.txt", text(4, 150_000), &summary).await;
    assert_eq!((status, said["parts"].as_u64()), (StatusCode::OK, Some(1)), "{said}");
    // ...not once the workers have learned that this provider counts 1.5 times as many.
    sqlx::query("INSERT INTO provider_token_ratios (provider, model, ratio, samples) VALUES ('anthropic', 'claude-sonnet-4-5', 1.5, 20)")
        .execute(&pool)
        .await
        .unwrap();
    let (status, said) = estimate(&app, &token, "long.txt", text(4, 150_000), &summary).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert!(said["parts"].as_u64().unwrap() >= 2, "planned by the provider's count: {said}");
}
