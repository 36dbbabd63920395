//! The document store's free space, as the upkeep last saw it: written by every process's
//! upkeep, read by the console, the metrics and the alerts (the queue's vital signs know no
//! documents; the console shows both side by side).

use sqlx::PgPool;

use super::Blobs;
use crate::error::Result;

/// The store's free bytes (a local folder's; none for S3), and whether a write found it full
/// since it last had room: as the upkeep last saw them (within 5 minutes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSpace {
    pub free_bytes: Option<i64>,
    pub full: bool,
}

/// Record the document store's free space, and whether it is full as this process sees it
/// (its upkeep, every half minute). The store counts as full for 90 s after the last process
/// that found it so said so.
pub async fn record(pool: &PgPool, blobs: &Blobs) -> Result<()> {
    let free = blobs.free_bytes().map(|b| b.min(i64::MAX as u64) as i64);
    sqlx::query(
        "INSERT INTO blob_store_space (id, free_bytes, full_at, checked_at)
         VALUES (1, $1, CASE WHEN $2 THEN now() END, now())
         ON CONFLICT (id) DO UPDATE SET free_bytes = $1, checked_at = now(),
             full_at = CASE WHEN $2 THEN now() ELSE blob_store_space.full_at END",
    )
    .bind(free)
    .bind(blobs.is_full())
    .execute(pool)
    .await?;
    Ok(())
}

/// The space last recorded (nothing known when no process recorded it in 5 minutes).
pub async fn read(pool: &PgPool) -> Result<StoreSpace> {
    let store: Option<(Option<i64>, bool)> = sqlx::query_as(
        "SELECT free_bytes, coalesce(full_at > now() - interval '90 seconds', false) FROM blob_store_space
         WHERE checked_at > now() - interval '5 minutes'",
    )
    .fetch_optional(pool)
    .await?;
    let (free_bytes, full) = store.unwrap_or((None, false));
    Ok(StoreSpace { free_bytes, full })
}
