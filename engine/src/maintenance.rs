//! Background upkeep, one loop per process (the periodic tasks taking turns across processes): rescue jobs whose worker vanished, prune old jobs
//! and their documents (and stored documents no job needs), reconcile the books (reporting only), and forget old failed logins. It
//! spans the queue, documents and accounts, so it lives beside them rather than in any.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::documents::sweep::delete_documents_of;
use crate::documents::Blobs;
use crate::periodic::{ask_every, start_clock, take_turn};
use crate::queue::hooks::TerminalHooks;
use crate::queue::policy::retry::RetryPolicy;
use crate::queue::rescue::rescue_expired;
use crate::queue::retention::{prune, Retention};

/// How often each upkeep task runs, and what retention keeps.
#[derive(Clone, Copy, Debug)]
pub struct MaintenanceConfig {
    /// Lease rescue: well under the lease (60 s), so a crashed worker's job waits little.
    pub rescue_every: Duration,
    /// Retention pruning.
    pub prune_every: Duration,
    /// Releasing documents no job needs (canceled, failed past the inspection window).
    pub release_every: Duration,
    pub retention: Retention,
    /// Forgetting failed logins older than `login_window`.
    pub account_upkeep_every: Duration,
    pub login_window: Duration,
    /// Reconciliation runs (reports only; see [`crate::reconcile`]).
    pub reconcile_every: Duration,
    /// Delivered and given-up webhook deliveries are kept this long (pruned with the logins).
    pub webhook_retention: Duration,
    /// Reconciliation reports and resolved alert firings are kept this long.
    pub evidence_retention: Duration,
    /// Client `Idempotency-Key`s are forgotten this long after their job was accepted.
    pub client_key_lifetime: Duration,
    /// Stored documents no job needs are deleted (with the hourly pruning) once this old.
    pub orphan_grace: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            rescue_every: Duration::from_secs(5),
            prune_every: Duration::from_secs(3600),
            release_every: Duration::from_secs(30),
            retention: Retention::default(),
            account_upkeep_every: Duration::from_secs(3600),
            login_window: crate::accounts::login::LoginLimits::default().window,
            reconcile_every: Duration::from_secs(3600),
            webhook_retention: Duration::from_secs(7 * 86_400),
            evidence_retention: Duration::from_secs(90 * 86_400),
            client_key_lifetime: crate::accounts::admission::CLIENT_KEY_LIFETIME,
            orphan_grace: Duration::from_secs(3600),
        }
    }
}

/// Run every upkeep task on its own schedule until aborted. Lease rescue and document release
/// run in every process (they are idempotent and must be prompt); pruning, account upkeep and
/// reconciliation run once per interval across all processes ([`crate::periodic`]).
pub async fn run(
    pool: PgPool,
    hooks: Arc<dyn TerminalHooks>,
    policy: RetryPolicy,
    config: MaintenanceConfig,
    blobs: Option<Blobs>,
) {
    let runner = format!("pid {}", std::process::id());
    let mut rescue_tick = tokio::time::interval(config.rescue_every);
    let mut release_tick = tokio::time::interval(config.release_every);
    let mut prune_tick = tokio::time::interval(ask_every(config.prune_every));
    let mut account_tick = tokio::time::interval(ask_every(config.account_upkeep_every));
    let mut reconcile_tick = tokio::time::interval(ask_every(config.reconcile_every));
    // Not at start-up: a fleet restarting should not all reconcile at once.
    if let Err(e) = start_clock(&pool, RECONCILE, &runner).await {
        tracing::warn!(error = %e, "starting the reconciliation clock failed");
    }
    let turn = |task: &'static str, every: Duration| {
        let (pool, runner) = (pool.clone(), runner.clone());
        async move {
            take_turn(&pool, task, every, &runner).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, task, "could not ask whether it is this process's turn");
                false
            })
        }
    };
    loop {
        tokio::select! {
            _ = rescue_tick.tick() => {
                if let Err(e) = crate::queue::rescue::rescue_dead_processes(&pool).await {
                    tracing::error!(error = %e, "rescue of a dead process's jobs failed");
                }
                if let Err(e) = rescue_expired(&pool, hooks.as_ref(), &policy).await {
                    tracing::error!(error = %e, "lease rescue failed");
                }
                match crate::queue::switches::resume_if_due(&pool).await {
                    Ok(true) => tracing::info!("a timed pause ended: processing resumed"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "could not check the timed pause"),
                }
            }
            _ = prune_tick.tick() => {
                if !turn(PRUNE, config.prune_every).await {
                    continue;
                }
                match prune(&pool, config.retention).await {
                    Ok(jobs) if !jobs.is_empty() => {
                        tracing::info!(jobs = jobs.len(), "pruned old jobs");
                        if let Some(blobs) = &blobs {
                            delete_documents_of(&pool, blobs, &jobs).await;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "retention pruning failed"),
                }
                if let Some(blobs) = &blobs {
                    match crate::documents::sweep::sweep_orphans(&pool, blobs, config.orphan_grace).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(documents = n, "deleted stored documents no job needs"),
                        Err(e) => tracing::warn!(error = %e, "deleting stored documents no job needs failed"),
                    }
                }
            }
            _ = release_tick.tick() => {
                if let Some(blobs) = &blobs {
                    if let Err(e) = crate::documents::kept_answers::forget_ended(&pool).await {
                        tracing::warn!(error = %e, "forgetting the kept answers of ended jobs failed");
                    }
                    if let Err(e) = crate::documents::store_space::record(&pool, blobs).await {
                        tracing::warn!(error = %e, "recording the document store's free space failed");
                    }
                    match crate::accounts::deletion::finish_deletions(&pool, blobs).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(jobs = n, "carried deletions through"),
                        Err(e) => tracing::warn!(error = %e, "carrying deletions through failed"),
                    }
                    match crate::documents::sweep::release_documents(&pool, blobs, config.retention.failed_documents).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(documents = n, "released documents no job needs"),
                        Err(e) => tracing::warn!(error = %e, "releasing documents failed"),
                    }
                }
            }
            _ = reconcile_tick.tick() => {
                if !turn(RECONCILE, config.reconcile_every).await {
                    continue;
                }
                if let Err(e) = crate::reconcile::run(&pool, blobs.as_ref(), "maintenance").await {
                    tracing::warn!(error = %e, "reconciliation failed");
                }
            }
            _ = account_tick.tick() => {
                if !turn(UPKEEP, config.account_upkeep_every).await {
                    continue;
                }
                if let Err(e) = crate::accounts::login::prune_login_failures(&pool, config.login_window).await {
                    tracing::warn!(error = %e, "pruning failed logins failed");
                }
                if let Err(e) = crate::webhooks::outbox::prune(&pool, config.webhook_retention).await {
                    tracing::warn!(error = %e, "pruning webhook deliveries failed");
                }
                // Mail keeps as long as webhook deliveries: a week, to answer "did it go out?".
                if let Err(e) = crate::mail::outbox::prune(&pool, config.webhook_retention).await {
                    tracing::warn!(error = %e, "pruning sent mail failed");
                }
                if let Err(e) = crate::accounts::links::prune(&pool).await {
                    tracing::warn!(error = %e, "pruning used and expired links failed");
                }
                if let Err(e) = crate::accounts::admission::forget_client_keys(&pool, config.client_key_lifetime).await {
                    tracing::warn!(error = %e, "forgetting old idempotency keys failed");
                }
                if let Err(e) = prune_evidence(&pool, config.evidence_retention).await {
                    tracing::warn!(error = %e, "pruning old reports and alerts failed");
                }
                if let Err(e) = crate::queue::processes::forget_stopped(&pool).await {
                    tracing::warn!(error = %e, "forgetting stopped processes failed");
                }
                if let Err(e) = crate::accounts::admission::fold_storage_deltas(&pool).await {
                    tracing::warn!(error = %e, "folding stored-bytes deltas failed");
                }
                if let Some(blobs) = &blobs {
                    let lifetime = crate::accounts::signup::UNVERIFIED_LIFETIME;
                    match crate::accounts::signup::expire_unverified(&pool, blobs, lifetime).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(accounts = n, "unverified accounts expired; their addresses are free"),
                        Err(e) => tracing::warn!(error = %e, "expiring unverified accounts failed"),
                    }
                }
            }
        }
    }
}

/// The periodic tasks' names in `periodic_runs`.
const PRUNE: &str = "retention";
const RECONCILE: &str = "reconciliation";
const UPKEEP: &str = "account_upkeep";

/// Reconciliation reports, resolved alert firings, provider cache reads, audit entries and
/// users' notices older than `keep` are deleted (the newest report is always kept: the admin
/// page and the drift alert read it). The audit log and the notices name people and jobs:
/// they are kept as long as the other evidence, not for ever.
pub async fn prune_evidence(pool: &PgPool, keep: Duration) -> crate::error::Result<u64> {
    let reports = sqlx::query(
        "DELETE FROM reconciliation_reports
         WHERE finished_at < now() - make_interval(secs => $1)
           AND id <> (SELECT max(id) FROM reconciliation_reports)",
    )
    .bind(keep.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    let alerts = sqlx::query(
        "DELETE FROM alert_firings WHERE resolved_at IS NOT NULL AND resolved_at < now() - make_interval(secs => $1)",
    )
    .bind(keep.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    let cache_reads = sqlx::query("DELETE FROM provider_cache_reads WHERE at < now() - make_interval(secs => $1)")
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected();
    let discarded = sqlx::query("DELETE FROM provider_output_discarded WHERE at < now() - make_interval(secs => $1)")
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected();
    // A batch's requests (the words it answered) go once their document has ended, and an
    // ended batch with them: they are not evidence, and no live document needs them.
    let requests = sqlx::query(
        "DELETE FROM batch_requests r WHERE NOT EXISTS (
             SELECT 1 FROM jobs j WHERE j.id = r.job_id AND j.state IN ('queued', 'retrying', 'running'))",
    )
    .execute(pool)
    .await?
    .rows_affected();
    let batches = sqlx::query(
        "DELETE FROM provider_batches b WHERE b.ended_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM batch_requests r WHERE r.batch_id = b.id)",
    )
    .execute(pool)
    .await?
    .rows_affected()
        + requests;
    let calls = sqlx::query("DELETE FROM provider_calls WHERE at < now() - make_interval(secs => $1)")
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected();
    let audit = sqlx::query("DELETE FROM audit_log WHERE at < now() - make_interval(secs => $1)")
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected();
    let notices = sqlx::query("DELETE FROM notices WHERE created_at < now() - make_interval(secs => $1)")
        .bind(keep.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected();
    Ok(reports + alerts + cache_reads + discarded + batches + calls + audit + notices)
}
