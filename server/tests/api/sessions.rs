//! Server functions as the browser calls them: sessions, log-in throttling, ownership.

use std::sync::Arc;

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn sessions_cycle_at_login_end_at_logout_and_cross_site_posts_are_refused(pool: PgPool) {
    // The grant at sign-up (with verification on it waits for the mailed link: tests/api/mail.rs).
    let app = TestApp::spawn(pool, WebSettings { require_email_verification: false, ..WebSettings::default() }).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up =
        call(&browser, &app, "sign_up", &[("email", "Carol@Example.com"), ("password", "long password")]).await;
    assert_eq!(signed_up.status(), StatusCode::OK);
    let first_cookie = session_cookie(&signed_up).expect("a session cookie");
    let raw = signed_up
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_lowercase())
        .find(|c| c.starts_with("sluice_session="))
        .unwrap();
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
            "prices": {"tiers": [{"up_to_tokens": u64::MAX, "credits": 1}], "scan_page_millicredits": 300},
            "max_document_tokens": null,
            "max_upload_bytes": 52428800,
            "signup_grant": 20,
            "verify_email": false,
            // No batch API here: the economy lane is not offered.
            "economy": null,
            // No document reader here: no scans read.
            "ocr_languages": [],
            "detect_language": false,
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
    users::create_user(&app.pool, "eve@example.com", "right password", Role::User, 0).await.unwrap();
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
async fn a_hundred_parallel_guesses_check_at_most_the_limit(pool: PgPool) {
    let app = Arc::new(TestApp::spawn(pool, WebSettings::default()).await);
    users::create_user(&app.pool, "target@example.com", "right password", Role::User, 0).await.unwrap();
    let guesses: Vec<_> = (0..100)
        .map(|n| {
            let app = app.clone();
            tokio::spawn(async move {
                let browser = reqwest::Client::new();
                let guess = format!("wrong password {n}");
                call(&browser, &app, "log_in", &[("email", "target@example.com"), ("password", &guess)]).await.status()
            })
        })
        .collect();
    let mut checked = 0;
    for guess in guesses {
        match guess.await.unwrap() {
            StatusCode::UNAUTHORIZED => checked += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(checked, 5, "exactly the per-account limit was checked against the password");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn sign_ups_are_throttled_per_address_whatever_the_concurrency(pool: PgPool) {
    let app = Arc::new(TestApp::spawn(pool, WebSettings::default()).await);
    let limit = WebSettings::default().signup_limits.per_address;
    let sign_ups: Vec<_> = (0..60)
        .map(|n| {
            let app = app.clone();
            tokio::spawn(async move {
                let email = format!("burst{n}@example.com");
                call(&reqwest::Client::new(), &app, "sign_up", &[("email", &email), ("password", "long password")])
                    .await
                    .status()
            })
        })
        .collect();
    let mut made = 0;
    for sign_up in sign_ups {
        match sign_up.await.unwrap() {
            StatusCode::OK => made += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(made, limit);
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM users").fetch_one(&app.pool).await.unwrap();
    assert_eq!(accounts, limit, "no account past the limit, no free credits past it");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_strangers_guesses_do_not_lock_the_owner_out(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    users::create_user(&app.pool, "owner@example.com", "right password", Role::User, 0).await.unwrap();
    let from =
        |ip: &str| reqwest::Client::builder().local_address(ip.parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let stranger = from("127.0.0.2");
    for _ in 0..6 {
        call(&stranger, &app, "log_in", &[("email", "owner@example.com"), ("password", "a guess")]).await;
    }
    let blocked = call(&stranger, &app, "log_in", &[("email", "owner@example.com"), ("password", "right password")]);
    assert_eq!(blocked.await.status(), StatusCode::TOO_MANY_REQUESTS, "the stranger's address is throttled");
    let owner = from("127.0.0.3");
    let welcome = call(&owner, &app, "log_in", &[("email", "owner@example.com"), ("password", "right password")]);
    assert_eq!(welcome.await.status(), StatusCode::OK, "the owner, elsewhere, still gets in");
}

/// OWASP's device cookies: strangers on ten addresses fill the account-wide window and lock
/// out every new device, but the browser the owner logged in with before still gets in, and a
/// made-up or another account's token does not count as known.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn strangers_on_many_addresses_cannot_lock_the_owner_out_of_a_device_it_used(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    users::create_user(&app.pool, "owner@example.com", "right password", Role::User, 0).await.unwrap();
    users::create_user(&app.pool, "other@example.com", "other password", Role::User, 0).await.unwrap();
    let browser = |ip: &str| {
        reqwest::Client::builder()
            .local_address(ip.parse::<std::net::IpAddr>().unwrap())
            .cookie_store(true)
            .build()
            .unwrap()
    };
    let log_in = |client: &reqwest::Client, email: &str, password: &str| {
        let form = [("email", email.to_string()), ("password", password.to_string())];
        let (client, url, origin) = (client.clone(), app.url("/api/log_in"), format!("http://{}", app.addr));
        async move { client.post(url).header("Origin", origin).form(&form).send().await.unwrap() }
    };
    let owners_laptop = browser("127.0.1.100");
    let first = log_in(&owners_laptop, "owner@example.com", "right password").await;
    assert_eq!(first.status(), StatusCode::OK);
    let device = first
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with("sluice_device="))
        .expect("a device cookie at log-in");
    assert!(device.contains("HttpOnly") && device.contains("SameSite=Strict"), "{device}");
    let others_device = browser("127.0.1.101");
    assert_eq!(log_in(&others_device, "other@example.com", "other password").await.status(), StatusCode::OK);

    // Ten addresses, five guesses each: the account-wide window (50) is full.
    for n in 1..=10 {
        let stranger = browser(&format!("127.0.1.{n}"));
        for _ in 0..5 {
            assert_eq!(log_in(&stranger, "owner@example.com", "a guess").await.status(), StatusCode::UNAUTHORIZED);
        }
    }
    let new_device = browser("127.0.1.50");
    let locked = log_in(&new_device, "owner@example.com", "right password").await;
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS, "a device the account never saw waits");
    // Another account's device token is not this account's.
    let borrowed = log_in(&others_device, "owner@example.com", "right password").await;
    assert_eq!(borrowed.status(), StatusCode::TOO_MANY_REQUESTS);
    let forged =
        reqwest::Client::builder().local_address("127.0.1.51".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let forged = forged
        .post(app.url("/api/log_in"))
        .header("Origin", format!("http://{}", app.addr))
        .header("Cookie", "sluice_device=00ff00ff")
        .form(&[("email", "owner@example.com"), ("password", "right password")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::TOO_MANY_REQUESTS);

    // The owner's laptop gets in, whatever the strangers did.
    assert_eq!(log_in(&owners_laptop, "owner@example.com", "right password").await.status(), StatusCode::OK);
    // Guesses with the device token are limited too: the device's own window.
    for _ in 0..5 {
        assert_eq!(log_in(&owners_laptop, "owner@example.com", "wrong").await.status(), StatusCode::UNAUTHORIZED);
    }
    let tired = log_in(&owners_laptop, "owner@example.com", "right password").await;
    assert_eq!(tired.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// One network (an IPv4 /24) cannot use up the overall sign-up limit from many addresses.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn sign_ups_are_limited_per_network_as_well_as_per_address(pool: PgPool) {
    let mut settings = WebSettings::default();
    settings.signup_limits.per_network = 3;
    let app = TestApp::spawn(pool, settings).await;
    let from =
        |ip: &str| reqwest::Client::builder().local_address(ip.parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let mut answers = Vec::new();
    for n in 1..=4 {
        let form = [("email", format!("n{n}@example.com")), ("password", "long password".into())];
        let answer = from(&format!("127.0.2.{n}"))
            .post(app.url("/api/sign_up"))
            .header("Origin", format!("http://{}", app.addr))
            .form(&form)
            .send()
            .await
            .unwrap();
        answers.push(answer.status());
    }
    assert_eq!(answers, [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    let elsewhere = from("127.0.3.1")
        .post(app.url("/api/sign_up"))
        .header("Origin", format!("http://{}", app.addr))
        .form(&[("email", "else@example.com"), ("password", "long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), StatusCode::OK, "another network still signs up");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_session_in_use_is_kept_alive_lazily_not_written_on_every_request(pool: PgPool) {
    let settings = WebSettings { session_renew_after: std::time::Duration::from_secs(1), ..WebSettings::default() };
    let app = TestApp::spawn(pool, settings).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up =
        call(&browser, &app, "sign_up", &[("email", "lazy@example.com"), ("password", "long password")]).await;
    assert_eq!(signed_up.status(), StatusCode::OK);
    let expiry = || async {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("SELECT expiry_date FROM tower_sessions.session")
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    let at_login = expiry().await;
    // Requests within the renewal period read the session and write nothing.
    for _ in 0..3 {
        assert_eq!(call(&browser, &app, "me", &[]).await.status(), StatusCode::OK);
    }
    assert_eq!(expiry().await, at_login, "no write per request");
    // Once the period has passed, the next request pushes the expiry back, once.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(call(&browser, &app, "me", &[]).await.status(), StatusCode::OK);
    let renewed = expiry().await;
    assert!(renewed >= at_login + chrono::Duration::seconds(2), "{at_login} -> {renewed}");
    assert!(renewed > chrono::Utc::now() + chrono::Duration::days(6), "seven days from now");
    assert_eq!(call(&browser, &app, "me", &[]).await.status(), StatusCode::OK);
    assert_eq!(expiry().await, renewed, "and not again at once");
}

/// A second web process on the same database: its own caches and its own listener.
async fn second_process(app: &TestApp) -> std::net::SocketAddr {
    let dir = app.blob_dir.with_extension("b");
    let blobs = engine::documents::blobs::Blobs::local(&dir).unwrap();
    server::startup::spawn_web(app.pool.clone(), WebSettings::default(), blobs).await.unwrap()
}

async fn poll(client: &reqwest::Client, addr: std::net::SocketAddr, job: &str, token: &str) -> u16 {
    let answer = client.get(format!("http://{addr}/api/v1/jobs/{job}")).bearer_auth(token).send().await.unwrap();
    answer.status().as_u16()
}

/// How long until `refused` holds, polling every 20 ms for at most 6 s.
async fn time_until<F, Fut>(mut refused: F) -> std::time::Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !refused().await {
        assert!(started.elapsed() < std::time::Duration::from_secs(6), "never refused");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_token_revoked_or_a_session_ended_on_one_process_is_refused_by_another_within_a_second(pool: PgPool) {
    let a = TestApp::spawn(pool, WebSettings::default()).await;
    let b = second_process(&a).await;
    let (user, token) = a.user_with_token("two@example.com", 5, 5).await;
    let job: serde_json::Value = a.upload(&token, doc(1), None).await.json().await.unwrap();
    let job = job["id"].as_str().unwrap().to_string();
    let program = reqwest::Client::new();
    // B knows the token now (kept for a few seconds).
    assert_eq!(poll(&program, b, &job, &token).await, 200);
    assert_eq!(poll(&program, b, &job, &token).await, 200);

    // The owner revokes it through A: B refuses it within a second.
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&browser, &a, "log_in", &[("email", "two@example.com"), ("password", "password123")]).await;
    assert_eq!(logged_in.status(), 200);
    let token_id = engine::accounts::tokens::list(&a.pool, user).await.unwrap()[0].id;
    assert_eq!(call(&browser, &a, "revoke_token", &[("id", &token_id.to_string())]).await.status(), 200);
    let took = time_until(|| async { poll(&program, b, &job, &token).await == 401 }).await;
    assert!(took < std::time::Duration::from_secs(1), "B refused the revoked token after {took:?}");

    // The same browser's session works on B (one database)... until it logs out through A.
    let on_b = |name: &'static str| {
        let browser = browser.clone();
        async move {
            browser.post(format!("http://{b}/api/{name}")).header("Origin", format!("http://{b}")).send().await.unwrap()
        }
    };
    let jobs = on_b("list_jobs").await;
    assert_eq!(jobs.status(), 200);
    assert_eq!(on_b("list_jobs").await.status(), 200);
    assert_eq!(call(&browser, &a, "log_out", &[]).await.status(), 200);
    // The browser no longer sends the cookie; a thief who kept it would: ask as one.
    let took = time_until(|| async { on_b("list_jobs").await.status() == 401 }).await;
    assert!(took < std::time::Duration::from_secs(1), "B kept the ended session for {took:?}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_revocation_whose_notification_is_lost_still_ends_within_the_cache_lifetime(pool: PgPool) {
    let a = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = a.user_with_token("lost@example.com", 5, 5).await;
    let job: serde_json::Value = a.upload(&token, doc(2), None).await.json().await.unwrap();
    let job = job["id"].as_str().unwrap().to_string();
    let program = reqwest::Client::new();
    assert_eq!(poll(&program, a.addr, &job, &token).await, 200);
    // Revoked behind the app's back: no notification. The kept answer stands for a while (the
    // cache is in use), and no longer than its lifetime (5 s).
    sqlx::query("UPDATE api_tokens SET revoked_at = now()").execute(&a.pool).await.unwrap();
    assert_eq!(poll(&program, a.addr, &job, &token).await, 200, "answered from memory");
    let took = time_until(|| async { poll(&program, a.addr, &job, &token).await == 401 }).await;
    assert!(took <= std::time::Duration::from_millis(5_100), "{took:?}");
}
