//! Building and running the application: the database, the workers, maintenance and the web
//! server, started and stopped in order (the zero2prod shape: `Application::build`, `port`,
//! `run_until_stopped`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower_sessions::session_store::ExpiredDeletion;
use tower_sessions_sqlx_store::PostgresStore;

use app::server::session::{ServerContext, WebSettings};
use engine::documents::processor::DocumentProcessor;
use engine::documents::Blobs;
use engine::queue::worker::{WorkerConfig, WorkerPool};

use crate::cli::Config;
use crate::database::{Cluster, Database};
use crate::http::serve::{serve, ConnectionLimits};
use crate::http::{leptos_options, router, AppState};

/// The connection bounds the web settings name.
fn connection_limits(settings: &WebSettings) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: settings.header_read_timeout,
        max_connections: settings.max_connections,
        max_connections_per_address: settings.max_connections_per_address,
        trusted_proxies: settings.trusted_proxies.iter().map(|ip| ip.to_canonical()).collect(),
        stalled_write_timeout: settings.stalled_write_timeout,
        ..ConnectionLimits::default()
    }
}

/// A built application: listening, workers and maintenance running, ready to serve.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    connections: ConnectionLimits,
    pool: PgPool,
    database: Database,
    workers: Option<WorkerPool>,
    background: Vec<JoinHandle<()>>,
    /// The name a process without workers records itself under (the pools retire their own).
    presence: Option<String>,
}

/// What a process runs: everything (`serve`), or one side, so the web and the workers can be
/// scaled and placed apart (they meet only in Postgres: the gate, the kill switch and the fair
/// claim are all in the claim's transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The web app, the workers and maintenance.
    All,
    /// The web app and maintenance; no workers.
    Web,
    /// The workers and maintenance; HTTP only for `/healthz`.
    Worker,
}

impl Application {
    /// Take the port, open the database (the embedded default without `DATABASE_URL`), run
    /// the migrations, and start what `role` runs.
    pub async fn build(config: &Config, role: Role) -> anyhow::Result<Application> {
        // Take the port first: if it is busy, fail before touching the database.
        let listener =
            TcpListener::bind(config.server.bind).await.with_context(|| format!("binding {}", config.server.bind))?;
        let database = Database::open(config, Cluster::Own).await?;
        match Self::start(config, role, listener, database).await {
            Ok(app) => Ok(app),
            Err((e, database)) => {
                database.close().await;
                Err(e)
            }
        }
    }

    async fn start(
        config: &Config,
        role: Role,
        listener: TcpListener,
        database: Database,
    ) -> Result<Application, (anyhow::Error, Database)> {
        let built = async {
            // A worker holds a connection only to write (never across a provider call), so 70
            // slots do not need 70 connections; Postgres allows 100 in all by default. Three
            // pools: the workers' and the upkeep's (waiting up to 10 s), the web requests'
            // (a second, then 503), and two connections for health checks and the console.
            // At most 40 for one process of every role, 32 for a web-only one and 31 for a
            // worker-only one: one web process and two workers stay within Postgres' default
            // 100 (97 for clients).
            let (work, requests) = match role {
                Role::Web => (6, 24),
                Role::Worker => ((config.workers.workers.min(24) as u32 + 4).max(12), 1),
                Role::All => ((config.workers.workers.min(24) as u32 + 4).max(12), 10),
            };
            let pool = engine::db::connect(&database.url, work)
                .await
                .context("connecting to Postgres and running migrations")?;
            let options = (*pool.connect_options()).clone();
            let request_pool = engine::db::open_pool(options.clone(), requests, engine::db::REQUEST_ACQUIRE)
                .await
                .context("connecting the web requests' pool")?;
            let reserved_pool = engine::db::open_pool(options, 2, engine::db::REQUEST_ACQUIRE)
                .await
                .context("connecting the console's pool")?;
            let hooks = Arc::new(engine::hooks::SluiceHooks);
            let blobs = config.blobs()?;
            let provider_config = config.provider.provider_config();
            let provider: Arc<dyn engine::documents::providers::Provider> =
                match config.provider.deployments().map_err(anyhow::Error::msg)? {
                    Some(deployments) => {
                        let names: Vec<&str> = deployments.iter().map(|d| d.name.as_str()).collect();
                        tracing::info!(deployments = ?names, "documents go to these provider deployments, in order");
                        let rest = config.provider.rest_policy();
                        Arc::new(
                            engine::documents::providers::router::Router::start(pool.clone(), deployments, rest)
                                .await
                                .context("storing the provider deployments")?,
                        )
                    }
                    None => {
                        engine::documents::providers::router::forget_deployments(&pool)
                            .await
                            .context("forgetting an earlier providers file's deployments")?;
                        engine::documents::providers::build(&provider_config)
                    }
                };
            tracing::info!(provider = provider.name(), "documents go to this provider");
            let token_ratio = match provider_config.kind {
                engine::documents::providers::ProviderKind::Local => engine::documents::ratio::TokenRatio::fixed(1.0),
                kind => {
                    engine::documents::ratio::TokenRatio::load(&pool, kind, provider.name(), provider.model()).await
                }
            };
            let mut sandbox = config.documents.sandbox_config()?;
            sandbox.ocr = config.scans.ocr_config().map(Arc::new);
            let sandbox = Arc::new(sandbox);
            let capacity = config.provider.capacity_config();
            // The processes that call the provider own its limits: a web process started
            // without them must not switch the workers' budget off.
            if config.workers.workers > 0 && role != Role::Web {
                engine::queue::capacity::configure(&pool, &capacity).await.context("storing the provider's limits")?;
                engine::queue::lanes::configure(&pool, &config.lanes.lane_config())
                    .await
                    .context("storing the lanes")?;
            }
            let batch_poller = (config.economy_terms().is_some() && config.workers.workers > 0 && role != Role::Web)
                .then(|| provider.clone());
            let processor = Arc::new(DocumentProcessor {
                blobs: blobs.clone(),
                provider,
                sandbox: sandbox.clone(),
                stages: engine::queue::stages::StageLog::new(pool.clone()),
                budget: engine::queue::capacity::Budget::new(pool.clone(), &capacity),
                context_tokens: config.provider.context_tokens(),
                parts: engine::queue::parts::PartStore::new(pool.clone()),
                max_document_tokens: config.admission.document_ceiling(),
                settle_held: Some(engine::documents::processor::HoldSettlement {
                    pool: pool.clone(),
                    prices: config.admission.price_table(),
                    economy: config.economy_terms(),
                }),
                token_ratio,
                writing: Default::default(),
                economy: config.economy_terms().map(|terms| {
                    engine::documents::economy::EconomyLane::new(
                        pool.clone(),
                        Duration::from_secs_f64(terms.window_hours * 3600.0),
                    )
                }),
            });
            let worker_config =
                WorkerConfig { role: if role == Role::All { "all" } else { "worker" }, ..config.worker_config() };
            let process_name = worker_config.name.clone();
            let workers = (config.workers.workers > 0 && role != Role::Web)
                .then(|| WorkerPool::start(pool.clone(), worker_config.clone(), processor, hooks.clone()));
            tracing::info!(?role, workers = workers.is_some(), "this process's role");
            let maintenance_config = config.maintenance_config();
            let mut background = vec![tokio::spawn(engine::maintenance::run(
                pool.clone(),
                hooks,
                config.workers.retry_policy(),
                maintenance_config,
                Some(blobs.clone()),
            ))];
            // Every process evaluates alerts (an advisory lock lets one at a time) and sends
            // due webhooks (claims keep senders apart), whatever its role.
            background.push(tokio::spawn(engine::alerts::run(pool.clone(), config.alerts.alert_config()?)));
            if let Some(provider) = batch_poller {
                let every = config.admission.economy_poll();
                background.push(tokio::spawn(engine::documents::economy::run(pool.clone(), provider, every)));
            }
            background.push(tokio::spawn(engine::webhooks::outbox::run(pool.clone(), config.alerts.delivery_config())));
            // ...and sends due mail the same way.
            let mail = config.mail_config();
            mail.check().map_err(anyhow::Error::msg).context("the mail settings")?;
            for warning in mail.warnings(config.mail.public_url.is_some()) {
                tracing::warn!("{warning}");
            }
            background.push(tokio::spawn(engine::mail::outbox::run(pool.clone(), mail)));
            // A process without workers records itself too (the pools announce themselves).
            let presence = workers.is_none().then(|| {
                let role = if role == Role::Worker { "worker" } else { "web" };
                let beat = worker_config.heartbeat;
                let announcing =
                    engine::queue::processes::keep_announcing(pool.clone(), process_name.clone(), role, beat);
                background.push(tokio::spawn(announcing));
                process_name
            });
            let addr = listener.local_addr()?;
            // Downloads rebuild with slots of their own: they never hold up the workers' readers.
            let rebuilds = sandbox.with_own_readers(app::server::session::REBUILDS_AT_ONCE);
            // Surveys at upload likewise, so neither uploads nor downloads wait for the other.
            let surveys = sandbox.with_own_readers(app::server::session::SURVEYS_AT_ONCE);
            let settings = WebSettings {
                document_reader: Some(Arc::new(rebuilds)),
                survey_reader: Some(Arc::new(surveys)),
                ..config.web_settings()
            };
            let ctx = ServerContext::new(request_pool, settings, blobs).with_reserved(reserved_pool);
            let state = AppState { leptos_options: leptos_options(&config.server.site_root, addr), ctx };
            if let Some(bind) = config.telemetry.metrics_bind {
                let listener =
                    TcpListener::bind(bind).await.with_context(|| format!("binding the metrics address {bind}"))?;
                tracing::info!(%bind, "serving /metrics");
                // /healthz here too: an address only the operator's probes reach, where no
                // stranger's connections can crowd a health check out.
                let metrics = axum::Router::new()
                    .route("/metrics", axum::routing::get(crate::metrics::scrape))
                    .with_state(crate::metrics::MetricsState::new(pool.clone(), None))
                    .merge(crate::http::health_route(state.clone()));
                background.push(tokio::spawn(async move {
                    let _ = axum::serve(listener, metrics).await;
                }));
            }
            let router = if role == Role::Worker {
                crate::http::health_only(state)
            } else {
                // Building the router migrates the session store, which the cleanup then finds.
                let router = router(state, config.accounts.secure_cookies).await?;
                background.push(spawn_session_cleanup(pool.clone(), maintenance_config.account_upkeep_every));
                router
            };
            anyhow::Ok((pool, workers, background, router, presence))
        };
        match built.await {
            Ok((pool, workers, background, router, presence)) => {
                let connections = connection_limits(&config.web_settings());
                Ok(Application { listener, router, connections, pool, database, workers, background, presence })
            }
            Err(e) => Err((e, database)),
        }
    }

    /// The port the application listens on (the OS picks one for port 0).
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serve until Ctrl-C or SIGTERM, then stop in order: stop accepting, let workers finish
    /// or hand back their jobs, close the pool, stop the embedded Postgres.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application { listener, router, connections, pool, database, workers, background, presence } = self;
        tracing::info!("Sluice is listening on http://{}", listener.local_addr()?);
        let served = serve(listener, router, connections, shutdown_signal()).await;
        tracing::info!("shutting down");
        for task in background {
            task.abort();
        }
        if let Some(workers) = workers {
            let report = workers.shutdown().await;
            tracing::info!(?report, "workers stopped");
        }
        if let Some(name) = presence {
            // Stopped on purpose: off the console's list, not "stopped beating".
            if let Err(e) = engine::queue::processes::retire(&pool, &name).await {
                tracing::warn!(error = %e, "could not take this process off the list");
            }
        }
        pool.close().await;
        database.close().await;
        served.context("serving HTTP")
    }
}

/// Serve the web app alone on a random loopback port, for tests and benchmarks: no workers,
/// no maintenance, the caller's pool.
pub async fn spawn_web(pool: PgPool, settings: WebSettings, blobs: Blobs) -> anyhow::Result<SocketAddr> {
    spawn_web_wrapped(pool, settings, blobs, |router| router).await
}

/// [`spawn_web`] with its router wrapped first (tests check the API's answers this way).
pub async fn spawn_web_wrapped(
    pool: PgPool,
    settings: WebSettings,
    blobs: Blobs,
    wrap: impl FnOnce(axum::Router) -> axum::Router,
) -> anyhow::Result<SocketAddr> {
    spawn_web_with_pools(pool.clone(), pool, settings, blobs, wrap).await
}

/// [`spawn_web_wrapped`] with the web requests' pool and the one kept for health checks and
/// the console apart, as a served process has them.
pub async fn spawn_web_with_pools(
    requests: PgPool,
    reserved: PgPool,
    settings: WebSettings,
    blobs: Blobs,
    wrap: impl FnOnce(axum::Router) -> axum::Router,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let connections = connection_limits(&settings);
    let ctx = ServerContext::new(requests, settings, blobs).with_reserved(reserved);
    let app = wrap(router(AppState { leptos_options: leptos_options("target/site", addr), ctx }, false).await?);
    tokio::spawn(async move {
        let _ = serve(listener, app, connections, std::future::pending()).await;
    });
    Ok(addr)
}

/// Expired sessions are deleted on the account-upkeep schedule (the session store belongs to
/// the web layer, so this one task lives here rather than in the engine's maintenance).
fn spawn_session_cleanup(pool: PgPool, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let sessions = PostgresStore::new(pool.clone());
        let runner = format!("pid {}", std::process::id());
        let mut tick = tokio::time::interval(engine::periodic::ask_every(every));
        loop {
            tick.tick().await;
            // Once per interval across every process.
            if !engine::periodic::take_turn(&pool, "session_cleanup", every, &runner).await.unwrap_or(false) {
                continue;
            }
            if let Err(e) = sessions.delete_expired().await {
                tracing::warn!(error = %e, "deleting expired sessions failed");
            }
        }
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
