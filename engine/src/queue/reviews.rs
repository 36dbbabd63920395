//! "Needs review": an admin puts a failed job or a dead-letter group in someone's hands (an
//! admin account) with a note. It stays open, shown beside the job or group with who and since
//! when, until it is resolved: by replaying or discarding what it names (recorded in the same
//! transaction), or as "resolved, no action" with a reason. Each step is audited.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::audit::audit;
use crate::error::{EngineError, Result};
use crate::FailureKind;

/// The longest note (a review's or a resolution's), in characters.
pub const NOTE_MAX: usize = 2000;

/// What a review is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Job(Uuid),
    Group { kind: FailureKind, reason: String },
}

impl Subject {
    fn describe(&self) -> String {
        match self {
            Subject::Job(id) => format!("job {id}"),
            Subject::Group { kind, reason } => format!("group {}: {reason}", kind.as_str()),
        }
    }
}

/// How a review ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolution {
    Replayed,
    Discarded,
    NoAction,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Replayed => "replayed",
            Resolution::Discarded => "discarded",
            Resolution::NoAction => "no_action",
        }
    }
}

/// A review as the console shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Review {
    pub id: i64,
    pub job_id: Option<Uuid>,
    pub failure_kind: Option<FailureKind>,
    pub failure_reason: Option<String>,
    pub note: String,
    pub assignee: Option<String>,
    pub marked_by: String,
    pub marked_at: DateTime<Utc>,
    pub resolved_by: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolution: Option<String>,
    pub resolution_note: Option<String>,
}

const SELECT_REVIEWS: &str = "SELECT r.id, r.job_id, r.failure_kind, r.failure_reason, r.note, u.email AS assignee,
        r.marked_by, r.marked_at, r.resolved_by, r.resolved_at, r.resolution, r.resolution_note
    FROM reviews r LEFT JOIN users u ON u.id = r.assignee_id";

/// Pure: a note as stored: trimmed, at most [`NOTE_MAX`] characters, not empty.
pub fn clean_note(note: &str) -> Result<String> {
    let note = note.trim();
    if note.is_empty() {
        return Err(EngineError::Invalid("write a note: what should the reviewer look at?".into()));
    }
    if note.chars().count() > NOTE_MAX {
        return Err(EngineError::Invalid(format!("a note is at most {NOTE_MAX} characters")));
    }
    Ok(note.to_string())
}

/// Mark `subject` as needing review by the admin `assignee_id` (the caller finds who that is:
/// [`crate::accounts::users::admin_id`]). Marking it again while open hands it over: the note,
/// the assignee and the time are replaced.
pub async fn mark(pool: &PgPool, subject: &Subject, note: &str, assignee_id: i64, actor: &str) -> Result<Review> {
    let note = clean_note(note)?;
    let mut tx = pool.begin().await?;
    let (job, kind, reason) = match subject {
        Subject::Job(id) => (Some(*id), None, None),
        Subject::Group { kind, reason } => (None, Some(*kind), Some(reason.as_str())),
    };
    // Only what is in the dead-letter queue (failed, not discarded) can need review. One of its
    // rows is held until this commits, so a replay or discard of it waits, then resolves this.
    let present: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'failed' AND discarded_at IS NULL
           AND (($1::uuid IS NOT NULL AND id = $1)
                OR ($1::uuid IS NULL AND failure_kind = $2 AND coalesce(failure_reason, '') = $3))
         LIMIT 1 FOR SHARE",
    )
    .bind(job)
    .bind(kind)
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?;
    if present.is_none() {
        return Err(EngineError::NotFound);
    }
    // One open review per job or group; marking again hands it over (two admins at once: the
    // later one's stands).
    let on_conflict = if job.is_some() {
        "(job_id) WHERE resolved_at IS NULL AND job_id IS NOT NULL"
    } else {
        "(failure_kind, failure_reason) WHERE resolved_at IS NULL AND job_id IS NULL"
    };
    // The assignee's address only as the audit line shows it, as the reviews' listing does.
    let assignee: Option<String> = sqlx::query_scalar(&format!(
        "INSERT INTO reviews (job_id, failure_kind, failure_reason, note, assignee_id, marked_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT {on_conflict} DO UPDATE
             SET note = EXCLUDED.note, assignee_id = EXCLUDED.assignee_id, marked_by = EXCLUDED.marked_by, marked_at = now()
         RETURNING (SELECT email FROM users WHERE id = assignee_id)"
    ))
    .bind(job)
    .bind(kind)
    .bind(reason)
    .bind(&note)
    .bind(assignee_id)
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    let assignee = assignee.unwrap_or_else(|| format!("user {assignee_id}"));
    audit(&mut tx, actor, "review", Some(&subject.describe()), "", &format!("{assignee}: {note}")).await?;
    tx.commit().await?;
    open_for(pool, subject).await?.ok_or(EngineError::NotFound)
}

/// The open review of `subject`, if any.
pub async fn open_for(pool: &PgPool, subject: &Subject) -> Result<Option<Review>> {
    let (job, kind, reason) = match subject {
        Subject::Job(id) => (Some(*id), None, None),
        Subject::Group { kind, reason } => (None, Some(*kind), Some(reason.as_str())),
    };
    Ok(sqlx::query_as(&format!(
        "{SELECT_REVIEWS} WHERE r.resolved_at IS NULL
           AND (($1::uuid IS NOT NULL AND r.job_id = $1)
                OR ($1::uuid IS NULL AND r.job_id IS NULL AND r.failure_kind = $2 AND r.failure_reason = $3))"
    ))
    .bind(job)
    .bind(kind)
    .bind(reason)
    .fetch_optional(pool)
    .await?)
}

/// The open reviews of these jobs (a page of search results).
pub async fn open_for_jobs(pool: &PgPool, jobs: &[Uuid]) -> Result<Vec<Review>> {
    Ok(sqlx::query_as(&format!("{SELECT_REVIEWS} WHERE r.resolved_at IS NULL AND r.job_id = ANY($1)"))
        .bind(jobs)
        .fetch_all(pool)
        .await?)
}

/// Which of `jobs` an operator is looking into: failed, still in the dead-letter queue, and
/// under an open review of their own or of their group (what their owners are told).
pub async fn under_review(pool: &PgPool, jobs: &[Uuid]) -> Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT j.id FROM jobs j
         WHERE j.id = ANY($1) AND j.state = 'failed' AND j.discarded_at IS NULL
           AND EXISTS (SELECT 1 FROM reviews r
                       WHERE r.resolved_at IS NULL
                         AND (r.job_id = j.id
                              OR (r.job_id IS NULL AND r.failure_kind = j.failure_kind
                                  AND r.failure_reason = coalesce(j.failure_reason, ''))))",
    )
    .bind(jobs)
    .fetch_all(pool)
    .await?)
}

/// The open reviews of dead-letter groups.
pub async fn open_for_groups(pool: &PgPool) -> Result<Vec<Review>> {
    Ok(sqlx::query_as(&format!("{SELECT_REVIEWS} WHERE r.resolved_at IS NULL AND r.job_id IS NULL"))
        .fetch_all(pool)
        .await?)
}

/// The newest `limit` reviews, open ones first.
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<Review>> {
    Ok(sqlx::query_as(&format!(
        "{SELECT_REVIEWS} ORDER BY r.resolved_at IS NULL DESC, r.marked_at DESC, r.id DESC LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// "Resolved, no action": close review `id` with the reason. Audited. Not found if it is not
/// open (already resolved, or none).
pub async fn resolve_without_action(pool: &PgPool, id: i64, note: &str, actor: &str) -> Result<Review> {
    let note = clean_note(note)?;
    let mut tx = pool.begin().await?;
    let closed: Option<(Option<Uuid>, Option<FailureKind>, Option<String>)> = sqlx::query_as(
        "UPDATE reviews SET resolved_at = now(), resolved_by = $2, resolution = 'no_action', resolution_note = $3
         WHERE id = $1 AND resolved_at IS NULL RETURNING job_id, failure_kind, failure_reason",
    )
    .bind(id)
    .bind(actor)
    .bind(&note)
    .fetch_optional(&mut *tx)
    .await?;
    let (job, kind, reason) = closed.ok_or(EngineError::NotFound)?;
    let subject = match (job, kind) {
        (Some(job), _) => Subject::Job(job),
        (None, Some(kind)) => Subject::Group { kind, reason: reason.unwrap_or_default() },
        (None, None) => unreachable!("a review names a job or a group (a CHECK)"),
    };
    audit(&mut tx, actor, "review_resolved", Some(&subject.describe()), "needs review", &format!("no action: {note}"))
        .await?;
    tx.commit().await?;
    Ok(sqlx::query_as(&format!("{SELECT_REVIEWS} WHERE r.id = $1")).bind(id).fetch_one(pool).await?)
}

/// After a replay or a discard changed `jobs` (in the caller's transaction): close their
/// open reviews, and those of groups that no longer have a job in the dead-letter queue, as
/// `resolution` by `actor`. Nothing changed: nothing is closed.
pub(crate) async fn close_for(
    tx: &mut PgConnection,
    jobs: &[Uuid],
    resolution: Resolution,
    actor: &str,
) -> Result<u64> {
    if jobs.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(
        "UPDATE reviews r SET resolved_at = now(), resolved_by = $2, resolution = $3
         WHERE r.resolved_at IS NULL
           AND (r.job_id = ANY($1)
                OR (r.job_id IS NULL AND NOT EXISTS (
                        SELECT 1 FROM dead_letters d
                        WHERE d.failure_kind = r.failure_kind AND coalesce(d.failure_reason, '') = r.failure_reason)))",
    )
    .bind(jobs)
    .bind(actor)
    .bind(resolution.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_trimmed_and_bounded() {
        assert_eq!(clean_note("  look at the PDF  ").unwrap(), "look at the PDF");
        assert!(clean_note("   ").is_err());
        assert!(clean_note(&"é".repeat(NOTE_MAX)).is_ok());
        assert!(clean_note(&"é".repeat(NOTE_MAX + 1)).is_err());
    }
}
