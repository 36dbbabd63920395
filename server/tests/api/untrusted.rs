//! Uploads from strangers: refused before their body is read, read in bounded memory when
//! accepted, with bounded side fields and parts, and a bounded number read at once.

use std::time::Duration;

use app::server::session::WebSettings;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;
use server::testing::{multipart_type, open_upload, raw_upload, send_body, status_within, BOUNDARY};

const MIB: usize = 1 << 20;

fn file_part(name: &str) -> String {
    server::testing::file_part(name)
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_50_mib_upload_without_credits_is_refused_before_its_body_is_read(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("broke@example.com", 0, 5).await;
    let addr = app.addr;
    let answer = tokio::task::spawn_blocking(move || {
        raw_upload(addr, &token, &file_part("big.pdf"), b"%PDF-1.7\n", b'0', 50 * MIB)
    })
    .await
    .unwrap();
    assert_eq!(answer.status, 402);
    assert!(answer.sent < 50 * MIB, "the answer came while the client was still sending ({} bytes sent)", answer.sent);
    eprintln!("refused after {:?}, {} KiB of 50 MiB sent", answer.took, answer.sent / 1024);
    assert_eq!(app.stored_blobs(), 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn side_fields_and_parts_are_bounded_and_unknown_parts_refused(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("fields@example.com", 5, 5).await;
    // A 300 MB `preset` is refused after its first few hundred bytes.
    let addr = app.addr;
    let secret = token.clone();
    let answer = tokio::task::spawn_blocking(move || {
        raw_upload(addr, &secret, "Content-Disposition: form-data; name=\"preset\"", b"", b'x', 300 * MIB)
    })
    .await
    .unwrap();
    assert_eq!(answer.status, 422);
    assert!(answer.sent < 300 * MIB);

    let send = |form: reqwest::multipart::Form| {
        reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(&token).multipart(form).send()
    };
    let file = || reqwest::multipart::Part::bytes(b"Plain notes.".to_vec()).file_name("a.txt");
    let unknown = send(reqwest::multipart::Form::new().part("file", file()).text("colour", "blue")).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(unknown.text().await.unwrap().contains("unknown form field"));
    let mut many = reqwest::multipart::Form::new().part("file", file());
    for _ in 0..12 {
        many = many.text("preset", "summarize");
    }
    assert_eq!(send(many).await.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);
    let two_files = reqwest::multipart::Form::new().part("file", file()).part("file", file());
    assert_eq!(send(two_files).await.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);
    let late_svg = format!("{}\n<svg onload=alert(1)></svg>\n", "Plain notes. ".repeat(2000));
    let svg = reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::text(late_svg).file_name("a.txt"));
    assert_eq!(send(svg).await.unwrap().status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(app.stored_blobs(), 0, "refused uploads leave no blob");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn uploads_past_the_concurrency_bound_wait_then_get_503(pool: PgPool) {
    let settings = WebSettings {
        max_concurrent_uploads: 1,
        busy_uploads_wait: Duration::from_millis(500),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (_, slow_token) = app.user_with_token("slow@example.com", 5, 5).await;
    let (_, token) = app.user_with_token("next@example.com", 5, 5).await;
    // Hold the only slot with an upload that is still sending.
    let opening = format!("--{BOUNDARY}\r\n{}\r\n\r\n%PDF-1.7\n", file_part("slow.pdf"));
    let slow = open_upload(app.addr, &slow_token, &multipart_type(), 100_000, opening.as_bytes());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy = app.upload(&token, doc(1), None).await;
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(busy.headers().get("retry-after").is_some());
    drop(slow);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.upload(&token, doc(2), None).await.status(), StatusCode::ACCEPTED, "the slot is free again");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_health_check_tells_strangers_nothing_about_database_errors(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let healthy = reqwest::get(app.url("/healthz")).await.unwrap();
    assert_eq!(healthy.status(), StatusCode::OK);
    app.pool.close().await;
    let down = reqwest::get(app.url("/healthz")).await.unwrap();
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = down.json().await.unwrap();
    assert_eq!(body, serde_json::json!({ "status": "degraded", "database": "unreachable" }));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_body_with_no_boundary_is_refused_after_a_bounded_read(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("preamble@example.com", 5, 5).await;
    let addr = app.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let content_type = "multipart/form-data; boundary=never-sent";
        let stream = open_upload(addr, &token, content_type, 100 * MIB, b"");
        send_body(stream, std::time::Instant::now(), b"", b'a', 100 * MIB, b"")
    })
    .await
    .unwrap();
    let (status, sent) = (answer.status, answer.sent);
    assert_eq!(status, 422);
    assert!(sent < 100 * MIB, "refused while the client was still sending ({sent} bytes)");
}

/// An upload of `bytes` sent from the local address `from` (127.0.0.x: another client).
async fn upload_from(app: &TestApp, from: &str, token: &str, bytes: Vec<u8>) -> reqwest::Response {
    let client = reqwest::Client::builder().local_address(from.parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let form =
        reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(bytes).file_name("doc.txt"));
    client.post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
}

/// Upload slots are shared fairly: one account, or several accounts on one address (free
/// accounts cost nothing), hold at most their allowance while others still upload.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn one_account_or_one_address_cannot_take_every_upload_slot(pool: PgPool) {
    let settings = WebSettings {
        max_uploads_per_user: 1,
        max_uploads_per_address: 2,
        busy_uploads_wait: Duration::from_millis(500),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let mut sybils = Vec::new();
    for n in 0..4 {
        sybils.push(app.user_with_token(&format!("sybil{n}@example.com"), 5, 5).await.1);
    }
    let (_, other) = app.user_with_token("other@example.com", 5, 5).await;
    // Two accounts on 127.0.0.1 each hold an upload that is still sending: the address's two.
    let opening = format!("--{BOUNDARY}\r\n{}\r\n\r\n%PDF-1.7\n", file_part("slow.pdf"));
    let held: Vec<_> =
        sybils[..2].iter().map(|t| open_upload(app.addr, t, &multipart_type(), 100_000, opening.as_bytes())).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The third and fourth accounts on that address wait their turn, then get 429.
    for token in &sybils[2..] {
        let refused = upload_from(&app, "127.0.0.1", token, doc(1)).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.headers().get("retry-after").is_some());
        assert_eq!(refused.json::<serde_json::Value>().await.unwrap()["error"], "too_many_uploads");
    }
    // An account holding its one slot is bounded on any address; others elsewhere still upload.
    let elsewhere = upload_from(&app, "127.0.0.3", &sybils[0], doc(3)).await;
    assert_eq!(elsewhere.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upload_from(&app, "127.0.0.2", &other, doc(2)).await.status(), StatusCode::ACCEPTED);
    drop(held);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_big_upload_sent_in_big_chunks_is_accepted(pool: PgPool) {
    // An honest client may put the part headers and much of the file in one network chunk.
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("bulk@example.com", 5, 5).await;
    let mut pdf = b"%PDF-1.7\n".to_vec();
    pdf.resize(8 * MIB, b'0');
    let form = reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(pdf).file_name("big.pdf"));
    let answer = reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(&token).multipart(form).send().await;
    assert_eq!(answer.unwrap().status(), StatusCode::ACCEPTED);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_client_silent_between_parts_is_dropped_after_the_idle_time(pool: PgPool) {
    let settings = WebSettings { upload_idle: Duration::from_secs(1), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("silent@example.com", 5, 5).await;
    let addr = app.addr;
    let (status, took) = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        // Half a part's headers, then nothing: the parser waits for the rest of them.
        let opening = format!("--{BOUNDARY}\r\nContent-Disposition: form-da");
        let mut stream = open_upload(addr, &token, &multipart_type(), 10 * MIB, opening.as_bytes());
        (status_within(&mut stream, Duration::from_secs(20)), started.elapsed())
    })
    .await
    .unwrap();
    assert_eq!(status, 422, "dropped with a clear error");
    assert!(took < Duration::from_secs(10), "after the idle time, not the 10-minute deadline: {took:?}");
    assert_eq!(app.stored_blobs(), 0);
}

/// The file stored, then a side field trickled a byte at a time, never idle long enough to be
/// dropped for it: the upload's deadline ends it, and the stored file goes with it (no job, no
/// quota, nothing for an operator to find).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_upload_held_open_past_its_deadline_after_its_file_leaves_nothing_stored(pool: PgPool) {
    let settings = WebSettings {
        upload_idle: Duration::from_secs(2),
        upload_deadline: Duration::from_secs(3),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (user, token) = app.user_with_token("trickle@example.com", 5, 5).await;
    let addr = app.addr;
    let blobs = app.blob_dir.clone();
    let (status, stored_meanwhile) = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let file = format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n\
             Content-Type: text/plain\r\n\r\nNotes worth keeping, twice over.\r\n\
             --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\n"
        );
        let mut stream = open_upload(addr, &token, &multipart_type(), 10_000, file.as_bytes());
        let mut stored_meanwhile = false;
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(500));
            stored_meanwhile |= files_under(&blobs) > 0;
            if stream.write_all(b"F").is_err() {
                break;
            }
        }
        (status_within(&mut stream, Duration::from_secs(10)), stored_meanwhile)
    })
    .await
    .unwrap();
    assert!(stored_meanwhile, "the file was stored before the side field began");
    assert_eq!(status, 422, "ended by the deadline, in words");
    assert_eq!(app.stored_blobs(), 0, "what it stored is gone");
    assert_eq!(app.user_state(user).await, (5, 0, 5, 0), "no job, nothing charged");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_reused_idempotency_key_is_refused_unread_while_intake_is_overloaded(pool: PgPool) {
    let mut settings = WebSettings::default();
    settings.admission.max_backlog = 1;
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("retry@example.com", 5, 5).await;
    assert_eq!(app.upload(&token, doc(1), Some("key-1")).await.status(), 202, "the backlog is now full");
    let addr = app.addr;
    let status = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        // The same key again, with a body that never finishes: only a refusal before reading
        // answers in time.
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "POST /api/v1/jobs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nIdempotency-Key: key-1\r\n\
             Content-Type: {}\r\nContent-Length: {}\r\n\r\n--{BOUNDARY}\r\n{}\r\n\r\n%PDF-1.7\n",
            multipart_type(),
            50 * MIB,
            file_part("again.pdf"),
        )
        .unwrap();
        status_within(&mut stream, Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert_eq!(status, 503, "an overloaded intake refuses even a retry before reading it");
}
