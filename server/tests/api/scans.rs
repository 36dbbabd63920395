//! Scans through the REST API: estimated and charged by their pages, read by OCR, and refused
//! in words (with nothing stored or charged) when they are past their bounds, in a language not
//! offered, or sent where no OCR reads them.

use std::sync::Arc;

use app::server::session::WebSettings;
use engine::documents::ocr::OcrConfig;
use engine::testing::{pdf_of_pages, png_of_lines, TestPage};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::*;

/// The server's settings with its reader (and OCR, unless `ocr` is none).
fn reading(ocr: Option<OcrConfig>) -> WebSettings {
    let mut reader = sandbox();
    reader.ocr = ocr.map(Arc::new);
    WebSettings { survey_reader: Some(Arc::new(reader)), ..WebSettings::default() }
}

fn english() -> Option<OcrConfig> {
    Some(OcrConfig::new(vec!["eng".into(), "deu".into()]))
}

async fn send(
    app: &TestApp,
    token: &str,
    path: &str,
    name: &str,
    bytes: Vec<u8>,
    fields: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()))
        .text("preset", "summarize");
    for (key, value) in fields {
        form = form.text(key.to_string(), value.to_string());
    }
    let response = reqwest::Client::new().post(app.url(path)).bearer_auth(token).multipart(form).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn balance(app: &TestApp, user: i64) -> i64 {
    sqlx::query_scalar("SELECT balance FROM users WHERE id = $1").bind(user).fetch_one(&app.pool).await.unwrap()
}

fn lines(page: usize) -> Vec<String> {
    vec![format!("Scanned page {page} of the survey."), format!("Finding {page}: the roof needs repair.")]
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_scan_is_estimated_and_charged_by_its_pages_then_read_by_ocr(pool: PgPool) {
    let app = TestApp::spawn(pool, reading(english())).await;
    let (user, token) = app.user_with_token("scans@example.com", 100, 10).await;
    // Five scanned pages and a text page: 5 × 0.3 credits is 2, its text page priced by its text.
    let mut pages: Vec<TestPage> = (1..=5).map(|n| TestPage::Scanned(lines(n))).collect();
    pages.push(TestPage::Text(lines(6)));
    let pdf = pdf_of_pages(&pages);
    let (status, said) = send(&app, &token, "/api/v1/estimate", "survey.pdf", pdf.clone(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!((said["pages"].as_u64(), said["scanned_pages"].as_u64()), (Some(6), Some(5)), "{said}");
    assert_eq!(said["scan_credits"], 2);
    assert_eq!(said["credits"], 3, "2 for the scanned pages, 1 for the text page: {said}");
    let (status, uploaded) =
        send(&app, &token, "/api/v1/jobs", "survey.pdf", pdf, &[("document_language", "eng")]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{uploaded}");
    assert_eq!(balance(&app, user).await, 97, "charged what the estimate said");
    let id = uploaded["id"].as_str().unwrap().to_string();
    work(&app, 1).await;
    let job = app.get_json(&token, &format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "done", "{job}");
    let read: Vec<u64> = job["scan"]["read"].as_array().unwrap().iter().map(|p| p["page"].as_u64().unwrap()).collect();
    assert_eq!(read, vec![1, 2, 3, 4, 5], "{job}");
    assert_eq!(job["scan"]["language"], "eng");
    let result = reqwest::Client::new()
        .get(app.url(&format!("/api/v1/jobs/{id}/result.md")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(result.contains("Finding 1") || result.contains("Scanned page 1"), "the scan's words: {result}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_png_photo_is_one_scanned_page(pool: PgPool) {
    let app = TestApp::spawn(pool, reading(english())).await;
    let (user, token) = app.user_with_token("photo@example.com", 10, 10).await;
    let png = png_of_lines(&["Receipt 4471", "Paid in full."]);
    let (status, uploaded) = send(&app, &token, "/api/v1/jobs", "receipt.png", png, &[]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{uploaded}");
    assert_eq!(balance(&app, user).await, 9, "one page: a credit");
    work(&app, 1).await;
    let job = app.get_json(&token, &format!("/api/v1/jobs/{}", uploaded["id"].as_str().unwrap())).await;
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["scan"]["read"][0]["page"], 1);
}

/// A PNG whose header claims `width` × `height` pixels, with almost nothing after it.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    png.extend_from_slice(&width.to_be_bytes());
    png.extend_from_slice(&height.to_be_bytes());
    png.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0, 0]);
    png.extend_from_slice(b"\x00\x00\x00\x0aIDATx\x9c\x63\x00\x00\x00\x01\x00\x01");
    png
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn bombs_unknown_languages_and_scans_without_ocr_are_refused_in_words_with_nothing_kept(pool: PgPool) {
    let app = TestApp::spawn(pool.clone(), reading(english())).await;
    let (user, token) = app.user_with_token("bombs@example.com", 10, 10).await;
    for path in ["/api/v1/estimate", "/api/v1/jobs"] {
        let (status, said) = send(&app, &token, path, "bomb.png", png_claiming(100_000, 100_000), &[]).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {said}");
        assert!(said["message"].to_string().contains("100,000 × 100,000"), "{said}");
        let (status, said) =
            send(&app, &token, path, "loop.tiff", engine::testing::tiff_of(&[(100, 100), (100, 100)], true), &[]).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {said}");
        assert!(said["message"].to_string().contains("point back"), "{said}");
    }
    let scan = pdf_of_pages(&[TestPage::Scanned(lines(1))]);
    let (status, said) =
        send(&app, &token, "/api/v1/jobs", "scan.pdf", scan.clone(), &[("document_language", "klingon")]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{said}");
    assert!(said["message"].to_string().contains("eng, deu"), "the offered languages are named: {said}");
    assert_eq!(app.stored_blobs(), 0, "nothing refused is kept");
    assert_eq!(balance(&app, user).await, 10, "nothing refused is charged");
    drop(app);
    // A server without OCR says so before it stores or charges anything.
    let app = TestApp::spawn(pool, reading(None)).await;
    let (status, said) = send(&app, &token, "/api/v1/jobs", "scan.pdf", scan, &[]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{said}");
    assert!(said["message"].to_string().contains("cannot read scans"), "{said}");
    assert_eq!(app.stored_blobs(), 0);
    assert_eq!(balance(&app, user).await, 10);
}
