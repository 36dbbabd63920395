//! Users delete what they sent: a job's document and result, or the whole account, which is
//! then found nowhere: no table, no stored file, no session or token on any process.

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use engine::queue::JobOutput;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

/// Rows anywhere in the database (every table of every schema but Postgres' own) whose text
/// holds `needle`, as `table: count`.
async fn found_anywhere(pool: &PgPool, needle: &str) -> Vec<String> {
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_schema, table_name FROM information_schema.tables
         WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(tables.len() > 15, "{tables:?}");
    let mut found = Vec::new();
    for (schema, table) in tables {
        let sql =
            format!("SELECT count(*) FROM \"{schema}\".\"{table}\" t WHERE strpos(lower(t::text), lower($1)) > 0");
        let n: i64 = sqlx::query_scalar(&sql).bind(needle).fetch_one(pool).await.unwrap();
        if n > 0 {
            found.push(format!("{schema}.{table}: {n}"));
        }
    }
    found
}

/// Stored files holding `needle`.
fn stored_files_holding(dir: &std::path::Path, needle: &[u8]) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                stored_files_holding(&path, needle)
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                usize::from(bytes.windows(needle.len()).any(|w| w == needle))
            }
        })
        .sum()
}

async fn upload_named(app: &TestApp, token: &str, name: &str, body: &str) -> String {
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(body.as_bytes().to_vec()).file_name(name.to_string()))
        .text("preset", "summarize");
    let response =
        reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    response.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn delete(app: &TestApp, token: &str, id: &str) -> reqwest::Response {
    reqwest::Client::new().delete(app.url(&format!("/api/v1/jobs/{id}"))).bearer_auth(token).send().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_user_deletes_an_ended_jobs_document_and_result_and_the_job_stays_in_their_credits(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user, token) = app.user_with_token("keeper@example.com", 10, 5).await;
    let (_, stranger) = app.user_with_token("stranger@example.com", 10, 5).await;
    let secret = "The merger closes on Friday: codeword PELICAN-7731.";
    let id = upload_named(&app, &token, "pelican-merger.txt", secret).await;
    // Not yet ended: 409, and nothing is deleted.
    let early = delete(&app, &token, &id).await;
    assert_eq!(early.status(), StatusCode::CONFLICT);
    assert_eq!(early.json::<serde_json::Value>().await.unwrap()["error"], "not_ended");
    work(&app, 1).await;
    let client = reqwest::Client::new();
    let result = client.get(app.url(&format!("/api/v1/jobs/{id}/result"))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(result.status(), StatusCode::OK);
    assert!(!found_anywhere(&app.pool, "pelican-merger").await.is_empty(), "the file name was stored");
    assert_eq!(app.stored_blobs(), 1);
    let balance_before = app.user_state(user).await;

    assert_eq!(delete(&app, &stranger, &id).await.status(), StatusCode::NOT_FOUND, "only its owner deletes it");
    let deleted = delete(&app, &token, &id).await;
    assert_eq!(deleted.status(), StatusCode::OK);
    let deleted: serde_json::Value = deleted.json().await.unwrap();
    assert_eq!(
        (
            deleted["deleted"].as_bool(),
            deleted["state"].as_str(),
            deleted["file_name"].is_null(),
            deleted["has_result"].as_bool(),
            deleted["cost"].as_i64()
        ),
        (Some(true), Some("done"), true, Some(false), Some(1)),
        "{deleted}"
    );
    // The document is gone from storage at once; the name, the text and the answer from every table.
    assert_eq!(app.stored_blobs(), 0);
    assert_eq!(stored_files_holding(&app.blob_dir, b"PELICAN-7731"), 0);
    for needle in ["pelican-merger", "PELICAN-7731", "codeword"] {
        assert_eq!(found_anywhere(&app.pool, needle).await, Vec::<String>::new(), "{needle}");
    }
    // The job and the credits stay: same balance, ledger and history line.
    assert_eq!(app.user_state(user).await, balance_before);
    for path in ["", "/result", "/result.md", "/original"] {
        let gone = client.get(app.url(&format!("/api/v1/jobs/{id}{path}"))).bearer_auth(&token).send().await.unwrap();
        assert_eq!(gone.status(), StatusCode::GONE, "{path}");
    }
    let again = client.post(app.url(&format!("/api/v1/jobs/{id}/run-again"))).bearer_auth(&token).send().await.unwrap();
    assert!(matches!(again.status().as_u16(), 404 | 410), "{}", again.status());
    assert_eq!(delete(&app, &token, &id).await.status(), StatusCode::OK, "deleting again changes nothing");
    assert_eq!(app.user_state(user).await, balance_before);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_deleted_account_is_found_nowhere_and_its_access_ends_on_every_process(pool: PgPool) {
    // Signed up with the grant at once (verification is the mail tests' business).
    let settings = WebSettings { require_email_verification: false, ..WebSettings::default() };
    let app = TestApp::spawn(pool.clone(), settings.clone()).await;
    let other_process = TestApp::spawn(pool, settings).await;
    let email = "erase.me@example.com";
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up = call(&browser, &app, "sign_up", &[("email", email), ("password", "a long password")]).await;
    assert_eq!(signed_up.status(), StatusCode::OK);
    let user: i64 =
        sqlx::query_scalar("SELECT id FROM users WHERE email = $1").bind(email).fetch_one(&app.pool).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 10 WHERE id = $1").bind(user).execute(&app.pool).await.unwrap();
    let (_, token) = engine::accounts::tokens::create(&app.pool, user, "laptop").await.unwrap();
    // Its traces everywhere: a done job, a waiting one, a running one, a failed log-in, an
    // admin's grant and download, and the address in an audit line.
    let done = upload_named(&app, &token, "erase-me-alpha.txt", "Alpha text ZEBRA-0042 one.").await;
    work(&app, 1).await;
    let running = upload_named(&app, &token, "erase-me-beta.txt", "Beta text ZEBRA-0042 two.").await;
    let claimed = engine::queue::claim(&app.pool, "test-worker", 1, std::time::Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let waiting = upload_named(&app, &token, "erase-me-gamma.txt", "Gamma text ZEBRA-0042 three.").await;
    // One the user canceled themselves (the job records who canceled it).
    let self_canceled = upload_named(&app, &token, "erase-me-delta.txt", "Delta text ZEBRA-0042 four.").await;
    let canceled = reqwest::Client::new()
        .post(app.url(&format!("/api/v1/jobs/{self_canceled}/cancel")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(canceled.status(), StatusCode::OK);
    let failed_login =
        call(&reqwest::Client::new(), &app, "log_in", &[("email", email), ("password", "wrong password")]).await;
    assert_eq!(failed_login.status(), StatusCode::UNAUTHORIZED);
    let admin = users::create_user(&app.pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    engine::accounts::ledger::admin_adjust(&app.pool, user, 5, "ops@example.com", &format!("goodwill for {email}"))
        .await
        .unwrap();
    let (_, admin_token) = engine::accounts::tokens::create(&app.pool, admin.id, "ops").await.unwrap();
    let original = reqwest::Client::new()
        .get(app.url(&format!("/api/v1/jobs/{done}/original")))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(original.status(), StatusCode::OK);
    let mut conn = app.pool.acquire().await.unwrap();
    engine::audit::audit(&mut conn, "ops@example.com", "note", Some(&format!("called {email}")), "", "").await.unwrap();
    drop(conn);
    assert!(found_anywhere(&app.pool, email).await.len() >= 3, "{:?}", found_anywhere(&app.pool, email).await);
    let ledger_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE user_id = $1")
        .bind(user)
        .fetch_one(&app.pool)
        .await
        .unwrap();

    // The wrong password deletes nothing; the right one deletes the account.
    let wrong = call(&browser, &app, "delete_account", &[("password", "not my password")]).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        call(&browser, &other_process, "me", &[]).await.json::<serde_json::Value>().await.unwrap()["email"],
        email
    );
    let deleted = call(&browser, &app, "delete_account", &[("password", "a long password")]).await;
    assert_eq!(deleted.status(), StatusCode::OK, "{}", deleted.text().await.unwrap());

    // Access ends at once, on the other process too: the session, the token, the password.
    let me: serde_json::Value = call(&browser, &other_process, "me", &[]).await.json().await.unwrap();
    assert!(me.is_null(), "{me}");
    let polled = reqwest::Client::new()
        .get(other_process.url(&format!("/api/v1/jobs/{done}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(polled.status(), StatusCode::UNAUTHORIZED);
    let again =
        call(&reqwest::Client::new(), &other_process, "log_in", &[("email", email), ("password", "a long password")])
            .await;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);

    // The waiting job was canceled; the running one stops and is erased when it ends.
    let state = |id: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM jobs WHERE id = $1::uuid")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(state(waiting.clone()).await, "canceled");
    assert_eq!(state(running.clone()).await, "running");
    let output = JobOutput { result: serde_json::json!({"markdown": "Beta summary ZEBRA-0042"}), ..Default::default() };
    engine::queue::complete(&app.pool, &engine::hooks::SluiceHooks, &claimed[0], &output).await.unwrap();
    // The upkeep's sweep (every half minute) deletes its document now that it has ended.
    let blobs = engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap();
    let released = engine::accounts::deletion::finish_deletions(&app.pool, &blobs).await.unwrap();
    assert!(released >= 1, "the running job's document goes when it ends");

    // Found nowhere: no table holds the address, a file name or the text; no file the bytes.
    for needle in [email, "erase-me-alpha", "erase-me-beta", "erase-me-gamma", "erase-me-delta", "ZEBRA-0042"] {
        assert_eq!(found_anywhere(&app.pool, needle).await, Vec::<String>::new(), "{needle}");
    }
    assert_eq!(app.stored_blobs(), 0);
    assert_eq!(stored_files_holding(&app.blob_dir, b"ZEBRA-0042"), 0);
    // The books stay: every ledger row (now with the refund of the canceled job), balanced.
    let (balance, in_flight, ledger_sum): (i64, i32, i64) = sqlx::query_as(
        "SELECT balance, in_flight, (SELECT sum(amount)::bigint FROM ledger WHERE user_id = $1) FROM users WHERE id = $1",
    )
    .bind(user)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((balance, in_flight), (ledger_sum, 0));
    let rows_after: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE user_id = $1")
        .bind(user)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(rows_after > ledger_rows, "kept, and the refund added");
    let report = engine::reconcile::run(&app.pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{report:?}");
    // A deleted account takes no grants.
    let grant = engine::accounts::ledger::admin_adjust(&app.pool, user, 5, "ops@example.com", "late goodwill").await;
    assert!(matches!(grant, Err(engine::EngineError::NotFound)), "{grant:?}");
    // The address is free for a new account.
    let fresh =
        call(&reqwest::Client::new(), &app, "sign_up", &[("email", email), ("password", "a new password")]).await;
    assert_eq!(fresh.status(), StatusCode::OK);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_address_is_erased_only_where_it_stands_whole(pool: PgPool) {
    let pattern = engine::accounts::deletion::whole_address_pattern("e@corp.com");
    let cases = [
        ("granted by e@corp.com", "granted by X"),
        ("mail e@corp.com.", "mail X."),
        ("(e@corp.com)", "(X)"),
        ("alice@corp.com", "alice@corp.com"),
        ("e@corp.com.au", "e@corp.com.au"),
        ("me@corp.community", "me@corp.community"),
    ];
    for (text, expected) in cases {
        let replaced: String = sqlx::query_scalar("SELECT regexp_replace($1, $2, 'X', 'g')")
            .bind(text)
            .bind(&pattern)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(replaced, expected, "{text}");
    }
    // Quotes and backslashes are taken literally, not as pattern syntax.
    let odd = engine::accounts::deletion::whole_address_pattern(r#"a"b\c.d+e@x.io"#);
    let replaced: String = sqlx::query_scalar("SELECT regexp_replace($1, $2, 'X', 'g')")
        .bind(r#"by a"b\c.d+e@x.io and abc@x.io"#)
        .bind(&odd)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(replaced, "by X and abc@x.io");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_deletion_cut_short_is_carried_through_by_the_upkeep(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("cut@example.com", 10, 5).await;
    let id = upload_named(&app, &token, "cut-short.txt", "Text cut short KESTREL-19.").await;
    work(&app, 1).await;
    // As if the process died right after the deletion committed: marked, nothing erased yet.
    sqlx::query("UPDATE jobs SET deleted_at = now() WHERE id = $1::uuid").bind(&id).execute(&app.pool).await.unwrap();
    assert!(!found_anywhere(&app.pool, "KESTREL-19").await.is_empty());
    let blobs = engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap();
    let moved = engine::accounts::deletion::finish_deletions(&app.pool, &blobs).await.unwrap();
    assert!(moved >= 2, "erased and its document deleted: {moved}");
    for needle in ["cut-short", "KESTREL-19"] {
        assert_eq!(found_anywhere(&app.pool, needle).await, Vec::<String>::new(), "{needle}");
    }
    assert_eq!(app.stored_blobs(), 0);
    assert_eq!(engine::accounts::deletion::finish_deletions(&app.pool, &blobs).await.unwrap(), 0, "nothing left to do");
}
