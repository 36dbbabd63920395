//! The operator commands, run as the real binary against a fresh database.

use std::process::Command;

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
