//! Log-in: the password check, throttled per account and per client address.

use std::time::Duration;

use sqlx::PgPool;

use super::users::{normalize_email, verify_password, User};
use crate::error::{EngineError, Result};

/// Limits on failed logins within a sliding window.
#[derive(Clone, Copy, Debug)]
pub struct LoginLimits {
    /// Failures per account before 429.
    pub per_account: i64,
    /// Failures per client address before 429.
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

/// Failures counted for one key (an account or an address) within the window.
async fn failures(pool: &PgPool, key: &str, window: Duration) -> Result<(i64, Duration)> {
    let (count, oldest_secs): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(at)), 0)::float8 FROM login_failures
         WHERE key = $1 AND at > now() - make_interval(secs => $2)",
    )
    .bind(key)
    .bind(window.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok((count, Duration::from_secs_f64(oldest_secs.max(0.0))))
}

/// A user with the password hash, only for the check.
#[derive(sqlx::FromRow)]
struct Credentials {
    #[sqlx(flatten)]
    user: User,
    password_hash: String,
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
    let found: Option<Credentials> =
        sqlx::query_as("SELECT * FROM users WHERE email = $1").bind(&email).fetch_optional(pool).await?;
    // A fixed dummy hash keeps the timing of unknown accounts like that of known ones.
    const DUMMY: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2x1aWNlLWR1bW15LXNhbHQ$0K4y4T8pQy7tK8m2cW1fQm7C3tV4nX5v6B7d8E9f0gA";
    let hash = found.as_ref().map_or(DUMMY, |c| c.password_hash.as_str()).to_string();
    let password = password.to_string();
    let ok = tokio::task::spawn_blocking(move || verify_password(&password, &hash)).await.expect("verify task");
    match found {
        Some(credentials) if ok => {
            sqlx::query("DELETE FROM login_failures WHERE key = $1").bind(&account_key).execute(pool).await?;
            Ok(credentials.user)
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
    fn login_wait_opens_when_the_oldest_failure_leaves_the_window() {
        let window = Duration::from_secs(900);
        assert_eq!(login_wait(4, Duration::from_secs(10), 5, window), None);
        assert_eq!(login_wait(5, Duration::from_secs(100), 5, window), Some(Duration::from_secs(800)));
        assert_eq!(login_wait(9, Duration::from_secs(900), 5, window), Some(Duration::from_secs(1)));
    }
}
