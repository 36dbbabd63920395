//! Operator commands beside `serve`: create an admin, grant credits, list users.
//! With the embedded default they use the running server's cluster, or start it briefly.

use anyhow::Context;
use engine::accounts::{users, Role};

use crate::cli::{Command, Config};
use crate::database::{Cluster, Database};

/// Run one operator command against the configured database (or the embedded cluster).
pub async fn run(config: Config, command: Command) -> anyhow::Result<()> {
    let database = Database::open(&config, Cluster::Borrow).await?;
    let result = run_with(&database.url, command).await;
    database.close().await;
    result
}

async fn run_with(url: &str, command: Command) -> anyhow::Result<()> {
    let pool = engine::db::connect(url, 2).await.context("connecting to Postgres")?;
    match command {
        Command::CreateAdmin { email } => {
            let password = match std::env::var("SLUICE_ADMIN_PASSWORD") {
                Ok(p) => p,
                Err(_) => rpassword::prompt_password(format!("Password for {email}: "))?,
            };
            let user = match users::create_user(&pool, &email, &password, Role::Admin, 0).await {
                Ok(user) => user,
                Err(engine::EngineError::EmailTaken) => {
                    // An existing account is promoted; its password stays.
                    let user = users::find_by_email(&pool, &email).await?;
                    users::set_role(&pool, user.id, Role::Admin).await?;
                    println!("{} already had an account; it is an admin now", user.email);
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            println!("created admin {} (id {})", user.email, user.id);
        }
        Command::GrantCredits { email, amount } => {
            let user = users::find_by_email(&pool, &email).await.with_context(|| format!("no user {email}"))?;
            let balance =
                engine::accounts::ledger::admin_adjust(&pool, user.id, amount, "cli", "granted from the command line")
                    .await?;
            println!("{}: balance {balance}", user.email);
        }
        Command::ListUsers => {
            println!("{:>6}  {:<40} {:<6} {:>8} {:>9}", "id", "email", "role", "balance", "in flight");
            for u in users::list(&pool).await? {
                println!(
                    "{:>6}  {:<40} {:<6} {:>8} {:>5} / {}",
                    u.id,
                    u.email,
                    u.role.as_str(),
                    u.balance,
                    u.in_flight,
                    u.max_in_flight
                );
            }
        }
        Command::Serve | Command::Extract { .. } => unreachable!("not an operator command"),
    }
    pool.close().await;
    Ok(())
}
