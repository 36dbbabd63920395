//! The durable job queue: a job row is also the outbox (admission inserts it in the same
//! transaction as the debit), every transition is one transaction, results and failures are
//! fenced by the attempt's lease token.

pub mod bulk;
pub mod cancel;
pub mod capacity;
mod claim;
pub mod dlq;
mod enqueue;
pub mod hooks;
pub mod lanes;
pub mod outcomes;
pub mod parts;
pub mod policy;
pub mod processes;
pub mod rescue;
pub mod retention;
pub mod retry_now;
pub mod reviews;
pub mod run_next;
pub mod stages;
pub mod switches;
mod transitions;
mod views;
pub mod vitals;
mod waiting_line;
pub mod worker;

pub use cancel::{cancel, Canceled};
pub use claim::{claim, claim_batch, heartbeat, mark_started, next_due, Batch, ClaimedJob};
pub use enqueue::{enqueue, lock_line, LaneRequest, NewJob};
pub use retry_now::{retry_now, RetriedNow};
pub use sluice_types::{FailureKind, JobStage, JobState};
pub use transitions::{complete, complete_many, fail, hand_back, unclaim, JobError, JobOutput, Recorded};
pub use views::{
    attempts, count_matching, get, matching_ids, page_for_owner, search, search_terms, AttemptView, FoundJob,
    JobFilter, JobSearch, JobView,
};
pub use waiting_line::{place_for_new_job, waiting_line, LineSnapshot, NewJobPlace, SharedLine, WaitingLine};

/// The NOTIFY channel workers listen on.
pub const JOBS_CHANNEL: &str = "sluice_jobs";

/// The notice on [`JOBS_CHANNEL`] that processing was paused: workers hand back the jobs they
/// fetched ahead and have not started.
pub const PAUSE_NOTICE: &str = "pause";

/// Tell every process, when the caller's transaction commits, that processing was paused.
pub(crate) async fn notify_pause(conn: &mut sqlx::PgConnection) -> crate::error::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(JOBS_CHANNEL).bind(PAUSE_NOTICE).execute(conn).await?;
    Ok(())
}

/// Make waiting `jobs` due at once (an answer they waited for came: their provider's batch
/// ended), and wake the workers when the caller's transaction commits. Returns how many.
pub async fn due_now(conn: &mut sqlx::PgConnection, jobs: &[uuid::Uuid]) -> crate::error::Result<u64> {
    let moved =
        sqlx::query("UPDATE jobs SET run_at = now() WHERE id = ANY($1) AND state = 'queued' AND run_at > now()")
            .bind(jobs)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    if moved > 0 {
        notify_workers(conn).await?;
    }
    Ok(moved)
}

/// Wake idle workers in every process when the caller's transaction commits.
pub(crate) async fn notify_workers(conn: &mut sqlx::PgConnection) -> crate::error::Result<()> {
    sqlx::query("SELECT pg_notify($1, 'work')").bind(JOBS_CHANNEL).execute(conn).await?;
    Ok(())
}
