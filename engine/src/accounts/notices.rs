//! Notices for users (refunds after failures, ...): written and read here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::error::Result;
use crate::mail::compose::{Detail, MailKind};
use crate::queue::hooks::TerminalJob;

/// One notice as its user reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Notice {
    pub id: i64,
    pub job_id: Option<Uuid>,
    /// `refund` for now.
    pub kind: String,
    pub message: String,
    pub created_at: DateTime<Utc>,
    pub read: bool,
}

/// Pure: what a user is told when a job failed, what was refunded of what it cost, and why
/// the rest was charged (`charged_because`, when any was).
pub fn refund_message(reason: Option<&str>, cost: i32, refunded: i64, charged_because: Option<&str>) -> String {
    let reason = reason.unwrap_or("it failed");
    let credits = |n: i64| if n == 1 { "1 credit".to_string() } else { format!("{n} credits") };
    let charged = i64::from(cost) - refunded.clamp(0, i64::from(cost.max(0)));
    let why = charged_because.unwrap_or("");
    match (cost, refunded) {
        (0, _) => format!("Your document could not be processed ({reason})."),
        _ if charged <= 0 => {
            format!("Your document could not be processed ({reason}). {} refunded.", credits(refunded))
        }
        (_, 0) => format!("Your document could not be processed ({reason}). Charged {}: {why}.", credits(charged)),
        (_, n) => format!(
            "Your document could not be processed ({reason}). {} refunded; charged {}: {why}.",
            credits(n),
            credits(charged)
        ),
    }
}

/// Pure: what a failed document done in parts keeps for its owner: the parts answered, and
/// the first part that was not (none when nothing was answered).
pub fn parts_kept_message(answered: i64, total: i64, first_missing: Option<i32>) -> Option<String> {
    let which = match (first_missing, total - answered) {
        (Some(idx), 1) => format!("Part {} of {total} was not done; ", idx + 1),
        (Some(idx), more) if more > 1 => format!("Part {} of {total} and {} more were not done; ", idx + 1, more - 1),
        _ => String::new(),
    };
    match answered {
        n if n <= 0 || total <= 0 => None,
        1 => Some(format!("{which}the 1 part done can be downloaded from its page while its document is kept.")),
        n => Some(format!("{which}the {n} parts done can be downloaded from its page while its document is kept.")),
    }
}

/// Tell the owner a job failed (and what was refunded), once per job whatever races.
pub async fn add_refund_notice(
    conn: &mut PgConnection,
    job: &TerminalJob,
    refunded: i64,
    charged_because: Option<String>,
) -> Result<(), sqlx::Error> {
    let reason = job.failure.as_ref().map(|(_, reason)| reason.as_str());
    let mut message = refund_message(reason, job.cost, refunded, charged_because.as_deref());
    let (answered, total, first_missing): (i64, i64, Option<i32>) = sqlx::query_as(
        "SELECT count(output), count(*), min(idx) FILTER (WHERE output IS NULL) FROM job_parts
         WHERE job_id = $1 AND level = 0",
    )
    .bind(job.id)
    .fetch_one(&mut *conn)
    .await?;
    // Parts are served only while the document paid for some of them.
    let served = sluice_types::settlement::answered_parts_served(i64::from(job.cost), refunded);
    if let Some(kept) = parts_kept_message(answered, total, first_missing).filter(|_| served) {
        message = format!("{message} {kept}");
    }
    sqlx::query(
        "INSERT INTO notices (user_id, job_id, kind, message) VALUES ($1, $2, 'refund', $3)
         ON CONFLICT (job_id) WHERE kind = 'refund' DO NOTHING",
    )
    .bind(job.owner_id)
    .bind(job.id)
    .bind(message)
    .execute(conn)
    .await?;
    Ok(())
}

/// What an operator did with a failed job from the dead-letter queue, as its owner is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorAction {
    /// Run again, at no cost to the owner (the failure was refunded as its notice said).
    Replayed,
    /// Closed: it stays failed and is not run again.
    Discarded,
}

impl OperatorAction {
    /// The notice's kind.
    pub fn kind(self) -> &'static str {
        match self {
            OperatorAction::Replayed => "replayed",
            OperatorAction::Discarded => "discarded",
        }
    }

    /// Pure: what the owner reads (nothing of the document itself; the notice links the job).
    pub fn message(self) -> &'static str {
        match self {
            OperatorAction::Replayed => {
                "An operator looked into your failed document and is running it again, at no cost to you."
            }
            OperatorAction::Discarded => {
                "An operator looked into your failed document and closed it: it will not be run again. \
                 What it cost was settled when it failed."
            }
        }
    }
}

/// Tell the owner what an operator did with their failed job (not if they deleted it since).
pub async fn add_operator_notice(
    conn: &mut PgConnection,
    job: &TerminalJob,
    action: OperatorAction,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO notices (user_id, job_id, kind, message)
         SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = $2 AND deleted_at IS NOT NULL)",
    )
    .bind(job.owner_id)
    .bind(job.id)
    .bind(action.kind())
    .bind(action.message())
    .execute(conn)
    .await?;
    Ok(())
}

/// Queue a notice mail for `user_id` in the caller's transaction, if they chose that notice
/// and their address is verified (both are checked again when it is sent).
pub async fn mail_if_chosen(
    conn: &mut PgConnection,
    user_id: i64,
    kind: MailKind,
    event_key: &str,
    detail: &Detail,
) -> Result<(), sqlx::Error> {
    let chosen: bool = sqlx::query_scalar(
        "SELECT coalesce((SELECT email_verified_at IS NOT NULL AND deleted_at IS NULL
                                 AND CASE $2 WHEN 'done' THEN mail_done WHEN 'failed' THEN mail_failed
                                             WHEN 'credits_low' THEN mail_credits_low ELSE false END
                          FROM users WHERE id = $1), false)",
    )
    .bind(user_id)
    .bind(kind.as_str())
    .fetch_one(&mut *conn)
    .await?;
    if chosen {
        crate::mail::outbox::enqueue(conn, user_id, kind, event_key, detail).await?;
    }
    Ok(())
}

/// A document that took longer than this from upload to done is worth a mail.
pub const DONE_MAIL_AFTER_SECS: i64 = 60;

/// Mail the owner that a job is done, if it took longer than [`DONE_MAIL_AFTER_SECS`] and they
/// chose that notice.
pub async fn mail_done(conn: &mut PgConnection, job: &TerminalJob) -> Result<(), sqlx::Error> {
    let took: i64 = sqlx::query_scalar("SELECT extract(epoch FROM now() - accepted_at)::int8 FROM jobs WHERE id = $1")
        .bind(job.id)
        .fetch_one(&mut *conn)
        .await?;
    if took <= DONE_MAIL_AFTER_SECS {
        return Ok(());
    }
    let detail = Detail { job_id: Some(job.id.to_string()), took_secs: Some(took), ..Detail::default() };
    mail_if_chosen(conn, job.owner_id, MailKind::Done, &format!("done:{}", job.id), &detail).await
}

/// Mail the owner that a job failed and what was refunded, if they chose that notice.
pub async fn mail_failed(conn: &mut PgConnection, job: &TerminalJob, refunded: i64) -> Result<(), sqlx::Error> {
    let detail = Detail { job_id: Some(job.id.to_string()), refunded: Some(refunded), ..Detail::default() };
    mail_if_chosen(conn, job.owner_id, MailKind::Failed, &format!("failed:{}", job.id), &detail).await
}

/// A user's newest `limit` notices, newest first.
pub async fn list(pool: &PgPool, user_id: i64, limit: i64) -> Result<Vec<Notice>> {
    Ok(sqlx::query_as(
        "SELECT id, job_id, kind, message, created_at, read_at IS NOT NULL AS read FROM notices
         WHERE user_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(user_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// How many of a user's notices are unread (the header's count).
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

#[cfg(test)]
mod tests {
    use super::{parts_kept_message, refund_message};

    #[test]
    fn a_failed_document_in_parts_says_where_it_stopped_and_what_can_be_downloaded() {
        assert_eq!(
            parts_kept_message(6, 12, Some(6)).as_deref(),
            Some("Part 7 of 12 and 5 more were not done; the 6 parts done can be downloaded from its page while its document is kept.")
        );
        assert!(parts_kept_message(1, 2, Some(1)).unwrap().starts_with("Part 2 of 2 was not done; the 1 part done"));
        assert_eq!(parts_kept_message(0, 12, Some(0)), None, "nothing answered, nothing to say");
        assert_eq!(parts_kept_message(0, 0, None), None, "not done in parts");
    }

    #[test]
    fn refund_messages_count_credits_in_words() {
        let allowance = Some("only 3 unreadable documents a day are refunded");
        assert_eq!(refund_message(Some("timeout"), 0, 0, None), "Your document could not be processed (timeout).");
        assert!(refund_message(None, 1, 1, None).ends_with("(it failed). 1 credit refunded."));
        assert!(refund_message(Some("x"), 3, 3, None).ends_with("3 credits refunded."));
        assert!(
            refund_message(Some("x"), 3, 0, allowance).contains("Charged 3 credits: only 3 unreadable documents a day")
        );
        assert!(refund_message(Some("cut"), 12, 1, Some("the provider had answered 11 of its 12 parts"))
            .ends_with("1 credit refunded; charged 11 credits: the provider had answered 11 of its 12 parts."));
    }
}
