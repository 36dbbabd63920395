//! Reconciliation (seed 001: someone is named to check, and evidence is kept). A run checks
//! that money and jobs add up, stores a report (when, what was checked, every discrepancy with
//! its ids), and fixes nothing: repairs are explicit, audited operator actions.
//!
//! The checks:
//! - each user's balance equals the sum of their ledger;
//! - each user's in-flight count equals their jobs not yet ended;
//! - every job that cost something has exactly one debit;
//! - every failed or canceled job that cost something has exactly one refund (of between 0,
//!   when it is charged after all, and its cost); a done job has one only for what a PDF's
//!   settlement gave back (exactly its cost less its settled price), and no other job has one (but a job replayed from the dead-letter queue keeps its refund: a replay is free);
//! - no job is `running` with a lease far in the future (a clock or a bug);
//! - every job not yet ended still has its document; no stored document older than an hour
//!   lacks a job (an upload stored before a crash).

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use sqlx::PgPool;

use crate::documents::Blobs;
use crate::error::Result;

/// One check: what it looked at and what it found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckSummary {
    pub check: String,
    /// Rows (users, jobs, documents) the check looked at.
    pub examined: i64,
    pub found: i64,
}

/// One thing that does not add up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Discrepancy {
    pub check: String,
    /// What to look at: `user 12`, `job <uuid>`, `document <key>`.
    pub subject: String,
    pub detail: String,
}

/// A stored report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub id: i64,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub actor: String,
    pub checks: Vec<CheckSummary>,
    pub discrepancies: Vec<Discrepancy>,
    pub acknowledged: Option<crate::acks::Acknowledgement>,
}

/// At most this many discrepancies of one check are kept in a report (the count is exact, and
/// memory stays bounded however broken the books are).
const KEEP_PER_CHECK: usize = 100;
/// Documents younger than this may belong to an upload still in progress.
const ORPHAN_GRACE: chrono::Duration = chrono::Duration::hours(1);

/// The SQL checks: (name, what they examine, the query returning (subject, detail) rows).
const SQL_CHECKS: [(&str, &str, &str); 6] = [
    (
        "balance_matches_ledger",
        "SELECT count(*) FROM users",
        "SELECT 'user ' || u.id, format('balance %s, the ledger sums to %s', u.balance, coalesce(l.sum, 0))
         FROM users u LEFT JOIN (SELECT user_id, sum(amount) AS sum FROM ledger GROUP BY user_id) l ON l.user_id = u.id
         WHERE u.balance <> coalesce(l.sum, 0) ORDER BY u.id",
    ),
    (
        "in_flight_matches_open_jobs",
        "SELECT count(*) FROM users",
        "SELECT 'user ' || u.id, format('in flight %s, jobs not yet ended %s', u.in_flight, coalesce(j.open, 0))
         FROM users u LEFT JOIN (SELECT owner_id, count(*) AS open FROM jobs
                                 WHERE state IN ('queued', 'running', 'retrying') GROUP BY owner_id) j
                ON j.owner_id = u.id
         WHERE u.in_flight <> coalesce(j.open, 0) ORDER BY u.id",
    ),
    (
        "one_debit_per_job",
        "SELECT count(*) FROM jobs WHERE cost > 0",
        "SELECT 'job ' || j.id, format('%s debits', coalesce(d.n, 0))
         FROM jobs j LEFT JOIN (SELECT job_id, count(*) AS n FROM ledger WHERE kind = 'debit' GROUP BY job_id) d
                ON d.job_id = j.id
         WHERE j.cost > 0 AND coalesce(d.n, 0) <> 1 ORDER BY j.accepted_at",
    ),
    (
        "refunds_match_state",
        "SELECT count(*) FROM jobs",
        "SELECT 'job ' || j.id, format('%s with %s refunds of %s credits (cost %s)', j.state, coalesce(r.n, 0),
                    coalesce(r.amount, 0), j.cost)
         FROM jobs j LEFT JOIN (SELECT job_id, count(*) AS n, sum(amount) AS amount FROM ledger
                                WHERE kind = 'refund' GROUP BY job_id) r
                ON r.job_id = j.id
         WHERE (j.state IN ('failed', 'canceled') AND j.cost > 0 AND coalesce(r.n, 0) <> 1)
            -- A done PDF admitted at a hold gets back exactly what its text's price left over.
            OR (j.state = 'done' AND j.replays = 0
                AND coalesce(r.amount, 0) <> j.cost - coalesce(j.settled_cost, j.cost))
            -- A settlement gives back between nothing (charged after all) and the whole cost.
            OR r.amount < 0 OR r.amount > j.cost
            -- A job replayed from the dead-letter queue runs again for free: its refund stands.
            OR (j.state NOT IN ('failed', 'canceled', 'done') AND coalesce(r.n, 0) > CASE WHEN j.replays > 0 THEN 1 ELSE 0 END)
            OR (j.state = 'done' AND coalesce(r.n, 0) > 1)
         ORDER BY j.accepted_at",
    ),
    // The storage quota reads a counter the transitions move (one row, not every job); it
    // must match the documents kept and the part text its owner's jobs hold.
    (
        "stored_bytes_match_documents",
        "SELECT count(*) FROM users",
        "WITH counted AS (
             SELECT owner_id, sum(bytes) AS bytes FROM (
                 SELECT DISTINCT ON (owner_id, payload #>> '{document,key}') owner_id,
                        coalesce((payload #>> '{document,size}')::numeric, 0)::int8 AS bytes
                 FROM jobs WHERE kind = 'document' AND document_released_at IS NULL AND payload #>> '{document,key}' IS NOT NULL
                 UNION ALL
                 SELECT j.owner_id, octet_length(p.body) + octet_length(p.overlap) + coalesce(octet_length(p.output), 0)
                 FROM job_parts p JOIN jobs j ON j.id = p.job_id) kept
             GROUP BY owner_id)
         SELECT 'user ' || u.id, format('stored bytes counted %s, its documents and parts hold %s',
                                        coalesce(s.bytes, 0), coalesce(c.bytes, 0))
         FROM users u LEFT JOIN (SELECT user_id, sum(bytes) AS bytes FROM storage_deltas GROUP BY user_id) s
                ON s.user_id = u.id
              LEFT JOIN counted c ON c.owner_id = u.id
         WHERE coalesce(s.bytes, 0) <> coalesce(c.bytes, 0) ORDER BY u.id",
    ),
    // A lease further ahead than 10 minutes is not one a worker set (leases are a minute).
    (
        "no_lease_far_in_future",
        "SELECT count(*) FROM jobs WHERE state = 'running'",
        "SELECT 'job ' || id, format('running with its lease until %s', lease_expires_at)
         FROM jobs WHERE state = 'running' AND lease_expires_at > now() + interval '10 minutes' ORDER BY id",
    ),
];

/// Run every check, store the report, and return it. `blobs` adds the document checks.
pub async fn run(pool: &PgPool, blobs: Option<&Blobs>, actor: &str) -> Result<Report> {
    let started_at = Utc::now();
    let mut checks = Vec::new();
    let mut discrepancies = Vec::new();
    for (name, examined_sql, found_sql) in SQL_CHECKS {
        let examined: i64 = sqlx::query_scalar(examined_sql).fetch_one(pool).await?;
        // Streamed: broken books can mean a row per job, and memory holds only the kept ones.
        let mut found = Found::new(name);
        let mut rows = sqlx::query_as::<_, (String, String)>(found_sql).fetch(pool);
        while let Some((subject, detail)) = rows.next().await.transpose()? {
            found.push(subject, detail);
        }
        found.record(&mut checks, &mut discrepancies, examined);
    }
    if let Some(blobs) = blobs {
        let (examined, found) = live_jobs_without_documents(pool, blobs).await?;
        found.record(&mut checks, &mut discrepancies, examined);
        let (examined, found) = documents_without_jobs(pool, blobs).await?;
        found.record(&mut checks, &mut discrepancies, examined);
    }
    let found: i64 = checks.iter().map(|c| c.found).sum();
    let (id, finished_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO reconciliation_reports (started_at, actor, checks, discrepancies, found)
         VALUES ($1, $2, $3, $4, $5) RETURNING id, finished_at",
    )
    .bind(started_at)
    .bind(actor)
    .bind(Json(&checks))
    .bind(Json(&discrepancies))
    .bind(found.min(i32::MAX as i64) as i32)
    .fetch_one(pool)
    .await?;
    if found > 0 {
        tracing::warn!(report = id, found, "reconciliation found discrepancies");
    }
    Ok(Report { id, started_at, finished_at, actor: actor.to_string(), checks, discrepancies, acknowledged: None })
}

/// What one check found: the exact count, and the first [`KEEP_PER_CHECK`] discrepancies.
struct Found {
    check: &'static str,
    count: i64,
    kept: Vec<Discrepancy>,
}

impl Found {
    fn new(check: &'static str) -> Found {
        Found { check, count: 0, kept: Vec::new() }
    }

    fn push(&mut self, subject: String, detail: String) {
        self.count += 1;
        if self.kept.len() < KEEP_PER_CHECK {
            self.kept.push(Discrepancy { check: self.check.to_string(), subject, detail });
        }
    }

    /// Add this check's summary and its kept discrepancies to the report.
    fn record(self, checks: &mut Vec<CheckSummary>, discrepancies: &mut Vec<Discrepancy>, examined: i64) {
        checks.push(CheckSummary { check: self.check.to_string(), examined, found: self.count });
        discrepancies.extend(self.kept);
    }
}

/// Jobs not yet ended whose document is gone.
async fn live_jobs_without_documents(pool: &PgPool, blobs: &Blobs) -> Result<(i64, Found)> {
    let mut live = sqlx::query_as::<_, (uuid::Uuid, String)>(
        "SELECT id, payload #>> '{document,key}' FROM jobs
         WHERE kind = 'document' AND state IN ('queued', 'running', 'retrying')
           AND payload #>> '{document,key}' IS NOT NULL",
    )
    .fetch(pool);
    let (mut examined, mut missing) = (0i64, Found::new("live_jobs_have_documents"));
    while let Some((id, key)) = live.next().await.transpose()? {
        examined += 1;
        if !blobs.exists(&key).await? {
            missing.push(format!("job {id}"), format!("its document {key} is missing"));
        }
    }
    Ok((examined, missing))
}

/// Stored documents older than the grace period that no job points at.
async fn documents_without_jobs(pool: &PgPool, blobs: &Blobs) -> Result<(i64, Found)> {
    let mut batches = blobs.documents_before(Utc::now() - ORPHAN_GRACE, 500);
    let (mut examined, mut orphans) = (0i64, Found::new("documents_have_jobs"));
    while let Some(batch) = batches.next().await {
        let batch = batch?;
        examined += batch.len() as i64;
        let found = crate::documents::sweep::without_jobs(pool, &batch).await?;
        for key in found {
            orphans.push(format!("document {key}"), "no job points at it".to_string());
        }
    }
    Ok((examined, orphans))
}

/// The newest report, if any run was made.
pub async fn latest(pool: &PgPool) -> Result<Option<Report>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        started_at: DateTime<Utc>,
        finished_at: DateTime<Utc>,
        actor: String,
        checks: Json<Vec<CheckSummary>>,
        discrepancies: Json<Vec<Discrepancy>>,
        acked_by: Option<String>,
        acked_at: Option<DateTime<Utc>>,
        ack_note: Option<String>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, started_at, finished_at, actor, checks, discrepancies, acked_by, acked_at, ack_note
         FROM reconciliation_reports ORDER BY finished_at DESC, id DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Report {
        id: r.id,
        started_at: r.started_at,
        finished_at: r.finished_at,
        actor: r.actor,
        checks: r.checks.0,
        discrepancies: r.discrepancies.0,
        acknowledged: crate::acks::from_columns(r.acked_by, r.acked_at, r.ack_note),
    }))
}
