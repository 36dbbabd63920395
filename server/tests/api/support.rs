//! The admin's support tools and "run again", through the same calls the pages make: search
//! any job (by id, e-mail, file name, state, failure kind, dates; paginated), set a user's
//! in-flight limit and grant credits (audited), download a user's original (audited), and run
//! a document again as a new, charged job. To anyone but an admin the admin calls are 404.

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use sqlx::PgPool;

use crate::helpers::*;

/// A browser logged in as `email`.
async fn browser(app: &TestApp, email: &str) -> reqwest::Client {
    let client = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let answer = call(&client, app, "log_in", &[("email", email), ("password", "password123")]).await;
    assert!(answer.status().is_success(), "log in: {}", answer.status());
    client
}

/// The console's search form: every field but the page inside `filter`.
fn filter_form(form: &[(&str, &str)]) -> Vec<(String, String)> {
    form.iter()
        .map(
            |(k, v)| {
                if *k == "page" {
                    (k.to_string(), v.to_string())
                } else {
                    (format!("filter[{k}]"), v.to_string())
                }
            },
        )
        .collect()
}

async fn search(client: &reqwest::Client, app: &TestApp, form: &[(&str, &str)]) -> (u16, serde_json::Value) {
    let form = filter_form(form);
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let answer = call(client, app, "admin/search_jobs", &form).await;
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

fn ids(page: &serde_json::Value) -> Vec<String> {
    page["jobs"].as_array().unwrap().iter().map(|pair| pair[0]["id"].as_str().unwrap().to_string()).collect()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn admins_find_any_job_and_change_users_on_the_record(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    users::create_user(&app.pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let (alice, alice_token) = app.user_with_token("alice@example.com", 40, 40).await;
    let (_, bob_token) = app.user_with_token("bob@example.com", 40, 40).await;
    let mut alices = Vec::new();
    for n in 0..30 {
        let body: serde_json::Value = upload_file(&app, &alice_token, &format!("invoice-{n}.txt"), doc(n), "summarize")
            .await
            .json()
            .await
            .unwrap();
        alices.push(body["id"].as_str().unwrap().to_string());
    }
    let bobs: serde_json::Value =
        upload_file(&app, &bob_token, "contract.txt", doc(99), "summarize").await.json().await.unwrap();
    let bobs = bobs["id"].as_str().unwrap().to_string();
    sqlx::query(
        "UPDATE jobs SET state = 'failed', failure_kind = 'invalid_input', failure_reason = 'no text', finished_at = now(),
                         accepted_at = '2026-01-15T10:00:00Z'
         WHERE id = $1::uuid",
    )
    .bind(&bobs)
    .execute(&app.pool)
    .await
    .unwrap();
    let ops = browser(&app, "ops@example.com").await;

    let (status, page) = search(&ops, &app, &[("text", &bobs)]).await;
    assert_eq!((status, ids(&page)), (200, vec![bobs.clone()]), "by id");
    assert_eq!(page["jobs"][0][1], "bob@example.com", "with its owner");
    let (_, page) = search(&ops, &app, &[("text", "ALICE@example")]).await;
    assert_eq!(ids(&page).len(), 25, "by e-mail, a page of 25");
    assert_eq!(page["has_more"], true);
    let (_, page2) = search(&ops, &app, &[("text", "alice@"), ("page", "1")]).await;
    assert_eq!((ids(&page2).len(), page2["has_more"].as_bool()), (5, Some(false)));
    let (_, page) = search(&ops, &app, &[("text", "invoice-1")]).await;
    assert_eq!(ids(&page).len(), 11, "by file name: invoice-1 and invoice-10..19");
    let (_, page) = search(&ops, &app, &[("text", "100%_")]).await;
    assert!(ids(&page).is_empty(), "wildcards in the box are literal");
    let (_, page) = search(&ops, &app, &[("state", "failed"), ("kind", "invalid_input")]).await;
    assert_eq!(ids(&page), vec![bobs.clone()], "by state and failure kind");
    let (_, page) = search(&ops, &app, &[("from", "2026-01-15"), ("until", "2026-01-15")]).await;
    assert_eq!(ids(&page), vec![bobs.clone()], "by day, both ends included");
    let (_, page) = search(&ops, &app, &[("until", "2026-01-14")]).await;
    assert!(ids(&page).is_empty());
    let (status, _) = search(&ops, &app, &[("from", "15/01/2026")]).await;
    assert_eq!(status, 422);

    // A user's limit and credits, both audited.
    let answer =
        call(&ops, &app, "admin/set_in_flight_limit", &[("user_id", &alice.to_string()), ("limit", "7")]).await;
    assert_eq!(answer.status(), 200);
    let answer =
        call(&ops, &app, "admin/set_in_flight_limit", &[("user_id", &alice.to_string()), ("limit", "0")]).await;
    assert_eq!(answer.status(), 422);
    let answer = call(&ops, &app, "admin/grant_credits", &[("user_id", &alice.to_string()), ("amount", "-5")]).await;
    let user: serde_json::Value = answer.json().await.unwrap();
    assert_eq!((user["max_in_flight"].as_i64(), user["balance"].as_i64()), (Some(7), Some(5)));
    let audited: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, new_value FROM audit_log WHERE action IN ('in_flight_limit', 'credits') ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        audited,
        vec![
            ("ops@example.com".into(), "in_flight_limit".into(), "7".into()),
            ("ops@example.com".into(), "credits".into(), "5".into())
        ]
    );

    // A failed job's original, for inspection: downloaded by an admin, on the record.
    let original = ops.get(app.url(&format!("/api/v1/jobs/{bobs}/original"))).send().await.unwrap();
    assert_eq!(original.status(), 200);
    assert_eq!(original.bytes().await.unwrap().as_ref(), doc(99).as_slice());
    let subject: String = sqlx::query_scalar("SELECT subject FROM audit_log WHERE action = 'download_original'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(subject, format!("job {bobs}"));

    // None of it for anyone else.
    let alice_browser = browser(&app, "alice@example.com").await;
    for name in ["admin/search_jobs", "admin/find_user", "admin/alerts"] {
        let answer = call(&alice_browser, &app, name, &[("email", "bob@example.com"), ("filter[text]", "bob")]).await;
        assert_eq!(answer.status(), 404, "{name}");
    }
    // Not even which arguments it would refuse: 404 before any is decoded (a bad one, a
    // missing one), where an admin gets 422 or 400.
    let ops_browser = browser(&app, "ops@example.com").await;
    for (name, form) in [
        ("admin/dlq_replay", vec![("kind", "nonsense"), ("reason", "x")]),
        ("admin/dlq_discard", vec![("kind", "nonsense"), ("reason", "x")]),
        ("admin/dlq_replay", vec![]),
        ("admin/grant_credits", vec![("user_id", "many")]),
    ] {
        assert_eq!(call(&alice_browser, &app, name, &form).await.status(), 404, "{name} {form:?}");
        let anonymous = reqwest::Client::new();
        assert_eq!(call(&anonymous, &app, name, &form).await.status(), 404, "{name} {form:?}, no session");
        let admin = call(&ops_browser, &app, name, &form).await.status();
        assert!(admin == 422 || admin == 400, "{name} {form:?}: an admin is told what is wrong ({admin})");
    }
    let answer =
        call(&alice_browser, &app, "admin/grant_credits", &[("user_id", &alice.to_string()), ("amount", "99")]).await;
    assert_eq!(answer.status(), 404);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn run_again_makes_a_new_charged_job_sharing_the_stored_document(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (user, token) = app.user_with_token("again@example.com", 2, 5).await;
    let first: serde_json::Value = app.upload(&token, doc(1), None).await.json().await.unwrap();
    let first = first["id"].as_str().unwrap().to_string();
    let client = reqwest::Client::new();
    let run_again = |id: &str, body: serde_json::Value| {
        client.post(app.url(&format!("/api/v1/jobs/{id}/run-again"))).bearer_auth(&token).json(&body).send()
    };
    // Uploading the same document again is the same job; running it again is a new one.
    let duplicate = app.upload(&token, doc(1), None).await;
    assert_eq!(duplicate.status(), 200);
    let again = run_again(&first, serde_json::json!({ "preset": "key_facts" })).await.unwrap();
    assert_eq!(again.status(), 202);
    let location = again.headers()["location"].to_str().unwrap().to_string();
    let again: serde_json::Value = again.json().await.unwrap();
    let second = again["id"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    assert_eq!(location, format!("/api/v1/jobs/{second}"));
    assert_eq!(app.user_state(user).await, (0, 2, 0, 2), "charged again: two debits, two in flight");
    let job = engine::queue::get(&app.pool, second.parse().unwrap()).await.unwrap();
    assert_eq!(job.payload["preset"], "key_facts");
    let key = job.payload["document"]["key"].as_str().unwrap().to_string();
    let first_job = engine::queue::get(&app.pool, first.parse().unwrap()).await.unwrap();
    assert_eq!(first_job.payload["document"]["key"].as_str(), Some(key.as_str()), "the same stored document");
    let blobs = engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap();
    assert_eq!(blobs.get(&key).await.unwrap().as_ref(), doc(1).as_slice());
    assert_eq!(app.stored_blobs(), 1, "shared, not copied");

    // A language sent is a name: an empty one is refused before anything else (the contract).
    let nameless = run_again(&first, serde_json::json!({ "language": "", "preset": "key_facts" })).await.unwrap();
    assert_eq!(nameless.status(), 422);
    // Out of credits now: 402, and nothing stored.
    let broke = run_again(&first, serde_json::json!({})).await.unwrap();
    assert_eq!(broke.status(), 402);
    assert_eq!(app.stored_blobs(), 1);
    // Another user's job does not exist for them; a job whose document is gone is 410.
    let (_, stranger) = app.user_with_token("stranger@example.com", 5, 5).await;
    let answer = client
        .post(app.url(&format!("/api/v1/jobs/{first}/run-again")))
        .bearer_auth(&stranger)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    sqlx::query("UPDATE users SET balance = balance + 1 WHERE id = $1").bind(user).execute(&app.pool).await.unwrap();

    // The run-again job canceled: its document is released, but the first job still needs it.
    let cancel = |id: &str| client.post(app.url(&format!("/api/v1/jobs/{id}/cancel"))).bearer_auth(&token).send();
    assert_eq!(cancel(&second).await.unwrap().status(), 200);
    let week = std::time::Duration::from_secs(7 * 86_400);
    assert_eq!(engine::documents::sweep::release_documents(&app.pool, &blobs, week).await.unwrap(), 1);
    assert!(blobs.exists(&key).await.unwrap(), "kept while a job needs it");
    // The first canceled too: no job needs it, so it is deleted, and running it again is 410.
    assert_eq!(cancel(&first).await.unwrap().status(), 200);
    assert_eq!(engine::documents::sweep::release_documents(&app.pool, &blobs, week).await.unwrap(), 1);
    assert!(!blobs.exists(&key).await.unwrap(), "deleted with its last job");
    let gone = run_again(&second, serde_json::json!({})).await.unwrap();
    assert_eq!(gone.status(), 410);
    assert_eq!(app.user_state(user).await.1, 0, "nothing admitted for a document that is gone");
}

/// Storage is paid for: past a user's quota an upload gets 413 before its body is read, and
/// documents released by their jobs make room again.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn uploads_past_the_storage_quota_are_refused_unread_until_documents_are_released(pool: PgPool) {
    let mut settings = WebSettings::default();
    settings.admission.storage_quota_bytes = Some(100_000);
    let app = TestApp::spawn(pool, settings).await;
    let (user, token) = app.user_with_token("hoarder@example.com", 10, 10).await;
    let page = |n: usize| format!("{n} ").repeat(20_000).into_bytes();
    let first: serde_json::Value = app.upload(&token, page(1), None).await.json().await.unwrap();
    assert_eq!(app.upload(&token, page(2), None).await.status(), 202, "80 KB of 100 KB");
    // Past the quota: the declared length is enough to refuse, while the body still streams.
    let addr = app.addr;
    let token_ = token.clone();
    let answer = tokio::task::spawn_blocking(move || {
        server::testing::raw_upload(addr, &token_, &server::testing::file_part("more.txt"), b"", b'x', 8 << 20)
    })
    .await
    .unwrap();
    assert_eq!(answer.status, 413);
    assert!(answer.sent < 8 << 20, "refused before the body was read ({} bytes sent)", answer.sent);
    // 25 KB: its declared length passes the check before the body (which allows for the form's
    // own bytes), its stored size does not; refused once that is known, and not kept.
    let small = |n: usize| format!("{n} ").repeat(12_500).into_bytes();
    let over = app.upload(&token, small(3), None).await;
    assert_eq!(over.status(), 413);
    let body: serde_json::Value = over.json().await.unwrap();
    assert_eq!((body["error"].as_str(), body["quota_bytes"].as_u64()), (Some("storage_full"), Some(100_000)));
    assert!(body["message"].as_str().unwrap().contains("of storage"), "{body}");
    assert_eq!(app.stored_blobs(), 2, "nothing of the refused uploads is kept");
    assert_eq!(app.user_state(user).await.1, 2, "and nothing charged");

    // A canceled job's document is released: room again.
    let id = first["id"].as_str().unwrap();
    let cancel = reqwest::Client::new().post(app.url(&format!("/api/v1/jobs/{id}/cancel"))).bearer_auth(&token);
    assert_eq!(cancel.send().await.unwrap().status(), 200);
    let blobs = engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap();
    engine::documents::sweep::release_documents(&app.pool, &blobs, std::time::Duration::ZERO).await.unwrap();
    assert_eq!(app.upload(&token, small(3), None).await.status(), 202);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_console_acts_on_a_whole_search_reviews_pauses_for_a_while_and_retries_now(pool: PgPool) {
    let settings = WebSettings { bulk_action_cap: 40, ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    users::create_user(&app.pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let (carol, carol_token) = app.user_with_token("carol@example.com", 60, 60).await;
    for n in 0..45 {
        let answer = upload_file(&app, &carol_token, &format!("batch-{n:02}.txt"), doc(n), "summarize").await;
        assert_eq!(answer.status(), 202);
    }
    let ops = browser(&app, "ops@example.com").await;
    let form = |pairs: &[(&str, &str)]| filter_form(pairs);
    let send = |name: &'static str, pairs: Vec<(String, String)>| {
        let ops = ops.clone();
        let app = &app;
        async move {
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let answer = call(&ops, app, name, &pairs).await;
            (answer.status().as_u16(), answer.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };

    // Counted first; past the cap (40) the action is refused and nothing changes.
    let (status, count) = send("admin/bulk_preview", form(&[("text", "carol@")])).await;
    assert_eq!(
        (status, count["matched"].as_i64(), count["cap"].as_i64()),
        (200, Some(41), Some(40)),
        "counted to one past the cap"
    );
    let mut all = form(&[("text", "carol@")]);
    all.push(("action".into(), "cancel".into()));
    all.push(("confirmed".into(), "45".into()));
    let (status, refused) = send("admin/bulk_action", all).await;
    assert_eq!(status, 422, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("narrow"));
    // Narrowed by file name to 30 jobs: canceled and refunded.
    let mut some = form(&[("text", "batch-0"), ("state", "queued")]);
    let (_, count) = send("admin/bulk_preview", some.clone()).await;
    assert_eq!(count["matched"], 10);
    some.push(("action".into(), "cancel".into()));
    // Confirmed for fewer than match now: refused, count again.
    let mut stale = some.clone();
    stale.push(("confirmed".into(), "9".into()));
    let (status, refused) = send("admin/bulk_action", stale).await;
    assert_eq!(status, 422);
    assert!(refused["message"].as_str().unwrap().contains("count again"), "{refused}");
    some.push(("confirmed".into(), "10".into()));
    let (status, done) = send("admin/bulk_action", some).await;
    assert_eq!((status, done["matched"].as_i64(), done["acted"].as_i64()), (200, Some(10), Some(10)));
    let balance: i64 =
        sqlx::query_scalar("SELECT balance FROM users WHERE id = $1").bind(carol).fetch_one(&app.pool).await.unwrap();
    assert_eq!(balance, 60 - 45 + 10, "the ten are refunded");
    let mut bad = form(&[("text", "batch")]);
    bad.push(("action".into(), "delete".into()));
    bad.push(("confirmed".into(), "1".into()));
    assert_eq!(send("admin/bulk_action", bad).await.0, 422);

    // A failed job marked for review shows in the search with who and the note.
    let failed: String = sqlx::query_scalar(
        "UPDATE jobs SET state = 'failed', failure_kind = 'invalid_input', failure_reason = 'no text', finished_at = now()
         WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY accepted_at LIMIT 1) RETURNING id::text",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let pairs = vec![
        ("job".to_string(), failed.clone()),
        ("note".to_string(), "why no text?".to_string()),
        ("assignee".to_string(), "ops@example.com".to_string()),
    ];
    let (status, review) = send("admin/mark_review", pairs).await;
    assert_eq!(status, 200, "{review}");
    let (_, page) = search(&ops, &app, &[("needs_review", "true")]).await;
    assert_eq!(ids(&page), vec![failed.clone()]);
    assert_eq!(page["reviews"][0]["assignee"], "ops@example.com");
    assert_eq!(page["reviews"][0]["note"], "why no text?");

    // A timed pause shows its end on the overview.
    let (status, _) = send("admin/pause_for", vec![("minutes".into(), "10".into())]).await;
    assert_eq!(status, 200);
    let (_, overview) = send("admin/overview", vec![]).await;
    assert_eq!(overview["processing_enabled"], false);
    let left = overview["resume_at"][1].as_i64().unwrap();
    assert!((590..=600).contains(&left), "{left} s left");
    assert_eq!(send("admin/pause_for", vec![("minutes".into(), "0".into())]).await.0, 422);

    // Retry now: the owner's own retrying job; someone else's is not found; a queued one is 409.
    let retrying: String = sqlx::query_scalar(
        "UPDATE jobs SET state = 'retrying', attempts = 1, run_at = now() + interval '1 hour'
         WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY accepted_at LIMIT 1) RETURNING id::text",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let (_, _other_token) = app.user_with_token("dave@example.com", 5, 5).await;
    let dave = browser(&app, "dave@example.com").await;
    assert_eq!(call(&dave, &app, "retry_now", &[("id", &retrying)]).await.status(), 404);
    let carol_browser = browser(&app, "carol@example.com").await;
    assert_eq!(call(&carol_browser, &app, "retry_now", &[("id", &retrying)]).await.status(), 200);
    let due: bool = sqlx::query_scalar("SELECT run_at <= now() AND attempts = 1 FROM jobs WHERE id = $1::uuid")
        .bind(&retrying)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(due, "due now, with the attempts it had");
    assert_eq!(
        call(&carol_browser, &app, "retry_now", &[("id", &retrying)]).await.status(),
        200,
        "still retrying: no harm"
    );
    let queued: String = sqlx::query_scalar("SELECT id::text FROM jobs WHERE state = 'queued' LIMIT 1")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(call(&carol_browser, &app, "retry_now", &[("id", &queued)]).await.status(), 409);

    // None of the console for anyone else.
    for name in [
        "admin/bulk_preview",
        "admin/bulk_action",
        "admin/mark_review",
        "admin/resolve_review",
        "admin/acknowledge",
        "admin/pause_for",
        "admin/outcomes",
        "admin/processes",
        "admin/reviews",
        "admin/admins",
    ] {
        // Every argument any of them takes, well formed: only the role decides.
        let form = [
            ("minutes", "5"),
            ("period", "hour"),
            ("id", "1"),
            ("note", "x"),
            ("what", "alert"),
            ("action", "cancel"),
            ("filter[text]", "carol"),
            ("assignee", "ops@example.com"),
            ("job", failed.as_str()),
            ("confirmed", "1"),
        ];
        let answer = call(&carol_browser, &app, name, &form).await;
        assert_eq!(answer.status(), 404, "{name}");
    }
    for (name, form) in [
        ("admin/outcomes", vec![("period".to_string(), "hour".to_string())]),
        ("admin/processes", vec![]),
        ("admin/reviews", vec![]),
        ("admin/admins", vec![]),
    ] {
        let (status, body) = send(name, form).await;
        assert_eq!(status, 200, "{name}: {body}");
    }
    assert_eq!(send("admin/outcomes", vec![("period".into(), "week".into())]).await.0, 422);
}
