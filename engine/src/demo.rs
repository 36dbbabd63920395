//! The first page's click counter: proves the browser -> server function -> Postgres path.

use sqlx::PgPool;

use crate::error::Result;

/// Count one click and return the new total, as stored in Postgres.
pub async fn record_click(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar("UPDATE page_clicks SET clicks = clicks + 1 WHERE id = 1 RETURNING clicks")
        .fetch_one(pool)
        .await?)
}
