//! Sign-up: strangers making accounts, throttled per address, per network and overall, with
//! the address confirmed by a mailed link before the sign-up grant when that is asked.

use std::time::Duration;

use sqlx::PgPool;

use super::users::{check_password_rules, get, give_signup_grant, insert_user, normalize_email, Role, User};
use super::{recovery, throttle};
use crate::error::{EngineError, Result};

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

/// What a sign-up came to.
#[derive(Debug)]
pub enum SignUp {
    /// A new account.
    Created(User),
    /// The address has an account already. With verification asked for, its owner was
    /// mailed (throttled), and the caller answers as for a new account: a stranger learns
    /// nothing of who has an account.
    Taken,
}

/// Sign a stranger up: the input is checked first (free), then the throttles per client
/// address and overall are taken (atomically), then the account is made. With `verify`, the
/// address must be proved first: a verification mail is queued with the account and the
/// `grant` waits for its link ([`super::recovery::verify`]); without, it is given at once.
/// The password is hashed whether or not the address is taken, so the answer's time tells
/// nothing either.
pub async fn sign_up(
    pool: &PgPool,
    email: &str,
    password: &str,
    grant: i64,
    client: &str,
    limits: SignupLimits,
    verify: bool,
) -> Result<SignUp> {
    normalize_email(email)?;
    check_password_rules(password)?;
    let windows = [
        (format!("signup:address:{client}"), limits.per_address),
        (format!("signup:network:{}", throttle::network_of(client)), limits.per_network),
        ("signup:all".to_string(), limits.overall),
    ];
    throttle::take_all(pool, &windows, limits.window).await?;
    let mut tx = pool.begin().await?;
    let id = match insert_user(&mut tx, email, password, Role::User, 0, !verify).await {
        Ok(id) => id,
        Err(EngineError::EmailTaken) => {
            drop(tx);
            if verify {
                tell_the_owner(pool, email).await?;
            }
            return Ok(SignUp::Taken);
        }
        Err(e) => return Err(e),
    };
    if verify {
        recovery::start_verification(&mut tx, id).await?;
    } else {
        give_signup_grant(&mut tx, id, email, grant).await?;
    }
    tx.commit().await?;
    Ok(SignUp::Created(get(pool, id).await?))
}

/// Mails to one address's owner about sign-ups with it, per hour; past it nothing is mailed
/// (the answer stays the same): its inbox is not a target.
const TAKEN_MAILS_PER_HOUR: i64 = 3;

/// Mail the owner of `email` that someone tried to sign up with it (at most
/// [`TAKEN_MAILS_PER_HOUR`] an hour).
async fn tell_the_owner(pool: &PgPool, email: &str) -> Result<()> {
    // A deleted account's address is erased (`deleted-user-N`): no deleted one is found here.
    let owner = match super::users::find_by_email(pool, email).await {
        Ok(user) => user,
        Err(EngineError::NotFound) => return Ok(()),
        Err(e) => return Err(e),
    };
    let window = Duration::from_secs(3600);
    match throttle::take(pool, &format!("signup-taken:account:{}", owner.id), TAKEN_MAILS_PER_HOUR, window).await {
        Ok(_) => {}
        Err(EngineError::RateLimited { .. }) => return Ok(()),
        Err(e) => return Err(e),
    }
    let mut tx = pool.begin().await?;
    let key = format!("signup-taken:{}:{}", owner.id, uuid::Uuid::new_v4());
    let detail = crate::mail::compose::Detail::default();
    crate::mail::outbox::enqueue(&mut tx, owner.id, crate::mail::MailKind::SignupTaken, &key, &detail).await?;
    tx.commit().await?;
    Ok(())
}

/// How long an account may stay unverified before it is deleted and its address freed (the
/// verification link is good for as long).
pub const UNVERIFIED_LIFETIME: Duration = super::links::VERIFY_VALID;

/// Delete accounts whose address was not verified within `lifetime` (at most 100 a run; the
/// upkeep runs it hourly): a stranger cannot hold someone's address by signing up with it.
/// An account in use is kept (it has jobs or credits: an operator granted them, say); the
/// verification is looked at again under the account's lock, so an address verified at the
/// last moment stays. Returns how many went.
pub async fn expire_unverified(pool: &PgPool, blobs: &crate::documents::Blobs, lifetime: Duration) -> Result<usize> {
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
