//! Users: accounts, e-mail and password rules, password hashing (argon2id), roles.

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::{EngineError, Result};

pub use sluice_types::roles::{Permission, Role};

/// An account (never with its password hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub role: Role,
    pub balance: i64,
    pub in_flight: i32,
    pub max_in_flight: i32,
    pub created_at: DateTime<Utc>,
    /// When the owner proved the address is theirs (a link mailed to it); accounts an
    /// operator makes count as proved.
    pub email_verified_at: Option<DateTime<Utc>>,
    /// Sessions carry the epoch they began in; a reset or a password change moves it on, so
    /// every older session ends on every process at once.
    pub session_epoch: i32,
}

impl User {
    /// Whether the admin page and actions are open to this user.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether this user's role allows `what`.
    pub fn may(&self, what: Permission) -> bool {
        self.role.may(what)
    }
}

/// Pure: the mailbox an address reaches, for giving the sign-up grant once: lower-cased,
/// without a `+tag`, and at Gmail (which ignores dots, and answers at googlemail.com too)
/// without dots. `me+1@x.org` and `Me@x.org` are one mailbox; `m.e@gmail.com` and
/// `me@googlemail.com` too.
pub fn mailbox_of(email: &str) -> String {
    let email = email.trim().to_lowercase();
    let Some((local, domain)) = email.rsplit_once('@') else { return email };
    let local = local.split('+').next().unwrap_or(local);
    match domain {
        "gmail.com" | "googlemail.com" => format!("{}@gmail.com", local.replace('.', "")),
        _ => format!("{local}@{domain}"),
    }
}

/// Give the sign-up grant to `user_id` (in the caller's transaction) unless its mailbox
/// ([`mailbox_of`]) had one already; returns whether it was given.
pub(super) async fn give_signup_grant(
    tx: &mut sqlx::PgConnection,
    user_id: i64,
    email: &str,
    grant: i64,
) -> Result<bool> {
    if grant <= 0 {
        return Ok(false);
    }
    // Kept as a digest: the grant is remembered past an account's deletion, its address not.
    let mailbox = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(mailbox_of(email).as_bytes()))
    };
    let first: Option<i64> = sqlx::query_scalar(
        "INSERT INTO signup_grants (mailbox, user_id) VALUES ($1, $2) ON CONFLICT (mailbox) DO NOTHING RETURNING user_id",
    )
    .bind(mailbox)
    .bind(user_id)
    .fetch_optional(&mut *tx)
    .await?;
    if first.is_some() {
        super::ledger::add_credits(
            tx,
            user_id,
            super::ledger::CreditKind::Grant,
            grant,
            "system",
            Some("sign-up grant"),
        )
        .await?;
    }
    Ok(first.is_some())
}

/// Trimmed and lower-cased, or a message saying what is wrong.
pub fn normalize_email(email: &str) -> Result<String> {
    let email = email.trim().to_lowercase();
    let valid = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
        })
        && !email.chars().any(char::is_whitespace)
        // A plain address, as mail is sent to it: no display name, quotes or angle brackets
        // (`"ceo@bank.com"<me@evil.com>` would be mailed to the second).
        && !email.contains(['<', '>', '"', '(', ')', ',', ';', '\\'])
        && email.parse::<lettre::Address>().is_ok();
    if valid {
        Ok(email)
    } else {
        Err(EngineError::Invalid("enter a valid e-mail address, like name@example.com".into()))
    }
}

/// The shortest password accepted, in characters.
pub const MIN_PASSWORD: usize = 8;
/// The longest password accepted, in bytes (argon2 time grows with it).
pub const MAX_PASSWORD: usize = 1024;

/// Ok, or a message saying which rule the password breaks.
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

/// Password hashes computed at once, across the process: argon2 takes CPU and 19 MiB each,
/// so a burst of sign-ups or log-ins waits its turn instead of starving the machine.
static HASHING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Run argon2 work on a blocking thread, at most [`HASHING`]'s permits at once.
async fn bounded_hashing<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let permit = HASHING.acquire().await.map_err(|_| EngineError::Invalid("the server is shutting down".into()))?;
    // The permit ('static: the semaphore is) lives as long as the hashing, even when the
    // request that asked is dropped meanwhile.
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|_| EngineError::Invalid("password hashing failed".into()))
}

/// Check `password` against `hash` on the bounded hashing pool.
pub async fn verify_password_bounded(password: &str, hash: String) -> Result<bool> {
    let password = password.to_string();
    bounded_hashing(move || verify_password(&password, &hash)).await
}

/// argon2id with the crate's defaults. CPU-heavy: callers on an async runtime go through the
/// bounded hashing pool.
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password.as_bytes(), &salt).expect("argon2 hashing").to_string()
}

/// Whether `password` matches an argon2 `hash` (false for a malformed hash).
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
}

/// argon2id on the bounded hashing pool.
pub async fn hash_password_bounded(password: &str) -> Result<String> {
    let password = password.to_string();
    bounded_hashing(move || hash_password(&password)).await
}

/// Create a user with `grant` credits (a ledger grant in the same transaction). An account an
/// operator (or a test) makes counts as verified.
pub async fn create_user(pool: &PgPool, email: &str, password: &str, role: Role, grant: i64) -> Result<User> {
    let mut tx = pool.begin().await?;
    let id = insert_user(&mut tx, email, password, role, grant, true).await?;
    tx.commit().await?;
    get(pool, id).await
}

/// Insert an account in the caller's transaction: the address and password checked, the
/// password hashed, `grant` credits given. Returns its id.
pub(super) async fn insert_user(
    tx: &mut sqlx::PgConnection,
    email: &str,
    password: &str,
    role: Role,
    grant: i64,
    verified: bool,
) -> Result<i64> {
    let email = normalize_email(email)?;
    check_password_rules(password)?;
    let hash = hash_password_bounded(password).await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO users (email, password_hash, role, email_verified_at) VALUES ($1, $2, $3, CASE WHEN $4 THEN now() END)
         ON CONFLICT (email) DO NOTHING RETURNING id",
    )
    .bind(&email)
    .bind(&hash)
    .bind(role)
    .bind(verified)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(EngineError::EmailTaken)?;
    if grant > 0 {
        let grant_kind = super::ledger::CreditKind::Grant;
        super::ledger::add_credits(tx, id, grant_kind, grant, "system", Some("sign-up grant")).await?;
    }
    Ok(id)
}

/// One user, or `NotFound`.
pub async fn get(pool: &PgPool, id: i64) -> Result<User> {
    // A deleted account is no one: its sessions stop working on every process at once.
    sqlx::query_as("SELECT * FROM users WHERE id = $1 AND deleted_at IS NULL")
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound)
}

/// Whether `password` is the password of user `id` (hashing bounded like a log-in's).
pub async fn password_matches(pool: &PgPool, id: i64, password: &str) -> Result<bool> {
    if password.len() > MAX_PASSWORD {
        return Ok(false);
    }
    let hash: Option<String> =
        sqlx::query_scalar("SELECT password_hash FROM users WHERE id = $1 AND deleted_at IS NULL")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    match hash {
        Some(hash) => verify_password_bounded(password, hash).await,
        None => Ok(false),
    }
}

/// The user with this e-mail address (any case), or `NotFound`.
pub async fn find_by_email(pool: &PgPool, email: &str) -> Result<User> {
    let email = normalize_email(email)?;
    sqlx::query_as("SELECT * FROM users WHERE email = $1")
        .bind(&email)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound)
}

/// The id of the live account at `email` that may resolve a review (an operator or an admin;
/// found as a log-in finds it: the same normalisation), or `Invalid` in words.
pub async fn admin_id(pool: &PgPool, email: &str) -> Result<i64> {
    let not_staff = || EngineError::Invalid("the assignee must be an operator or admin account".into());
    match find_by_email(pool, email).await {
        // A deleted account is no one.
        Ok(user) if user.may(Permission::ActOnJobs) => get(pool, user.id).await.map(|u| u.id).map_err(|_| not_staff()),
        Ok(_) | Err(EngineError::NotFound | EngineError::Invalid(_)) => Err(not_staff()),
        Err(e) => Err(e),
    }
}

/// Every user, oldest first (the `list-users` command).
pub async fn list(pool: &PgPool) -> Result<Vec<User>> {
    Ok(sqlx::query_as("SELECT * FROM users ORDER BY id").fetch_all(pool).await?)
}

/// Set how many jobs a user may have in flight (1 to 1000), audited. Jobs already in flight
/// stay; the new limit applies to the next upload.
pub async fn set_max_in_flight(pool: &PgPool, id: i64, limit: i32, actor: &str) -> Result<User> {
    if !(1..=1000).contains(&limit) {
        return Err(EngineError::Invalid("the in-flight limit must be between 1 and 1000".into()));
    }
    let mut tx = pool.begin().await?;
    let old: i32 = sqlx::query_scalar("SELECT max_in_flight FROM users WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(EngineError::NotFound)?;
    let user: User = sqlx::query_as("UPDATE users SET max_in_flight = $2 WHERE id = $1 RETURNING *")
        .bind(id)
        .bind(limit)
        .fetch_one(&mut *tx)
        .await?;
    crate::audit::audit(
        &mut tx,
        actor,
        "in_flight_limit",
        Some(&format!("user {id}")),
        &old.to_string(),
        &limit.to_string(),
    )
    .await?;
    tx.commit().await?;
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_is_one_whatever_its_tags_case_and_gmail_dots() {
        assert_eq!(mailbox_of(" Ada+news@Example.org "), "ada@example.org");
        assert_eq!(mailbox_of("a.d.a+1@gmail.com"), "ada@gmail.com");
        assert_eq!(mailbox_of("ADA@googlemail.com"), "ada@gmail.com");
        assert_eq!(mailbox_of("a.da@example.org"), "a.da@example.org", "dots count outside Gmail");
        assert_ne!(mailbox_of("ada@example.org"), mailbox_of("ada@example.com"));
    }

    #[test]
    fn emails_are_normalized_and_checked() {
        assert_eq!(normalize_email("  Ada@Example.COM ").unwrap(), "ada@example.com");
        for bad in [
            "",
            "ada",
            "@example.com",
            "ada@",
            "ada@example",
            "a da@example.com",
            "ada@.com",
            "\"ceo@bank.com\"<me@evil.com>",
            "ceo@bank.com<me@evil.com>",
            "a,b@example.com",
        ] {
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
}
