//! Staff roles: who may use the console, given from the command line (audited).

use sqlx::PgPool;

use super::users::{get, Role, User};
use crate::error::{EngineError, Result};

/// Give a user a role, audited (`actor` names who). Every process forgets what it kept of the
/// account, so the new role holds on the next request.
pub async fn set_role(pool: &PgPool, id: i64, role: Role, actor: &str) -> Result<User> {
    let mut tx = pool.begin().await?;
    let old: Role = sqlx::query_scalar("SELECT role FROM users WHERE id = $1 AND deleted_at IS NULL FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(EngineError::NotFound)?;
    sqlx::query("UPDATE users SET role = $2 WHERE id = $1").bind(id).bind(role).execute(&mut *tx).await?;
    crate::audit::audit(&mut tx, actor, "role", Some(&format!("user {id}")), old.as_str(), role.as_str()).await?;
    super::auth_cache::announce(&mut tx, &super::auth_cache::Revoked::User(id)).await?;
    tx.commit().await?;
    get(pool, id).await
}
