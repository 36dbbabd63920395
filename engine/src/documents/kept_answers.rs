//! A document's answer kept before its completion is written: the worker's completer writes
//! results in batches, so a process dying in between lost a paid answer and the rescue called
//! the provider again. The processor keeps each final answer here (durably: the commit waits
//! for the WAL flush, the database's default) before handing it on; the next attempt of the
//! same job finds it and calls nobody. The upkeep forgets the answers of jobs done or canceled;
//! a failed job's stays (its last attempt's process may have died with it kept), so a replay
//! from the dead-letter queue uses it, until its document is released, the job is pruned or its
//! owner deletes it.

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Result;
use crate::queue::{ClaimedJob, JobOutput};

/// Keep `job`'s final answer (replacing one kept before).
pub async fn keep(pool: &PgPool, job: &ClaimedJob, output: &JobOutput) -> Result<()> {
    sqlx::query(
        "INSERT INTO kept_answers (job_id, result, input_tokens, output_tokens) VALUES ($1, $2, $3, $4)
         ON CONFLICT (job_id) DO UPDATE
         SET result = EXCLUDED.result, input_tokens = EXCLUDED.input_tokens,
             output_tokens = EXCLUDED.output_tokens, kept_at = now()",
    )
    .bind(job.id)
    .bind(&output.result)
    .bind(output.input_tokens)
    .bind(output.output_tokens)
    .execute(pool)
    .await?;
    Ok(())
}

/// The answer an earlier attempt of `job` got and could not complete, if any.
pub async fn kept(pool: &PgPool, job: Uuid) -> Result<Option<JobOutput>> {
    let row: Option<(serde_json::Value, Option<i64>, Option<i64>)> =
        sqlx::query_as("SELECT result, input_tokens, output_tokens FROM kept_answers WHERE job_id = $1")
            .bind(job)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(result, input_tokens, output_tokens)| JobOutput { result, input_tokens, output_tokens, part: None }))
}

/// Forget the answers of jobs done (their results are written) or canceled, and of failed jobs
/// whose document was released (no replay can come; what was read from it goes with it).
pub async fn forget_ended(pool: &PgPool) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM kept_answers k USING jobs j
         WHERE k.job_id = j.id
           AND (j.state IN ('done', 'canceled') OR (j.state = 'failed' AND j.document_released_at IS NOT NULL))",
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
