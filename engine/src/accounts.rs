//! Users: sign-up, password check (argon2id), roles, and throttling of failed logins.

use std::time::Duration;

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};

use crate::error::{EngineError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Admin => "admin",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub role: Role,
    pub balance: i64,
    pub in_flight: i32,
    pub max_in_flight: i32,
    pub created_at: DateTime<Utc>,
}

impl User {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

const USER_COLUMNS: &str = "id, email, role, balance, in_flight, max_in_flight, created_at";

fn user_from_row(row: &sqlx::postgres::PgRow) -> User {
    User {
        id: row.get("id"),
        email: row.get("email"),
        role: if row.get::<String, _>("role") == "admin" { Role::Admin } else { Role::User },
        balance: row.get("balance"),
        in_flight: row.get("in_flight"),
        max_in_flight: row.get("max_in_flight"),
        created_at: row.get("created_at"),
    }
}

/// Trimmed and lower-cased, or a message saying what is wrong.
pub fn normalize_email(email: &str) -> Result<String> {
    let email = email.trim().to_lowercase();
    let valid = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
        })
        && !email.chars().any(char::is_whitespace);
    if valid {
        Ok(email)
    } else {
        Err(EngineError::Invalid("enter a valid e-mail address, like name@example.com".into()))
    }
}

pub const MIN_PASSWORD: usize = 8;
pub const MAX_PASSWORD: usize = 1024;

pub fn check_password_rules(password: &str) -> Result<()> {
    let n = password.chars().count();
    if n < MIN_PASSWORD {
        return Err(EngineError::Invalid(format!("the password needs at least {MIN_PASSWORD} characters")));
    }
    if password.len() > MAX_PASSWORD {
        return Err(EngineError::Invalid(format!("the password may have at most {MAX_PASSWORD} bytes")));
    }
    Ok(())
}

/// argon2id with the crate's defaults. CPU-heavy: callers on an async runtime should run it
/// on a blocking thread.
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password.as_bytes(), &salt).expect("argon2 hashing").to_string()
}

pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
}

/// Create a user with `grant` credits (a ledger grant in the same transaction).
pub async fn create_user(pool: &PgPool, email: &str, password: &str, role: Role, grant: i64) -> Result<User> {
    let email = normalize_email(email)?;
    check_password_rules(password)?;
    let password = password.to_string();
    let hash = tokio::task::spawn_blocking(move || hash_password(&password)).await.expect("hashing task");
    let mut tx = pool.begin().await?;
    let row = sqlx::query(&format!(
        "INSERT INTO users (email, password_hash, role) VALUES ($1, $2, $3)
         ON CONFLICT (email) DO NOTHING RETURNING {USER_COLUMNS}"
    ))
    .bind(&email)
    .bind(&hash)
    .bind(role.as_str())
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(EngineError::EmailTaken)?;
    let user = user_from_row(&row);
    if grant > 0 {
        crate::ledger::add_credits(
            &mut tx,
            user.id,
            crate::ledger::CreditKind::Grant,
            grant,
            "system",
            Some("sign-up grant"),
        )
        .await?;
    }
    tx.commit().await?;
    get(pool, user.id).await
}

pub async fn get(pool: &PgPool, id: i64) -> Result<User> {
    let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound)?;
    Ok(user_from_row(&row))
}

pub async fn find_by_email(pool: &PgPool, email: &str) -> Result<User> {
    let email = normalize_email(email)?;
    let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE email = $1"))
        .bind(&email)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound)?;
    Ok(user_from_row(&row))
}

pub async fn list(pool: &PgPool) -> Result<Vec<User>> {
    let rows = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users ORDER BY id")).fetch_all(pool).await?;
    Ok(rows.iter().map(user_from_row).collect())
}

pub async fn set_role(pool: &PgPool, id: i64, role: Role) -> Result<()> {
    sqlx::query("UPDATE users SET role = $2 WHERE id = $1").bind(id).bind(role.as_str()).execute(pool).await?;
    Ok(())
}

/// Limits on failed logins within a sliding window.
#[derive(Clone, Copy, Debug)]
pub struct LoginLimits {
    pub per_account: i64,
    pub per_address: i64,
    pub window: Duration,
}

impl Default for LoginLimits {
    fn default() -> Self {
        LoginLimits { per_account: 5, per_address: 20, window: Duration::from_secs(15 * 60) }
    }
}

/// Pure: given the failures counted in the window and the oldest one's age, how long until
/// another attempt is allowed (None = allowed now).
pub fn login_wait(failures: i64, oldest_age: Duration, limit: i64, window: Duration) -> Option<Duration> {
    (failures >= limit).then(|| window.saturating_sub(oldest_age).max(Duration::from_secs(1)))
}

async fn failures(pool: &PgPool, key: &str, window: Duration) -> Result<(i64, Duration)> {
    let row = sqlx::query(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(at)), 0)::float8 FROM login_failures
         WHERE key = $1 AND at > now() - make_interval(secs => $2)",
    )
    .bind(key)
    .bind(window.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok((row.get(0), Duration::from_secs_f64(row.get::<f64, _>(1).max(0.0))))
}

/// Check e-mail and password, throttled per account and per client address.
/// Unknown e-mail and wrong password answer the same, and cost the same argon2 work.
pub async fn log_in(pool: &PgPool, email: &str, password: &str, client: &str, limits: LoginLimits) -> Result<User> {
    let email = normalize_email(email).map_err(|_| EngineError::BadCredentials)?;
    let account_key = format!("account:{email}");
    let address_key = format!("address:{client}");
    for (key, limit) in [(&account_key, limits.per_account), (&address_key, limits.per_address)] {
        let (count, oldest) = failures(pool, key, limits.window).await?;
        if let Some(wait) = login_wait(count, oldest, limit, limits.window) {
            return Err(EngineError::RateLimited { retry_after_secs: wait.as_secs().max(1) });
        }
    }
    let row = sqlx::query(&format!("SELECT {USER_COLUMNS}, password_hash FROM users WHERE email = $1"))
        .bind(&email)
        .fetch_optional(pool)
        .await?;
    // A fixed dummy hash keeps the timing of unknown accounts like that of known ones.
    const DUMMY: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2x1aWNlLWR1bW15LXNhbHQ$0K4y4T8pQy7tK8m2cW1fQm7C3tV4nX5v6B7d8E9f0gA";
    let hash = row.as_ref().map(|r| r.get::<String, _>("password_hash")).unwrap_or_else(|| DUMMY.to_string());
    let password = password.to_string();
    let ok = tokio::task::spawn_blocking(move || verify_password(&password, &hash)).await.expect("verify task");
    match row {
        Some(row) if ok => {
            sqlx::query("DELETE FROM login_failures WHERE key = $1").bind(&account_key).execute(pool).await?;
            Ok(user_from_row(&row))
        }
        _ => {
            sqlx::query("INSERT INTO login_failures (key) VALUES ($1), ($2)")
                .bind(&account_key)
                .bind(&address_key)
                .execute(pool)
                .await?;
            Err(EngineError::BadCredentials)
        }
    }
}

/// Forget failures older than the window (called by maintenance).
pub async fn prune_login_failures(pool: &PgPool, window: Duration) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM login_failures WHERE at < now() - make_interval(secs => $1)")
        .bind(window.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_normalized_and_checked() {
        assert_eq!(normalize_email("  Ada@Example.COM ").unwrap(), "ada@example.com");
        for bad in ["", "ada", "@example.com", "ada@", "ada@example", "a da@example.com", "ada@.com"] {
            assert!(normalize_email(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn password_rules() {
        assert!(check_password_rules("short").is_err());
        assert!(check_password_rules("long enough").is_ok());
        assert!(check_password_rules(&"x".repeat(2000)).is_err());
    }

    #[test]
    fn hashes_verify_only_the_right_password() {
        let hash = hash_password("correct horse");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &hash));
        assert!(!verify_password("wrong horse", &hash));
        assert!(!verify_password("correct horse", "not a hash"));
    }

    #[test]
    fn login_wait_opens_when_the_oldest_failure_leaves_the_window() {
        let window = Duration::from_secs(900);
        assert_eq!(login_wait(4, Duration::from_secs(10), 5, window), None);
        assert_eq!(login_wait(5, Duration::from_secs(100), 5, window), Some(Duration::from_secs(800)));
        assert_eq!(login_wait(9, Duration::from_secs(900), 5, window), Some(Duration::from_secs(1)));
    }
}
