//! The economy lane: a document whose owner chose "by tomorrow, at half the credits" sends its
//! calls through the provider's batch API (half the interactive price, answered within a day).
//!
//! 1. Its first claim reads and plans it as any document's (parts included) but, instead of
//!    calling, collects every call of its first round (each part's) and submits them as one
//!    batch. The batch's id and each request's text (by its hash) are stored, and the job goes
//!    back in line until the window's end, no attempt used.
//! 2. The poller ([`poll_batches`], every process with workers) asks the provider where each
//!    open batch stands; once one has ended its answers are stored and its jobs are due at once.
//! 3. The job's next claim runs as any document's: each call whose text the batch answered takes
//!    that answer (once), checked as an interactive answer is (a translation's paragraphs
//!    accounted for); whatever the batch did not answer (an error, expired, canceled, a
//!    paragraph asked again) is asked interactively, at no extra charge to the user.
//!
//! Past the window without an answer (a poller that never ran, a batch that never ended), the
//! job is due anyway and done interactively. A batch in flight survives a restart: its id is
//! durable and the poller resumes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::providers::batch::{BatchRequest, BatchState};
use super::providers::{Provider, ProviderOutput, Task};
use crate::error::Result;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::{ClaimedJob, JobError};

/// A batch still open this long after it was sent is given up.
const GIVEN_UP_AFTER: chrono::TimeDelta = chrono::TimeDelta::hours(48);

/// How often an open batch is asked where it stands.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_secs(30);

/// The economy lane as the workers' processor sees it.
#[derive(Clone)]
pub struct EconomyLane {
    pool: PgPool,
    /// The longest a document waits for its batch before it is done interactively.
    pub window: Duration,
    /// The calls collected by each claim (by its lease) that is gathering a batch.
    collecting: Arc<Mutex<HashMap<Uuid, Vec<Task>>>>,
}

fn sha256(text: &str) -> Vec<u8> {
    Sha256::digest(text.as_bytes()).to_vec()
}

/// The error a collected call ends with: not a failure, the call is in the batch.
pub fn in_batch() -> JobError {
    JobError { deferred: true, ..JobError::new(ErrorClass::Overloaded, "sent to the provider's batch") }
}

impl EconomyLane {
    pub fn new(pool: PgPool, window: Duration) -> EconomyLane {
        EconomyLane { pool, window, collecting: Arc::default() }
    }

    /// Whether this claim of `job` gathers its calls into a batch: it is in the economy lane,
    /// the provider has a batch API, and none of its calls was ever sent to one.
    pub async fn begin(&self, job: &ClaimedJob, provider: &dyn Provider) -> Result<bool> {
        if job.payload["economy"] != serde_json::Value::Bool(true) || provider.batch_api(None).is_none() {
            return Ok(false);
        }
        let sent: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM batch_requests WHERE job_id = $1)")
            .bind(job.id)
            .fetch_one(&self.pool)
            .await?;
        if !sent {
            self.collecting.lock().unwrap().insert(job.lease_token, Vec::new());
        }
        Ok(!sent)
    }

    /// Keep `task` for the batch when this claim gathers one (the key terms of a translation
    /// are found at once: every part's request carries them).
    pub fn collect(&self, job: &ClaimedJob, task: &Task) -> bool {
        if task.finds_terms {
            return false;
        }
        match self.collecting.lock().unwrap().get_mut(&job.lease_token) {
            Some(tasks) => {
                tasks.push(task.clone());
                true
            }
            None => false,
        }
    }

    /// Whether this claim gathers a batch.
    pub fn is_gathering(&self, job: &ClaimedJob) -> bool {
        self.collecting.lock().unwrap().contains_key(&job.lease_token)
    }

    /// The calls this claim gathered (none when it gathered nothing).
    pub fn end(&self, job: &ClaimedJob) -> Vec<Task> {
        self.collecting.lock().unwrap().remove(&job.lease_token).unwrap_or_default()
    }

    /// Send `tasks` as one batch, and keep what the job's next claim needs to find the answers.
    /// The requests are stored before the batch is sent: were this process to die in between,
    /// the job is done interactively, never sent twice. Returns whether the provider took it
    /// (not: the job's next claim asks at once).
    pub async fn submit(&self, provider: &dyn Provider, job: &ClaimedJob, tasks: &[Task]) -> Result<bool, JobError> {
        let (deployment, api) = provider
            .batch_api(None)
            .ok_or_else(|| JobError::new(ErrorClass::Rejected, "the provider has no batch API"))?;
        let database = |e: sqlx::Error| {
            tracing::warn!(error = %e, "could not store a batch");
            JobError::new(ErrorClass::Connection, "the database did not answer; the batch was not sent")
        };
        let ids: Vec<String> = (0..tasks.len()).map(|i| format!("{}-{i}", job.id.simple())).collect();
        let mut tx = self.pool.begin().await.map_err(database)?;
        let batch: i64 = sqlx::query_scalar(
            "INSERT INTO provider_batches (deployment, provider_batch_id, requests) VALUES ($1, '', $2) RETURNING id",
        )
        .bind(&deployment)
        .bind(tasks.len() as i32)
        .fetch_one(&mut *tx)
        .await
        .map_err(database)?;
        let hashes: Vec<Vec<u8>> = tasks.iter().map(|t| sha256(&t.text)).collect();
        let asked: Vec<i32> =
            tasks.iter().map(|t| t.answer_tokens.unwrap_or(1024).min(i32::MAX as u32) as i32).collect();
        sqlx::query(
            "INSERT INTO batch_requests (job_id, custom_id, batch_id, text_sha256, answer_tokens)
             SELECT $1, c, $2, h, a FROM unnest($3::text[], $4::bytea[], $5::int4[]) AS r (c, h, a)",
        )
        .bind(job.id)
        .bind(batch)
        .bind(&ids)
        .bind(&hashes)
        .bind(&asked)
        .execute(&mut *tx)
        .await
        .map_err(database)?;
        tx.commit().await.map_err(database)?;
        let requests: Vec<BatchRequest> =
            ids.iter().zip(tasks).map(|(id, task)| BatchRequest { custom_id: id.clone(), task }).collect();
        let provider_batch = match api.submit_batch(&requests).await {
            Ok(id) => id,
            Err(e) => {
                // Its requests stay on the record, so the next claim asks at once: an economy
                // document is never stuck on a batch API that will not take it.
                tracing::warn!(job = %job.id, error = %e.message, "the provider did not take a batch; the document is done at once");
                sqlx::query("UPDATE provider_batches SET ended_at = now() WHERE id = $1")
                    .bind(batch)
                    .execute(&self.pool)
                    .await
                    .map_err(database)?;
                return Ok(false);
            }
        };
        sqlx::query("UPDATE provider_batches SET provider_batch_id = $2 WHERE id = $1")
            .bind(batch)
            .bind(&provider_batch)
            .execute(&self.pool)
            .await
            .map_err(database)?;
        tracing::info!(job = %job.id, batch = %provider_batch, requests = tasks.len(), "sent to the provider's batch");
        Ok(true)
    }

    /// The batch's answer for `task`'s text, if the batch answered it and no call took it yet.
    pub async fn prefetched(&self, job: &ClaimedJob, task: &Task) -> Result<Option<ProviderOutput>> {
        // Nothing while this claim gathers: nothing was sent yet.
        if job.payload["economy"] != serde_json::Value::Bool(true) || task.finds_terms || self.is_gathering(job) {
            return Ok(None);
        }
        // Taken once, and its words not kept twice (the part's answer is stored with the part).
        let answer: Option<serde_json::Value> = sqlx::query_scalar(
            "WITH taken AS (SELECT custom_id, answer FROM batch_requests
                            WHERE job_id = $1 AND text_sha256 = $2 AND answer IS NOT NULL
                            ORDER BY custom_id LIMIT 1 FOR UPDATE SKIP LOCKED)
             UPDATE batch_requests r SET used_at = now(), answer = NULL FROM taken t
             WHERE r.job_id = $1 AND r.custom_id = t.custom_id
             RETURNING t.answer",
        )
        .bind(job.id)
        .bind(sha256(&task.text))
        .fetch_optional(&self.pool)
        .await?
        .flatten();
        Ok(answer.and_then(|a| serde_json::from_value(a).ok()))
    }
}

/// When each of `jobs` was sent to the provider's batch, for those the batch has not answered.
pub async fn in_batch_since(pool: &PgPool, jobs: &[Uuid]) -> Result<HashMap<Uuid, chrono::DateTime<chrono::Utc>>> {
    let rows: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT r.job_id, min(b.submitted_at) FROM batch_requests r JOIN provider_batches b ON b.id = r.batch_id
         WHERE r.job_id = ANY($1) AND b.ended_at IS NULL AND b.provider_batch_id <> '' GROUP BY r.job_id",
    )
    .bind(jobs)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Ask the provider where each open batch not asked lately stands (at most 20 a round, each
/// by one process); store an ended one's answers and make its jobs due. Returns how many
/// batches ended.
pub async fn poll_batches(pool: &PgPool, provider: &dyn Provider, every: Duration) -> Result<usize> {
    // A batch the provider never ended is given up long after any window (its jobs went on
    // without it at their window's end).
    sqlx::query("UPDATE provider_batches SET ended_at = now() WHERE ended_at IS NULL AND submitted_at < now() - $1")
        .bind(GIVEN_UP_AFTER)
        .execute(pool)
        .await?;
    let open: Vec<(i64, String, String)> = sqlx::query_as(
        "UPDATE provider_batches SET polled_at = now()
         WHERE id IN (SELECT id FROM provider_batches
                      WHERE ended_at IS NULL AND provider_batch_id <> ''
                        AND (polled_at IS NULL OR polled_at < now() - make_interval(secs => $1))
                      ORDER BY submitted_at LIMIT 20 FOR UPDATE SKIP LOCKED)
         RETURNING id, deployment, provider_batch_id",
    )
    .bind(every.as_secs_f64())
    .fetch_all(pool)
    .await?;
    let mut ended = 0;
    for (batch, deployment, provider_batch) in open {
        match poll_one(pool, provider, batch, &deployment, &provider_batch).await {
            Ok(true) => ended += 1,
            Ok(false) => {}
            // One batch's trouble is not the others'.
            Err(e) => tracing::warn!(batch = %provider_batch, error = %e, "could not poll a provider batch"),
        }
    }
    Ok(ended)
}

/// Reads of a batch's results that may fail before it is ended without them (its documents
/// are then done at once).
const MAX_READ_FAILURES: i32 = 3;

/// Poll one batch; whether it ended.
async fn poll_one(
    pool: &PgPool,
    provider: &dyn Provider,
    batch: i64,
    deployment: &str,
    provider_batch: &str,
) -> Result<bool> {
    let Some((_, api)) = provider.batch_api(Some(deployment)) else {
        tracing::warn!(batch = %provider_batch, %deployment, "no batch API for this batch's deployment any more");
        end_batch(pool, batch, &HashMap::new()).await?;
        return Ok(true);
    };
    // Every document of it ended (canceled, deleted, failed): the provider is asked to stop,
    // and nothing more is kept of it.
    let live: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM batch_requests r JOIN jobs j ON j.id = r.job_id
                        WHERE r.batch_id = $1 AND j.state IN ('queued', 'retrying', 'running'))",
    )
    .bind(batch)
    .fetch_one(pool)
    .await?;
    if !live {
        if let Err(e) = api.cancel_batch(provider_batch).await {
            tracing::info!(batch = %provider_batch, error = %e.message, "a batch none of whose documents waits could not be canceled");
        }
        end_batch(pool, batch, &HashMap::new()).await?;
        return Ok(true);
    }
    let outcomes = match api.batch_state(provider_batch).await {
        Ok(BatchState::Running { .. }) => return Ok(false),
        Ok(BatchState::Refused(why)) => {
            tracing::warn!(batch = %provider_batch, %why, "the provider refused a batch; its documents are done at once");
            HashMap::new()
        }
        Ok(BatchState::Ended) => {
            let asked: HashMap<String, u32> = sqlx::query_as::<_, (String, i32)>(
                "SELECT custom_id, answer_tokens FROM batch_requests WHERE batch_id = $1",
            )
            .bind(batch)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|(id, asked)| (id, asked.max(1) as u32))
            .collect();
            match api.batch_results(provider_batch, &asked).await {
                Ok(outcomes) => outcomes,
                Err(e) => {
                    let failures: i32 = sqlx::query_scalar(
                        "UPDATE provider_batches SET read_failures = read_failures + 1 WHERE id = $1 RETURNING read_failures",
                    )
                    .bind(batch)
                    .fetch_one(pool)
                    .await?;
                    tracing::warn!(batch = %provider_batch, error = %e.message, failures, "a batch's results could not be read");
                    if failures < MAX_READ_FAILURES {
                        return Ok(false);
                    }
                    HashMap::new()
                }
            }
        }
        Err(e) => {
            tracing::warn!(batch = %provider_batch, error = %e.message, "a batch could not be asked where it stands");
            return Ok(false);
        }
    };
    end_batch(pool, batch, &outcomes).await?;
    Ok(true)
}

/// Store a batch's answers (the failures as words), mark it ended and make its jobs due.
async fn end_batch(
    pool: &PgPool,
    batch: i64,
    outcomes: &HashMap<String, std::result::Result<ProviderOutput, JobError>>,
) -> Result<()> {
    let mut ids = Vec::new();
    let mut answers = Vec::new();
    let mut failures = Vec::new();
    for (id, outcome) in outcomes {
        ids.push(id.clone());
        match outcome {
            // Postgres keeps no NUL in text or jsonb: a model's answer may hold one.
            Ok(output) => {
                let output = ProviderOutput { text: output.text.replace('\0', ""), ..output.clone() };
                answers.push(Some(serde_json::to_value(output).unwrap_or_default()));
                failures.push(None);
            }
            Err(e) => {
                answers.push(None);
                failures.push(Some(e.message.replace('\0', "")));
            }
        }
    }
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE batch_requests r SET answer = o.answer, failure = o.failure
         FROM unnest($2::text[], $3::jsonb[], $4::text[]) AS o (custom_id, answer, failure)
         WHERE r.batch_id = $1 AND r.custom_id = o.custom_id AND r.used_at IS NULL",
    )
    .bind(batch)
    .bind(&ids)
    .bind(&answers)
    .bind(&failures)
    .execute(&mut *tx)
    .await?;
    let jobs: Vec<Uuid> = sqlx::query_scalar("SELECT DISTINCT job_id FROM batch_requests WHERE batch_id = $1")
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
    sqlx::query("UPDATE provider_batches SET ended_at = now() WHERE id = $1").bind(batch).execute(&mut *tx).await?;
    crate::queue::due_now(&mut tx, &jobs).await?;
    tx.commit().await?;
    Ok(())
}

/// The poller: every `every`, the open batches asked where they stand (every process with
/// workers runs one; a batch is asked by one at a time).
pub async fn run(pool: PgPool, provider: Arc<dyn Provider>, every: Duration) {
    loop {
        match poll_batches(&pool, provider.as_ref(), every).await {
            Ok(0) => {}
            Ok(ended) => tracing::info!(ended, "provider batches ended; their documents are due"),
            Err(e) => tracing::warn!(error = %e, "could not poll the provider's batches"),
        }
        tokio::time::sleep(every.min(Duration::from_secs(5)).max(Duration::from_millis(200))).await;
    }
}
