//! Log-in: the password check, throttled per account and per client address.

use std::time::Duration;

use sqlx::PgPool;

use super::throttle;
use super::users::{normalize_email, verify_password_bounded, User};
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
    let account_key = format!("login:account:{email}");
    let address_key = format!("login:address:{client}");
    // Every attempt takes its event before the password is checked (atomically), so at most
    // the limit is ever checked, however many guesses race; a success gives them back.
    let account = throttle::take(pool, &account_key, limits.per_account, limits.window).await?;
    let address = match throttle::take(pool, &address_key, limits.per_address, limits.window).await {
        Ok(taken) => taken,
        Err(e) => {
            throttle::give_back(pool, account).await?;
            return Err(e);
        }
    };
    let found: Option<Credentials> =
        sqlx::query_as("SELECT * FROM users WHERE email = $1").bind(&email).fetch_optional(pool).await?;
    // A fixed dummy hash keeps the timing of unknown accounts like that of known ones.
    const DUMMY: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2x1aWNlLWR1bW15LXNhbHQ$0K4y4T8pQy7tK8m2cW1fQm7C3tV4nX5v6B7d8E9f0gA";
    let hash = found.as_ref().map_or(DUMMY, |c| c.password_hash.as_str()).to_string();
    let ok = verify_password_bounded(password, hash).await?;
    match found {
        Some(credentials) if ok => {
            throttle::clear(pool, &account_key).await?;
            throttle::give_back(pool, address).await?;
            Ok(credentials.user)
        }
        // The events taken stay: they are this failure.
        _ => Err(EngineError::BadCredentials),
    }
}

/// Forget throttle events older than a day (called by maintenance).
pub async fn prune_login_failures(pool: &PgPool, _window: Duration) -> Result<u64> {
    throttle::prune(pool, Duration::from_secs(86_400)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_five_per_account_and_twenty_per_address_in_fifteen_minutes() {
        let limits = LoginLimits::default();
        assert_eq!((limits.per_account, limits.per_address, limits.window), (5, 20, Duration::from_secs(900)));
    }
}
