//! Accounts, credits and admission over real HTTP against the router, on a fresh database per
//! test (`#[sqlx::test]`), with no workers (jobs stay where the test puts them).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use app::handlers::WebSettings;
use engine::accounts::{self, Role};
use engine::admission::{self, Admission, AdmissionConfig, Submission};
use engine::dlq::{self, Selection};
use engine::hooks::TerminalHooks;
use engine::ledger::{self, AccountHooks};
use engine::queue::{self, JobError, JobOutput};
use engine::retry::{ErrorClass, RetryPolicy};
use engine::testing::wider_pool;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use sqlx::PgPool;

struct TestApp {
    addr: SocketAddr,
    pool: PgPool,
    blob_dir: std::path::PathBuf,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.blob_dir);
    }
}

impl TestApp {
    async fn spawn(pool: PgPool, settings: WebSettings) -> TestApp {
        let pool = wider_pool(&pool, 60).await;
        let db = pool.connect_options().get_database().unwrap_or("db").to_string();
        let blob_dir = std::env::temp_dir().join(format!("sluice-test-blobs-{db}"));
        let blobs = engine::blobs::Blobs::local(&blob_dir).unwrap();
        let addr = server::spawn_web(pool.clone(), settings, blobs).await.expect("the app starts");
        TestApp { addr, pool, blob_dir }
    }

    /// Files in blob storage (refusals must leave none behind).
    fn stored_blobs(&self) -> usize {
        fn count(dir: &std::path::Path) -> usize {
            std::fs::read_dir(dir)
                .map(|entries| {
                    entries.filter_map(|e| e.ok()).map(|e| if e.path().is_dir() { count(&e.path()) } else { 1 }).sum()
                })
                .unwrap_or(0)
        }
        count(&self.blob_dir)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A user with `balance` credits and an API token; returns (user id, token).
    async fn user_with_token(&self, email: &str, balance: i64, limit: i32) -> (i64, String) {
        let user = accounts::create_user(&self.pool, email, "password123", Role::User, balance).await.unwrap();
        sqlx::query("UPDATE users SET max_in_flight = $2 WHERE id = $1")
            .bind(user.id)
            .bind(limit)
            .execute(&self.pool)
            .await
            .unwrap();
        let (_, secret) = engine::tokens::create(&self.pool, user.id, "tests").await.unwrap();
        (user.id, secret)
    }

    async fn upload(&self, token: &str, bytes: Vec<u8>, idempotency_key: Option<&str>) -> reqwest::Response {
        let form = reqwest::multipart::Form::new()
            .part("file", reqwest::multipart::Part::bytes(bytes).file_name("doc.txt"))
            .text("preset", "summarize");
        let mut request = reqwest::Client::new().post(self.url("/api/v1/jobs")).bearer_auth(token).multipart(form);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.unwrap()
    }

    async fn user_state(&self, user_id: i64) -> (i64, i32, i64, i64) {
        let user = accounts::get(&self.pool, user_id).await.unwrap();
        let ledger_sum = ledger::ledger_sum(&self.pool, user_id).await.unwrap();
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE owner_id = $1 AND state IN ('queued', 'running', 'retrying')",
        )
        .bind(user_id)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        (user.balance, user.in_flight, ledger_sum, live)
    }
}

fn doc(n: usize) -> Vec<u8> {
    format!("document number {n}\n").into_bytes()
}

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

    let bobs_token = engine::tokens::list(&app.pool, bob_id).await.unwrap().remove(0);
    engine::tokens::revoke(&app.pool, bob_id, bobs_token.id).await.unwrap();
    assert_eq!(client.get(app.url(&path)).bearer_auth(&bob).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

/// Call a server function as the browser does (form-encoded, same origin).
async fn call(client: &reqwest::Client, app: &TestApp, name: &str, form: &[(&str, &str)]) -> reqwest::Response {
    client
        .post(app.url(&format!("/api/{name}")))
        .header("Origin", format!("http://{}", app.addr))
        .form(form)
        .send()
        .await
        .unwrap()
}

fn session_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("sluice_session="))
        .map(|c| c.split(';').next().unwrap().to_string())
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn sessions_cycle_at_login_end_at_logout_and_cross_site_posts_are_refused(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up =
        call(&browser, &app, "sign_up", &[("email", "Carol@Example.com"), ("password", "long password")]).await;
    assert_eq!(signed_up.status(), StatusCode::OK);
    let first_cookie = session_cookie(&signed_up).expect("a session cookie");
    let raw = signed_up.headers().get("set-cookie").unwrap().to_str().unwrap().to_lowercase();
    assert!(raw.contains("httponly") && raw.contains("samesite=lax"), "{raw}");
    let me: serde_json::Value = call(&browser, &app, "me", &[]).await.json().await.unwrap();
    assert_eq!((me["email"].as_str(), me["balance"].as_i64()), (Some("carol@example.com"), Some(20)));

    let logged_in =
        call(&browser, &app, "log_in", &[("email", "carol@example.com"), ("password", "long password")]).await;
    assert_eq!(logged_in.status(), StatusCode::OK);
    let second_cookie = session_cookie(&logged_in).expect("a new session id at login");
    assert_ne!(first_cookie, second_cookie);

    // Log out, then replay the old cookie by hand: the server no longer knows it.
    assert_eq!(call(&browser, &app, "log_out", &[]).await.status(), StatusCode::OK);
    let stale = reqwest::Client::new()
        .post(app.url("/api/me"))
        .header("Cookie", &second_cookie)
        .header("Origin", format!("http://{}", app.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.json::<serde_json::Value>().await.unwrap(), serde_json::Value::Null);
    let jobs = call(&browser, &app, "list_jobs", &[]).await;
    assert_eq!(jobs.status(), StatusCode::UNAUTHORIZED);

    // A page on another site posting to us, with or without Fetch metadata.
    let evil = reqwest::Client::new();
    let forged = evil
        .post(app.url("/api/log_in"))
        .header("Origin", "http://evil.example")
        .form(&[("email", "carol@example.com"), ("password", "long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let forged = evil.post(app.url("/api/v1/jobs")).header("Sec-Fetch-Site", "cross-site").send().await.unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);

    let terms: serde_json::Value = call(&browser, &app, "terms", &[]).await.json().await.unwrap();
    assert_eq!(
        terms,
        serde_json::json!({
            "presets": [{"id": "summarize", "label": "Summarize"}, {"id": "key_facts", "label": "Extract key facts"}],
            "cost": 1,
            "max_upload_bytes": 52428800,
            "signup_grant": 20,
        })
    );

    let taken = call(&browser, &app, "sign_up", &[("email", "carol@example.com"), ("password", "another one")]).await;
    assert_eq!(taken.status(), StatusCode::CONFLICT);
    let weak = call(&browser, &app, "sign_up", &[("email", "dan@example.com"), ("password", "short")]).await;
    assert_eq!(weak.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn failed_logins_past_the_limit_get_429(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    accounts::create_user(&app.pool, "eve@example.com", "right password", Role::User, 0).await.unwrap();
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    for _ in 0..5 {
        let r = call(&browser, &app, "log_in", &[("email", "eve@example.com"), ("password", "wrong password")]).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let limited = call(&browser, &app, "log_in", &[("email", "eve@example.com"), ("password", "right password")]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = limited.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait > 0 && wait <= 900);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn another_users_job_detail_is_404_through_server_functions(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, alice) = app.user_with_token("alice2@example.com", 5, 5).await;
    let job: serde_json::Value = app.upload(&alice, doc(1), None).await.json().await.unwrap();
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    call(&browser, &app, "sign_up", &[("email", "mallory@example.com"), ("password", "long password")]).await;
    let peek = call(&browser, &app, "job_detail", &[("id", job["id"].as_str().unwrap())]).await;
    assert_eq!(peek.status(), StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_refund_raced_from_many_transactions_happens_once(pool: PgPool) {
    let pool = wider_pool(&pool, 30).await;
    let user = accounts::create_user(&pool, "race@example.com", "password123", Role::User, 5).await.unwrap();
    let submission = Submission {
        user_id: user.id,
        payload: serde_json::json!({}),
        content_key: "k".into(),
        client_key: None,
        fingerprint: "k".into(),
    };
    let Admission::Accepted { job_id } =
        admission::submit(&pool, &AdmissionConfig::default(), &submission).await.unwrap()
    else {
        panic!("accepted")
    };
    let job = engine::hooks::TerminalJob {
        id: job_id,
        owner_id: user.id,
        cost: 1,
        attempts: 3,
        failure: Some((engine::retry::FailureKind::RetriesExhausted, "provider overloaded".into())),
    };
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (pool, job) = (pool.clone(), job.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let refunded = ledger::refund_job(&mut tx, &job).await.unwrap();
                tx.commit().await.unwrap();
                refunded
            })
        })
        .collect();
    let mut refunds = 0;
    for t in tasks {
        refunds += t.await.unwrap() as usize;
    }
    assert_eq!(refunds, 1);
    assert_eq!(accounts::get(&pool, user.id).await.unwrap().balance, 5);
    assert_eq!(ledger::ledger_sum(&pool, user.id).await.unwrap(), 5);
    assert_eq!(engine::notices::list(&pool, user.id, 10).await.unwrap().len(), 1);
}

/// Random sequences of submit / complete / fail / replay, checking after every step that the
/// ledger sums to the balance, the balance is never negative, and in-flight equals the user's
/// non-terminal jobs.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn ledger_and_in_flight_invariants_hold_over_random_sequences(pool: PgPool) {
    let hooks = AccountHooks;
    let policy = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let config = AdmissionConfig { max_backlog: 1_000_000, ..AdmissionConfig::default() };
    for seed in 0..12u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let user = accounts::create_user(
            &pool,
            &format!("p{seed}@example.com"),
            "password123",
            Role::User,
            rng.random_range(0..6),
        )
        .await
        .unwrap();
        for step in 0..40 {
            match rng.random_range(0..4) {
                0 => {
                    let key = format!("doc-{}", rng.random_range(0..8));
                    let s = Submission {
                        user_id: user.id,
                        payload: serde_json::json!({}),
                        content_key: key.clone(),
                        client_key: None,
                        fingerprint: key,
                    };
                    admission::submit(&pool, &config, &s).await.unwrap();
                }
                op @ (1 | 2) => {
                    if let Some(job) =
                        queue::claim(&pool, "prop", 1, std::time::Duration::from_secs(60)).await.unwrap().pop()
                    {
                        if op == 1 {
                            queue::complete(&pool, &hooks, &job, &JobOutput::default()).await.unwrap();
                        } else {
                            let class =
                                if rng.random_bool(0.5) { ErrorClass::Rejected } else { ErrorClass::Overloaded };
                            queue::fail(&pool, &hooks, &policy, &job, &JobError::new(class, "boom")).await.unwrap();
                        }
                    }
                }
                _ => {
                    let failed: Option<uuid::Uuid> =
                        sqlx::query_scalar("SELECT id FROM jobs WHERE owner_id = $1 AND state = 'failed' LIMIT 1")
                            .bind(user.id)
                            .fetch_optional(&pool)
                            .await
                            .unwrap();
                    if let Some(id) = failed {
                        // A live job with the same content key blocks the replay (unique index); skip then.
                        let _ = dlq::replay(&pool, &hooks as &dyn TerminalHooks, &Selection::Job(id), "admin").await;
                    }
                }
            }
            let u = accounts::get(&pool, user.id).await.unwrap();
            let sum = ledger::ledger_sum(&pool, user.id).await.unwrap();
            let live: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM jobs WHERE owner_id = $1 AND state IN ('queued', 'running', 'retrying')",
            )
            .bind(user.id)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(sum, u.balance, "seed {seed} step {step}: ledger sum = balance");
            assert!(u.balance >= 0, "seed {seed} step {step}");
            assert_eq!(u.in_flight as i64, live, "seed {seed} step {step}: in-flight = non-terminal jobs");
        }
    }
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
    let ok = engine::worker::work_once(
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
    engine::worker::work_once(&app.pool, &config, Arc::new(rejected), hooks.clone(), 1).await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 0, 4, 0));
    let notices = engine::notices::list(&app.pool, user, 10).await.unwrap();
    assert_eq!(notices.len(), 1);
    assert!(notices[0].message.contains("1 credit refunded"), "{}", notices[0].message);
    // Replaying it from the DLQ is free (the refund stands) and counts it in flight again.
    let failed_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'failed'").fetch_one(&app.pool).await.unwrap();
    dlq::replay(&app.pool, hooks.as_ref(), &Selection::Job(failed_id), "admin").await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 1, 4, 1));
    engine::worker::work_once(&app.pool, &config, Arc::new(rejected), hooks.clone(), 1).await.unwrap();
    assert_eq!(app.user_state(user).await, (4, 0, 4, 0), "no second refund after the replay fails again");
    assert_eq!(engine::notices::list(&app.pool, user, 10).await.unwrap().len(), 1);
}

async fn upload_file(app: &TestApp, token: &str, name: &str, bytes: Vec<u8>, preset: &str) -> reqwest::Response {
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str("application/pdf").unwrap(),
        )
        .text("preset", preset.to_string());
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
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
        ("page.pdf", b"<!DOCTYPE html><html><body>%PDF-1.7 not really</body></html>".to_vec(), "summarize", 415),
        (
            "logo.pdf",
            b"<svg xmlns=\"http://www.w3.org/2000/svg\"><script>x()</script></svg>".to_vec(),
            "summarize",
            415,
        ),
        ("archive.pdf", zip, "summarize", 415),
        ("tool.pdf", b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00".to_vec(), "summarize", 415),
        ("latin1.txt", b"caf\xe9 au lait".to_vec(), "summarize", 415),
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
    ];
    let mut ids = Vec::new();
    for (name, bytes) in accepted {
        let r = upload_file(&app, &token, name, bytes, "summarize").await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{name}");
        ids.push(r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(app.stored_blobs(), 4);
    let types: Vec<String> = sqlx::query_scalar("SELECT payload->'document'->>'type' FROM jobs ORDER BY accepted_at")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(types, vec!["pdf", "plain_text", "markdown", "plain_text"]);
    // A duplicate keeps the first upload's bytes only.
    assert_eq!(upload_file(&app, &token, "again.pdf", pdf, "summarize").await.status(), StatusCode::OK);
    assert_eq!(app.stored_blobs(), 4);
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
    let blobs = engine::blobs::Blobs::local(&app.blob_dir).unwrap();
    let processor = engine::processing::DocumentProcessor {
        blobs,
        provider: engine::providers::build(&engine::providers::ProviderConfig::default()),
    };
    let reports = engine::worker::work_once(
        &app.pool,
        &engine::testing::fast_worker("dl", 1),
        Arc::new(processor),
        Arc::new(AccountHooks),
        1,
    )
    .await
    .unwrap();
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
