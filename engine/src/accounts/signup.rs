//! Sign-up: strangers making accounts, throttled per address, per network and overall, with
//! the address confirmed by a mailed link before the sign-up grant when that is asked.

use std::time::Duration;

use sqlx::PgPool;

use super::users::{check_password_rules, get, give_signup_grant, insert_user, normalize_email, Role, User};
use super::{recovery, throttle};
use crate::error::Result;

/// How many accounts may be made, per client address, per network and in all, within a window.
#[derive(Clone, Copy, Debug)]
pub struct SignupLimits {
    pub per_address: i64,
    /// Per IPv4 /24 or IPv6 /48, so one network cannot use up the overall limit.
    pub per_network: i64,
    pub overall: i64,
    pub window: Duration,
}

impl Default for SignupLimits {
    /// 10 per address, 30 per network and 300 in all per hour: each account gets free credits
    /// and costs an argon2 hash, so a burst from one place must not be free.
    fn default() -> Self {
        SignupLimits { per_address: 10, per_network: 30, overall: 300, window: Duration::from_secs(3600) }
    }
}

/// Sign a stranger up: the input is checked first (free), then the throttles per client
/// address and overall are taken (atomically), then the account is made. With `verify`, the
/// address must be proved first: a verification mail is queued with the account and the
/// `grant` waits for its link ([`super::recovery::verify`]); without, it is given at once.
pub async fn sign_up(
    pool: &PgPool,
    email: &str,
    password: &str,
    grant: i64,
    client: &str,
    limits: SignupLimits,
    verify: bool,
) -> Result<User> {
    normalize_email(email)?;
    check_password_rules(password)?;
    let windows = [
        (format!("signup:address:{client}"), limits.per_address),
        (format!("signup:network:{}", throttle::network_of(client)), limits.per_network),
        ("signup:all".to_string(), limits.overall),
    ];
    throttle::take_all(pool, &windows, limits.window).await?;
    let mut tx = pool.begin().await?;
    let id = insert_user(&mut tx, email, password, Role::User, 0, !verify).await?;
    if verify {
        recovery::start_verification(&mut tx, id).await?;
    } else {
        give_signup_grant(&mut tx, id, email, grant).await?;
    }
    tx.commit().await?;
    get(pool, id).await
}

/// How long an account may stay unverified before it is deleted and its address freed (the
/// verification link is good for as long).
pub const UNVERIFIED_LIFETIME: Duration = super::links::VERIFY_VALID;

/// Delete accounts whose address was not verified within `lifetime` (at most 100 a run; the
/// upkeep runs it hourly): a stranger cannot hold someone's address by signing up with it.
/// An account in use is kept (it has jobs or credits: an operator granted them, say); the
/// verification is looked at again under the account's lock, so an address verified at the
/// last moment stays. Returns how many went.
pub async fn expire_unverified(
    pool: &PgPool,
    blobs: &crate::documents::custody::Blobs,
    lifetime: Duration,
) -> Result<usize> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM users u WHERE email_verified_at IS NULL AND deleted_at IS NULL
           AND created_at < now() - make_interval(secs => $1) AND balance = 0 AND in_flight = 0
           AND NOT EXISTS (SELECT 1 FROM job_listing l WHERE l.owner_id = u.id)
         ORDER BY created_at LIMIT 100",
    )
    .bind(lifetime.as_secs_f64())
    .fetch_all(pool)
    .await?;
    let mut expired = 0;
    for id in &ids {
        match super::deletion::delete_unverified_account(pool, blobs, *id).await {
            Ok(()) => expired += 1,
            Err(crate::error::EngineError::NotFound) => {} // verified (or deleted) meanwhile
            Err(e) => return Err(e),
        }
    }
    Ok(expired)
}
