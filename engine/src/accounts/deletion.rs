//! Users delete what they sent: one ended job's document and result, or their whole account.
//! Jobs stay as lines of the credit history (their cost, refunds and times) with every field
//! that holds what the user sent or got erased; the stored documents go at once. A deleted
//! account keeps its row and ledger for the books, without its e-mail address, password,
//! tokens, sessions or notices, and its address is erased wherever it was copied (audit log,
//! ledger notes, throttle rows, reports, alerts and their acknowledgements and webhooks,
//! reviews), each looked up by an index.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::documents::custody::{forget_deleted_jobs_documents, Blobs};
use crate::error::{EngineError, Result};
use crate::hooks::SluiceHooks;
use crate::JobState;

/// Erase what the user sent and got from these jobs, where they have ended and are marked
/// deleted: the result, the file name and hash, the callback, the keys, the provider's words,
/// the parts' texts, the notices about them and the file name in their webhook deliveries.
/// Returns the ids erased. Runs in the caller's transaction. (A job still running when its
/// account was deleted is erased by [`finish_deletions`] once it has ended: nothing is added to
/// every job's ending for this rare case.)
pub async fn erase_deleted_jobs(conn: &mut PgConnection, job_ids: &[Uuid]) -> sqlx::Result<Vec<Uuid>> {
    let erased: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE jobs SET result = NULL, last_error = NULL, client_key = NULL, idempotency_key = NULL,
                request_fingerprint = NULL, erased_at = now(),
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
    crate::documents::custody::forget_answers(conn, &erased).await?;
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

/// What deleting a job came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobDeletion {
    Deleted,
    /// It has not ended: cancel it first.
    NotEnded(JobState),
}

/// Delete `owner_id`'s ended job `job_id`: its document, result and file name go; the job
/// stays as a line "deleted by you". Deleting it again changes nothing. The erasure commits
/// with the deletion; the stored document goes right after (or, if that is cut short, with
/// the upkeep's [`finish_deletions`]).
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
    // The deletion stands; a document that cannot go right now (a backup listing its own)
    // goes with the upkeep's next turn.
    if let Err(e) = forget_deleted_jobs_documents(pool, blobs, Some(job_id)).await {
        tracing::warn!(error = %e, %job_id, "deleting a deleted job's document failed; the upkeep retries");
    }
    Ok(JobDeletion::Deleted)
}

/// The name a deleted account goes by in what is kept (audit log, ledger, its users row).
pub fn deleted_label(user_id: i64) -> String {
    format!("deleted user {user_id}")
}

/// Delete `user_id`'s account. In one transaction, at once on every process: its sessions
/// stop working (the user no longer exists for them), its tokens and device tokens are
/// deleted, its address is freed and erased from what is kept, and all its jobs are marked
/// deleted. Then ([`finish_deletions`], also run by the upkeep every half minute, so nothing
/// is left if this is cut short) waiting jobs are canceled by the cancel rules, running ones
/// asked to stop (erased once they have ended), and ended ones erased with their documents.
/// The ledger stays, for the books.
pub async fn delete_account(pool: &PgPool, blobs: &Blobs, user_id: i64) -> Result<()> {
    delete_account_where(pool, blobs, user_id, false).await
}

/// [`delete_account`], only while the account's address is unverified (checked under its
/// lock); `NotFound` otherwise. An unverified account's expiry.
pub async fn delete_unverified_account(pool: &PgPool, blobs: &Blobs, user_id: i64) -> Result<()> {
    delete_account_where(pool, blobs, user_id, true).await
}

async fn delete_account_where(pool: &PgPool, blobs: &Blobs, user_id: i64, only_unverified: bool) -> Result<()> {
    let label = deleted_label(user_id);
    let mut tx = pool.begin().await?;
    // The jobs before the user row: the order a job's ending takes them (job, then owner).
    sqlx::query(
        "UPDATE jobs SET deleted_at = coalesce(deleted_at, now()), payload = payload - 'callback'
         WHERE id IN (SELECT job_id FROM job_listing WHERE owner_id = $1)",
    )
    .bind(user_id)
    .execute(&mut *tx)
    .await?;
    let email: Option<String> = sqlx::query_scalar(
        "SELECT email FROM users WHERE id = $1 AND deleted_at IS NULL
               AND NOT ($2 AND email_verified_at IS NOT NULL) FOR UPDATE",
    )
    .bind(user_id)
    .bind(only_unverified)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(email) = email else { return Err(EngineError::NotFound) };
    // No '@': nobody can sign up as it (to block the deletion), nobody can log in as it.
    sqlx::query("UPDATE users SET deleted_at = now(), email = $2, password_hash = '!deleted' WHERE id = $1")
        .bind(user_id)
        .bind(format!("deleted-user-{user_id}"))
        .execute(&mut *tx)
        .await?;
    // Its webhook deliveries go with its tokens (cascade); its jobs call back no more.
    sqlx::query("DELETE FROM api_tokens WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    // Every process forgets its tokens and sessions when this commits.
    super::auth_cache::announce(&mut tx, &super::auth_cache::Revoked::User(user_id)).await?;
    sqlx::query("DELETE FROM device_tokens WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM notices WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    // Its mailed links stop working and its unsent mail is not sent.
    sqlx::query("DELETE FROM account_links WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM mail_outbox WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
    // Its mail kept in a folder (live links among it) goes at once, on every process.
    crate::mail::outbox::forget_account(&mut tx).await?;
    erase_address(&mut tx, &email, &label).await?;
    crate::audit::audit(&mut tx, &label, "delete_account", Some(&format!("user {user_id}")), "", "deleted").await?;
    tx.commit().await?;
    if let Err(e) = finish_deletions(pool, blobs).await {
        tracing::warn!(error = %e, user_id, "finishing an account deletion failed; the upkeep retries");
    }
    Ok(())
}

/// Carry deletions through (idempotent; the upkeep runs it every half minute): cancel the
/// waiting and running jobs of deleted accounts, erase deleted jobs that have ended, and
/// delete their stored documents. Returns how many jobs it moved on.
pub async fn finish_deletions(pool: &PgPool, blobs: &Blobs) -> Result<usize> {
    let live: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, owner_id FROM jobs
         WHERE deleted_at IS NOT NULL AND erased_at IS NULL -- implied (a live job is never erased); it lets
               -- the partial index jobs_deletions_pending answer instead of a scan of every job
           AND cancel_requested_at IS NULL AND state NOT IN ('done', 'failed', 'canceled')
         LIMIT 500",
    )
    .fetch_all(pool)
    .await?;
    for (id, owner) in &live {
        crate::queue::cancel(pool, &SluiceHooks, *id, &deleted_label(*owner), false).await?;
    }
    let unerased: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE deleted_at IS NOT NULL AND erased_at IS NULL AND state IN ('done', 'failed', 'canceled')
         LIMIT 500",
    )
    .fetch_all(pool)
    .await?;
    let mut tx = pool.begin().await?;
    erase_deleted_jobs(&mut tx, &unerased).await?;
    tx.commit().await?;
    let documents = forget_deleted_jobs_documents(pool, blobs, None).await?;
    Ok(live.len() + unerased.len() + documents)
}

/// Columns that hold an actor's address whole: `$1` the address, `$2` its label. Each is
/// indexed (`20261207000001_abuse_round_two.sql`), so a deletion touches only its rows.
pub const ADDRESS_COLUMNS: &[&str] = &[
    "UPDATE audit_log SET actor = $2 WHERE actor = $1",
    "UPDATE ledger SET actor = $2 WHERE actor = $1",
    "UPDATE jobs SET canceled_by = $2 WHERE canceled_by = $1",
    "UPDATE reconciliation_reports SET actor = $2 WHERE actor = $1",
    "UPDATE reconciliation_reports SET acked_by = $2 WHERE acked_by = $1",
    "UPDATE queue_settings SET processing_changed_by = $2 WHERE processing_changed_by = $1",
    "UPDATE reviews SET marked_by = $2 WHERE marked_by = $1",
    "UPDATE reviews SET resolved_by = $2 WHERE resolved_by = $1",
    "UPDATE alert_firings SET acked_by = $2 WHERE acked_by = $1",
    // An alert's webhook carries who acknowledged it.
    "UPDATE webhook_deliveries SET body = jsonb_set(body, '{alert,acked_by}', to_jsonb($2::text))
     WHERE token_id IS NULL AND body #>> '{alert,acked_by}' = $1",
];

/// Free text that may name an address: `$1` the whole-address pattern, `$2` the label, `$3`
/// a `LIKE` pattern holding the address, which the trigram indexes answer (only rows with an
/// `@` are indexed) before the exact pattern is tried on the few rows found.
pub const ADDRESS_TEXTS: &[&str] = &[
    "UPDATE audit_log SET subject = regexp_replace(subject, $1, $2, 'g'),
            old_value = regexp_replace(old_value, $1, $2, 'g'), new_value = regexp_replace(new_value, $1, $2, 'g')
     WHERE ((subject LIKE '%@%' AND subject LIKE $3) OR (old_value LIKE '%@%' AND old_value LIKE $3)
            OR (new_value LIKE '%@%' AND new_value LIKE $3))
       AND (subject ~ $1 OR old_value ~ $1 OR new_value ~ $1)",
    "UPDATE ledger SET note = regexp_replace(note, $1, $2, 'g') WHERE note LIKE '%@%' AND note LIKE $3 AND note ~ $1",
    "UPDATE alert_firings SET detail = regexp_replace(detail, $1, $2, 'g'), ack_note = regexp_replace(ack_note, $1, $2, 'g')
     WHERE ((detail LIKE '%@%' AND detail LIKE $3) OR (ack_note LIKE '%@%' AND ack_note LIKE $3))
       AND (detail ~ $1 OR ack_note ~ $1)",
    "UPDATE reviews SET note = regexp_replace(note, $1, $2, 'g'),
            resolution_note = regexp_replace(resolution_note, $1, $2, 'g')
     WHERE ((note LIKE '%@%' AND note LIKE $3) OR (resolution_note LIKE '%@%' AND resolution_note LIKE $3))
       AND (note ~ $1 OR resolution_note ~ $1)",
    "UPDATE reconciliation_reports SET ack_note = regexp_replace(ack_note, $1, $2, 'g')
     WHERE ack_note LIKE '%@%' AND ack_note LIKE $3 AND ack_note ~ $1",
    // An alert's webhook carries its detail and its acknowledgement's note (jsonb_set with a
    // null would null the whole body: a missing field stays JSON null).
    "UPDATE webhook_deliveries SET body = jsonb_set(jsonb_set(body,
            '{alert,detail}', coalesce(to_jsonb(regexp_replace(body #>> '{alert,detail}', $1, $2, 'g')), 'null')),
            '{alert,ack_note}', coalesce(to_jsonb(regexp_replace(body #>> '{alert,ack_note}', $1, $2, 'g')), 'null'))
     WHERE token_id IS NULL AND body::text LIKE $3
       AND (body #>> '{alert,detail}' ~ $1 OR body #>> '{alert,ack_note}' ~ $1)",
];

/// The login throttle's rows about an account (`$1` its key), by the index on that key.
pub const ACCOUNT_THROTTLE_ROWS: &str =
    "DELETE FROM throttle_events WHERE key LIKE 'login:account:%' AND split_part(key, ':', 3) = $1";

/// Erase `email` from everything kept that copied it, putting `label` in its place: whole
/// values where a column holds an address, whole-address matches inside free text (so
/// `e@corp.com` never touches `alice@corp.com`).
async fn erase_address(tx: &mut PgConnection, email: &str, label: &str) -> Result<()> {
    for sql in ADDRESS_COLUMNS {
        sqlx::query(sql).bind(email).bind(label).execute(&mut *tx).await?;
    }
    let (pattern, containing) = (whole_address_pattern(email), containing(email));
    for sql in ADDRESS_TEXTS {
        sqlx::query(sql).bind(&pattern).bind(label).bind(&containing).execute(&mut *tx).await?;
    }
    let account = crate::accounts::login::account_key(email);
    sqlx::query(ACCOUNT_THROTTLE_ROWS).bind(&account).execute(&mut *tx).await?;
    Ok(())
}

/// Pure: a `LIKE` pattern matching any text that holds `text` (its `%`, `_` and `\` literal).
pub fn containing(text: &str) -> String {
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '%' | '_' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    format!("%{escaped}%")
}

/// Pure: a Postgres regular expression matching `email` as a whole address: every character
/// taken literally, and no address character on either side.
pub fn whole_address_pattern(email: &str) -> String {
    let literal: String =
        email.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\{c}") }).collect();
    format!("(?<![[:alnum:]._%+-]){literal}(?![[:alnum:]_%+-]|\\.[[:alnum:]])")
}

#[cfg(test)]
mod tests {
    use super::{containing, whole_address_pattern};

    #[test]
    fn like_patterns_take_wildcards_literally() {
        assert_eq!(containing("a_b%c@x.io"), r"%a\_b\%c@x.io%");
        assert_eq!(containing(r"a\b@x.io"), r"%a\\b@x.io%");
    }

    #[test]
    fn address_patterns_take_every_character_literally() {
        assert_eq!(
            whole_address_pattern("e@corp.com"),
            r"(?<![[:alnum:]._%+-])e\@corp\.com(?![[:alnum:]_%+-]|\.[[:alnum:]])"
        );
        assert!(whole_address_pattern("a\"b\\c@x.io").contains(r#"a\"b\\c\@x\.io"#));
    }
}
