//! A document's answer kept before its completion is written: the worker's completer writes
//! results in batches, so a process dying in between lost a paid answer and the rescue called
//! the provider again. The processor keeps each final answer here (durably: the commit waits
//! for the WAL flush, the database's default) before handing it on; the next attempt of the
//! same job finds it and calls nobody. The upkeep forgets the answers of jobs done or canceled;
//! a failed job's stays (its last attempt's process may have died with it kept), so a replay
//! from the dead-letter queue uses it, until its document is released, the job is pruned or its
//! owner deletes it.
//!
//! A scan's text as OCR read it is kept likewise (`kept_scan_texts`): minutes of pages are not
//! read again because a provider refused once.

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

/// A scan's text as OCR read it, its pages read and its text layer's own tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct ScanText {
    pub text: String,
    pub pages_read: u32,
    pub text_layer_tokens: i64,
}

/// Keep `job`'s scan text for its next attempts (only while this attempt holds the job: one
/// that lost it keeps nothing).
pub async fn keep_scan_text(pool: &PgPool, job: &ClaimedJob, scan: &ScanText) -> Result<()> {
    sqlx::query(
        "INSERT INTO kept_scan_texts (job_id, text, pages_read, text_layer_tokens)
         SELECT id, $3, $4, $5 FROM jobs WHERE id = $1 AND lease_token = $2 AND state = 'running'
         ON CONFLICT (job_id) DO UPDATE
         SET text = EXCLUDED.text, pages_read = EXCLUDED.pages_read,
             text_layer_tokens = EXCLUDED.text_layer_tokens, kept_at = now()",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(&scan.text)
    .bind(scan.pages_read.min(i32::MAX as u32) as i32)
    .bind(scan.text_layer_tokens)
    .execute(pool)
    .await?;
    Ok(())
}

/// The scan text an earlier attempt of `job` read, if any.
pub async fn kept_scan_text(pool: &PgPool, job: Uuid) -> Result<Option<ScanText>> {
    let row: Option<(String, i32, i64)> =
        sqlx::query_as("SELECT text, pages_read, text_layer_tokens FROM kept_scan_texts WHERE job_id = $1")
            .bind(job)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(text, pages_read, text_layer_tokens)| ScanText {
        text,
        pages_read: pages_read.max(0) as u32,
        text_layer_tokens,
    }))
}

/// Forget the answers and scan texts of jobs done (their results are written) or canceled, and
/// of failed jobs whose document was released (no replay can come; what was read from it goes
/// with it). Returns how many rows went.
pub async fn forget_ended(pool: &PgPool) -> Result<u64> {
    let mut forgotten = 0;
    for table in ["kept_answers", "kept_scan_texts"] {
        let done = sqlx::query(&format!(
            "DELETE FROM {table} k USING jobs j
             WHERE k.job_id = j.id
               AND (j.state IN ('done', 'canceled') OR (j.state = 'failed' AND j.document_released_at IS NOT NULL))"
        ))
        .execute(pool)
        .await?;
        forgotten += done.rows_affected();
    }
    Ok(forgotten)
}
