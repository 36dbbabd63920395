//! Uploads through the REST API: admission under concurrency, duplicates, refusals that store
//! nothing, every status, and accounts settled when the jobs end.

use std::collections::HashMap;
use std::sync::Arc;

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::AccountHooks;
use engine::queue::dlq::{self, Selection};
use engine::queue::hooks::TerminalHooks;
use engine::queue::policy::retry::ErrorClass;
use engine::queue::{self, JobError, JobOutput};
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn two_hundred_concurrent_uploads_with_three_credits_accept_exactly_three(pool: PgPool) {
    let app = Arc::new(TestApp::spawn(pool, WebSettings::default()).await);
    let (user, token) = app.user_with_token("many@example.com", 3, 5).await;
    let tasks: Vec<_> = (0..200)
        .map(|n| {
            let (app, token) = (app.clone(), token.clone());
            tokio::spawn(async move { app.upload(&token, doc(n), None).await.status() })
        })
        .collect();
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap().as_u16()).or_default() += 1;
    }
    assert_eq!(statuses.get(&202), Some(&3), "{statuses:?}");
    // With the balance gone, waiting would not help: every refusal is 402.
    assert_eq!(statuses.get(&402), Some(&197), "{statuses:?}");
    let (balance, in_flight, ledger_sum, live) = app.user_state(user).await;
    assert_eq!((balance, in_flight, ledger_sum, live), (0, 3, 0, 3));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn concurrent_uploads_past_the_in_flight_limit_get_429_with_retry_after(pool: PgPool) {
    let app = Arc::new(TestApp::spawn(pool, WebSettings::default()).await);
    let (user, token) = app.user_with_token("busy@example.com", 100, 5).await;
    let tasks: Vec<_> = (0..60)
        .map(|n| {
            let (app, token) = (app.clone(), token.clone());
            tokio::spawn(async move {
                let r = app.upload(&token, doc(n), None).await;
                (r.status(), r.headers().get("retry-after").is_some(), r.json::<serde_json::Value>().await.unwrap())
            })
        })
        .collect();
    let mut accepted = 0;
    for t in tasks {
        let (status, retry_after, body) = t.await.unwrap();
        match status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(retry_after);
                assert_eq!(body["error"], "too_many_in_flight");
                assert_eq!(body["limit"], 5);
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(accepted, 5);
    assert_eq!(app.user_state(user).await, (95, 5, 95, 5));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn duplicates_return_the_same_job_and_reused_idempotency_keys_are_checked(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user, token) = app.user_with_token("dup@example.com", 10, 5).await;
    let first = app.upload(&token, doc(1), None).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let location = first.headers()["location"].to_str().unwrap().to_string();
    let first: serde_json::Value = first.json().await.unwrap();
    assert_eq!(location, format!("/api/v1/jobs/{}", first["id"].as_str().unwrap()));

    let again = app.upload(&token, doc(1), None).await;
    assert_eq!(again.status(), StatusCode::OK);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!((again["id"].clone(), again["duplicate"].clone()), (first["id"].clone(), true.into()));
    assert_eq!(app.user_state(user).await.0, 9, "no second debit");

    let keyed = app.upload(&token, doc(2), Some("key-1")).await;
    assert_eq!(keyed.status(), StatusCode::ACCEPTED);
    let keyed: serde_json::Value = keyed.json().await.unwrap();
    let same = app.upload(&token, doc(2), Some("key-1")).await;
    assert_eq!(same.status(), StatusCode::OK);
    assert_eq!(same.json::<serde_json::Value>().await.unwrap()["id"], keyed["id"]);
    let conflict = app.upload(&token, doc(3), Some("key-1")).await;
    assert_eq!(conflict.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(conflict.json::<serde_json::Value>().await.unwrap()["error"], "idempotency_conflict");
    assert_eq!(app.user_state(user).await, (8, 2, 8, 2));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_idempotency_key_names_its_job_for_24_hours_and_then_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user, token) = app.user_with_token("keys@example.com", 10, 5).await;
    let first = app.upload(&token, doc(1), Some("nightly-42")).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: serde_json::Value = first.json().await.unwrap();
    // The answer says until when the key holds: 24 h after the job was accepted.
    let expires = chrono::DateTime::parse_from_rfc3339(first["idempotency_key_expires_at"].as_str().unwrap()).unwrap();
    let left = expires.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!((left.num_minutes() - 24 * 60).abs() <= 1, "{left:?}");
    let age = |secs: i64| {
        let pool = app.pool.clone();
        async move {
            sqlx::query(
                "UPDATE jobs SET accepted_at = now() - make_interval(secs => $1) WHERE client_key = 'nightly-42'",
            )
            .bind(secs as f64)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    // A minute before the end: still the same job, and another body is still a conflict.
    age(24 * 3600 - 60).await;
    let repeat = app.upload(&token, doc(1), Some("nightly-42")).await;
    assert_eq!(repeat.status(), StatusCode::OK);
    let repeat: serde_json::Value = repeat.json().await.unwrap();
    assert_eq!(repeat["id"], first["id"]);
    let left = chrono::DateTime::parse_from_rfc3339(repeat["idempotency_key_expires_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc)
        - chrono::Utc::now();
    assert!(left.num_seconds() <= 60, "the duplicate's answer tells the same end: {left:?}");
    assert_eq!(app.upload(&token, doc(2), Some("nightly-42")).await.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // A minute past it: the key names nothing, so it is a new upload like any other.
    age(24 * 3600 + 60).await;
    let later = app.upload(&token, doc(2), Some("nightly-42")).await;
    assert_eq!(later.status(), StatusCode::ACCEPTED);
    let later: serde_json::Value = later.json().await.unwrap();
    assert_ne!(later["id"], first["id"]);
    let keyed: Vec<String> = sqlx::query_scalar("SELECT id::text FROM jobs WHERE client_key = 'nightly-42'")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(keyed, vec![later["id"].as_str().unwrap().to_string()], "the old job no longer holds the key");
    assert_eq!(app.user_state(user).await.0, 8, "two jobs, two debits");
    // The periodic sweep forgets expired keys too.
    age(25 * 3600).await;
    let forgotten =
        engine::accounts::admission::forget_client_keys(&app.pool, engine::accounts::admission::CLIENT_KEY_LIFETIME)
            .await
            .unwrap();
    assert_eq!(forgotten, 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn refusals_store_nothing(pool: PgPool) {
    let settings = WebSettings {
        admission: AdmissionConfig { max_backlog: 2, ..Default::default() },
        max_upload_bytes: 1024,
        ..Default::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (user, token) = app.user_with_token("full@example.com", 10, 5).await;
    let too_big = app.upload(&token, vec![b'a'; 4096], None).await;
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let empty = app.upload(&token, Vec::new(), None).await;
    assert_eq!(empty.status(), StatusCode::UNPROCESSABLE_ENTITY);
    for n in 0..2 {
        assert_eq!(app.upload(&token, doc(n), None).await.status(), StatusCode::ACCEPTED);
    }
    let overloaded = app.upload(&token, doc(9), None).await;
    assert_eq!(overloaded.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(overloaded.headers().get("retry-after").is_some());
    assert_eq!(app.user_state(user).await, (8, 2, 8, 2), "only the two accepted uploads left a trace");
    assert_eq!(app.stored_blobs(), 2, "the refused uploads' bytes are gone");
    let no_token = reqwest::Client::new()
        .post(app.url("/api/v1/jobs"))
        .multipart(reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(doc(5))))
        .send()
        .await
        .unwrap();
    assert_eq!(no_token.status(), StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn every_upload_case_gets_the_right_status_and_refusals_store_nothing(pool: PgPool) {
    let settings = WebSettings { max_upload_bytes: 64 * 1024, ..Default::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (user, token) = app.user_with_token("uploads@example.com", 20, 20).await;
    let pdf = engine::testing::pdf_with_text(&["A real PDF", "made by the test"]);
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00".to_vec();
    zip.resize(200, 0);
    let refused: Vec<(&str, Vec<u8>, &str, u16)> = vec![
        ("notes.txt", b"plain words, then <script>x()</script>".to_vec(), "summarize", 415),
        (
            "logo.pdf",
            b"<svg xmlns=\"http://www.w3.org/2000/svg\"><script>x()</script></svg>".to_vec(),
            "summarize",
            415,
        ),
        ("archive.pdf", zip, "summarize", 415),
        ("tool.pdf", b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00".to_vec(), "summarize", 415),
        ("huge.txt", vec![b'a'; 200 * 1024], "summarize", 413),
        ("empty.txt", Vec::new(), "summarize", 422),
        ("doc.txt", b"fine text".to_vec(), "translate", 422),
        ("doc.txt", b"fine text".to_vec(), "poetry", 422),
    ];
    for (name, bytes, preset, status) in refused {
        let r = upload_file(&app, &token, name, bytes, preset).await;
        assert_eq!(r.status().as_u16(), status, "{name}: {}", r.text().await.unwrap());
    }
    assert_eq!(app.user_state(user).await, (20, 0, 20, 0), "refusals debit nothing and store no job");
    assert_eq!(app.stored_blobs(), 0, "refusals store no bytes");

    let accepted: Vec<(&str, Vec<u8>)> = vec![
        ("report.pdf", pdf.clone()),
        ("notes.txt", "Plain notes.\nSecond line with ünïcödé.".as_bytes().to_vec()),
        ("readme.md", b"# Heading\n\nSome **bold** text.\n- one\n- two\n".to_vec()),
        ("looks-like-html.txt", b"This text mentions <b> tags but is plain text.".to_vec()),
        // Text as older editors save it: Latin-1, and UTF-16 with its byte-order mark.
        ("latin1.txt", b"caf\xe9 au lait".to_vec()),
        (
            "utf16.txt",
            [&[0xFF, 0xFE][..], &"thé vert".encode_utf16().flat_map(u16::to_le_bytes).collect::<Vec<u8>>()].concat(),
        ),
        // The content decides, not the name: a Word file, an OpenDocument text, a page saved
        // as ".pdf", a ".docx" that is a PDF.
        ("contract.docx", engine::testing::docx_with_paragraphs(&["The parties agree."])),
        ("manual.odt", engine::testing::odt_of("<text:p>Switch it on.</text:p>")),
        ("page.pdf", b"<!DOCTYPE html><html><body><p>Saved page.</p></body></html>".to_vec()),
        ("really-a-pdf.docx", engine::testing::pdf_with_text(&["Not Word at all"])),
    ];
    let mut ids = Vec::new();
    for (name, bytes) in accepted {
        let r = upload_file(&app, &token, name, bytes, "summarize").await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{name}");
        ids.push(r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stored_blobs(), 10);
    let types: Vec<String> = sqlx::query_scalar("SELECT payload->'document'->>'type' FROM jobs ORDER BY accepted_at")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        types,
        vec!["pdf", "plain_text", "markdown", "plain_text", "plain_text", "plain_text", "docx", "odt", "html", "pdf"]
    );
    // They are stored as UTF-8, which is what the reader and the downloads see.
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT payload #>> '{document,key}' FROM jobs WHERE payload #>> '{document,name}' LIKE '%.txt'
         ORDER BY accepted_at DESC LIMIT 2",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let blobs = engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap();
    assert_eq!(blobs.get(&keys[0]).await.unwrap().as_ref(), "thé vert".as_bytes());
    assert_eq!(blobs.get(&keys[1]).await.unwrap().as_ref(), "café au lait".as_bytes());
    // A duplicate keeps the first upload's bytes only.
    assert_eq!(upload_file(&app, &token, "again.pdf", pdf, "summarize").await.status(), StatusCode::OK);
    assert_eq!(app.stored_blobs(), 10);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn terminal_hooks_settle_in_flight_refunds_and_notices_exactly_once(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user, token) = app.user_with_token("hooks@example.com", 5, 5).await;
    for n in 0..2 {
        assert_eq!(app.upload(&token, doc(n), None).await.status(), StatusCode::ACCEPTED);
    }
    assert_eq!(app.user_state(user).await, (3, 2, 3, 2));
    let config = engine::testing::fast_worker("hooks", 1);
    let hooks: Arc<dyn TerminalHooks> = Arc::new(AccountHooks);
    // One job succeeds: still paid for, no longer in flight.
    let ok = engine::queue::worker::work_once(
        &app.pool,
        &config,
        Arc::new(|_| async { Ok(JobOutput::default()) }),
        hooks.clone(),
        1,
    )
    .await
    .unwrap();
    assert_eq!(ok[0].recorded, queue::Recorded::Done);
    assert_eq!(app.user_state(user).await, (3, 1, 3, 1));
    // The other is rejected for good: refunded once, with one notice.
    let rejected =
        |_| async { Err(JobError::new(ErrorClass::Rejected, "the provider refused the document").with_status(400)) };
    engine::queue::worker::work_once(&app.pool, &config, Arc::new(rejected), hooks.clone(), 1).await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 0, 4, 0));
    let notices = engine::accounts::notices::list(&app.pool, user, 10).await.unwrap();
    assert_eq!(notices.len(), 1);
    assert!(notices[0].message.contains("1 credit refunded"), "{}", notices[0].message);
    // Replaying it from the DLQ is free (the refund stands) and counts it in flight again.
    let failed_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'failed'").fetch_one(&app.pool).await.unwrap();
    dlq::replay(&app.pool, hooks.as_ref(), &Selection::Job(failed_id), "admin").await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 1, 4, 1));
    engine::queue::worker::work_once(&app.pool, &config, Arc::new(rejected), hooks.clone(), 1).await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 0, 4, 0), "no second refund after the replay fails again");
    let kinds: Vec<String> =
        engine::accounts::notices::list(&app.pool, user, 10).await.unwrap().into_iter().map(|n| n.kind).collect();
    assert_eq!(kinds, ["replayed", "refund"], "told of the replay; no second refund notice");
}

async fn upload_with(app: &TestApp, token: &str, n: usize, fields: &[(&str, String)]) -> reqwest::Response {
    let mut form =
        reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(doc(n)).file_name("doc.txt"));
    for (name, value) in fields {
        form = form.text(name.to_string(), value.clone());
    }
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
}

/// Issue 58: an upload may carry a deadline and ask for the urgent lane; the job says both and
/// where the deadline stands, the estimate says whether it can be met, and a deadline past,
/// unreadable or a year away, or a flag that is not yes or no, is refused with nothing stored.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_deadline_and_the_urgent_lane_are_asked_for_with_the_upload_and_shown_on_the_job(pool: PgPool) {
    let app = TestApp::spawn(pool.clone(), WebSettings::default()).await;
    let (user, token) = app.user_with_token("due@example.com", 10, 5).await;
    let due = chrono::Utc::now() + chrono::TimeDelta::hours(2);
    let due_text = due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let accepted = upload_with(&app, &token, 1, &[("due_by", due_text.clone()), ("urgent", "true".into())]).await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED, "{:?}", accepted.text().await);
    let id = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let job = app.get_json(&token, &format!("/api/v1/jobs/{id}")).await;
    let shown = chrono::DateTime::parse_from_rfc3339(job["due_by"].as_str().unwrap()).unwrap();
    assert_eq!(shown.timestamp(), due.timestamp());
    assert_eq!(job["deadline"], "on_track");
    assert_eq!(job["urgent"], true);
    let (latest_start, due_by): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT latest_start, due_by FROM jobs WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(latest_start < due_by, "it must start before it is due, by its expected run time");

    // The estimate: two hours is enough for a small text in an idle queue; a minute is not
    // enough when nothing was measured yet (its run time is then the most an attempt may take).
    for (due_in, meets) in [(chrono::TimeDelta::hours(2), true), (chrono::TimeDelta::seconds(1), false)] {
        let form = reqwest::multipart::Form::new()
            .part("file", reqwest::multipart::Part::bytes(doc(2)).file_name("doc.txt"))
            .text("due_by", (chrono::Utc::now() + due_in).to_rfc3339());
        let estimate: serde_json::Value = reqwest::Client::new()
            .post(app.url("/api/v1/estimate"))
            .bearer_auth(&token)
            .multipart(form)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(estimate["meets_deadline"], meets, "due in {due_in}: {estimate}");
    }

    let before = app.user_state(user).await;
    let stored = app.stored_blobs();
    let past = (chrono::Utc::now() - chrono::TimeDelta::minutes(5)).to_rfc3339();
    let far = (chrono::Utc::now() + chrono::TimeDelta::days(400)).to_rfc3339();
    for (field, value, says) in [
        ("due_by", past, "in the past"),
        ("due_by", "tomorrow at five".to_string(), "date and time with its zone"),
        ("due_by", "2026-12-05T17:00:00".to_string(), "date and time with its zone"),
        ("due_by", far, "more than a year"),
        ("urgent", "maybe".to_string(), "urgent should be true or false"),
    ] {
        let refused = upload_with(&app, &token, 3, &[(field, value.clone())]).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{field}={value}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(says), "{field}={value}: {body}");
    }
    assert_eq!(app.user_state(user).await, before, "refused uploads charge nothing");
    assert_eq!(app.stored_blobs(), stored, "refused uploads store nothing");
}
