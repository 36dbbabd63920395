//! Links mailed to an address (verification, password reset): a random token in the mail, its
//! SHA-256 in `account_links`; good once, until it expires.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};

use crate::error::{EngineError, Result};

/// What a link is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Verify,
    Reset,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Purpose::Verify => "verify",
            Purpose::Reset => "reset",
        }
    }
}

/// How long a reset link works.
pub const RESET_VALID: Duration = Duration::from_secs(30 * 60);
/// How long a verification link works.
pub const VERIFY_VALID: Duration = Duration::from_secs(48 * 3600);

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new link's token for `user_id` (only its hash is stored), good for `valid`.
pub async fn issue(conn: &mut PgConnection, user_id: i64, purpose: Purpose, valid: Duration) -> Result<String> {
    let token = hex::encode(rand::random::<[u8; 32]>());
    sqlx::query(
        "INSERT INTO account_links (token_hash, user_id, purpose, expires_at)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(digest(&token))
    .bind(user_id)
    .bind(purpose.as_str())
    .bind(valid.as_secs_f64())
    .execute(conn)
    .await?;
    Ok(token)
}

/// Use a link: the account it was issued to, once. A used, expired, unknown or malformed
/// token is [`EngineError::LinkExpired`], all alike. Also spends the account's other links of
/// the same purpose (an older reset mail stops working once one is used).
pub async fn consume(conn: &mut PgConnection, token: &str, purpose: Purpose) -> Result<i64> {
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(EngineError::LinkExpired);
    }
    // One statement spends this link and the account's other unused ones of its purpose, so
    // two links used at once lock in the same order; the later finds them used (410).
    let spent: Vec<(i64, bool)> = sqlx::query_as(
        "UPDATE account_links SET used_at = now()
         WHERE user_id = (SELECT user_id FROM account_links
                          WHERE token_hash = $1 AND purpose = $2 AND used_at IS NULL AND expires_at > now())
           AND purpose = $2 AND used_at IS NULL
         RETURNING user_id, token_hash = $1 AND expires_at > now()",
    )
    .bind(digest(token))
    .bind(purpose.as_str())
    .fetch_all(&mut *conn)
    .await?;
    spent.into_iter().find(|(_, this)| *this).map(|(user_id, _)| user_id).ok_or(EngineError::LinkExpired)
}

/// Delete links that expired a day ago (maintenance).
pub async fn prune(pool: &PgPool) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM account_links WHERE expires_at < now() - interval '1 day'")
        .execute(pool)
        .await?
        .rows_affected())
}
