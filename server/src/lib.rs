//! The Sluice server: configuration, the embedded Postgres default, the axum router and the
//! worker runtime's start-up. `main.rs` only parses the command line.

pub mod cli;
pub mod config;
pub mod csrf;
pub mod rest;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use leptos::prelude::*;
use leptos_axum::{generate_route_list, LeptosRoutes};
use sqlx::PgPool;
use tower_sessions::cookie::SameSite;
use tower_sessions::session_store::ExpiredDeletion;
use tower_sessions::{Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::PostgresStore;

use app::handlers::ServerContext;
use app::{shell, App};
use config::Config;
use engine::ledger::AccountHooks;
use engine::processing::DocumentProcessor;
use engine::worker::{WorkerConfig, WorkerPool};

pub fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}

/// Everything a request handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub leptos_options: LeptosOptions,
    pub ctx: ServerContext,
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}

pub fn leptos_options(site_root: &str, addr: SocketAddr) -> LeptosOptions {
    LeptosOptions::builder().output_name("sluice").site_root(site_root).site_pkg_dir("pkg").site_addr(addr).build()
}

/// The whole HTTP surface: Leptos pages and server functions, the REST API, `/healthz`,
/// static files; sessions in Postgres; cross-site writes refused.
pub async fn router(state: AppState, secure_cookies: bool) -> anyhow::Result<Router> {
    let store = PostgresStore::new(state.ctx.pool.clone());
    store.migrate().await.context("session store migration")?;
    let sessions = SessionManagerLayer::new(store)
        .with_name("sluice_session")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(secure_cookies)
        .with_expiry(Expiry::OnInactivity(time::Duration::days(7)));
    let routes = generate_route_list(App);
    let ctx = state.ctx.clone();
    let api = Router::new()
        .route("/api/v1/jobs", post(rest::create_job))
        .route("/api/v1/jobs/{id}", get(rest::get_job))
        .route("/api/v1/jobs/{id}/result", get(rest::get_result))
        .route("/api/v1/jobs/{id}/result.md", get(rest::get_result_markdown))
        .route("/api/v1/jobs/{id}/original", get(rest::get_original))
        // The upload handler enforces its own cap while streaming (413).
        .layer(DefaultBodyLimit::disable());
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        .leptos_routes_with_context(&state, routes, move || provide_context(ctx.clone()), {
            let options = state.leptos_options.clone();
            move || shell(options.clone())
        })
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(middleware::from_fn(csrf::refuse_cross_site))
        .layer(sessions)
        .with_state(state))
}

/// Hourly upkeep for accounts: delete expired sessions and forget old failed logins.
pub fn spawn_account_upkeep(pool: PgPool, login_window: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let sessions = PostgresStore::new(pool.clone());
        let mut tick = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tick.tick().await;
            if let Err(e) = sessions.delete_expired().await {
                tracing::warn!(error = %e, "deleting expired sessions failed");
            }
            if let Err(e) = engine::accounts::prune_login_failures(&pool, login_window).await {
                tracing::warn!(error = %e, "pruning failed logins failed");
            }
        }
    })
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    match engine::db::server_version(&state.ctx.pool).await {
        Ok(version) => {
            (StatusCode::OK, Json(serde_json::json!({ "status": "ok", "database": "ok", "postgres": version })))
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "degraded", "database": "unreachable", "error": e.to_string() })),
        ),
    }
}

/// Where the database comes from: a URL, or the private cluster this process runs.
pub struct Database {
    pub url: String,
    cluster: Option<pgcluster::Cluster>,
}

impl Database {
    pub async fn open(config: &Config) -> anyhow::Result<Database> {
        if let Some(url) = &config.database_url {
            return Ok(Database { url: url.clone(), cluster: None });
        }
        let folder = config.data_dir.join("postgres");
        tracing::info!(folder = %folder.display(), "starting the embedded Postgres cluster");
        let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<pgcluster::Cluster> {
            let cluster = pgcluster::Cluster::start(&folder)?;
            cluster.create_database("sluice")?;
            Ok(cluster)
        })
        .await??;
        Ok(Database { url: cluster.url("sluice"), cluster: Some(cluster) })
    }

    /// For operator commands: use the embedded cluster a running server has up, without
    /// stopping it afterwards; start it (and stop it again) if none runs.
    pub async fn open_for_operator(config: &Config) -> anyhow::Result<Database> {
        if let Some(url) = &config.database_url {
            return Ok(Database { url: url.clone(), cluster: None });
        }
        let folder = config.data_dir.join("postgres");
        let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<pgcluster::Cluster> {
            let cluster = pgcluster::Cluster::attach_or_start(&folder)?;
            cluster.create_database("sluice")?;
            Ok(cluster)
        })
        .await??;
        Ok(Database { url: cluster.url("sluice"), cluster: Some(cluster) })
    }

    pub async fn close(mut self) {
        if let Some(mut cluster) = self.cluster.take() {
            tracing::info!("stopping the embedded Postgres cluster");
            let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
        }
    }
}

pub fn worker_config(config: &Config) -> WorkerConfig {
    WorkerConfig {
        name: format!("{}-{}", hostname(), std::process::id()),
        concurrency: config.workers,
        lease: Duration::from_secs_f64(config.lease_secs),
        heartbeat: Duration::from_secs_f64(config.heartbeat_secs),
        policy: config.retry_policy(),
        ..WorkerConfig::default()
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}

/// Retention removes jobs; this removes their documents from blob storage.
fn delete_blobs_of(blobs: engine::blobs::Blobs) -> Arc<dyn Fn(Vec<engine::maintenance::PrunedJob>) + Send + Sync> {
    Arc::new(move |jobs| {
        let blobs = blobs.clone();
        tokio::spawn(async move {
            for job in jobs {
                if let Some(key) = engine::processing::blob_key(&job.payload) {
                    if let Err(e) = blobs.delete(key).await {
                        tracing::warn!(job = %job.id, error = %e, "could not delete a pruned job's document");
                    }
                }
            }
        });
    })
}

/// Serve the app on a random loopback port (tests and benchmarks): no workers.
pub async fn spawn_web(
    pool: PgPool,
    settings: app::handlers::WebSettings,
    blobs: engine::blobs::Blobs,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let ctx = ServerContext { pool, settings: Arc::new(settings), blobs };
    let app = router(AppState { leptos_options: leptos_options("target/site", addr), ctx }, false).await?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
    });
    Ok(addr)
}

/// Run the web server and the workers until Ctrl-C or SIGTERM, then stop in order:
/// stop accepting, let workers finish or hand back their jobs, close the pool, stop Postgres.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Take the port first: if it is busy, fail before touching the database.
    let listener =
        tokio::net::TcpListener::bind(config.bind).await.with_context(|| format!("binding {}", config.bind))?;
    let database = Database::open(&config).await?;
    let result = serve_with(&config, &database.url, listener).await;
    database.close().await;
    result
}

async fn serve_with(config: &Config, url: &str, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let pool = engine::db::connect(url, (config.workers as u32 + 16).max(20))
        .await
        .context("connecting to Postgres and running migrations")?;
    let hooks: Arc<AccountHooks> = Arc::new(AccountHooks);
    let blobs = config.blobs()?;
    let provider = engine::providers::build(&config.provider_config());
    tracing::info!(provider = provider.name(), "documents go to this provider");
    let processor = Arc::new(DocumentProcessor { blobs: blobs.clone(), provider });
    let workers =
        (config.workers > 0).then(|| WorkerPool::start(pool.clone(), worker_config(config), processor, hooks.clone()));
    let maintenance = tokio::spawn(engine::maintenance::run(
        pool.clone(),
        hooks.clone(),
        config.retry_policy(),
        config.retention(),
        Duration::from_secs(5),
        Duration::from_secs(3600),
        delete_blobs_of(blobs.clone()),
    ));

    let addr = listener.local_addr()?;
    let settings = Arc::new(config.web_settings());
    let login_window = settings.login_limits.window;
    let ctx = ServerContext { pool: pool.clone(), settings, blobs };
    let state = AppState { leptos_options: leptos_options(&config.site_root, addr), ctx };
    let app = router(state, config.secure_cookies).await?;
    let account_upkeep = spawn_account_upkeep(pool.clone(), login_window);
    tracing::info!("Sluice is listening on http://{addr}");
    let served = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown_signal())
        .await;

    tracing::info!("shutting down");
    maintenance.abort();
    account_upkeep.abort();
    if let Some(workers) = workers {
        let report = workers.shutdown().await;
        tracing::info!(?report, "workers stopped");
    }
    pool.close().await;
    served.context("serving HTTP")
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
