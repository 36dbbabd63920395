//! Alerts: the [`rules`] evaluated every half minute by one process at a time (an advisory
//! lock), each firing kept as a row (since when, value, threshold) for the admin page, and
//! sent to the operator's webhook once when it fires and once when it resolves (through the
//! [`crate::webhooks`] outbox, in the same transaction as the firing row).

pub mod rules;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::Result;
use crate::webhooks::outbox;
pub use rules::{Observation, Rule, Thresholds};

/// How alerts are evaluated and where they go.
#[derive(Clone, Debug)]
pub struct AlertConfig {
    pub thresholds: Thresholds,
    pub every: Duration,
    /// The operator's receiver (signed with the delivery config's alert secret).
    pub webhook_url: Option<String>,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig { thresholds: Thresholds::default(), every: Duration::from_secs(30), webhook_url: None }
    }
}

/// The advisory lock that makes one process at a time the evaluator (`pg_try_advisory_xact_lock`).
pub const EVALUATOR_LOCK: i64 = 0x51CE_A1E4;

/// Calls that fail because of the provider (not the document, not a crashed worker).
const PROVIDER_FAILURES: &str =
    "('rate_limited', 'overloaded', 'server_error', 'timeout', 'connection', 'rejected', 'unfinished', 'quota_exhausted')";

/// Read what the rules look at.
pub async fn observe(pool: &PgPool) -> Result<Observation> {
    use crate::accounts::admission::{intake_state, WaitSince};
    let (backlog, oldest_wait) = intake_state(pool, i64::MAX, WaitSince::AcceptanceAcrossParts).await?;
    #[derive(sqlx::FromRow)]
    struct Row {
        processing_enabled: bool,
        stalled_secs: Option<f64>,
        dlq_added_last_hour: i64,
        provider_calls: i64,
        provider_failures: i64,
        drift: Option<i32>,
        store_free_bytes: Option<i64>,
        store_full: Option<bool>,
        provider_held: bool,
        deadlines_at_risk: i64,
        nearest_latest_start_secs: Option<f64>,
    }
    let row: Row = sqlx::query_as(&format!(
        "SELECT (SELECT processing_enabled FROM queue_settings WHERE id = 1) AS processing_enabled,
                (SELECT NOT processing_enabled AND processing_changed_by = $1 FROM queue_settings WHERE id = 1)
                    AS provider_held,
                extract(epoch FROM now() - greatest(
                    (SELECT max(finished_at) FROM jobs WHERE finished_at IS NOT NULL),
                    (SELECT max(resumed_at) FROM processing_pauses),
                    (SELECT min(run_at) FROM waiting_jobs WHERE run_at <= now())))::float8 AS stalled_secs,
                (SELECT count(*) FROM jobs WHERE state = 'failed' AND finished_at > now() - interval '1 hour')
                    AS dlq_added_last_hour,
                a.calls AS provider_calls, a.failures AS provider_failures,
                (SELECT found FROM reconciliation_reports ORDER BY finished_at DESC, id DESC LIMIT 1) AS drift,
                s.free_bytes AS store_free_bytes, s.full_at > now() - interval '90 seconds' AS store_full,
                d.at_risk AS deadlines_at_risk, d.nearest AS nearest_latest_start_secs
         FROM (SELECT NULL) one
         CROSS JOIN (SELECT count(*) AS at_risk, extract(epoch FROM min(w.latest_start) - now())::float8 AS nearest
                     FROM waiting_jobs w, queue_settings q
                     WHERE q.id = 1 AND w.latest_start IS NOT NULL AND w.due_by >= now()
                       AND w.latest_start <= now() + make_interval(secs => q.deadline_lead_secs)) d
         LEFT JOIN blob_store_space s ON s.checked_at > now() - interval '5 minutes'
         CROSS JOIN (SELECT count(*) FILTER (WHERE outcome = 'succeeded' OR error_class IN {PROVIDER_FAILURES}) AS calls,
                      count(*) FILTER (WHERE error_class IN {PROVIDER_FAILURES}) AS failures
               FROM attempt_history WHERE finished_at > now() - interval '15 minutes') a"
    ))
    .bind(crate::queue::switches::PROVIDER_HOLD_ACTOR)
    .fetch_one(pool)
    .await?;
    Ok(Observation {
        backlog,
        oldest_wait_secs: oldest_wait.map(|w| w.as_secs_f64()),
        processing_enabled: row.processing_enabled,
        stalled_secs: row.stalled_secs,
        dlq_depth: crate::queue::dlq::depth(pool).await?,
        dlq_added_last_hour: row.dlq_added_last_hour,
        provider_calls: row.provider_calls,
        provider_failures: row.provider_failures,
        drift: row.drift.map(i64::from),
        store_free_bytes: row.store_free_bytes,
        store_full: row.store_full.unwrap_or(false),
        provider_held: row.provider_held,
        deadlines_at_risk: row.deadlines_at_risk,
        nearest_latest_start_secs: row.nearest_latest_start_secs,
        primary: sqlx::query_as(
            "SELECT name, extract(epoch FROM now() - resting_since)::float8 FROM provider_deployments
             WHERE in_file ORDER BY position LIMIT 1",
        )
        .fetch_optional(pool)
        .await?,
    })
}

/// A firing, as the admin page and the webhook show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Firing {
    pub id: i64,
    pub rule: String,
    pub fired_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub value: f64,
    pub threshold: f64,
    pub detail: String,
    /// Who acknowledged it, when and with what note (sent with the `resolved` event).
    pub acked_by: Option<String>,
    pub acked_at: Option<DateTime<Utc>>,
    pub ack_note: Option<String>,
}

impl Firing {
    /// Queue this firing's `fired` or `resolved` event for the operator's webhook, if set
    /// (once: the event key is the firing and the event).
    async fn send(&self, tx: &mut sqlx::PgConnection, config: &AlertConfig, event: &str) -> Result<()> {
        if let Some(url) = &config.webhook_url {
            let body = serde_json::json!({ "event": format!("alert.{event}"), "alert": self });
            outbox::enqueue(tx, &format!("alert:{}:{event}", self.id), url, None, &body).await?;
        }
        Ok(())
    }
}

/// Evaluate the rules once and record what changed; `None` when another process is
/// evaluating right now.
pub async fn evaluate_once(pool: &PgPool, config: &AlertConfig) -> Result<Option<rules::Transitions>> {
    let mut tx = pool.begin().await?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(EVALUATOR_LOCK).fetch_one(&mut *tx).await?;
    if !ours {
        return Ok(None);
    }
    let observation = observe(pool).await?;
    let open: Vec<(String, f64)> = sqlx::query_as(
        "SELECT rule, extract(epoch FROM now() - fired_at)::float8 FROM alert_firings WHERE resolved_at IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    let before: Vec<(Rule, f64)> = open.iter().filter_map(|(r, secs)| Some((Rule::parse(r)?, *secs))).collect();
    let readings = rules::evaluate(&observation, &config.thresholds);
    for reading in &readings {
        metrics::gauge!("sluice_alert_firing", "rule" => reading.rule.as_str()).set(if reading.firing {
            1.0
        } else {
            0.0
        });
    }
    let changes = rules::transitions(&before, readings, config.thresholds.min_firing_secs);
    for reading in &changes.fired {
        let firing: Firing = sqlx::query_as(
            "INSERT INTO alert_firings (rule, value, threshold, detail) VALUES ($1, $2, $3, $4) RETURNING *",
        )
        .bind(reading.rule.as_str())
        .bind(reading.value)
        .bind(reading.threshold)
        .bind(&reading.detail)
        .fetch_one(&mut *tx)
        .await?;
        tracing::warn!(rule = firing.rule, value = firing.value, threshold = firing.threshold, "alert firing");
        firing.send(&mut tx, config, "fired").await?;
    }
    for reading in &changes.still {
        sqlx::query("UPDATE alert_firings SET value = $2, detail = $3 WHERE rule = $1 AND resolved_at IS NULL")
            .bind(reading.rule.as_str())
            .bind(reading.value)
            .bind(&reading.detail)
            .execute(&mut *tx)
            .await?;
    }
    for rule in &changes.resolved {
        let firing: Firing = sqlx::query_as(
            "UPDATE alert_firings SET resolved_at = now() WHERE rule = $1 AND resolved_at IS NULL RETURNING *",
        )
        .bind(rule.as_str())
        .fetch_one(&mut *tx)
        .await?;
        tracing::info!(rule = firing.rule, "alert resolved");
        firing.send(&mut tx, config, "resolved").await?;
    }
    tx.commit().await?;
    Ok(Some(changes))
}

/// The alerts firing now, oldest first.
pub async fn firing(pool: &PgPool) -> Result<Vec<Firing>> {
    Ok(sqlx::query_as("SELECT * FROM alert_firings WHERE resolved_at IS NULL ORDER BY fired_at, id")
        .fetch_all(pool)
        .await?)
}

/// The newest `limit` firings, resolved or not.
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<Firing>> {
    Ok(sqlx::query_as("SELECT * FROM alert_firings ORDER BY fired_at DESC, id DESC LIMIT $1")
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// Evaluate on schedule until aborted. Every process runs this; one round per interval runs
/// across all of them ([`crate::periodic`]), and the lock keeps rounds from overlapping.
pub async fn run(pool: PgPool, config: AlertConfig) {
    let runner = format!("pid {}", std::process::id());
    let mut tick = tokio::time::interval(crate::periodic::ask_every(config.every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match crate::periodic::take_turn(&pool, "alerts", config.every, &runner).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "could not ask whether it is this process's turn to evaluate alerts");
                continue;
            }
        }
        if let Err(e) = evaluate_once(&pool, &config).await {
            tracing::warn!(error = %e, "evaluating alerts failed");
        }
    }
}
