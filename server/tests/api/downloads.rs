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
    // The revocation reaches the auth cache by a notification: at once, but not within the
    // revoking transaction's commit (under load, a few milliseconds after it).
    let refused = engine::testing::wait_for(std::time::Duration::from_secs(2), || async {
        client.get(app.url(&path)).bearer_auth(&bob).send().await.unwrap().status() == StatusCode::UNAUTHORIZED
    })
    .await;
    assert!(refused, "a revoked token stops working");
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
    let json = app.get_json(&token, &format!("/api/v1/jobs/{id}/result")).await;
    assert_eq!(json["result"]["provider"], "local");
}

/// Issue 57: a translated web page comes back as a page, its markup as it was and its words
/// translated.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translated_web_page_downloads_as_a_page_with_its_markup(pool: PgPool) {
    let settings = WebSettings {
        presets: engine::Preset::ALL.to_vec(),
        document_reader: Some(std::sync::Arc::new(sandbox())),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("pages@example.com", 10, 5).await;
    let page = r#"<!DOCTYPE html><html><body><h2 class="t">News</h2><p>It <a href="/more">rained</a>.</p><script>x()</script></body></html>"#;
    let job: serde_json::Value =
        upload_file(&app, &token, "news.html", page.as_bytes().to_vec(), "translate").await.json().await.unwrap();
    let fake = fakeprovider::FakeProvider::start().await;
    fake.behave_like(fakeprovider::HostedModel { first_token_ms: 1, ..fakeprovider::HostedModel::default() });
    let provider = engine::documents::providers::ProviderConfig {
        kind: engine::documents::providers::ProviderKind::Anthropic,
        base_url: fake.base_url(),
        api_key: Some("k".into()),
        model: "m".into(),
        ..Default::default()
    };
    work_with(&app, 1, &provider).await;
    let path = format!("/api/v1/jobs/{}/translated", job["id"].as_str().unwrap());
    let file = reqwest::Client::new().get(app.url(&path)).bearer_auth(&token).send().await.unwrap();
    if file.status() != StatusCode::OK {
        let view = engine::queue::get(&app.pool, job["id"].as_str().unwrap().parse().unwrap()).await.unwrap();
        panic!("{}: {} {view:?}", file.status(), file.text().await.unwrap());
    }
    assert!(file.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(file.headers()["content-disposition"].to_str().unwrap().contains("news-translated.html"));
    let html = file.text().await.unwrap();
    for kept in [
        r#"<h2 class="t">[translated] News</h2>"#,
        r#"<p>[translated] It <a href="/more">rained</a>.</p>"#,
        "<script>x()</script>",
    ] {
        assert!(html.contains(kept), "{kept}\nin\n{html}");
    }
}

/// A translated Word file comes back as a Word file: the owner uploads a contract, a model
/// translates it, and the download is the same document with every paragraph translated in
/// place; a summary or another's job does not offer one.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translated_word_file_downloads_in_its_own_format_with_every_paragraph_translated(pool: PgPool) {
    let settings = WebSettings {
        presets: engine::Preset::ALL.to_vec(),
        document_reader: Some(std::sync::Arc::new(sandbox())),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (_, token) = app.user_with_token("translator@example.com", 10, 5).await;
    let (_, other) = app.user_with_token("other@example.com", 10, 5).await;
    let body = r#"<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr><w:r><w:t>Lease</w:t></w:r></w:p>
        <w:p><w:r><w:t xml:space="preserve">Rent is </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>900 EUR</w:t></w:r></w:p>
        <w:tbl><w:tr><w:tc><w:p><w:r><w:t>Deposit</w:t></w:r></w:p></w:tc></w:tr></w:tbl>"#;
    let docx = engine::testing::docx_of(body);
    let upload = |preset: &'static str| upload_docx(&app, &token, docx.clone(), preset, "German");
    let translation: serde_json::Value = upload("translate").await.unwrap().json().await.unwrap();
    let summary: serde_json::Value = upload("summarize").await.unwrap().json().await.unwrap();
    let path = |job: &serde_json::Value| format!("/api/v1/jobs/{}/translated", job["id"].as_str().unwrap());
    let client = reqwest::Client::new();
    let early = client.get(app.url(&path(&translation))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(early.status(), StatusCode::CONFLICT, "not done yet");

    let fake = fakeprovider::FakeProvider::start().await;
    fake.behave_like(fakeprovider::HostedModel {
        first_token_ms: 1,
        prefill_tokens_per_sec: 1e9,
        output_tokens_per_sec: 1e9,
        ..fakeprovider::HostedModel::default()
    });
    let provider = engine::documents::providers::ProviderConfig {
        kind: engine::documents::providers::ProviderKind::Anthropic,
        base_url: fake.base_url(),
        api_key: Some("k".into()),
        model: "m".into(),
        ..Default::default()
    };
    work_with(&app, 2, &provider).await;

    let file = client.get(app.url(&path(&translation))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(file.status(), StatusCode::OK);
    assert_eq!(
        file.headers()["content-type"],
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    );
    let disposition = file.headers()["content-disposition"].to_str().unwrap().to_string();
    assert!(disposition.contains("lease-translated.docx"), "{disposition}");
    let bytes = file.bytes().await.unwrap();
    assert_eq!(engine::documents::sniff::sniff(&bytes), Ok(engine::documents::DocType::Docx));
    let text = engine::documents::extract::extract_text(engine::documents::DocType::Docx, &bytes).unwrap().text;
    // The bold amount still bold (its run tagged when the file is read again).
    assert_eq!(text, "# [translated] Lease\n\n[translated] Rent is <b1>900 EUR</b1>\n\n[translated] Deposit");
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    let mut xml = String::new();
    std::io::Read::read_to_string(&mut archive.by_name("word/document.xml").unwrap(), &mut xml).unwrap();
    for kept in ["<w:pStyle w:val=\"Heading1\"/>", "<w:tbl>", "<w:b/>"] {
        assert!(xml.contains(kept), "{kept}: {xml}");
    }

    // Not someone else's, and not a summary.
    assert_eq!(client.get(app.url(&path(&translation))).bearer_auth(&other).send().await.unwrap().status(), 404);
    let summarized = client.get(app.url(&path(&summary))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(summarized.status(), StatusCode::CONFLICT);

    // A flood of downloads: a process rebuilds two at once (here with a reader that takes 2 s);
    // the rest are told to come back, before their document is read.
    let slow = engine::documents::sandbox::SandboxConfig::new(
        "/bin/sh".into(),
        vec!["-c".into(), "cat > /dev/null; sleep 2; printf F".into(), "reader".into()],
    );
    let settings = WebSettings {
        presets: engine::Preset::ALL.to_vec(),
        document_reader: Some(std::sync::Arc::new(slow)),
        ..WebSettings::default()
    };
    let busy_app = TestApp::spawn_storing_in(app.pool.clone(), settings, app.blob_dir.clone()).await;
    // The file built above is kept: a flood of first downloads needs it built again.
    let id: uuid::Uuid = translation["id"].as_str().unwrap().parse().unwrap();
    let kept = engine::documents::Blobs::translated_key(id);
    assert!(app.blobs.exists(&kept).await.unwrap(), "the rebuilt file is kept in the store");
    app.blobs.delete(&kept).await.unwrap();
    let asks = (0..6).map(|_| client.get(busy_app.url(&path(&translation))).bearer_auth(&token).send());
    let answers = futures::future::join_all(asks).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.as_ref().unwrap().status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 2, "two rebuilt at once: {statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 4, "{statuses:?}");
    let busy = answers.into_iter().map(Result::unwrap).find(|a| a.status() == 503).unwrap();
    assert!(busy.headers().contains_key("retry-after"));

    // Issue 55, item 3: built once, the file is streamed from the store. One user looping
    // downloads of it from four connections takes no rebuild turn from anyone; another
    // user's download (built once too) is served in well under a second every time, where
    // each used to rebuild it (here 2 s) or be told to come back.
    let (_, second) = busy_app.user_with_token("second@example.com", 10, 5).await;
    let theirs = upload_docx(&busy_app, &second, docx.clone(), "translate", "Italian").await.unwrap();
    let theirs: serde_json::Value = theirs.json().await.unwrap();
    assert!(theirs["id"].is_string(), "{theirs}");
    work_with(&busy_app, 1, &provider).await;
    for (job, who) in [(&translation, &token), (&theirs, &second)] {
        let first = client.get(busy_app.url(&path(job))).bearer_auth(who).send().await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "the first download builds it (2 s)");
    }
    let looping = (0..4).map(|_| {
        let (client, url, token) = (client.clone(), busy_app.url(&path(&translation)), token.clone());
        tokio::spawn(async move {
            for _ in 0..10 {
                let answer = client.get(&url).bearer_auth(&token).send().await.unwrap();
                assert_eq!(answer.status(), StatusCode::OK);
                answer.bytes().await.unwrap();
            }
        })
    });
    let looping: Vec<_> = looping.collect();
    for _ in 0..8 {
        let started = std::time::Instant::now();
        let answer = client.get(busy_app.url(&path(&theirs))).bearer_auth(&second).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        answer.bytes().await.unwrap();
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_millis(500), "another user's download took {took:?}");
    }
    for task in looping {
        task.await.unwrap();
    }
}

/// Upload `docx` as `lease.docx` for `token` with `preset` into `language`.
fn upload_docx(
    app: &TestApp,
    token: &str,
    docx: Vec<u8>,
    preset: &str,
    language: &str,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(docx).file_name("lease.docx"))
        .text("preset", preset.to_string())
        .text("language", language.to_string());
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send()
}

/// A document done in parts can be read before it ends (or after it failed): the parts
/// answered so far, in order, each part not done marked in its place.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_parts_answered_so_far_download_in_order_with_the_rest_marked(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("parts@example.com", 5, 5).await;
    let (_, other) = app.user_with_token("someone@example.com", 5, 5).await;
    let job: serde_json::Value = app.upload(&token, doc(1), None).await.json().await.unwrap();
    let id: uuid::Uuid = job["id"].as_str().unwrap().parse().unwrap();
    let path = format!("/api/v1/jobs/{id}/parts.md");
    let client = reqwest::Client::new();
    let none = client.get(app.url(&path)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(none.status(), StatusCode::CONFLICT, "not done in parts");

    // Split in four; the second and the fourth answered so far (parts run side by side).
    sqlx::query(
        "INSERT INTO job_parts (job_id, level, idx, body, est_tokens, output, done_at)
         SELECT $1, 0, i, 'text', 10, CASE WHEN i IN (1, 3) THEN 'Chapter ' || (i + 1) || ' translated.' END,
                CASE WHEN i IN (1, 3) THEN now() END
         FROM generate_series(0, 3) i",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    // Staff reading a user's parts (audited) charge the owner nothing; nor did the owner's
    // look before any part was done. Only the owner's reading counts the parts as had.
    let admin = engine::accounts::users::create_user(
        &app.pool,
        "ops@example.com",
        "password123",
        engine::accounts::Role::Admin,
        0,
    );
    let (_, staff) = engine::accounts::tokens::create(&app.pool, admin.await.unwrap().id, "ops").await.unwrap();
    assert_eq!(client.get(app.url(&path)).bearer_auth(&staff).send().await.unwrap().status(), StatusCode::OK);
    let read = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM parts_read WHERE job_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    assert_eq!(read().await, 0, "neither staff nor an early look counts as the owner's reading");
    let so_far = client.get(app.url(&path)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(so_far.status(), StatusCode::OK);
    assert_eq!(read().await, 1);
    assert!(so_far.headers()["content-disposition"].to_str().unwrap().contains("-parts-so-far.md"));
    assert_eq!(
        so_far.text().await.unwrap(),
        "*[part 1 of 4 is not done]*\n\nChapter 2 translated.\n\n*[part 3 of 4 is not done]*\n\nChapter 4 translated."
    );
    assert_eq!(client.get(app.url(&path)).bearer_auth(&other).send().await.unwrap().status(), StatusCode::NOT_FOUND);

    // Failed and refunded in full (the failure was ours): what was answered is not served, as
    // nothing of it was paid for (issue 55, item 2).
    sqlx::query(
        "UPDATE jobs SET state = 'failed', failure_kind = 'provider_rejected', failure_reason = 'refused',
                finished_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO ledger (user_id, kind, amount, job_id, note) SELECT owner_id, 'refund', cost, id, 'ours' FROM jobs WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    let refunded = client.get(app.url(&path)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(refunded.status(), StatusCode::CONFLICT);
    assert!(refunded.text().await.unwrap().contains("refunded in full"));
}

/// Issue 55, item 3 (a review's case): a translated file that cannot be built (its paragraphs
/// do not line up with the document's) is refused once; later downloads get the same answer
/// without the document being read again (here: its original is gone, and the answer stays).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translated_file_that_cannot_be_built_is_refused_without_reading_it_again(pool: PgPool) {
    let settings = WebSettings {
        presets: engine::Preset::ALL.to_vec(),
        document_reader: Some(std::sync::Arc::new(sandbox())),
        ..WebSettings::default()
    };
    let app = TestApp::spawn(pool, settings).await;
    let (user, token) = app.user_with_token("mismatch@example.com", 10, 5).await;
    let docx = engine::testing::docx_with_paragraphs(&["One.", "Two.", "Three."]);
    let key = engine::documents::Blobs::new_key();
    app.blobs.put(&key, docx.clone().into()).await.unwrap();
    let id: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, result, cost, accepted_at, run_at, finished_at)
         VALUES ($1, 'done', $2, $3, 1, now(), now(), now()) RETURNING id",
    )
    .bind(user)
    .bind(serde_json::json!({"document": {"key": key, "type": "docx", "size": docx.len(), "sha256": key, "name": "m.docx"},
                             "preset": "translate", "language": "German"}))
    .bind(serde_json::json!({"markdown": "Eins und zwei."}))
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let get =
        || reqwest::Client::new().get(app.url(&format!("/api/v1/jobs/{id}/translated"))).bearer_auth(&token).send();
    let first = get().await.unwrap();
    assert_eq!(first.status(), StatusCode::CONFLICT);
    let reason = first.text().await.unwrap();
    assert!(reason.contains("paragraphs"), "{reason}");
    app.blobs.delete(&key).await.unwrap();
    let again = get().await.unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT, "answered from what was kept, not by reading the document");
    assert_eq!(again.text().await.unwrap(), reason);
}
