//! API tokens for programs: shown once, stored as a SHA-256 hash, revocable.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};

use super::users::User;
use crate::error::{EngineError, Result};

const PREFIX: &str = "slc_";

/// A token as its owner sees it (never the secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ApiToken {
    pub id: i64,
    pub name: String,
    /// The first characters, to recognise a token without revealing it.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked: bool,
}

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Live API tokens an account may hold: each may name a callback, and the outbox is shared by
/// account, so more would buy nothing but rows.
pub const MAX_TOKENS_PER_ACCOUNT: i64 = 20;

/// Create a token (at most [`MAX_TOKENS_PER_ACCOUNT`] live); the secret is returned this once
/// and never stored.
pub async fn create(pool: &PgPool, user_id: i64, name: &str) -> Result<(ApiToken, String)> {
    let name = name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(EngineError::Invalid("give the token a name of 1 to 100 characters".into()));
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret = format!("{PREFIX}{}", hex::encode(bytes));
    let prefix: String = secret.chars().take(PREFIX.len() + 6).collect();
    let mut tx = pool.begin().await?;
    // The owner's row locked: two creations at once count each other.
    let live: Option<i64> = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM api_tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL)
         FROM users u WHERE u.id = $1 FOR UPDATE",
    )
    .bind(user_id)
    .fetch_optional(&mut *tx)
    .await?;
    if live.ok_or(EngineError::NotFound)? >= MAX_TOKENS_PER_ACCOUNT {
        return Err(EngineError::Invalid(format!(
            "an account has at most {MAX_TOKENS_PER_ACCOUNT} API tokens; revoke one you no longer use first"
        )));
    }
    let token: ApiToken = sqlx::query_as(
        "INSERT INTO api_tokens (user_id, name, token_sha256, prefix) VALUES ($1, $2, $3, $4)
         RETURNING id, name, prefix, created_at, last_used_at, revoked_at IS NOT NULL AS revoked",
    )
    .bind(user_id)
    .bind(name)
    .bind(digest(&secret))
    .bind(&prefix)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((token, secret))
}

/// A user's tokens, newest first.
pub async fn list(pool: &PgPool, user_id: i64) -> Result<Vec<ApiToken>> {
    Ok(sqlx::query_as(
        "SELECT id, name, prefix, created_at, last_used_at, revoked_at IS NOT NULL AS revoked FROM api_tokens
         WHERE user_id = $1 ORDER BY created_at DESC",
    )
    .bind(user_id)
    .fetch_all(pool)
    .await?)
}

/// Revoke one of the user's tokens (another user's token id is "not found"). Every process
/// forgets it when this commits ([`super::auth_cache`]).
pub async fn revoke(pool: &PgPool, user_id: i64, id: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    let done =
        sqlx::query("UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND user_id = $2")
            .bind(id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
    if done.rows_affected() == 0 {
        return Err(EngineError::NotFound);
    }
    super::auth_cache::announce(&mut tx, &super::auth_cache::Revoked::Token(id)).await?;
    tx.commit().await?;
    Ok(())
}

/// [`authenticate_token`], answered from `cache` while it holds the token (a few seconds,
/// forgotten at once when the token is revoked or its account deleted).
pub async fn authenticate_cached<R: Clone>(
    conn: &mut PgConnection,
    cache: &super::auth_cache::AuthCache<R>,
    secret: &str,
) -> Result<Option<(User, i64)>> {
    let key = hex::encode(digest(secret));
    if let Some(owner) = cache.token(&key) {
        return Ok(Some((owner.user, owner.token_id)));
    }
    let read_at = cache.generation();
    let found = authenticate_token(conn, secret).await?;
    if let Some((user, token_id)) = &found {
        cache.put_token(key, super::auth_cache::TokenOwner { user: user.clone(), token_id: *token_id }, read_at);
    }
    Ok(found)
}

/// The user a bearer token belongs to, if it is valid and not revoked.
pub async fn authenticate(pool: &PgPool, secret: &str) -> Result<Option<User>> {
    Ok(authenticate_token(&mut *pool.acquire().await?, secret).await?.map(|(user, _)| user))
}

/// The user and the token's id, if the token is valid and not revoked. A poll is a read: the
/// token's `last_used_at` is written at most once a minute (one row, one commit per poll would
/// be a synchronous write on every status check).
/// Over `conn`, which the caller may keep for its next query.
pub async fn authenticate_token(conn: &mut PgConnection, secret: &str) -> Result<Option<(User, i64)>> {
    if !secret.starts_with(PREFIX) {
        return Ok(None);
    }
    #[derive(sqlx::FromRow)]
    struct Found {
        token_id: i64,
        stale: bool,
        #[sqlx(flatten)]
        user: User,
    }
    let found: Option<Found> = sqlx::query_as(
        "SELECT t.id AS token_id,
                (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute') AS stale,
                u.id, u.email, u.role, u.balance, u.in_flight, u.max_in_flight, u.created_at,
                u.email_verified_at, u.session_epoch
         FROM api_tokens t JOIN users u ON u.id = t.user_id
         WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL AND u.deleted_at IS NULL",
    )
    .bind(digest(secret))
    .fetch_optional(&mut *conn)
    .await?;
    let Some(found) = found else { return Ok(None) };
    if found.stale {
        // Bookkeeping: a failed write does not refuse the caller.
        let noted = sqlx::query(
            "UPDATE api_tokens SET last_used_at = now()
             WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')",
        )
        .bind(found.token_id)
        .execute(&mut *conn)
        .await;
        if let Err(e) = noted {
            tracing::warn!(error = %e, token = found.token_id, "recording a token's last use failed");
        }
    }
    Ok(Some((found.user, found.token_id)))
}
