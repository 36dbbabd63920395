//! Users delete what they sent: one ended job's document and result, or their whole account.
//! Jobs stay as lines of the credit history (their cost, refunds and times) with every field
//! that holds what the user sent or got erased; the stored documents go at once. A deleted
//! account keeps its row and ledger for the books, without its e-mail address, password,
//! tokens, sessions or notices, and its address is erased wherever it was copied (audit log,
//! ledger notes, throttle rows, reports, alerts).

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::documents::processor::blob_key;
use crate::documents::sweep::delete_if_unneeded;
use crate::documents::Blobs;
use crate::error::{EngineError, Result};
use crate::hooks::SluiceHooks;
use crate::JobState;

/// Erase what the user sent and got from these jobs, where they have ended and are marked
/// deleted: the result, the file name and hash, the callback, the keys, the provider's words,
/// the parts' texts, the notices about them and the file name in their webhook deliveries.
/// Returns the ids erased. Runs in the caller's transaction (also a job's ending's, for a job
/// that was still running when its account was deleted).
pub async fn erase_deleted_jobs(conn: &mut PgConnection, job_ids: &[Uuid]) -> sqlx::Result<Vec<Uuid>> {
    let erased: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE jobs SET result = NULL, last_error = NULL, client_key = NULL, idempotency_key = NULL,
                request_fingerprint = NULL,
                payload = CASE WHEN payload ? 'document'
                               THEN (payload - 'callback')
                                    || jsonb_build_object('document', (payload -> 'document')
                                                          || '{\"name\": null, \"sha256\": \"\"}'::jsonb)
                               ELSE payload - 'callback' END
         WHERE id = ANY($1) AND deleted_at IS NOT NULL AND state IN ('done', 'failed', 'canceled')
         RETURNING id",
    )
    .bind(job_ids)
    .fetch_all(&mut *conn)
    .await?;
    if erased.is_empty() {
        return Ok(erased);
    }
    sqlx::query("DELETE FROM job_parts WHERE job_id = ANY($1)").bind(&erased).execute(&mut *conn).await?;
    sqlx::query("DELETE FROM notices WHERE job_id = ANY($1)").bind(&erased).execute(&mut *conn).await?;
    sqlx::query("UPDATE job_attempts SET detail = NULL WHERE job_id = ANY($1) AND detail IS NOT NULL")
        .bind(&erased)
        .execute(&mut *conn)
        .await?;
    let ids: Vec<String> = erased.iter().map(Uuid::to_string).collect();
    sqlx::query(
        "UPDATE webhook_deliveries SET body = jsonb_set(body, '{job,file_name}', 'null')
         WHERE body #>> '{job,id}' = ANY($1) AND body #>> '{job,file_name}' IS NOT NULL",
    )
    .bind(&ids)
    .execute(&mut *conn)
    .await?;
    Ok(erased)
}

/// Delete the stored documents of these erased jobs (each unless another job still needs it),
/// recording them released.
async fn delete_documents(pool: &PgPool, blobs: &Blobs, job_ids: &[Uuid]) -> Result<()> {
    let released = crate::queue::retention::mark_released(pool, job_ids).await?;
    for job in &released {
        if let Some(key) = blob_key(&job.payload) {
            delete_if_unneeded(pool, blobs, key).await?;
        }
    }
    Ok(())
}

/// What deleting a job came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobDeletion {
    Deleted,
    /// It has not ended: cancel it first.
    NotEnded(JobState),
}

/// Delete `owner_id`'s ended job `job_id`: its document, result and file name go; the job
/// stays as a line "deleted by you". Deleting it again changes nothing.
pub async fn delete_job(pool: &PgPool, blobs: &Blobs, owner_id: i64, job_id: Uuid) -> Result<JobDeletion> {
    let mut tx = pool.begin().await?;
    let state: Option<JobState> =
        sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 AND owner_id = $2 FOR UPDATE")
            .bind(job_id)
            .bind(owner_id)
            .fetch_optional(&mut *tx)
            .await?;
    match state {
        None => return Err(EngineError::NotFound),
        Some(state) if !state.is_terminal() => return Ok(JobDeletion::NotEnded(state)),
        Some(_) => {}
    }
    sqlx::query("UPDATE jobs SET deleted_at = coalesce(deleted_at, now()) WHERE id = $1")
        .bind(job_id)
        .execute(&mut *tx)
        .await?;
    erase_deleted_jobs(&mut tx, &[job_id]).await?;
    tx.commit().await?;
    delete_documents(pool, blobs, &[job_id]).await?;
    Ok(JobDeletion::Deleted)
}

/// What deleting an account came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccountDeletion {
    /// Waiting jobs canceled (and refunded, to the books).
    pub canceled: usize,
    /// Running jobs asked to stop: each is erased, and its document deleted, when it ends.
    pub stopping: usize,
}

/// The name a deleted account goes by in what is kept (audit log, ledger).
pub fn deleted_label(user_id: i64) -> String {
    format!("deleted user {user_id}")
}

/// Delete `user_id`'s account. At once, on every process: its sessions stop working (the
/// user no longer exists for them), its tokens and device tokens are deleted, its address is
/// freed and erased from what is kept, its waiting jobs are canceled by the cancel rules and
/// running ones asked to stop, and its ended jobs are erased with their documents. A running
/// job is erased when it ends ([`crate::hooks::SluiceHooks`]), its document by the release
/// sweep within half a minute. The ledger stays, for the books.
pub async fn delete_account(pool: &PgPool, blobs: &Blobs, user_id: i64) -> Result<AccountDeletion> {
    let label = deleted_label(user_id);
    let mut tx = pool.begin().await?;
    let email: Option<String> =
        sqlx::query_scalar("SELECT email FROM users WHERE id = $1 AND deleted_at IS NULL FOR UPDATE")
            .bind(user_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(email) = email else { return Err(EngineError::NotFound) };
    sqlx::query("UPDATE users SET deleted_at = now(), email = $2, password_hash = '!deleted' WHERE id = $1")
        .bind(user_id)
        .bind(format!("deleted-{user_id}@deleted.invalid"))
        .execute(&mut *tx)
        .await?;
    // Its webhook deliveries go with its tokens (cascade); its jobs call back no more.
    sqlx::query("DELETE FROM api_tokens WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM device_tokens WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM notices WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    sqlx::query(
        "UPDATE jobs SET deleted_at = coalesce(deleted_at, now()), payload = payload - 'callback' WHERE owner_id = $1",
    )
    .bind(user_id)
    .execute(&mut *tx)
    .await?;
    erase_address(&mut tx, &email, &label).await?;
    crate::audit::audit(&mut tx, &label, "delete_account", Some(&format!("user {user_id}")), "", "deleted").await?;
    tx.commit().await?;

    // Waiting jobs are canceled and refunded; running ones stop at their next safe point.
    let live: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE owner_id = $1 AND state NOT IN ('done', 'failed', 'canceled')")
            .bind(user_id)
            .fetch_all(pool)
            .await?;
    let mut deletion = AccountDeletion::default();
    for id in live {
        match crate::queue::cancel(pool, &SluiceHooks, id, &label, false).await? {
            crate::queue::Canceled::Now => deletion.canceled += 1,
            crate::queue::Canceled::Requested => deletion.stopping += 1,
            crate::queue::Canceled::AlreadyEnded(_) => {}
        }
    }
    let ended: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE owner_id = $1 AND state IN ('done', 'failed', 'canceled')")
            .bind(user_id)
            .fetch_all(pool)
            .await?;
    let mut conn = pool.acquire().await?;
    erase_deleted_jobs(&mut conn, &ended).await?;
    drop(conn);
    delete_documents(pool, blobs, &ended).await?;
    Ok(deletion)
}

/// Erase `email` from everything kept that copied it, putting `label` in its place.
async fn erase_address(tx: &mut PgConnection, email: &str, label: &str) -> Result<()> {
    for sql in [
        "UPDATE audit_log SET actor = replace(actor, $1, $2), subject = replace(subject, $1, $2),
                old_value = replace(old_value, $1, $2), new_value = replace(new_value, $1, $2)
         WHERE strpos(actor, $1) > 0 OR strpos(subject, $1) > 0 OR strpos(old_value, $1) > 0
            OR strpos(new_value, $1) > 0",
        "UPDATE ledger SET actor = replace(actor, $1, $2), note = replace(note, $1, $2)
         WHERE strpos(actor, $1) > 0 OR strpos(note, $1) > 0",
        "UPDATE alert_firings SET detail = replace(detail, $1, $2) WHERE strpos(detail, $1) > 0",
        "UPDATE reconciliation_reports SET checks = replace(checks::text, $1, $2)::jsonb,
                discrepancies = replace(discrepancies::text, $1, $2)::jsonb
         WHERE strpos(checks::text, $1) > 0 OR strpos(discrepancies::text, $1) > 0",
        "UPDATE webhook_deliveries SET body = replace(body::text, $1, $2)::jsonb WHERE strpos(body::text, $1) > 0",
    ] {
        sqlx::query(sql).bind(email).bind(label).execute(&mut *tx).await?;
    }
    let account = crate::accounts::login::account_key(email);
    sqlx::query("DELETE FROM throttle_events WHERE strpos(key, $1) > 0 OR strpos(key, $2) > 0")
        .bind(email)
        .bind(&account)
        .execute(&mut *tx)
        .await?;
    Ok(())
}
