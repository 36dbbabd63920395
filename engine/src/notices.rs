//! Notices for users (refunds after failures, ...).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::Result;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    pub id: i64,
    pub job_id: Option<Uuid>,
    pub kind: String,
    pub message: String,
    pub created_at: DateTime<Utc>,
    pub read: bool,
}

pub async fn list(pool: &PgPool, user_id: i64, limit: i64) -> Result<Vec<Notice>> {
    let rows = sqlx::query(
        "SELECT id, job_id, kind, message, created_at, read_at IS NOT NULL FROM notices
         WHERE user_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(user_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| Notice {
            id: r.get(0),
            job_id: r.get(1),
            kind: r.get(2),
            message: r.get(3),
            created_at: r.get(4),
            read: r.get(5),
        })
        .collect())
}

pub async fn unread_count(pool: &PgPool, user_id: i64) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM notices WHERE user_id = $1 AND read_at IS NULL")
        .bind(user_id)
        .fetch_one(pool)
        .await?)
}

/// Mark one notice (or all, with `None`) as read; only the user's own.
pub async fn mark_read(pool: &PgPool, user_id: i64, id: Option<i64>) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE notices SET read_at = now() WHERE user_id = $1 AND read_at IS NULL AND ($2::int8 IS NULL OR id = $2)",
    )
    .bind(user_id)
    .bind(id)
    .execute(pool)
    .await?
    .rows_affected())
}
