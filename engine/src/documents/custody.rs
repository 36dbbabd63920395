//! The documents' one door for the accounts: admission locks a new upload's stored document
//! until it commits and checks that a shared one ("run again") is still kept; deleting a job or
//! an account has its documents forgotten. Accounts call only this; the sweep, the blobs and
//! the backup's holds stay behind it (the architecture chapter's whiteboard, checked by
//! `app/tests/import_circles.rs`).

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::sweep;
use crate::error::Result;

/// The stored documents, passed through the accounts' calls as they are.
pub use super::Blobs;

/// Hold a new upload's stored document `key` until `tx` ends: an abandoned upload's cleanup
/// then sees the job this transaction admits, or none.
pub async fn lock_new_document(tx: &mut PgConnection, key: &str) -> Result<()> {
    sweep::lock_document(tx, key).await
}

/// Whether the stored document `key` is still kept for a job to share, locked until `tx` ends
/// so that no deletion outruns the admission.
pub async fn still_kept(tx: &mut PgConnection, key: &str) -> Result<bool> {
    sweep::document_needed(tx, key).await
}

/// Erase what the provider answered for deleted jobs (their words) and is kept apart from the
/// jobs' rows: the batches' answers, answers kept before their completion, scans' texts kept
/// for a next attempt; in the caller's transaction.
pub async fn forget_answers(conn: &mut PgConnection, jobs: &[Uuid]) -> sqlx::Result<()> {
    for table in ["batch_requests", "kept_answers", "kept_scan_texts"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE job_id = ANY($1)")).bind(jobs).execute(&mut *conn).await?;
    }
    Ok(())
}

/// Forget the stored documents of jobs their owners deleted, once those have ended (one job's,
/// or all: an account's). Returns how many jobs were released.
pub async fn forget_deleted_jobs_documents(pool: &PgPool, blobs: &Blobs, only: Option<Uuid>) -> Result<usize> {
    sweep::forget_deleted_jobs_documents(pool, blobs, only).await
}
