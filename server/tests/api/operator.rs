//! The operator commands, run as the real binary against a fresh database.

use std::process::Command;

use engine::accounts::Role;
use sqlx::PgPool;

/// The URL of the test's database (`#[sqlx::test]` made it) as the binary needs it.
fn url_of(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask test sets it)");
    let db = pool.connect_options().get_database().expect("a database name").to_string();
    let (head, query) = base.split_once('?').map(|(h, q)| (h, format!("?{q}"))).unwrap_or((&base, String::new()));
    let head = head.rsplit_once('/').map(|(h, _)| h).unwrap_or(head);
    format!("{head}/{db}{query}")
}

fn server(url: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_server"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("SLUICE_ADMIN_PASSWORD", "admin password")
        .env("SLUICE_LOG", "warn")
        .output()
        .expect("run the server binary");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn operators_create_admins_grant_credits_and_list_users(pool: PgPool) {
    let url = url_of(&pool);
    let (ok, out) = server(&url, &["create-admin", "--email", "Root@Example.com"]);
    assert!(ok, "{out}");
    let admin = engine::accounts::users::find_by_email(&pool, "root@example.com").await.unwrap();
    assert!(admin.is_admin());
    assert_eq!(admin.balance, 0);
    assert!(engine::accounts::login::log_in(
        &pool,
        "root@example.com",
        "admin password",
        "cli-test",
        None,
        Default::default()
    )
    .await
    .is_ok());

    let (ok, out) = server(&url, &["grant-credits", "--email", "root@example.com", "--amount", "15"]);
    assert!(ok && out.contains("balance 15"), "{out}");
    let (ok, out) = server(&url, &["grant-credits", "--email", "root@example.com", "--amount", "-20"]);
    assert!(!ok && out.contains("below zero"), "{out}");
    assert_eq!(engine::accounts::users::get(&pool, admin.id).await.unwrap().balance, 15);
    assert_eq!(engine::accounts::ledger::ledger_sum(&pool, admin.id).await.unwrap(), 15);
    let audit = engine::audit::recent(&pool, 5).await.unwrap();
    assert_eq!((audit[0].action.as_str(), audit[0].actor.as_str()), ("credits", "cli"));

    let (ok, out) = server(&url, &["list-users"]);
    assert!(ok && out.contains("root@example.com") && out.contains("admin"), "{out}");
    let (ok, out) = server(&url, &["grant-credits", "--email", "nobody@example.com", "--amount", "1"]);
    assert!(!ok && out.contains("no user"), "{out}");
}

/// Issue 55, item 1: a stranger signs up with the operator's address before the operator runs
/// `create-admin` as the README shows. The command refuses; with `--promote-existing` it still
/// refuses while the address is unverified; and once an account is promoted, every session and
/// token it had ends. The stranger's cookie, token and password never reach the console.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn create_admin_never_hands_the_console_to_whoever_signed_up_with_the_address_first(pool: PgPool) {
    use crate::helpers::{call, TestApp};
    let mut settings = app::server::session::WebSettings::default();
    settings.require_email_verification = true;
    let app = TestApp::spawn(pool, settings).await;
    let url = url_of(&app.pool);
    let stranger = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up =
        call(&stranger, &app, "sign_up", &[("email", "ops@example.com"), ("password", "stranger's password")]).await;
    assert_eq!(signed_up.status(), 200);
    let user = engine::accounts::users::find_by_email(&app.pool, "ops@example.com").await.unwrap();
    let (_, token) = engine::accounts::tokens::create(&app.pool, user.id, "stranger's").await.unwrap();
    let console_answers = |client: reqwest::Client| {
        let app = &app;
        async move { call(&client, app, "admin/overview", &[]).await.status() }
    };

    let (ok, out) = server(&url, &["create-admin", "--email", "ops@example.com"]);
    assert!(!ok && out.contains("already has an account") && out.contains("NOT verified"), "{out}");
    let (ok, out) = server(&url, &["create-admin", "--email", "ops@example.com", "--promote-existing"]);
    assert!(!ok && out.contains("not verified"), "{out}");
    let (ok, out) = server(&url, &["set-role", "--email", "ops@example.com", "--role", "operator"]);
    assert!(!ok && out.contains("not verified"), "{out}");
    let held = engine::accounts::users::get(&app.pool, user.id).await.unwrap();
    assert_eq!(held.role, Role::User, "{out}");
    assert_eq!(console_answers(stranger.clone()).await, 404);
    // The operator's password opens nothing: no account was made or changed with it.
    let operator = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&operator, &app, "log_in", &[("email", "ops@example.com"), ("password", "admin password")]);
    assert_ne!(logged_in.await.status(), 200);
    // The database itself refuses an unverified staff account, whoever writes it.
    let written = sqlx::query("UPDATE users SET role = 'admin' WHERE id = $1").bind(user.id).execute(&app.pool).await;
    assert!(written.is_err(), "an unverified account was made admin");

    // The holder proves the address; promoting it then ends everything it held before.
    sqlx::query("UPDATE users SET email_verified_at = now() WHERE id = $1")
        .bind(user.id)
        .execute(&app.pool)
        .await
        .unwrap();
    let (ok, out) = server(&url, &["create-admin", "--email", "ops@example.com", "--promote-existing"]);
    assert!(ok && out.contains("is an admin now"), "{out}");
    // Its password is now the operator's: whoever knew the old one is out.
    let old_password = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let tried =
        call(&old_password, &app, "log_in", &[("email", "ops@example.com"), ("password", "stranger's password")]);
    assert_ne!(tried.await.status(), 200, "the stranger's password still logs in");
    let operator = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&operator, &app, "log_in", &[("email", "ops@example.com"), ("password", "admin password")]);
    assert_eq!(logged_in.await.status(), 200);
    assert_eq!(console_answers(operator).await, 200, "the operator reaches the console");
    assert_eq!(engine::accounts::users::get(&app.pool, user.id).await.unwrap().role, Role::Admin);
    let mut old_session_ended = false;
    for _ in 0..50 {
        if console_answers(stranger.clone()).await == 404 {
            old_session_ended = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(old_session_ended, "a session from before the promotion reaches the console");
    let me = call(&stranger, &app, "me", &[]).await.text().await.unwrap();
    assert_eq!(me.trim(), "null", "the old session still names the account: {me}");
    let with_token = reqwest::Client::new()
        .get(app.url(&format!("/api/v1/jobs/{}", uuid::Uuid::new_v4())))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), 401, "an API token from before the promotion still works");
}
