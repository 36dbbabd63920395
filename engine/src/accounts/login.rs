//! Log-in: the password check, throttled per account and per client address.

use std::time::Duration;

use sqlx::PgPool;

use super::throttle;
use super::users::{normalize_email, verify_password_bounded, User};
use crate::error::{EngineError, Result};

/// Limits on failed logins within a sliding window.
#[derive(Clone, Copy, Debug)]
pub struct LoginLimits {
    /// Failures at one account from one address before 429 (ten times as many from anywhere).
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

/// The account-wide window allows this many times the per-(account, address) limit.
pub const ACCOUNT_WIDE_FACTOR: i64 = 10;

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
    // No account has a longer password (sign-up refuses them): wrong, without hashing it.
    if password.len() > super::users::MAX_PASSWORD {
        return Err(EngineError::BadCredentials);
    }
    // Three windows: guesses at this account from this address (the tight one), at this
    // account from anywhere (looser, so a stranger cannot lock its owner out with a few
    // guesses), and from this address at any account.
    let windows = [
        (format!("login:account:{email}:from:{client}"), limits.per_account),
        (format!("login:account:{email}"), limits.per_account * ACCOUNT_WIDE_FACTOR),
        (format!("login:address:{client}"), limits.per_address),
    ];
    // Every attempt takes its place before the password is checked (atomically), so at most
    // the limit is ever checked, however many guesses race; a success gives them back.
    let mut taken = Vec::with_capacity(windows.len());
    for (key, limit) in &windows {
        match throttle::take(pool, key, *limit, limits.window).await {
            Ok(t) => taken.push(t),
            Err(e) => {
                for t in taken {
                    throttle::give_back(pool, t).await?;
                }
                return Err(e);
            }
        }
    }
    let found: Option<Credentials> =
        sqlx::query_as("SELECT * FROM users WHERE email = $1").bind(&email).fetch_optional(pool).await?;
    // A fixed dummy hash keeps the timing of unknown accounts like that of known ones.
    const DUMMY: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2x1aWNlLWR1bW15LXNhbHQ$0K4y4T8pQy7tK8m2cW1fQm7C3tV4nX5v6B7d8E9f0gA";
    let hash = found.as_ref().map_or(DUMMY, |c| c.password_hash.as_str()).to_string();
    let ok = verify_password_bounded(password, hash).await?;
    match found {
        Some(credentials) if ok => {
            // The owner is in: this address's guesses at the account are forgiven.
            throttle::clear(pool, &windows[0].0).await?;
            for t in taken {
                throttle::give_back(pool, t).await?;
            }
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
