//! Staff roles: who may use the console, given from the command line (audited).
//!
//! A staff role never lands on an account whose holder has not proved the address (a stranger
//! could have signed up with the operator's address first), and any change of role ends the
//! account's sessions, device tokens and API tokens: whoever held them logs in again, as the
//! role now is.

use sqlx::{PgConnection, PgPool};

use super::users::{get, Role, User};
use crate::error::{EngineError, Result};

/// Give a user a role, audited (`actor` names who). Refused in words for a staff role on an
/// account whose address is not verified. Every session, device token and API token of the
/// account ends on every process when the role changes.
pub async fn set_role(pool: &PgPool, id: i64, role: Role, actor: &str) -> Result<User> {
    let mut tx = pool.begin().await?;
    set_role_in(&mut tx, id, role, actor).await?;
    tx.commit().await?;
    get(pool, id).await
}

/// Make an existing account the admin, as `create-admin --promote-existing` does: only a
/// verified one, and with a password the operator sets (whoever knew the old one is out), all
/// its access ended, in one transaction.
pub async fn adopt_as_admin(pool: &PgPool, id: i64, password: &str, actor: &str) -> Result<User> {
    super::users::check_password_rules(password)?;
    let mut tx = pool.begin().await?;
    set_role_in(&mut tx, id, Role::Admin, actor).await?;
    super::recovery::set_password_hash(&mut tx, id, password).await?;
    super::recovery::end_access(&mut tx, id, true).await?;
    crate::audit::audit(&mut tx, actor, "password_set", Some(&format!("user {id}")), "", "").await?;
    tx.commit().await?;
    get(pool, id).await
}

async fn set_role_in(tx: &mut PgConnection, id: i64, role: Role, actor: &str) -> Result<()> {
    let (old, verified): (Role, bool) = sqlx::query_as(
        "SELECT role, email_verified_at IS NOT NULL FROM users WHERE id = $1 AND deleted_at IS NULL FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(EngineError::NotFound)?;
    if role != Role::User && !verified {
        return Err(EngineError::Invalid(format!(
            "the account's address is not verified, so it cannot be {}: its holder verifies it first \
             (the link mailed at sign-up, or a password reset)",
            role.as_str()
        )));
    }
    if old != role {
        sqlx::query("UPDATE users SET role = $2 WHERE id = $1").bind(id).bind(role).execute(&mut *tx).await?;
        crate::audit::audit(tx, actor, "role", Some(&format!("user {id}")), old.as_str(), role.as_str()).await?;
        super::recovery::end_access(tx, id, true).await?;
    }
    Ok(())
}
