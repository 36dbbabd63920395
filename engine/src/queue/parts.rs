//! Jobs done in parts: a document too long for one provider call is split into parts, each
//! one claim of the job (its own lease, gate slot, token reservation and attempts). Level 0
//! holds the document's parts; level n + 1 the combined outputs of level n (a summary of the
//! summaries). A part's output is stored in the transaction that puts the job back in line
//! ([`super::complete_many`] with a [`PartDone`]), so a crash never redoes a finished part.
//! Every write here is fenced by the attempt's lease token.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::ClaimedJob;
use crate::error::Result;

/// A part's output, handed back with the attempt's [`super::JobOutput`]: the job goes back in
/// line instead of ending.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartDone {
    pub level: i32,
    pub idx: i32,
    pub output: String,
    /// What the job's next claim reserves from the token budget (its next part's estimate).
    pub next_est_tokens: i64,
}

/// A part still to do.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct PendingPart {
    pub level: i32,
    pub idx: i32,
    /// Parts at its level.
    pub count: i32,
    pub body: String,
    pub overlap: String,
    pub est_tokens: i64,
    /// The estimate of the part after it at the same level, if any.
    pub following_est_tokens: Option<i64>,
}

/// Where a job in parts stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// Not split (yet): the attempt reads the document.
    Unsplit,
    /// This part is next.
    Pending(PendingPart),
    /// Every part of the top level is done: combine them (or they are the result).
    LevelDone { level: i32, count: i32 },
}

/// A new part to store.
#[derive(Clone, Debug)]
pub struct NewPart {
    pub body: String,
    pub overlap: String,
    pub est_tokens: i64,
}

/// Reads and writes a job's parts. Disabled (no database) it stores nothing, and documents
/// over one call fail as before.
#[derive(Clone)]
pub struct PartStore {
    pool: Option<PgPool>,
}

impl PartStore {
    pub fn new(pool: PgPool) -> PartStore {
        PartStore { pool: Some(pool) }
    }

    pub fn disabled() -> PartStore {
        PartStore { pool: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.pool.is_some()
    }

    /// Where `job` stands: the first part not done at the top level, or that level done.
    pub async fn progress(&self, job: Uuid) -> Result<Progress> {
        let Some(pool) = &self.pool else { return Ok(Progress::Unsplit) };
        let top: Option<(i32, i32)> = sqlx::query_as(
            "SELECT level, count(*)::int4 FROM job_parts WHERE job_id = $1 GROUP BY level ORDER BY level DESC LIMIT 1",
        )
        .bind(job)
        .fetch_optional(pool)
        .await?;
        let Some((level, count)) = top else { return Ok(Progress::Unsplit) };
        let pending: Option<PendingPart> = sqlx::query_as(
            "SELECT p.level, p.idx, $3::int4 AS count, p.body, p.overlap, p.est_tokens,
                    (SELECT n.est_tokens FROM job_parts n
                     WHERE n.job_id = p.job_id AND n.level = p.level AND n.idx > p.idx AND n.output IS NULL
                     ORDER BY n.idx LIMIT 1) AS following_est_tokens
             FROM job_parts p WHERE p.job_id = $1 AND p.level = $2 AND p.output IS NULL
             ORDER BY p.idx LIMIT 1",
        )
        .bind(job)
        .bind(level)
        .bind(count)
        .fetch_optional(pool)
        .await?;
        Ok(match pending {
            Some(part) => Progress::Pending(part),
            None => Progress::LevelDone { level, count },
        })
    }

    /// The outputs of a finished level, in order.
    pub async fn outputs(&self, job: Uuid, level: i32) -> Result<Vec<String>> {
        let Some(pool) = &self.pool else { return Ok(Vec::new()) };
        Ok(sqlx::query_scalar(
            "SELECT coalesce(output, '') FROM job_parts WHERE job_id = $1 AND level = $2 ORDER BY idx",
        )
        .bind(job)
        .bind(level)
        .fetch_all(pool)
        .await?)
    }

    /// How many parts `level` of `job` has.
    pub async fn count(&self, job: Uuid, level: i32) -> Result<i64> {
        let Some(pool) = &self.pool else { return Ok(0) };
        Ok(sqlx::query_scalar("SELECT count(*) FROM job_parts WHERE job_id = $1 AND level = $2")
            .bind(job)
            .bind(level)
            .fetch_one(pool)
            .await?)
    }

    /// Store a level's parts, if `job`'s attempt still holds its lease (and the level is not
    /// there yet: a second attempt that split the same text finds the first one's parts).
    /// Returns whether the attempt still holds the job.
    pub async fn add_level(&self, job: &ClaimedJob, level: i32, parts: &[NewPart]) -> Result<bool> {
        let Some(pool) = &self.pool else { return Ok(false) };
        let bodies: Vec<&str> = parts.iter().map(|p| p.body.as_str()).collect();
        let overlaps: Vec<&str> = parts.iter().map(|p| p.overlap.as_str()).collect();
        let estimates: Vec<i64> = parts.iter().map(|p| p.est_tokens).collect();
        let mut tx = pool.begin().await?;
        let held: Option<i32> = sqlx::query_scalar(
            "UPDATE jobs SET parts_total = CASE WHEN $3 = 0 THEN $4 ELSE parts_total END,
                 parts_stage = CASE WHEN $3 = 0 THEN 'parts' ELSE 'combining' END, updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND state = 'running' RETURNING 1",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(level)
        .bind(parts.len() as i32)
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO job_parts (job_id, level, idx, body, overlap, est_tokens)
             SELECT $1, $2, (t.n - 1)::int4, t.body, t.overlap, t.est
             FROM unnest($3::text[], $4::text[], $5::int8[]) WITH ORDINALITY AS t(body, overlap, est, n)
             ON CONFLICT (job_id, level, idx) DO NOTHING",
        )
        .bind(job.id)
        .bind(level)
        .bind(&bodies)
        .bind(&overlaps)
        .bind(&estimates)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Store the outputs of parts and put their jobs back in line, each fenced by its attempt's
/// lease token, inside the caller's transaction. Returns the ids of the jobs moved.
pub(crate) async fn store_and_requeue(
    tx: &mut sqlx::PgConnection,
    items: &[(&ClaimedJob, &PartDone, Option<i64>, Option<i64>)],
) -> Result<Vec<Uuid>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = items.iter().map(|(j, ..)| j.id).collect();
    let tokens: Vec<Uuid> = items.iter().map(|(j, ..)| j.lease_token).collect();
    let levels: Vec<i32> = items.iter().map(|(_, p, ..)| p.level).collect();
    let idxs: Vec<i32> = items.iter().map(|(_, p, ..)| p.idx).collect();
    // Postgres text holds no NUL: a provider's stray one goes.
    let outputs: Vec<String> = items.iter().map(|(_, p, ..)| p.output.replace('\0', "")).collect();
    let next: Vec<i64> = items.iter().map(|(_, p, ..)| p.next_est_tokens.max(0)).collect();
    let input_tokens: Vec<Option<i64>> = items.iter().map(|(.., i, _)| *i).collect();
    let output_tokens: Vec<Option<i64>> = items.iter().map(|(.., o)| *o).collect();
    // The jobs first, each locked and checked against its lease (and a cancel request) after
    // the lock, so a rescue or a cancel that won the race leaves its part untouched; then the
    // parts of the jobs that moved, and their attempts.
    let moved: Vec<Uuid> = sqlx::query_scalar(
        "WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::int4[], $5::int8[])
                 AS t(id, token, level, idx, next_est)
         )
         UPDATE jobs j SET state = 'queued', attempts = 0, run_at = now(), est_input_tokens = i.next_est,
             parts_done = j.parts_done + (CASE WHEN i.level = 0 THEN 1 ELSE 0 END),
             lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL,
             updated_at = now()
         FROM input i
         WHERE j.id = i.id AND j.lease_token = i.token AND j.state = 'running' AND j.cancel_requested_at IS NULL
           AND EXISTS (SELECT 1 FROM job_parts p
                       WHERE p.job_id = i.id AND p.level = i.level AND p.idx = i.idx AND p.output IS NULL)
         RETURNING j.id",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&levels)
    .bind(&idxs)
    .bind(&next)
    .fetch_all(&mut *tx)
    .await?;
    sqlx::query(
        "WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::int4[], $5::text[], $6::int8[], $7::int8[])
                 AS t(id, token, level, idx, output, input_tokens, output_tokens)
             WHERE t.id = ANY($8)
         ),
         part AS (
             UPDATE job_parts p SET output = i.output, input_tokens = i.input_tokens,
                 output_tokens = i.output_tokens, attempt_id = i.token, done_at = now()
             FROM input i
             WHERE p.job_id = i.id AND p.level = i.level AND p.idx = i.idx AND p.output IS NULL
         )
         UPDATE job_attempts a SET finished_at = now(), outcome = 'succeeded',
             input_tokens = i.input_tokens, output_tokens = i.output_tokens
         FROM input i WHERE a.id = i.token",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&levels)
    .bind(&idxs)
    .bind(&outputs)
    .bind(&input_tokens)
    .bind(&output_tokens)
    .bind(&moved)
    .execute(&mut *tx)
    .await?;
    if !moved.is_empty() {
        super::notify_workers(tx).await?;
    }
    Ok(moved)
}
