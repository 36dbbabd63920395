//! Log-in: the password check, throttled per account and per client address, and per device
//! for a browser that logged in to the account before (OWASP's device cookies): strangers'
//! guesses fill the account-wide window, but the owner's own device is counted on its own.

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

/// A successful log-in: the user, and the device token to keep (a new one for a device the
/// account has not seen, the same one otherwise).
#[derive(Debug)]
pub struct LoggedIn {
    pub user: User,
    pub device_token: String,
}

/// Device tokens kept per account (the newest used); older devices count as new again.
pub const DEVICES_PER_ACCOUNT: i64 = 20;
/// A device token not used for this long counts as new.
pub const DEVICE_TOKEN_DAYS: i64 = 90;

/// Check e-mail and password, throttled per account and per client address, or, for a device
/// token this account issued, per device. Unknown e-mail and wrong password answer the same,
/// and cost the same argon2 work.
pub async fn log_in(
    pool: &PgPool,
    email: &str,
    password: &str,
    client: &str,
    device_token: Option<&str>,
    limits: LoginLimits,
) -> Result<LoggedIn> {
    let email = normalize_email(email).map_err(|_| EngineError::BadCredentials)?;
    // No account has a longer password (sign-up refuses them): wrong, without hashing it.
    if password.len() > super::users::MAX_PASSWORD {
        return Err(EngineError::BadCredentials);
    }
    let device = match device_token {
        Some(token) => known_device(pool, &email, token).await?,
        None => None,
    };
    let windows = match &device {
        // A device this account knows: its own window only, so however many strangers guess
        // at the account, its owner still gets in; guesses with a stolen token stay limited.
        Some(hash) => vec![(format!("login:device:{}", hex::encode(hash)), limits.per_account)],
        // Three windows: guesses at this account from this address (the tight one), at this
        // account from anywhere (looser), and from this address at any account.
        None => vec![
            (format!("login:account:{}:from:{client}", account_key(&email)), limits.per_account),
            (format!("login:account:{}", account_key(&email)), limits.per_account * ACCOUNT_WIDE_FACTOR),
            (format!("login:address:{client}"), limits.per_address),
        ],
    };
    // Every attempt takes its place before the password is checked (atomically), so at most
    // the limit is ever checked, however many guesses race; a success gives them back.
    let taken = throttle::take_all(pool, &windows, limits.window).await?;
    let found: Option<Credentials> =
        sqlx::query_as("SELECT * FROM users WHERE email = $1").bind(&email).fetch_optional(pool).await?;
    // A fixed dummy hash keeps the timing of unknown accounts like that of known ones.
    const DUMMY: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2x1aWNlLWR1bW15LXNhbHQ$0K4y4T8pQy7tK8m2cW1fQm7C3tV4nX5v6B7d8E9f0gA";
    let hash = found.as_ref().map_or(DUMMY, |c| c.password_hash.as_str()).to_string();
    let ok = verify_password_bounded(password, hash).await?;
    match found {
        Some(credentials) if ok => {
            // The owner is in: this address's (or device's) guesses at the account are forgiven.
            throttle::clear(pool, &windows[0].0).await?;
            for t in taken {
                throttle::give_back(pool, t).await?;
            }
            let device_token = match (device, device_token) {
                (Some(hash), Some(token)) => {
                    sqlx::query("UPDATE device_tokens SET last_used_at = now() WHERE token_hash = $1")
                        .bind(&hash)
                        .execute(pool)
                        .await?;
                    token.to_string()
                }
                _ => issue_device_token(pool, credentials.user.id).await?,
            };
            Ok(LoggedIn { user: credentials.user, device_token })
        }
        // The events taken stay: they are this failure.
        _ => Err(EngineError::BadCredentials),
    }
}

/// The token's hash if `token` is a device token `email`'s account issued and used lately.
async fn known_device(pool: &PgPool, email: &str, token: &str) -> Result<Option<Vec<u8>>> {
    if token.len() > 128 {
        return Ok(None);
    }
    let hash = device_hash(token);
    Ok(sqlx::query_scalar(
        "SELECT d.token_hash FROM device_tokens d JOIN users u ON u.id = d.user_id
         WHERE d.token_hash = $1 AND u.email = $2 AND d.last_used_at > now() - make_interval(days => $3)",
    )
    .bind(&hash)
    .bind(email)
    .bind(DEVICE_TOKEN_DAYS as i32)
    .fetch_optional(pool)
    .await?)
}

fn device_hash(token: &str) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).to_vec()
}

/// A new device token for `user_id` (only its hash is stored); the account keeps its newest
/// [`DEVICES_PER_ACCOUNT`].
pub async fn issue_device_token(pool: &PgPool, user_id: i64) -> Result<String> {
    let token = hex::encode(rand::random::<[u8; 32]>());
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO device_tokens (token_hash, user_id) VALUES ($1, $2)")
        .bind(device_hash(&token))
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "DELETE FROM device_tokens WHERE user_id = $1 AND token_hash NOT IN (
             SELECT token_hash FROM device_tokens WHERE user_id = $1 ORDER BY last_used_at DESC LIMIT $2)",
    )
    .bind(user_id)
    .bind(DEVICES_PER_ACCOUNT)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(token)
}

/// Forget throttle events older than a day, and device tokens no longer used (called by
/// maintenance).
pub async fn prune_login_failures(pool: &PgPool, _window: Duration) -> Result<u64> {
    sqlx::query("DELETE FROM device_tokens WHERE last_used_at < now() - make_interval(days => $1)")
        .bind(DEVICE_TOKEN_DAYS as i32)
        .execute(pool)
        .await?;
    throttle::prune(pool, Duration::from_secs(86_400)).await
}

/// How throttle rows name an account: a hash of its address, so they hold no e-mail address
/// (the address is personal data; the rows are only counted).
pub fn account_key(email: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(email.as_bytes())[..16])
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
