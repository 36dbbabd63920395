//! Several provider deployments behind one [`Provider`]: each call goes to the first one, in
//! the providers file's order, that is not resting and has room in its own budget; a failure
//! that is the deployment's moves the call on to the next (within the same attempt: nothing is
//! answered twice, nothing more is charged), and enough of them in a row put it to rest
//! ([`super::routing`]). Health and budgets live in `provider_deployments`, so every process
//! sees a deployment go down, rest and come back.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::PgPool;

use super::deployments::{Deployment, Limits};
use super::routing::{self, FailureRoute, RestPolicy, Standing};
use super::{build, Preset, Provider, ProviderOutput, Task};
use crate::error::Result;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;
pub use sluice_types::capacity::DeploymentState;

/// The deployments, as the router calls them.
pub struct Router {
    pool: PgPool,
    deployments: Vec<Routed>,
    rest: RestPolicy,
}

struct Routed {
    name: String,
    provider: Arc<dyn Provider>,
    /// Its batch API, when the file says it has one (`batch = true`).
    batch: Option<super::HttpProvider>,
}

impl Router {
    /// Store the deployments' order and limits for every process (a deployment whose limits
    /// changed starts with a full budget; one no longer in the file is kept, marked so, for its
    /// calls' history) and make the router.
    pub async fn start(pool: PgPool, deployments: &[Deployment], rest: RestPolicy) -> Result<Router> {
        configure(&pool, deployments).await?;
        let deployments = deployments
            .iter()
            .map(|d| Routed {
                name: d.name.clone(),
                provider: build(&d.config),
                batch: (d.batch && d.config.kind != super::ProviderKind::Local)
                    .then(|| super::HttpProvider::new(&d.config)),
            })
            .collect();
        Ok(Router { pool, deployments, rest })
    }

    fn primary(&self) -> &dyn Provider {
        self.deployments[0].provider.as_ref()
    }

    async fn standings(&self, task: &Task) -> Result<Vec<Standing>> {
        let (input, output) = needs(task);
        let rows: Vec<(String, f64, bool)> = sqlx::query_as(&format!(
            "SELECT name, greatest(coalesce(extract(epoch FROM resting_until - now())::float8, 0), 0), {ROOM}
             FROM provider_deployments WHERE in_file ORDER BY position"
        ))
        .bind(input)
        .bind(output)
        .fetch_all(&self.pool)
        .await?;
        Ok(self
            .deployments
            .iter()
            .map(|d| match rows.iter().find(|(name, ..)| *name == d.name) {
                Some((_, rest_left, has_room)) => Standing { rest_left: *rest_left, has_room: *has_room },
                None => Standing { rest_left: 0.0, has_room: true },
            })
            .collect())
    }

    /// Take a call's needs from the deployment's budget: only when it has room, unless
    /// `anyway` (the last resort: the budget goes below zero and the next calls wait).
    async fn take(&self, name: &str, task: &Task, anyway: bool) -> Result<bool> {
        let (input, output) = needs(task);
        let taken = sqlx::query(&format!(
            "UPDATE provider_deployments SET
                level_requests = {REFILL_REQUESTS} - least(1, {CAP_REQUESTS}),
                level_input = {REFILL_INPUT} - least($1, {CAP_INPUT}),
                level_output = {REFILL_OUTPUT} - least($2, {CAP_OUTPUT}),
                levels_at = clock_timestamp()
             WHERE name = $3 AND ($4 OR {ROOM})"
        ))
        .bind(input)
        .bind(output)
        .bind(name)
        .bind(anyway)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(taken > 0)
    }

    /// A failure of the deployment's own counts toward its rest, unless it rests already (the
    /// calls in flight when it went down fail together: one outage, not fifty).
    async fn failed(&self, name: &str, error: &JobError) -> Result<()> {
        let in_a_row: Option<i32> = sqlx::query_scalar(
            "UPDATE provider_deployments SET failures_in_a_row = failures_in_a_row + 1, last_failure = $2,
                    last_failure_at = now()
             WHERE name = $1 AND (resting_until IS NULL OR resting_until <= now())
             RETURNING failures_in_a_row",
        )
        .bind(name)
        .bind(&error.message)
        .fetch_optional(&self.pool)
        .await?;
        let Some(in_a_row) = in_a_row else { return Ok(()) };
        if let Some(rest) = routing::rest_after(&self.rest, in_a_row.max(0) as u32) {
            sqlx::query(
                "UPDATE provider_deployments
                 SET resting_until = greatest(coalesce(resting_until, now()), now() + make_interval(secs => $2)),
                     resting_since = coalesce(resting_since, now())
                 WHERE name = $1",
            )
            .bind(name)
            .bind(rest.as_secs_f64())
            .execute(&self.pool)
            .await?;
            tracing::warn!(
                deployment = name,
                failures_in_a_row = in_a_row,
                rest_secs = rest.as_secs_f64(),
                "a provider deployment rests"
            );
        }
        Ok(())
    }

    /// A success ends a rest and the failures in a row, when the call began after they did (a
    /// call sent before the outage and answered late proves nothing); written only when it
    /// changes something, or every 10 s for the console's "last answered".
    async fn answered(&self, name: &str, began: chrono::DateTime<chrono::Utc>) -> Result<()> {
        sqlx::query(
            "UPDATE provider_deployments SET
                failures_in_a_row = CASE WHEN recovered THEN 0 ELSE failures_in_a_row END,
                resting_until = CASE WHEN recovered THEN NULL ELSE resting_until END,
                resting_since = CASE WHEN recovered THEN NULL ELSE resting_since END,
                last_success_at = now()
             FROM (SELECT last_failure_at IS NULL OR last_failure_at <= $2 AS recovered
                   FROM provider_deployments WHERE name = $1) r
             WHERE name = $1 AND (failures_in_a_row > 0 OR resting_since IS NOT NULL
                                  OR last_success_at IS NULL OR last_success_at < now() - interval '10 seconds')",
        )
        .bind(name)
        .bind(began)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A 429: the deployment's budget is spent for now, whatever our count said.
    async fn limited(&self, name: &str) -> Result<()> {
        sqlx::query(
            "UPDATE provider_deployments SET level_requests = least(level_requests, 0), level_input = least(level_input, 0),
                    level_output = least(level_output, 0), levels_at = clock_timestamp()
             WHERE name = $1",
        )
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn route(&self, task: &Task) -> std::result::Result<ProviderOutput, JobError> {
        let unavailable = |e: crate::error::EngineError| {
            tracing::warn!(error = %e, "the provider deployments' state could not be read");
            JobError::new(ErrorClass::Connection, "the provider could not be reached")
        };
        let standings = self.standings(task).await.map_err(unavailable)?;
        let order = routing::order(&standings);
        let mut moved_on: Vec<(String, String)> = Vec::new();
        let mut errors: Vec<JobError> = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let deployment = &self.deployments[i];
            let last_resort = k + 1 == order.len() && moved_on.is_empty();
            if !self.take(&deployment.name, task, last_resort).await.map_err(unavailable)? && !last_resort {
                continue; // another process took its room meanwhile
            }
            let began = chrono::Utc::now();
            match deployment.provider.run(task).await {
                Ok(mut output) => {
                    if let Err(e) = self.answered(&deployment.name, began).await {
                        tracing::warn!(error = %e, "could not record a deployment's answer");
                    }
                    // One deployment's rate-limit headers say nothing of the others'.
                    if self.deployments.len() > 1 {
                        output.remaining = Default::default();
                    }
                    output.deployment = Some(deployment.name.clone());
                    output.moved_on = moved_on;
                    return Ok(output);
                }
                Err(error) => {
                    let route = routing::on_failure(error.class);
                    let recorded = match route {
                        FailureRoute::Stop => return Err(error),
                        FailureRoute::CountAndMoveOn => self.failed(&deployment.name, &error).await,
                        FailureRoute::MoveOn if error.class == ErrorClass::RateLimited => {
                            self.limited(&deployment.name).await
                        }
                        FailureRoute::MoveOn => Ok(()),
                    };
                    if let Err(e) = recorded {
                        tracing::warn!(error = %e, "could not record a deployment's failure");
                    }
                    tracing::info!(deployment = %deployment.name, error = %error.message, "moving the call to the next deployment");
                    moved_on.push((deployment.name.clone(), error.message.clone()));
                    errors.push(error);
                }
            }
        }
        Err(final_error(errors))
    }
}

/// The error a call that every deployment failed ends with: a passing one's (an outage is
/// retried) over a spent account's (which holds all processing: only when every deployment's
/// is spent) over a lasting one (a wrong key on a fallback must not fail a document the
/// primary only dropped for a moment), the latest of each; said in words that name no
/// deployment (users read it).
fn final_error(mut errors: Vec<JobError>) -> JobError {
    let tried = errors.len();
    let passing = |e: &JobError| e.class.is_transient() && e.class != ErrorClass::QuotaExhausted;
    let chosen = errors.iter().rposition(passing).or_else(|| errors.iter().rposition(|e| e.class.is_transient()));
    let mut error = match chosen {
        Some(i) => errors.swap_remove(i),
        None => {
            errors.pop().unwrap_or_else(|| JobError::new(ErrorClass::Connection, "the provider could not be reached"))
        }
    };
    if tried > 1 {
        error.message = format!("{} (all {tried} provider deployments failed)", error.message);
    }
    error
}

/// What a call takes from a budget: its input as counted, and the output it asks for.
fn needs(task: &Task) -> (f64, f64) {
    (task.estimated_tokens().max(0) as f64, f64::from(task.answer_tokens.unwrap_or(1024)))
}

// Each deployment's budget holds a minute of its rate (as the vendors' do) and plans to use
// 0.95 of it (the claim's budget paces all of them together). A bucket refilled to now:
macro_rules! refill {
    ($limit:literal, $level:literal) => {
        concat!(
            "(CASE WHEN ",
            $limit,
            " IS NULL THEN 'Infinity'::float8 ELSE least(",
            $limit,
            " * 0.95 * 60.0 / 60.0, ",
            $level,
            " + ",
            $limit,
            " * 0.95 / 60.0 * extract(epoch FROM clock_timestamp() - levels_at)) END)"
        )
    };
}
macro_rules! cap {
    ($limit:literal) => {
        concat!("coalesce(", $limit, " * 0.95 * 60.0 / 60.0, 'Infinity'::float8)")
    };
}
const REFILL_REQUESTS: &str = refill!("limit_requests_per_min", "level_requests");
const REFILL_INPUT: &str = refill!("limit_input_tokens_per_min", "level_input");
const REFILL_OUTPUT: &str = refill!("limit_output_tokens_per_min", "level_output");
const CAP_REQUESTS: &str = cap!("limit_requests_per_min");
const CAP_INPUT: &str = cap!("limit_input_tokens_per_min");
const CAP_OUTPUT: &str = cap!("limit_output_tokens_per_min");
/// Room for a call of `$1` input and `$2` output tokens (a call larger than a whole bucket
/// needs the whole bucket).
const ROOM: &str = concat!(
    "(",
    refill!("limit_requests_per_min", "level_requests"),
    " >= least(1, ",
    cap!("limit_requests_per_min"),
    ") AND ",
    refill!("limit_input_tokens_per_min", "level_input"),
    " >= least($1, ",
    cap!("limit_input_tokens_per_min"),
    ") AND ",
    refill!("limit_output_tokens_per_min", "level_output"),
    " >= least($2, ",
    cap!("limit_output_tokens_per_min"),
    "))"
);

async fn configure(pool: &PgPool, deployments: &[Deployment]) -> Result<()> {
    let mut tx = pool.begin().await?;
    // Processes starting together write the rows one after the other (no deadlock between
    // two files' orders).
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('provider_deployments'))").execute(&mut *tx).await?;
    sqlx::query("UPDATE provider_deployments SET in_file = false").execute(&mut *tx).await?;
    for (position, d) in deployments.iter().enumerate() {
        let limit = |v: Option<u64>| v.map(|v| v.min(i64::MAX as u64) as i64);
        let Limits { requests_per_min, input_tokens_per_min, output_tokens_per_min, .. } = d.limits;
        sqlx::query(concat!(
            "INSERT INTO provider_deployments AS d (name, position, kind, model, limit_requests_per_min,
                    limit_input_tokens_per_min, limit_output_tokens_per_min, in_file)
             VALUES ($1, $2, $3, $4, $5, $6, $7, true)
             ON CONFLICT (name) DO UPDATE SET position = $2, kind = $3, model = $4, in_file = true,
                 level_requests = CASE WHEN d.limit_requests_per_min IS NOT DISTINCT FROM $5 THEN d.level_requests
                                       ELSE ",
            cap!("$5"),
            " END,
                 level_input = CASE WHEN d.limit_input_tokens_per_min IS NOT DISTINCT FROM $6 THEN d.level_input
                                    ELSE ",
            cap!("$6"),
            " END,
                 level_output = CASE WHEN d.limit_output_tokens_per_min IS NOT DISTINCT FROM $7 THEN d.level_output
                                     ELSE ",
            cap!("$7"),
            " END,
                 limit_requests_per_min = $5, limit_input_tokens_per_min = $6, limit_output_tokens_per_min = $7"
        ))
        .bind(&d.name)
        .bind(position as i32)
        .bind(format!("{:?}", d.config.kind).to_lowercase())
        .bind(&d.config.model)
        .bind(limit(requests_per_min))
        .bind(limit(input_tokens_per_min))
        .bind(limit(output_tokens_per_min))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

impl Provider for Router {
    /// The primary's: what is learned of the model (its tokenizer, its expansion) is kept
    /// under it; the deployments serve one model family.
    fn name(&self) -> &'static str {
        self.primary().name()
    }
    fn supports(&self, preset: Preset) -> bool {
        self.deployments.iter().all(|d| d.provider.supports(preset))
    }
    /// The shortest answer any deployment allows: a part may go to any.
    fn max_output_tokens(&self) -> Option<u64> {
        self.deployments.iter().filter_map(|d| d.provider.max_output_tokens()).min()
    }
    fn reasons(&self) -> bool {
        self.deployments.iter().any(|d| d.provider.reasons())
    }
    fn model(&self) -> &str {
        self.primary().model()
    }
    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, std::result::Result<ProviderOutput, JobError>> {
        Box::pin(self.route(task))
    }
    /// The first deployment with a batch API (in the file's order), or the one named.
    fn batch_api(&self, deployment: Option<&str>) -> Option<(String, &super::HttpProvider)> {
        self.deployments
            .iter()
            .filter(|d| deployment.is_none_or(|name| name == d.name))
            .find_map(|d| d.batch.as_ref().map(|api| (d.name.clone(), api)))
    }
}

/// No providers file: the deployments of an earlier one are history, shown and alerted on no
/// more.
pub async fn forget_deployments(pool: &PgPool) -> Result<()> {
    sqlx::query("UPDATE provider_deployments SET in_file = false WHERE in_file").execute(pool).await?;
    Ok(())
}

/// Every deployment in the file, in its order (none when no providers file is used).
pub async fn states(pool: &PgPool) -> Result<Vec<DeploymentState>> {
    Ok(sqlx::query_as(&format!(
        "SELECT name, kind, model, failures_in_a_row,
                CASE WHEN resting_until > now() THEN extract(epoch FROM resting_until - now())::float8 END AS resting_for_secs,
                extract(epoch FROM now() - resting_since)::float8 AS failing_for_secs,
                last_failure,
                extract(epoch FROM now() - last_success_at)::float8 AS last_success_secs_ago,
                limit_requests_per_min, limit_input_tokens_per_min, limit_output_tokens_per_min,
                CASE WHEN limit_input_tokens_per_min IS NOT NULL THEN {REFILL_INPUT} END AS input_tokens_left
         FROM provider_deployments WHERE in_file ORDER BY position"
    ))
    .fetch_all(pool)
    .await?)
}

/// Record which deployment answered a job's call, and those it moved on from (for operators).
pub async fn record_calls(pool: &PgPool, job: uuid::Uuid, output: &ProviderOutput) -> Result<()> {
    let Some(answered_by) = &output.deployment else { return Ok(()) };
    let mut names: Vec<&str> = output.moved_on.iter().map(|(name, _)| name.as_str()).collect();
    let mut failures: Vec<Option<&str>> = output.moved_on.iter().map(|(_, why)| Some(why.as_str())).collect();
    names.push(answered_by);
    failures.push(None);
    sqlx::query(
        "INSERT INTO provider_calls (job_id, deployment, answered, failure)
         SELECT $1, name, failure IS NULL, failure FROM unnest($2::text[], $3::text[]) AS c (name, failure)",
    )
    .bind(job)
    .bind(&names)
    .bind(&failures)
    .execute(pool)
    .await?;
    Ok(())
}

/// One call of a job's, as the job page shows it to operators.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct CallRecord {
    pub at: chrono::DateTime<chrono::Utc>,
    pub deployment: String,
    pub answered: bool,
    pub failure: Option<String>,
}

/// A job's calls, in order (at most the last 200).
pub async fn calls_of(pool: &PgPool, job: uuid::Uuid) -> Result<Vec<CallRecord>> {
    let mut calls: Vec<CallRecord> = sqlx::query_as(
        "SELECT at, deployment, answered, failure FROM provider_calls WHERE job_id = $1 ORDER BY id DESC LIMIT 200",
    )
    .bind(job)
    .fetch_all(pool)
    .await?;
    calls.reverse();
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(class: ErrorClass) -> JobError {
        JobError::new(class, format!("{class:?}"))
    }

    #[test]
    fn a_call_every_deployment_failed_ends_with_the_error_that_lets_the_document_go_on() {
        let last = |classes: &[ErrorClass]| final_error(classes.iter().map(|c| error(*c)).collect());
        let outage_then_bad_key = last(&[ErrorClass::ServerError, ErrorClass::Rejected]);
        assert_eq!(outage_then_bad_key.class, ErrorClass::ServerError, "retried, not failed for the fallback's key");
        assert_eq!(outage_then_bad_key.message, "ServerError (all 2 provider deployments failed)");
        assert_eq!(last(&[ErrorClass::Timeout, ErrorClass::QuotaExhausted]).class, ErrorClass::Timeout);
        assert_eq!(last(&[ErrorClass::QuotaExhausted, ErrorClass::QuotaExhausted]).class, ErrorClass::QuotaExhausted);
        assert_eq!(last(&[ErrorClass::Rejected, ErrorClass::Rejected]).class, ErrorClass::Rejected);
        let one = last(&[ErrorClass::Overloaded]);
        assert_eq!(
            (one.class, one.message.as_str()),
            (ErrorClass::Overloaded, "Overloaded"),
            "one deployment: its own words"
        );
        assert_eq!(last(&[]).class, ErrorClass::Connection);
    }
}
