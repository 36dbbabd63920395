//! What a backup in progress holds off deletion: the documents of its snapshot it has not
//! copied yet (`backup_holds`). The locks are shared by the backup (`crate::backup`), which
//! takes them, and by every deletion of a document (`sweep`), which heeds them.

use sqlx::PgConnection;

use crate::error::Result;

/// The advisory lock a backup holds (exclusive) while it lists what it will copy, and
/// deletions of documents take (shared, for at most [`DELETION_LOCK_WAIT`]).
pub const BACKUP_LOCK: i64 = 0x5_11CE_BAC0;
/// The advisory lock a backup holds (exclusive) from start to end: `backup_holds` means
/// something only while it is held (a backup that died leaves rows nobody heeds).
pub const BACKUP_RUNNING: i64 = 0x5_11CE_BAC1;
/// The longest a deletion waits for a backup to list its documents; past it the deletion
/// fails as busy (503 and `Retry-After` for a request, a skipped turn for a sweep).
pub const DELETION_LOCK_WAIT: &str = "5s";

/// Whether a backup in progress has yet to copy `key`: then its deletion is left to the
/// backup (marked `deferred`), which deletes it once copied. Waits at most
/// [`DELETION_LOCK_WAIT`] for a backup listing its documents (then the
/// database's lock timeout: busy, try again), never for the copying.
pub(crate) async fn held_by_backup(tx: &mut PgConnection, key: &str) -> Result<bool> {
    sqlx::query(&format!("SET LOCAL lock_timeout = '{}'", DELETION_LOCK_WAIT)).execute(&mut *tx).await?;
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)").bind(BACKUP_LOCK).execute(&mut *tx).await?;
    // No backup running: its rows (if one died) mean nothing.
    let idle: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock_shared($1)")
        .bind(BACKUP_RUNNING)
        .fetch_one(&mut *tx)
        .await?;
    if idle {
        return Ok(false);
    }
    let held: Option<i32> = sqlx::query_scalar("UPDATE backup_holds SET deferred = true WHERE key = $1 RETURNING 1")
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
    Ok(held.is_some())
}
