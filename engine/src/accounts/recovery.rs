//! Keeping an account: proving the address (verification), getting back in (a password reset
//! by mail), changing the password, and choosing which notices come by mail.
//!
//! A reset or a change ends the account's other access on every process at once: its session
//! epoch moves on (sessions carry the epoch they began in), its device tokens go, its API
//! tokens are revoked, and the access notification makes every process forget what it kept.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

use super::links::{self, Purpose, RESET_VALID, VERIFY_VALID};
use super::users::{self, check_password_rules, User};
use super::{auth_cache, login, throttle};
use crate::error::{EngineError, Result};
use crate::mail::compose::{Detail, MailKind};

/// How often links may be asked for, within a sliding window.
#[derive(Clone, Copy, Debug)]
pub struct LinkLimits {
    /// Reset or verification mails to one account.
    pub per_account: i64,
    /// Requests from one client address, whatever the accounts.
    pub per_address: i64,
    pub window: Duration,
}

impl Default for LinkLimits {
    /// 3 mails an account and 10 requests an address per hour: enough for a typo and a slow
    /// mailbox, too few to flood anyone's inbox.
    fn default() -> Self {
        LinkLimits { per_account: 3, per_address: 10, window: Duration::from_secs(3600) }
    }
}

/// Verification mails an account may ask for again in all (the first, at sign-up, aside).
pub const MAX_VERIFY_RESENDS: i64 = 5;

/// Issue a verification link for `user_id` and queue its mail, in the caller's transaction.
pub async fn start_verification(conn: &mut PgConnection, user_id: i64) -> Result<()> {
    let token = links::issue(conn, user_id, Purpose::Verify, VERIFY_VALID).await?;
    let detail =
        Detail { token: Some(token), valid_minutes: Some(VERIFY_VALID.as_secs() as i64 / 60), ..Default::default() };
    let key = format!("verify:{user_id}:{}", uuid::Uuid::new_v4());
    crate::mail::outbox::enqueue(conn, user_id, MailKind::Verify, &key, &detail).await?;
    Ok(())
}

/// Send the verification mail again (throttled per account and per client address); an
/// address already verified gets nothing.
pub async fn resend_verification(pool: &PgPool, user: &User, client: &str, limits: LinkLimits) -> Result<()> {
    if user.email_verified_at.is_some() {
        return Ok(());
    }
    let windows = [
        (format!("verify:account:{}", user.id), limits.per_account),
        (format!("links:address:{client}"), limits.per_address),
    ];
    throttle::take_all(pool, &windows, limits.window).await?;
    // In all, over the account's unverified life: the hourly window alone would mail an
    // address that never asked 3 times an hour until the account expires.
    // (An unverified account lives as long as its link: `signup::UNVERIFIED_LIFETIME`.)
    throttle::take(pool, &format!("verify:account-total:{}", user.id), MAX_VERIFY_RESENDS, VERIFY_VALID).await?;
    let mut tx = pool.begin().await?;
    start_verification(&mut tx, user.id).await?;
    tx.commit().await?;
    Ok(())
}

/// Mark the address verified, and give the sign-up grant the first time (in `tx`).
async fn mark_verified(tx: &mut PgConnection, user_id: i64, grant: i64) -> Result<()> {
    let first: Option<i64> = sqlx::query_scalar(
        "UPDATE users SET email_verified_at = now() WHERE id = $1 AND email_verified_at IS NULL RETURNING id",
    )
    .bind(user_id)
    .fetch_optional(&mut *tx)
    .await?;
    if first.is_some() {
        let email: String =
            sqlx::query_scalar("SELECT email FROM users WHERE id = $1").bind(user_id).fetch_one(&mut *tx).await?;
        users::give_signup_grant(tx, user_id, &email, grant).await?;
    }
    Ok(())
}

/// Use a verification link: the address is proved and the sign-up grant given (once).
pub async fn verify(pool: &PgPool, token: &str, grant: i64) -> Result<User> {
    let mut tx = pool.begin().await?;
    let user_id = links::consume(&mut tx, token, Purpose::Verify).await?;
    mark_verified(&mut tx, user_id, grant).await?;
    tx.commit().await?;
    users::get(pool, user_id).await
}

/// Ask for a reset link. Answers the same whether or not an account uses `email` (throttled
/// per address and per account, counted for unknown addresses too); a deleted account gets
/// nothing.
pub async fn request_reset(pool: &PgPool, email: &str, client: &str, limits: LinkLimits) -> Result<()> {
    let email = users::normalize_email(email)?;
    let account = login::account_key(&email);
    // What the asker is told (429) is about the asker: this account from this address, and
    // this address at all. A stranger asking about someone else's address cannot lock its
    // owner out of resetting.
    let windows = [
        (format!("reset:account:{account}:from:{client}"), limits.per_account),
        (format!("links:address:{client}"), limits.per_address),
    ];
    throttle::take_all(pool, &windows, limits.window).await?;
    // Past the account's own bound (askers on many addresses), the answer stays the same and
    // nothing is mailed: its inbox is not a target.
    let account_wide = limits.per_account * login::ACCOUNT_WIDE_FACTOR / 3;
    match throttle::take(pool, &format!("reset:account:{account}"), account_wide, limits.window).await {
        Ok(_) => {}
        Err(EngineError::RateLimited { .. }) => return Ok(()),
        Err(e) => return Err(e),
    }
    let mut tx = pool.begin().await?;
    let user_id: Option<i64> = sqlx::query_scalar("SELECT id FROM users WHERE email = $1 AND deleted_at IS NULL")
        .bind(&email)
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(user_id) = user_id {
        let token = links::issue(&mut tx, user_id, Purpose::Reset, RESET_VALID).await?;
        let valid_minutes = Some(RESET_VALID.as_secs() as i64 / 60);
        let detail = Detail { token: Some(token), valid_minutes, ..Default::default() };
        let key = format!("reset:{user_id}:{}", uuid::Uuid::new_v4());
        crate::mail::outbox::enqueue(&mut tx, user_id, MailKind::Reset, &key, &detail).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// End the account's access but what the caller keeps: every session (the epoch moves on),
/// every device token, and (unless kept) every API token; every process forgets them when
/// `tx` commits. Returns the new epoch.
pub(super) async fn end_access(tx: &mut PgConnection, user_id: i64, revoke_api_tokens: bool) -> Result<i32> {
    let epoch: i32 =
        sqlx::query_scalar("UPDATE users SET session_epoch = session_epoch + 1 WHERE id = $1 RETURNING session_epoch")
            .bind(user_id)
            .fetch_one(&mut *tx)
            .await?;
    sqlx::query("DELETE FROM device_tokens WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    if revoke_api_tokens {
        sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE user_id = $1 AND revoked_at IS NULL")
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
    }
    auth_cache::announce(tx, &auth_cache::Revoked::User(user_id)).await?;
    Ok(epoch)
}

pub(super) async fn set_password_hash(tx: &mut PgConnection, user_id: i64, password: &str) -> Result<()> {
    let hash = users::hash_password_bounded(password).await?;
    sqlx::query("UPDATE users SET password_hash = $2 WHERE id = $1 AND deleted_at IS NULL")
        .bind(user_id)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Use a reset link to set a new password: every session, device token and API token of the
/// account ends; the address counts as proved (the link reached it), with the sign-up grant
/// if it had not been. Returns the account (with its new epoch) for the caller to log in.
pub async fn reset_password(pool: &PgPool, token: &str, new_password: &str, grant: i64) -> Result<User> {
    check_password_rules(new_password)?;
    let mut tx = pool.begin().await?;
    let user_id = links::consume(&mut tx, token, Purpose::Reset).await?;
    set_password_hash(&mut tx, user_id, new_password).await?;
    end_access(&mut tx, user_id, true).await?;
    mark_verified(&mut tx, user_id, grant).await?;
    crate::audit::audit(
        &mut tx,
        &format!("user {user_id}"),
        "password_reset",
        Some(&format!("user {user_id}")),
        "",
        "",
    )
    .await?;
    tx.commit().await?;
    users::get(pool, user_id).await
}

/// Change the password, knowing the current one: every other session and device ends, and the
/// API tokens are revoked unless `keep_api_tokens`. Returns the account with its new epoch,
/// which the caller's own session takes on.
pub async fn change_password(
    pool: &PgPool,
    user_id: i64,
    current: &str,
    new_password: &str,
    keep_api_tokens: bool,
) -> Result<User> {
    check_password_rules(new_password)?;
    // Guesses at the current password from a session are bounded like log-ins (and each
    // costs an argon2 hash); a right one gives its place back.
    let key = format!("password-change:{user_id}");
    let taken =
        throttle::take(pool, &key, login::LoginLimits::default().per_account, login::LoginLimits::default().window)
            .await?;
    if !users::password_matches(pool, user_id, current).await? {
        return Err(EngineError::Invalid("the current password is not right".into()));
    }
    throttle::give_back(pool, taken).await?;
    let mut tx = pool.begin().await?;
    set_password_hash(&mut tx, user_id, new_password).await?;
    end_access(&mut tx, user_id, !keep_api_tokens).await?;
    tx.commit().await?;
    users::get(pool, user_id).await
}

/// Which notices also come by mail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct MailChoices {
    /// A document that took longer than a minute is done.
    pub done: bool,
    /// A document failed, and what was refunded.
    pub failed: bool,
    /// The balance fell low.
    pub credits_low: bool,
}

pub async fn mail_choices(pool: &PgPool, user_id: i64) -> Result<MailChoices> {
    sqlx::query_as(
        "SELECT mail_done AS done, mail_failed AS failed, mail_credits_low AS credits_low FROM users
         WHERE id = $1 AND deleted_at IS NULL",
    )
    .bind(user_id)
    .fetch_optional(pool)
    .await?
    .ok_or(EngineError::NotFound)
}

pub async fn set_mail_choices(pool: &PgPool, user_id: i64, choices: MailChoices) -> Result<MailChoices> {
    sqlx::query("UPDATE users SET mail_done = $2, mail_failed = $3, mail_credits_low = $4 WHERE id = $1")
        .bind(user_id)
        .bind(choices.done)
        .bind(choices.failed)
        .bind(choices.credits_low)
        .execute(pool)
        .await?;
    mail_choices(pool, user_id).await
}

/// One-click unsubscribe from a mail's link: turn off notice `kind` for the account, if `key`
/// is its mail key (else `NotFound`, telling nothing). Idempotent.
pub async fn unsubscribe(pool: &PgPool, user_id: i64, key: &str, kind: MailKind) -> Result<()> {
    let column = match kind {
        MailKind::Done => "mail_done",
        MailKind::Failed => "mail_failed",
        MailKind::CreditsLow => "mail_credits_low",
        MailKind::Verify | MailKind::Reset => return Err(EngineError::NotFound),
    };
    let key = uuid::Uuid::parse_str(key).map_err(|_| EngineError::NotFound)?;
    let done = sqlx::query(&format!("UPDATE users SET {column} = false WHERE id = $1 AND mail_key = $2"))
        .bind(user_id)
        .bind(key)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(EngineError::NotFound);
    }
    Ok(())
}
