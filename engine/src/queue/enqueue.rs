//! Putting a job in the queue, inside the caller's transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::error::Result;

/// A job to enqueue.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub owner_id: i64,
    pub kind: String,
    pub payload: Value,
    /// Same owner + same key = the same job while that job is not failed.
    pub idempotency_key: Option<String>,
    /// Credits charged for it (refunded if it fails).
    pub cost: i32,
    /// Input tokens its provider request is estimated at (reserved from the budget at claim).
    pub est_input_tokens: i64,
    pub max_attempts: i32,
    /// A REST client's `Idempotency-Key`, and the fingerprint of the request it came with.
    pub client_key: Option<String>,
    pub request_fingerprint: Option<String>,
    pub lane: LaneRequest,
}

/// An upload's `urgent` flag moves a document into the urgent lane only up to this many times
/// the operator's `urgent_max_tokens` (64K tokens by default): anyone may set the flag, and a
/// large document flagged urgent would take the reserve kept for small ones.
pub const URGENT_FLAG_REACH: i64 = 4;

/// What decides a job's lane, and its deadline (DESIGN: deadlines and lanes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaneRequest {
    /// The upload asked for the urgent lane.
    pub urgent: bool,
    /// The whole document's tokens: at most the operator's `urgent_max_tokens` is urgent work
    /// (0: unknown, small).
    pub document_tokens: i64,
    /// When the user needs it done.
    pub due_by: Option<DateTime<Utc>>,
    /// How long it should run once started: it must start this long before `due_by`.
    pub expected_run: Duration,
}

impl NewJob {
    /// A free document job with the default three attempts.
    pub fn new(owner_id: i64, payload: Value) -> NewJob {
        NewJob {
            owner_id,
            kind: "document".into(),
            payload,
            idempotency_key: None,
            cost: 0,
            est_input_tokens: 0,
            max_attempts: 3,
            client_key: None,
            request_fingerprint: None,
            lane: LaneRequest::default(),
        }
    }
}

/// Insert a job inside the caller's transaction (admission debits credits in the same one).
/// Workers are woken by a trigger when the transaction commits. Its lane is decided here, by
/// the operator's settings at admission: small enough (or, asked for, [`URGENT_FLAG_REACH`]
/// times that), or its owner's account.
pub async fn enqueue(conn: &mut PgConnection, job: &NewJob) -> Result<Uuid> {
    let lane = &job.lane;
    Ok(sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, kind, payload, idempotency_key, cost, max_attempts, client_key, request_fingerprint,
                           est_input_tokens, trace_parent, urgent, due_by, latest_start)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                 $12 <= (SELECT CASE WHEN $11 THEN $15 ELSE 1 END * q.urgent_max_tokens
                         FROM queue_settings q WHERE q.id = 1)
                     OR coalesce((SELECT u.urgent_lane FROM users u WHERE u.id = $1), false),
                 $13, $13 - make_interval(secs => $14))
         RETURNING id",
    )
    .bind(job.owner_id)
    .bind(&job.kind)
    .bind(&job.payload)
    .bind(&job.idempotency_key)
    .bind(job.cost)
    .bind(job.max_attempts)
    .bind(&job.client_key)
    .bind(&job.request_fingerprint)
    .bind(job.est_input_tokens.max(0))
    // The request's trace, when traces are exported: the job's attempts join it.
    .bind(crate::telemetry::current_trace_parent())
    .bind(lane.urgent)
    .bind(lane.document_tokens.max(0))
    .bind(lane.due_by)
    .bind(lane.expected_run.as_secs_f64().min(1e9))
    .bind(URGENT_FLAG_REACH)
    .fetch_one(conn)
    .await?)
}

/// Lock `owner_id`'s line (its `owner_lines` row, which holds its finish tag) in the caller's
/// transaction, as enqueueing would. A transaction that also writes the owner's `users` row must
/// take this first: replay and a document's parts change the line before their hooks write
/// `users`.
pub async fn lock_line(conn: &mut PgConnection, owner_id: i64) -> Result<()> {
    sqlx::query("SELECT sluice_lock_lines(ARRAY[$1::bigint])").bind(owner_id).execute(conn).await?;
    Ok(())
}

/// Lock jobs about to come back into the line, several owners' at once, and then their owners'
/// lines in owner order (`sluice_lock_entries`): each job's new tag locks its owner's line, and
/// two such statements taking lines in row order could deadlock.
pub(crate) async fn lock_entries(conn: &mut PgConnection, jobs: &[Uuid]) -> Result<()> {
    sqlx::query("SELECT sluice_lock_entries($1)").bind(jobs).execute(conn).await?;
    Ok(())
}
