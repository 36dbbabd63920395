//! Accounts people can keep, against a real SMTP server on loopback: the verification link
//! and the sign-up grant, password resets (once, expiring, the same answer for unknown
//! addresses, throttled), a reset or a change ending access on another process within a
//! second, notices by mail with one-click unsubscribe, and the outbox's retries and bounds.

use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use engine::mail::{MailConfig, Transport};
use fakeprovider::mailbox::{Mail, MailServer};
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

/// The app's mail going to a real SMTP server, sent by a sender like every process runs.
async fn with_mail(app: &TestApp) -> MailServer {
    let server = MailServer::start();
    let config = MailConfig {
        transport: Transport::Smtp(server.smtp_url()),
        site: app.url(""),
        poll_every: Duration::from_millis(200),
        ..MailConfig::default()
    };
    config.check().unwrap();
    tokio::spawn(engine::mail::outbox::run(app.pool.clone(), config));
    server
}

async fn one_mail(server: &MailServer, to: &str, n: usize) -> Mail {
    let mails = server.wait_for(to, n, Duration::from_secs(10)).await;
    assert_eq!(mails.len(), n, "mails to {to}: {:?}", mails.iter().map(Mail::subject).collect::<Vec<_>>());
    mails.into_iter().last().unwrap()
}

/// The token of the link in `mail` that starts with `prefix` (`/verify?token=`).
fn token_in(mail: &Mail, app: &TestApp, path: &str) -> String {
    let link = mail.link(&app.url(path)).unwrap_or_else(|| panic!("no {path} link in {}", mail.text()));
    link.split("token=").nth(1).unwrap().to_string()
}

/// A job no one has: a valid token gets 404, a revoked one 401.
const NO_JOB: &str = "/api/v1/jobs/00000000-0000-4000-8000-000000000000";

fn browser() -> reqwest::Client {
    reqwest::Client::builder().cookie_store(true).build().unwrap()
}

async fn me(client: &reqwest::Client, app: &TestApp) -> serde_json::Value {
    call(client, app, "me", &[]).await.json().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_new_account_gets_its_grant_when_the_mailed_link_proves_the_address(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let mail = with_mail(&app).await;
    let ada = browser();
    let signed_up = call(&ada, &app, "sign_up", &[("email", "Ada@Example.com"), ("password", "long password")]).await;
    assert_eq!(signed_up.status(), StatusCode::OK);
    let before = me(&ada, &app).await;
    assert_eq!((before["balance"].as_i64(), before["email_verified"].as_bool()), (Some(0), Some(false)));

    let letter = one_mail(&mail, "ada@example.com", 1).await;
    assert_eq!(letter.subject(), "Confirm your e-mail address for Sluice");
    assert_eq!(letter.header("List-Unsubscribe"), None, "an account's own mail is not a notice");
    let token = token_in(&letter, &app, "/verify?token=");
    // Only the link's hash is kept; the token left the outbox once sent.
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM mail_outbox WHERE detail::text LIKE '%' || $1 || '%'")
        .bind(&token)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(kept, 0, "the token is not kept after sending");

    // Anyone holding the link proves the address (no session needed); once.
    let verified = call(&reqwest::Client::new(), &app, "verify_email", &[("token", &token)]).await;
    assert_eq!(verified.status(), StatusCode::OK);
    let after = me(&ada, &app).await;
    assert_eq!((after["balance"].as_i64(), after["email_verified"].as_bool()), (Some(20), Some(true)));
    let again = call(&reqwest::Client::new(), &app, "verify_email", &[("token", &token)]).await;
    assert_eq!(again.status(), StatusCode::GONE, "a link works once");
    assert_eq!(me(&ada, &app).await["balance"].as_i64(), Some(20), "the grant is given once");
    for junk in ["", "zz", &"0".repeat(64), &"g".repeat(64)] {
        assert_eq!(call(&ada, &app, "verify_email", &[("token", junk)]).await.status(), StatusCode::GONE, "{junk:?}");
    }
    // Asking for the mail again once verified sends nothing.
    assert_eq!(call(&ada, &app, "resend_verification", &[]).await.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(mail.mails_to("ada@example.com").len(), 1);

    // With verification off (an operator's choice), the grant comes at sign-up and no mail.
    let open =
        TestApp::spawn(app.pool.clone(), WebSettings { require_email_verification: false, ..WebSettings::default() })
            .await;
    let bob = browser();
    call(&bob, &open, "sign_up", &[("email", "bob@example.com"), ("password", "long password")]).await;
    assert_eq!(me(&bob, &open).await["balance"].as_i64(), Some(20));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(mail.mails_to("bob@example.com").is_empty());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_reset_link_works_once_expires_and_unknown_addresses_are_answered_alike(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let mail = with_mail(&app).await;
    users::create_user(&app.pool, "carol@example.com", "old password", Role::User, 3).await.unwrap();
    let stranger = reqwest::Client::new();

    let known = call(&stranger, &app, "forgot_password", &[("email", "Carol@example.com")]).await;
    let unknown = call(&stranger, &app, "forgot_password", &[("email", "nobody@example.com")]).await;
    assert_eq!((known.status(), unknown.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(known.text().await.unwrap(), unknown.text().await.unwrap(), "the same answer");
    let letter = one_mail(&mail, "carol@example.com", 1).await;
    assert_eq!(letter.subject(), "Reset your Sluice password");
    assert!(letter.text().contains("30 minutes"), "{}", letter.text());
    let token = token_in(&letter, &app, "/reset?token=");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mail.mails().len(), 1, "nothing is mailed for an unknown address");
    let hashes: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT token_hash FROM account_links").fetch_all(&app.pool).await.unwrap();
    assert_eq!(hashes.len(), 1);
    assert_ne!(hashes[0], token.as_bytes(), "only the hash is stored");

    // Too short a password: refused, and the link still works.
    let weak = call(&stranger, &app, "reset_password", &[("token", &token), ("password", "short")]).await;
    assert_eq!(weak.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let carol = browser();
    let reset = call(&carol, &app, "reset_password", &[("token", &token), ("password", "new password")]).await;
    assert_eq!(reset.status(), StatusCode::OK);
    assert_eq!(me(&carol, &app).await["email"].as_str(), Some("carol@example.com"), "logged in by the reset");
    let twice = call(&stranger, &app, "reset_password", &[("token", &token), ("password", "another password")]).await;
    assert_eq!(twice.status(), StatusCode::GONE, "a reset link works once");
    let old = call(&browser(), &app, "log_in", &[("email", "carol@example.com"), ("password", "old password")]).await;
    assert_eq!(old.status(), StatusCode::UNAUTHORIZED);
    let new = call(&browser(), &app, "log_in", &[("email", "carol@example.com"), ("password", "new password")]).await;
    assert_eq!(new.status(), StatusCode::OK);

    // A link older than 30 minutes is refused (the clock moved on by aging the row).
    call(&stranger, &app, "forgot_password", &[("email", "carol@example.com")]).await;
    let late = token_in(&one_mail(&mail, "carol@example.com", 2).await, &app, "/reset?token=");
    sqlx::query("UPDATE account_links SET created_at = created_at - interval '31 minutes', expires_at = expires_at - interval '31 minutes' WHERE used_at IS NULL")
        .execute(&app.pool)
        .await
        .unwrap();
    let expired = call(&stranger, &app, "reset_password", &[("token", &late), ("password", "late password")]).await;
    assert_eq!(expired.status(), StatusCode::GONE);
    let body: serde_json::Value = expired.json().await.unwrap();
    assert!(body.to_string().contains("link_expired"), "{body}");

    // Throttled per account, and unknown addresses alike: 3 an hour, then 429 for both.
    call(&stranger, &app, "forgot_password", &[("email", "carol@example.com")]).await;
    let throttled = call(&stranger, &app, "forgot_password", &[("email", "carol@example.com")]).await;
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..3 {
        assert_eq!(
            call(&stranger, &app, "forgot_password", &[("email", "ghost@example.com")]).await.status(),
            StatusCode::OK
        );
    }
    let ghost = call(&stranger, &app, "forgot_password", &[("email", "ghost@example.com")]).await;
    assert_eq!(ghost.status(), StatusCode::TOO_MANY_REQUESTS, "unknown addresses are throttled the same");
    // ...and per client address, whatever the accounts.
    for n in 0..10 {
        let email = format!("someone{n}@example.com");
        call(&stranger, &app, "forgot_password", &[("email", &email)]).await;
    }
    let flood = call(&stranger, &app, "forgot_password", &[("email", "one-more@example.com")]).await;
    assert_eq!(flood.status(), StatusCode::TOO_MANY_REQUESTS);
    // A malformed address is told so, whatever the throttles.
    let malformed = call(&stranger, &app, "forgot_password", &[("email", "not an address")]).await;
    assert_eq!(malformed.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// Wait until `check` holds, up to `limit`; returns how long it took (None: never).
async fn within<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_reset_ends_every_session_device_and_token_on_another_process_within_a_second(pool: PgPool) {
    let first = TestApp::spawn(pool, WebSettings::default()).await;
    // A second process on the same database: its own caches, told through LISTEN/NOTIFY.
    let second = TestApp::spawn(first.pool.clone(), WebSettings::default()).await;
    let mail = with_mail(&first).await;
    let (_, api_token) = first.user_with_token("dora@example.com", 5, 5).await;
    let elsewhere = browser();
    let logged_in =
        call(&elsewhere, &second, "log_in", &[("email", "dora@example.com"), ("password", "password123")]).await;
    assert_eq!(logged_in.status(), StatusCode::OK);
    // Known and kept by the second process (its cache holds the session, the user and the token).
    assert_eq!(me(&elsewhere, &second).await["email"].as_str(), Some("dora@example.com"));
    // A job that is no one's: 404 to a valid token, 401 to a revoked one.
    let jobs = |app: &TestApp| reqwest::Client::new().get(app.url(NO_JOB)).bearer_auth(&api_token).send();
    assert_eq!(jobs(&second).await.unwrap().status(), StatusCode::NOT_FOUND);
    let devices: i64 = sqlx::query_scalar("SELECT count(*) FROM device_tokens").fetch_one(&first.pool).await.unwrap();
    assert_eq!(devices, 1);

    call(&reqwest::Client::new(), &first, "forgot_password", &[("email", "dora@example.com")]).await;
    let token = token_in(&one_mail(&mail, "dora@example.com", 1).await, &first, "/reset?token=");
    let here = browser();
    let reset = call(&here, &first, "reset_password", &[("token", &token), ("password", "fresh password")]).await;
    assert_eq!(reset.status(), StatusCode::OK);

    let session_ended = within(Duration::from_secs(1), || async { me(&elsewhere, &second).await.is_null() }).await;
    assert!(session_ended.is_some(), "the other process still honours the old session after a second");
    let token_ended =
        within(Duration::from_secs(1), || async { jobs(&second).await.unwrap().status() == StatusCode::UNAUTHORIZED })
            .await;
    assert!(token_ended.is_some(), "the other process still honours the API token after a second");
    // The device token went too (a new one for the browser that reset), and this browser is in.
    let devices: i64 = sqlx::query_scalar("SELECT count(*) FROM device_tokens").fetch_one(&first.pool).await.unwrap();
    assert_eq!(devices, 1, "only the resetting browser's new device token");
    assert_eq!(
        me(&here, &second).await["email"].as_str(),
        Some("dora@example.com"),
        "the new session works everywhere"
    );
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_password_change_keeps_this_session_and_ends_the_others(pool: PgPool) {
    let first = TestApp::spawn(pool, WebSettings::default()).await;
    let second = TestApp::spawn(first.pool.clone(), WebSettings::default()).await;
    let (_, api_token) = first.user_with_token("erin@example.com", 5, 5).await;
    let (this, other) = (browser(), browser());
    for (client, app) in [(&this, &first), (&other, &second)] {
        call(client, app, "log_in", &[("email", "erin@example.com"), ("password", "password123")]).await;
        assert_eq!(me(client, app).await["email"].as_str(), Some("erin@example.com"));
    }
    let jobs = || reqwest::Client::new().get(second.url(NO_JOB)).bearer_auth(&api_token).send();

    let wrong = call(
        &this,
        &first,
        "change_password",
        &[("current", "not it at all"), ("password", "changed password"), ("keep_api_tokens", "true")],
    )
    .await;
    assert_eq!(wrong.status(), StatusCode::UNPROCESSABLE_ENTITY, "the current password is asked");
    let changed = call(
        &this,
        &first,
        "change_password",
        &[("current", "password123"), ("password", "changed password"), ("keep_api_tokens", "true")],
    )
    .await;
    assert_eq!(changed.status(), StatusCode::OK);
    assert_eq!(me(&this, &first).await["email"].as_str(), Some("erin@example.com"), "this session stays");
    assert_eq!(me(&this, &second).await["email"].as_str(), Some("erin@example.com"), "on every process");
    let ended = within(Duration::from_secs(1), || async { me(&other, &second).await.is_null() }).await;
    assert!(ended.is_some(), "the other session ends within a second");
    assert_eq!(jobs().await.unwrap().status(), StatusCode::NOT_FOUND, "API tokens kept when the user chose so");

    let again = call(
        &this,
        &first,
        "change_password",
        &[("current", "changed password"), ("password", "third password"), ("keep_api_tokens", "false")],
    )
    .await;
    assert_eq!(again.status(), StatusCode::OK);
    let revoked =
        within(Duration::from_secs(1), || async { jobs().await.unwrap().status() == StatusCode::UNAUTHORIZED }).await;
    assert!(revoked.is_some(), "API tokens revoked within a second");
}

/// Upload `bytes` as `name` and run it with the local provider, its job made `age` old first.
async fn run_aged(app: &TestApp, token: &str, name: &str, bytes: Vec<u8>, age_secs: i64) -> String {
    let uploaded = upload_file(app, token, name, bytes, "summarize").await;
    assert!(uploaded.status().is_success(), "{}", uploaded.status());
    let id = uploaded.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    sqlx::query("UPDATE jobs SET accepted_at = now() - make_interval(secs => $2) WHERE id = $1::uuid")
        .bind(&id)
        .bind(age_secs as f64)
        .execute(&app.pool)
        .await
        .unwrap();
    work(app, 1).await;
    id
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn notices_come_by_mail_as_chosen_without_document_text_and_unsubscribe_in_one_click(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let mail = with_mail(&app).await;
    let (user_id, token) = app.user_with_token("fay@example.com", 7, 5).await;
    let secret_text = "the merger closes on friday";

    // Done after two minutes: mailed, with a link to the job and none of the document.
    let slow = run_aged(&app, &token, "merger.txt", format!("{secret_text}\n").into_bytes(), 120).await;
    let done = one_mail(&mail, "fay@example.com", 1).await;
    assert_eq!(done.subject(), "Your document is ready");
    assert!(done.text().contains(&app.url(&format!("/jobs/{slow}"))), "{}", done.text());
    assert!(!done.raw.contains(secret_text) && !done.raw.contains("merger"), "no document text or name in a mail");
    assert_eq!(done.header("List-Unsubscribe-Post").as_deref(), Some("List-Unsubscribe=One-Click"));
    let unsubscribe = done.header("List-Unsubscribe").unwrap();
    let unsubscribe = unsubscribe.trim_start_matches('<').trim_end_matches('>').to_string();
    assert!(unsubscribe.starts_with(&app.url("/unsubscribe?")), "{unsubscribe}");

    // Done within the minute: no mail.
    run_aged(&app, &token, "quick.txt", b"a quick one\n".to_vec(), 0).await;

    // A link scanner's GET changes nothing; the mail provider's one-click POST does.
    let page = reqwest::Client::new().get(&unsubscribe).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("Unsubscribe"));
    let choices = || async {
        sqlx::query_as::<_, (bool, bool, bool)>(
            "SELECT mail_done, mail_failed, mail_credits_low FROM users WHERE id = $1",
        )
        .bind(user_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };
    assert_eq!(choices().await, (true, true, true));
    let one_click = reqwest::Client::new()
        .post(&unsubscribe)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("Origin", "null")
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(one_click.status(), StatusCode::OK);
    assert_eq!(choices().await, (false, true, true), "only that notice is off");
    let forged = unsubscribe.replace("what=done", "what=failed").replace("&k=", "&k=0");
    assert_eq!(reqwest::Client::new().post(&forged).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let own_mail = unsubscribe.replace("what=done", "what=reset");
    assert_eq!(reqwest::Client::new().post(&own_mail).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    run_aged(&app, &token, "slow-again.txt", b"another slow one\n".to_vec(), 300).await;

    // Failed and refunded (a PDF with no text): mailed. The balance 7 went to 4 with three
    // uploads: below 5 once, so one "credits low" mail.
    let failed = run_aged(&app, &token, "scan.pdf", engine::testing::pdf_without_text(), 0).await;
    let mails = mail.wait_for("fay@example.com", 3, Duration::from_secs(10)).await;
    let subjects: Vec<String> = mails.iter().map(Mail::subject).collect();
    assert_eq!(subjects.iter().filter(|s| *s == "Your document could not be processed").count(), 1, "{subjects:?}");
    assert_eq!(subjects.iter().filter(|s| *s == "Your Sluice credits are running low").count(), 1, "{subjects:?}");
    assert_eq!(subjects.iter().filter(|s| *s == "Your document is ready").count(), 1, "{subjects:?}");
    let failure = mails.iter().find(|m| m.subject() == "Your document could not be processed").unwrap();
    assert!(
        failure.text().contains(&format!("/jobs/{failed}")) && failure.text().contains("refunded"),
        "{}",
        failure.text()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(mail.mails_to("fay@example.com").len(), 3, "nothing more");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_outbox_retries_a_server_that_is_down_is_bounded_per_account_and_writes_files_without_one(pool: PgPool) {
    use engine::accounts::recovery;
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let user = users::create_user(&app.pool, "gus@example.com", "password123", Role::User, 0).await.unwrap();
    let limits = recovery::LinkLimits { per_account: 100, per_address: 100, ..Default::default() };
    recovery::request_reset(&app.pool, "gus@example.com", "203.0.113.1", limits).await.unwrap();

    // Nothing listens on this port: the mail waits, with the error, for its next attempt.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let down = MailConfig {
        transport: Transport::Smtp(format!("smtp://{closed}")),
        site: app.url(""),
        ..MailConfig::default()
    };
    let sender = down.transport.open().unwrap();
    assert_eq!(engine::mail::outbox::send_due(&app.pool, &down, &sender, 10).await.unwrap(), 1);
    let (attempts, error, wait): (i32, Option<String>, f64) = sqlx::query_as(
        "SELECT attempts, last_error, extract(epoch FROM next_attempt_at - now())::float8 FROM mail_outbox WHERE sent_at IS NULL",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.is_some());
    assert!((5.0..=11.0).contains(&wait), "tried again after the backoff, not at once: {wait}");
    assert_eq!(engine::mail::outbox::send_due(&app.pool, &down, &sender, 10).await.unwrap(), 0, "not due yet");

    // The server is back when it is due again: sent.
    let server = MailServer::start();
    sqlx::query("UPDATE mail_outbox SET next_attempt_at = now()").execute(&app.pool).await.unwrap();
    let up = MailConfig { transport: Transport::Smtp(server.smtp_url()), ..down.clone() };
    let sender = up.transport.open().unwrap();
    assert_eq!(engine::mail::outbox::send_due(&app.pool, &up, &sender, 10).await.unwrap(), 1);
    assert_eq!(server.mails_to("gus@example.com").len(), 1);

    // At most 20 notices waiting per account: the rest are given up at once, on the record.
    // The account's own mail (a reset link) is never dropped for them.
    let mut tx = app.pool.begin().await.unwrap();
    for n in 0..25 {
        let detail = engine::mail::compose::Detail { balance: Some(1), ..Default::default() };
        let kind = engine::mail::MailKind::CreditsLow;
        engine::mail::outbox::enqueue(&mut tx, user.id, kind, &format!("low:{n}"), &detail).await.unwrap();
    }
    tx.commit().await.unwrap();
    recovery::request_reset(&app.pool, "gus@example.com", "203.0.113.1", limits).await.unwrap();
    let (pending, given_up, resets): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE sent_at IS NULL AND gave_up_at IS NULL), count(*) FILTER (WHERE gave_up_at IS NOT NULL),
                count(*) FILTER (WHERE kind = 'reset' AND sent_at IS NULL AND gave_up_at IS NULL)
         FROM mail_outbox WHERE user_id = $1",
    )
    .bind(user.id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((pending, given_up, resets), (21, 5, 1));

    // No SMTP server configured: each mail is a file in the outbox folder.
    let folder = std::env::temp_dir().join(format!("sluice-outbox-{}", user.id + rand::random::<u32>() as i64));
    let files = MailConfig { transport: Transport::Folder(folder.clone()), ..up };
    let sender = files.transport.open().unwrap();
    sqlx::query("UPDATE users SET email_verified_at = now() WHERE id = $1")
        .bind(user.id)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(engine::mail::outbox::send_due(&app.pool, &files, &sender, 30).await.unwrap(), 21);
    let written: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert_eq!(written.len(), 21);
    let reset = written.iter().find(|m| m.contains("Subject: Reset your Sluice password")).expect("the reset mail");
    assert!(reset.contains("gus@example.com"), "{reset}");
    let _ = std::fs::remove_dir_all(&folder);
}

/// Issue 55, item 7: the mail folder holds live links, so it is private whatever the umask
/// (a folder made earlier with 0755 too), each file is 0600, and an account's files go at
/// once when it is deleted and with the outbox's retention otherwise.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_mail_folder_is_private_and_forgets_a_deleted_accounts_links_at_once(pool: PgPool) {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let folder = std::env::temp_dir().join(format!("sluice-private-outbox-{}", rand::random::<u32>()));
    std::fs::DirBuilder::new().mode(0o755).create(&folder).unwrap();
    let config = MailConfig {
        transport: Transport::Folder(folder.clone()),
        site: app.url(""),
        poll_every: Duration::from_millis(100),
        ..MailConfig::default()
    };
    tokio::spawn(engine::mail::outbox::run(app.pool.clone(), config));
    let limits = engine::accounts::recovery::LinkLimits { per_account: 100, per_address: 100, ..Default::default() };
    let ann = users::create_user(&app.pool, "ann@example.com", "password123", Role::Admin, 0).await.unwrap();
    let bea = users::create_user(&app.pool, "bea@example.com", "password123", Role::User, 0).await.unwrap();
    for email in ["ann@example.com", "bea@example.com"] {
        engine::accounts::recovery::request_reset(&app.pool, email, "203.0.113.9", limits).await.unwrap();
    }
    let files = || -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()).collect();
        found.sort();
        found
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while files().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(files().len(), 2, "both reset mails written");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&folder), 0o700, "the folder is private");
    for file in files() {
        assert_eq!(mode(&file), 0o600, "{} is readable by others", file.display());
    }

    engine::accounts::deletion::delete_account(&app.pool, &app.blobs, bea.id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let bea_prefix = format!("{}-", bea.id);
    let held_by =
        |prefix: &str| files().iter().filter(|f| f.file_name().unwrap().to_str().unwrap().starts_with(prefix)).count();
    while held_by(&bea_prefix) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held_by(&bea_prefix), 0, "a deleted account's reset link is still in the folder");
    assert_eq!(held_by(&format!("{}-", ann.id)), 1, "another account's mail is kept");

    // Past the retention everything goes (here a retention of nothing).
    let sender = Transport::Folder(folder.clone()).open().unwrap();
    let pruned = engine::mail::outbox::prune_folder(&app.pool, sender.folder().unwrap(), Duration::ZERO).await.unwrap();
    assert_eq!((pruned, files().len()), (1, 0));
    let _ = std::fs::remove_dir_all(&folder);
}

/// Issue 55, item 6: mail an attacker can make Sluice send is bounded. An upload and a cancel
/// repeated send "credits are low" once a day, not once per upload (against a real SMTP
/// server); every account's notices are capped per day whatever the transport.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn credits_low_is_mailed_once_a_day_and_notices_are_capped_per_account(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let mail = with_mail(&app).await;
    let (user_id, token) = app.user_with_token("low@example.com", 5, 5).await;
    let client = reqwest::Client::new();
    for n in 0..6 {
        let accepted = app.upload(&token, doc(n), None).await;
        assert_eq!(accepted.status(), StatusCode::ACCEPTED);
        let id = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
        let canceled = client.post(app.url(&format!("/api/v1/jobs/{id}/cancel"))).bearer_auth(&token).send().await;
        assert_eq!(canceled.unwrap().status(), StatusCode::OK);
        assert_eq!(users::get(&app.pool, user_id).await.unwrap().balance, 5, "refunded at once");
    }
    let first = one_mail(&mail, "low@example.com", 1).await;
    assert!(first.subject().to_lowercase().contains("credit"), "{}", first.subject());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(mail.mails_to("low@example.com").len(), 1, "six falls below the line, one mail");

    // Every notice an account is sent counts toward its day: past the cap, given up on the record.
    let mut tx = app.pool.begin().await.unwrap();
    for n in 0..engine::mail::outbox::MAX_NOTICES_PER_DAY + 5 {
        let detail = engine::mail::compose::Detail { job_id: Some(format!("job-{n}")), ..Default::default() };
        let kind = engine::mail::MailKind::Done;
        engine::mail::outbox::enqueue(&mut tx, user_id, kind, &format!("done:test:{n}"), &detail).await.unwrap();
        // Sent at once, as a folder or a fast server would: nothing stays waiting.
        sqlx::query("UPDATE mail_outbox SET sent_at = now() WHERE sent_at IS NULL AND gave_up_at IS NULL")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let (kept, given_up): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE gave_up_at IS NULL), count(*) FILTER (WHERE gave_up_at IS NOT NULL)
         FROM mail_outbox WHERE user_id = $1 AND kind IN ('done', 'failed', 'credits_low')",
    )
    .bind(user_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((kept, given_up), (engine::mail::outbox::MAX_NOTICES_PER_DAY, 6), "one credits-low mail and the cap");
}

/// Issue 55, item 6: sign-ups are not free mail and free credits. The grant is given once per
/// mailbox (`+tags`, case and Gmail's dots folded); an address left unverified expires (freed
/// for its owner); verification mails cannot be asked for without end.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_signup_grant_is_once_per_mailbox_and_unverified_accounts_expire(pool: PgPool) {
    use engine::accounts::{recovery, signup};
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let limits = signup::SignupLimits { per_address: 100, per_network: 100, overall: 100, ..Default::default() };
    let sign_up = |email: &'static str, verify: bool| {
        let pool = app.pool.clone();
        async move { signup::sign_up(&pool, email, "long password", 20, "203.0.113.5", limits, verify).await }
    };
    let first = sign_up("jo.doe@gmail.com", false).await.unwrap();
    assert_eq!(first.balance, 20);
    for again in ["jodoe+1@gmail.com", "J.O.D.O.E@googlemail.com"] {
        let user = sign_up(again, false).await.unwrap();
        assert_eq!(user.balance, 0, "{again} is the same mailbox: no second grant");
    }
    assert_eq!(sign_up("jo.doe@example.org", false).await.unwrap().balance, 20, "another mailbox");

    // Unverified: the verification mails are bounded in all, and the account expires.
    let waiting = sign_up("late@example.org", true).await.unwrap();
    let links = recovery::LinkLimits { per_account: 100, per_address: 100, ..Default::default() };
    for _ in 0..recovery::MAX_VERIFY_RESENDS {
        recovery::resend_verification(&app.pool, &waiting, "203.0.113.6", links).await.unwrap();
    }
    let refused = recovery::resend_verification(&app.pool, &waiting, "203.0.113.7", links).await;
    assert!(matches!(refused, Err(engine::EngineError::RateLimited { .. })), "{refused:?}");
    assert_eq!(signup::expire_unverified(&app.pool, &app.blobs, signup::UNVERIFIED_LIFETIME).await.unwrap(), 0);
    sqlx::query("UPDATE users SET created_at = now() - interval '49 hours' WHERE id = $1")
        .bind(waiting.id)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(signup::expire_unverified(&app.pool, &app.blobs, signup::UNVERIFIED_LIFETIME).await.unwrap(), 1);
    assert!(users::get(&app.pool, waiting.id).await.is_err(), "expired");
    let owner = sign_up("late@example.org", true).await.expect("the address is free for its owner");
    assert_ne!(owner.id, waiting.id);
    assert_eq!(users::get(&app.pool, first.id).await.unwrap().balance, 20, "verified accounts stay");
}
