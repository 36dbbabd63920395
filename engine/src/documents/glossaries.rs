//! Glossaries saved in a user's account by name ([`super::glossary`] reads and checks them):
//! reused from the upload page and the REST API.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::glossary::{self, Entry};
use crate::error::{EngineError, Result};

/// The most glossaries one account keeps.
pub const MAX_PER_ACCOUNT: i64 = 50;

/// A saved glossary as listed: its name and size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Saved {
    pub name: String,
    pub entries: i64,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Pure: a glossary's name, trimmed: 1 to 60 visible characters.
pub fn check_name(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > glossary::MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(EngineError::Invalid(format!(
            "a glossary's name has 1 to {} characters, none of them control characters",
            glossary::MAX_NAME_CHARS
        )));
    }
    Ok(name.to_string())
}

/// `owner`'s glossaries, by name.
pub async fn list(pool: &PgPool, owner: i64) -> Result<Vec<Saved>> {
    Ok(sqlx::query_as(
        "SELECT name, jsonb_array_length(entries)::int8 AS entries, updated_at FROM glossaries
         WHERE owner_id = $1 ORDER BY name",
    )
    .bind(owner)
    .fetch_all(pool)
    .await?)
}

/// `owner`'s glossary `name`'s entries ([`EngineError::NotFound`] when it has none so named).
pub async fn get(pool: &PgPool, owner: i64, name: &str) -> Result<Vec<Entry>> {
    let entries: Option<sqlx::types::Json<Vec<Entry>>> =
        sqlx::query_scalar("SELECT entries FROM glossaries WHERE owner_id = $1 AND name = $2")
            .bind(owner)
            .bind(check_name(name)?)
            .fetch_optional(pool)
            .await?;
    entries.map(|e| e.0).ok_or(EngineError::NotFound)
}

/// Save `entries` as `owner`'s glossary `name` (replacing one so named). An account keeps at
/// most [`MAX_PER_ACCOUNT`]; an empty glossary is refused.
pub async fn save(pool: &PgPool, owner: i64, name: &str, entries: &[Entry]) -> Result<()> {
    let name = check_name(name)?;
    if entries.is_empty() {
        return Err(EngineError::Invalid("the glossary has no entries".into()));
    }
    let mut tx = pool.begin().await?;
    // The owner's row orders saves of one account (the count below stays true).
    sqlx::query("SELECT 1 FROM users WHERE id = $1 FOR UPDATE").bind(owner).execute(&mut *tx).await?;
    let (count, exists): (i64, bool) =
        sqlx::query_as("SELECT count(*), coalesce(bool_or(name = $2), false) FROM glossaries WHERE owner_id = $1")
            .bind(owner)
            .bind(&name)
            .fetch_one(&mut *tx)
            .await?;
    if !exists && count >= MAX_PER_ACCOUNT {
        return Err(EngineError::Invalid(format!(
            "an account keeps at most {MAX_PER_ACCOUNT} glossaries; delete one first"
        )));
    }
    sqlx::query(
        "INSERT INTO glossaries (owner_id, name, entries) VALUES ($1, $2, $3)
         ON CONFLICT (owner_id, name) DO UPDATE SET entries = $3, updated_at = now()",
    )
    .bind(owner)
    .bind(&name)
    .bind(sqlx::types::Json(entries))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Delete `owner`'s glossary `name`; whether there was one.
pub async fn delete(pool: &PgPool, owner: i64, name: &str) -> Result<bool> {
    let deleted = sqlx::query("DELETE FROM glossaries WHERE owner_id = $1 AND name = $2")
        .bind(owner)
        .bind(check_name(name)?)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(deleted > 0)
}
