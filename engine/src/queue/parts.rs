//! Jobs done in parts: a document too long for one provider call (or whose answer would not
//! fit one answer) is split into parts. Level 0 holds the document's parts; level n + 1 the
//! combined outputs of level n (a summary of the summaries). One claim of the job runs its
//! parts side by side, as many at once as [`PartStore::calls`] grants (the gate and the token
//! budget, after every other owner waiting); each part's output is stored the moment it ends
//! ([`PartStore::store_output`]), so a crash never redoes a finished part, and a part's
//! failures are its own ([`PartStore::part_failed`]). Every write here is fenced by the
//! attempt's lease token.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::ClaimedJob;
use crate::error::Result;

/// An attempt that stored parts and stopped before the end (processing paused, a cancel asked
/// for, or its turn over): the job goes back in line, its attempts counted afresh, instead of
/// ending. Its parts are stored already.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartsProgress {
    /// What the job's next claim reserves from the token budget (its next part's estimate).
    pub next_est_tokens: i64,
    /// How long it waits before it is due again (none: at once); the economy lane's job waits
    /// for its batch.
    pub wait: Option<std::time::Duration>,
}

/// What [`PartStore::calls`] granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallGrant {
    /// How many of the parts asked for may start now.
    pub granted: usize,
    /// False: start nothing more (paused, to be canceled, or the lease is lost).
    pub go_on: bool,
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
    /// Its failed attempts so far.
    pub failures: i32,
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

/// The answered parts of a document's own text, by their index, and how many it has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnsweredSoFar {
    pub total: usize,
    pub answered: Vec<(i32, String)>,
}

impl AnsweredSoFar {
    /// Pure: the answers in order, a line in place of each part not answered (yet).
    pub fn markdown(&self) -> String {
        let mut next = self.answered.iter().peekable();
        let mut pieces = Vec::new();
        for idx in 0..self.total as i32 {
            match next.peek() {
                Some((at, answer)) if *at == idx => {
                    pieces.push(answer.trim().to_string());
                    next.next();
                }
                _ => pieces.push(format!("*[part {} of {} is not done]*", idx + 1, self.total)),
            }
        }
        pieces.join("\n\n")
    }
}

/// Reads and writes a job's parts. Disabled (no database) it stores nothing, and documents
/// over one call fail as before.
#[derive(Clone)]
pub struct PartStore {
    pool: Option<PgPool>,
}

impl PartStore {
    /// Its database (none: parts are not kept), for what is recorded beside a job's parts.
    pub fn pool(&self) -> Option<&PgPool> {
        self.pool.as_ref()
    }

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
        let pending = self.pending(job, level, count, 1).await?;
        Ok(match pending.into_iter().next() {
            Some(part) => Progress::Pending(part),
            None => Progress::LevelDone { level, count },
        })
    }

    /// The parts of `level` (of `count`) not done yet, in order, at most `limit`.
    pub async fn pending(&self, job: Uuid, level: i32, count: i32, limit: i64) -> Result<Vec<PendingPart>> {
        let Some(pool) = &self.pool else { return Ok(Vec::new()) };
        Ok(sqlx::query_as(
            "SELECT p.level, p.idx, $3::int4 AS count, p.body, p.overlap, p.est_tokens, p.failures
             FROM job_parts p WHERE p.job_id = $1 AND p.level = $2 AND p.output IS NULL
             ORDER BY p.idx LIMIT $4",
        )
        .bind(job)
        .bind(level)
        .bind(count)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }

    /// Ask to start parts of these `(input, expected output)` tokens while `running` of the
    /// job's calls run (see `sluice_part_calls`): the gate slots and budget they take are
    /// reserved until [`PartStore::store_output`] or the end of the attempt gives them back.
    pub async fn calls(&self, job: &ClaimedJob, running: usize, wants: &[(i64, i64)]) -> Result<CallGrant> {
        let Some(pool) = &self.pool else { return Ok(CallGrant { granted: 0, go_on: false }) };
        let inputs: Vec<i64> = wants.iter().map(|w| w.0.max(0)).collect();
        let outputs: Vec<i64> = wants.iter().map(|w| w.1.max(0)).collect();
        let (granted, go_on): (i32, bool) = sqlx::query_as("SELECT * FROM sluice_part_calls($1, $2, $3, $4, $5)")
            .bind(job.id)
            .bind(job.lease_token)
            .bind(running.min(i32::MAX as usize) as i32)
            .bind(&inputs)
            .bind(&outputs)
            .fetch_one(pool)
            .await?;
        Ok(CallGrant { granted: granted.max(0) as usize, go_on })
    }

    /// Store a part's output, if the attempt still holds its lease, and give back the gate slot
    /// its call held (the job keeps its own). Returns whether the attempt still holds the job.
    pub async fn store_output(&self, job: &ClaimedJob, part: &StoredPart<'_>) -> Result<bool> {
        let Some(pool) = &self.pool else { return Ok(false) };
        let mut tx = pool.begin().await?;
        let held: Option<i32> = sqlx::query_scalar(
            "UPDATE jobs SET extra_calls = greatest(0, extra_calls - 1),
                 extra_tokens = greatest(0, extra_tokens - $3),
                 parts_done = parts_done + (CASE WHEN $4 = 0 THEN 1 ELSE 0 END),
                 -- Progress: what fails from here on counts from this claim as its first.
                 attempts = least(attempts, 1), updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND state = 'running' RETURNING 1",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(part.reserved_tokens)
        .bind(part.level)
        .fetch_optional(&mut *tx)
        .await?;
        if held.is_none() {
            return Ok(false);
        }
        // Postgres text holds no NUL: a provider's stray one goes.
        sqlx::query(
            "UPDATE job_parts SET output = $4, input_tokens = $5, output_tokens = $6, attempt_id = $7, done_at = now()
             WHERE job_id = $1 AND level = $2 AND idx = $3 AND output IS NULL",
        )
        .bind(job.id)
        .bind(part.level)
        .bind(part.idx)
        .bind(part.output.replace('\0', ""))
        .bind(part.input_tokens)
        .bind(part.output_tokens)
        .bind(job.lease_token)
        .execute(&mut *tx)
        .await?;
        super::notify_workers(&mut tx).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A part's call failed: count it against the part (not while processing is paused: that
    /// failure uses no attempt), and give back the gate slot its call held. Returns the part's
    /// failures so far; none when the attempt no longer holds the job.
    pub async fn part_failed(&self, job: &ClaimedJob, level: i32, idx: i32, reserved_tokens: i64) -> Result<i32> {
        let Some(pool) = &self.pool else { return Ok(0) };
        let mut tx = pool.begin().await?;
        let counts: Option<bool> = sqlx::query_scalar(
            "UPDATE jobs SET extra_calls = greatest(0, extra_calls - 1),
                 extra_tokens = greatest(0, extra_tokens - $3)
             WHERE id = $1 AND lease_token = $2 AND state = 'running'
             RETURNING (SELECT processing_enabled FROM queue_settings WHERE id = 1)",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(reserved_tokens)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(counts) = counts else { return Ok(0) };
        let failures: Option<i32> = sqlx::query_scalar(
            "UPDATE job_parts SET failures = failures + (CASE WHEN $4 THEN 1 ELSE 0 END)
             WHERE job_id = $1 AND level = $2 AND idx = $3
             RETURNING failures",
        )
        .bind(job.id)
        .bind(level)
        .bind(idx)
        .bind(counts)
        .fetch_optional(&mut *tx)
        .await?;
        super::notify_workers(&mut tx).await?;
        tx.commit().await?;
        Ok(failures.unwrap_or(1))
    }

    /// Before the attempt's failure is recorded: the job's attempts become those of its part
    /// that failed most (the retry policy counts per part), and its next claim reserves
    /// `next_est_tokens`.
    pub async fn stand_down(&self, job: &ClaimedJob, attempts: i32, next_est_tokens: i64) -> Result<()> {
        let Some(pool) = &self.pool else { return Ok(()) };
        sqlx::query(
            "UPDATE jobs SET attempts = $3, est_input_tokens = $4
             WHERE id = $1 AND lease_token = $2 AND state = 'running'",
        )
        .bind(job.id)
        .bind(job.lease_token)
        .bind(attempts.max(1))
        .bind(next_est_tokens.max(0))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// The key terms found for `job`'s translation (none: not looked for yet). The queue keeps
    /// them for the processor, whose type they are.
    pub async fn found_terms<Term: serde::de::DeserializeOwned + Send + Unpin + 'static>(
        &self,
        job: Uuid,
    ) -> Result<Option<Vec<Term>>> {
        let Some(pool) = &self.pool else { return Ok(Some(Vec::new())) };
        let found: Option<Option<sqlx::types::Json<Vec<Term>>>> =
            sqlx::query_scalar("SELECT found_terms FROM jobs WHERE id = $1").bind(job).fetch_optional(pool).await?;
        Ok(found.flatten().map(|f| f.0))
    }

    /// Keep the key terms found for `job`'s translation, if its attempt still holds it.
    pub async fn keep_found_terms<Term: serde::Serialize + Sync>(
        &self,
        job: &ClaimedJob,
        terms: &[Term],
    ) -> Result<()> {
        let Some(pool) = &self.pool else { return Ok(()) };
        sqlx::query("UPDATE jobs SET found_terms = $3 WHERE id = $1 AND lease_token = $2")
            .bind(job.id)
            .bind(job.lease_token)
            .bind(sqlx::types::Json(terms))
            .execute(pool)
            .await?;
        Ok(())
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
            // Not once a cancel is asked for: a canceled job's text is not kept.
            "UPDATE jobs SET parts_total = CASE WHEN $3 = 0 THEN $4 ELSE parts_total END,
                 parts_stage = CASE WHEN $3 = 0 THEN 'parts' ELSE 'combining' END, updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND state = 'running' AND cancel_requested_at IS NULL
             RETURNING 1",
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

/// Forget the parts (their text and answers) of jobs that can no longer continue: canceled
/// ones, and failed ones once their replay window ends. Inside the caller's transaction.
pub(crate) async fn forget(conn: &mut sqlx::PgConnection, jobs: &[Uuid]) -> Result<()> {
    if !jobs.is_empty() {
        sqlx::query("DELETE FROM job_parts WHERE job_id = ANY($1)").bind(jobs).execute(conn).await?;
    }
    Ok(())
}

/// A part's answer, to store.
#[derive(Clone, Debug)]
pub struct StoredPart<'a> {
    pub level: i32,
    pub idx: i32,
    pub output: &'a str,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// The input tokens its call was granted by [`PartStore::calls`] (0 for the call on the
    /// claim's own reservation), given back from the job's tokens in flight.
    pub reserved_tokens: i64,
}

/// Put jobs that stored parts and stopped back in line, each fenced by its attempt's lease
/// token (and not when a cancel was asked for: that one ends canceled), inside the caller's
/// transaction, which has locked their rows and lines (`lock_entries`): each comes back as a
/// new arrival, with a new tag. Returns the ids of the jobs moved.
pub(crate) async fn requeue(
    tx: &mut sqlx::PgConnection,
    items: &[(&ClaimedJob, &PartsProgress, Option<i64>, Option<i64>)],
) -> Result<Vec<Uuid>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = items.iter().map(|(j, ..)| j.id).collect();
    let tokens: Vec<Uuid> = items.iter().map(|(j, ..)| j.lease_token).collect();
    let next: Vec<i64> = items.iter().map(|(_, p, ..)| p.next_est_tokens.max(0)).collect();
    let input_tokens: Vec<Option<i64>> = items.iter().map(|(.., i, _)| *i).collect();
    let output_tokens: Vec<Option<i64>> = items.iter().map(|(.., o)| *o).collect();
    let waits: Vec<f64> = items.iter().map(|(_, p, ..)| p.wait.map_or(0.0, |w| w.as_secs_f64())).collect();
    // Found by key, fenced by the lease token (which implies `running`), as `write_results` does;
    // `o` is the row as the attempt left it (its number and worker), for the attempt's row.
    let moved: Vec<Uuid> = sqlx::query_scalar(
        "WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int8[], $4::int8[], $5::int8[], $6::float8[])
                 AS t(id, token, next_est, input_tokens, output_tokens, wait_secs)
         ),
         moved AS (
             UPDATE jobs j SET state = 'queued', attempts = 0, run_at = now() + make_interval(secs => i.wait_secs),
                 est_input_tokens = i.next_est,
                 extra_calls = 0, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL,
                 updated_at = now()
             FROM input i JOIN jobs o ON o.id = i.id
             WHERE j.id = ANY($1) AND j.id = i.id AND j.lease_token = i.token AND j.cancel_requested_at IS NULL
             RETURNING j.id, i.token, o.attempts, o.lease_owner, j.claimed_at, i.input_tokens, i.output_tokens
         ),
         attempt_rows AS (
             INSERT INTO job_attempts (id, job_id, attempt, worker, started_at, finished_at, outcome,
                                       input_tokens, output_tokens)
             SELECT m.token, m.id, m.attempts, coalesce(m.lease_owner, ''), coalesce(m.claimed_at, now()), now(), 'succeeded',
                    m.input_tokens, m.output_tokens
             FROM moved m
         )
         SELECT id FROM moved",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&next)
    .bind(&input_tokens)
    .bind(&output_tokens)
    .bind(&waits)
    .fetch_all(&mut *tx)
    .await?;
    if !moved.is_empty() {
        super::notify_workers(tx).await?;
    }
    Ok(moved)
}

/// Record that `job`'s answered parts are being read, unless its whole cost was refunded
/// (then nothing answered is served: returns false). Taken under the job's row lock, so a
/// failure settling at the same moment either comes first (refunded in full, nothing served)
/// or sees the read (and keeps the answered parts' share).
pub async fn mark_parts_read(pool: &PgPool, job: Uuid) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let Some(cost) = sqlx::query_scalar::<_, i32>("SELECT cost FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(job)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(false);
    };
    // A statement after the lock: it sees a refund committed while this waited for it.
    let refunded: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(amount), 0)::int8 FROM ledger WHERE job_id = $1 AND kind = 'refund'")
            .bind(job)
            .fetch_one(&mut *tx)
            .await?;
    if !sluice_types::settlement::answered_parts_served(i64::from(cost), refunded) {
        return Ok(false);
    }
    sqlx::query("INSERT INTO parts_read (job_id) VALUES ($1) ON CONFLICT (job_id) DO NOTHING")
        .bind(job)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(true)
}

/// What is answered so far of `job`'s own text (level 0), to read while the rest runs or
/// after it failed (until its parts go with its replay window).
pub async fn answered_so_far(pool: &PgPool, job: Uuid) -> Result<AnsweredSoFar> {
    let rows: Vec<(i32, Option<String>)> =
        sqlx::query_as("SELECT idx, output FROM job_parts WHERE job_id = $1 AND level = 0 ORDER BY idx")
            .bind(job)
            .fetch_all(pool)
            .await?;
    Ok(AnsweredSoFar {
        total: rows.len(),
        answered: rows.into_iter().filter_map(|(idx, output)| Some((idx, output?))).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::AnsweredSoFar;

    #[test]
    fn parts_not_done_are_marked_in_their_place() {
        let so_far = AnsweredSoFar { total: 4, answered: vec![(0, "One.\n".into()), (2, "Three.".into())] };
        assert_eq!(so_far.markdown(), "One.\n\n*[part 2 of 4 is not done]*\n\nThree.\n\n*[part 4 of 4 is not done]*");
        assert_eq!(AnsweredSoFar::default().markdown(), "");
    }
}
