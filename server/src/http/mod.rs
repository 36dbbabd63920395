//! The whole HTTP surface: Leptos pages and server functions, the REST API (`/api/v1`),
//! `/healthz` and static files; sessions in Postgres; cross-site writes refused.

pub mod api;
pub mod bounds;
pub mod csrf;
pub mod error;
pub mod glossaries;
pub mod jobs;
pub mod layers;
pub mod openapi;
pub mod serve;
mod sessions;
pub mod shares;
pub mod unavailable;
pub mod unsubscribe;

use std::net::SocketAddr;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use leptos::prelude::*;
use leptos_axum::{generate_route_list, LeptosRoutes};
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::PostgresStore;

use app::server::session::ServerContext;
use app::{shell, App};

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

/// Leptos' options for a site served from `site_root` at `addr`.
pub fn leptos_options(site_root: &str, addr: SocketAddr) -> LeptosOptions {
    // cargo-leptos writes `hash.txt` beside the server binary when it names assets by content.
    let hashed = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("hash.txt").exists()));
    LeptosOptions::builder()
        .output_name("sluice")
        .site_root(site_root)
        .site_pkg_dir("pkg")
        .site_addr(addr)
        .hash_files(hashed.unwrap_or(false))
        .build()
}

/// The router, with its session store migrated.
pub async fn router(state: AppState, secure_cookies: bool) -> anyhow::Result<Router> {
    let store = PostgresStore::new(state.ctx.pool.clone());
    store.migrate().await.context("session store migration")?;
    // Every process forgets revoked tokens and ended sessions as soon as it is told.
    tokio::spawn(engine::accounts::auth_cache::listen(state.ctx.pool.clone(), state.ctx.auth.clone()));
    let store = sessions::CachedStore::new(state.ctx.pool.clone(), state.ctx.reserved.clone(), state.ctx.auth.clone());
    let sessions = SessionManagerLayer::new(store)
        .with_name("sluice_session")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(secure_cookies)
        .with_expiry(Expiry::OnInactivity(time::Duration::days(7)));
    let routes = generate_route_list(App);
    let ctx = state.ctx.clone();
    let ctx_pool = state.ctx.pool.clone();
    let request_timeout = state.ctx.settings.request_timeout;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .merge(api::api_routes().split_for_parts().0)
        .merge(api::docs_routes())
        // The upload path enforces its own cap while streaming (413).
        .layer(DefaultBodyLimit::disable())
        .leptos_routes_with_context(
            &state,
            routes,
            move || {
                provide_context(ctx.clone());
                layers::page_security_policy();
            },
            {
                let options = state.leptos_options.clone();
                move || shell(options.clone())
            },
        )
        // Built assets, precompressed by the release build where it could (`.br`, `.gz`).
        .nest_service(
            "/pkg",
            tower_http::services::ServeDir::new(std::path::Path::new(&*state.leptos_options.site_root).join("pkg"))
                .precompressed_br()
                .precompressed_gzip(),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        // Inside the request timeout (a slow body is a 408) and before any handler reads it.
        .layer(middleware::from_fn(bounds::bound_body))
        .layer(middleware::from_fn(crate::metrics::record_http))
        .layer(middleware::from_fn(move |request, next| {
            layers::timeout_unless_transfer(request_timeout, request, next)
        }))
        .layer(middleware::from_fn(csrf::refuse_cross_site))
        .layer(middleware::from_fn_with_state(state.ctx.clone(), layers::admin_area_only_for_admins))
        .layer(sessions)
        .layer(middleware::from_fn_with_state(
            (ctx_pool, unavailable::DatabasePing::default()),
            unavailable::restarting_is_not_an_internal_error,
        ))
        .with_state(state.clone());
    let app = app.merge(metrics_route(&state)).merge(unsubscribe::routes(state.clone()));
    Ok(layers::around_every_request(app, secure_cookies))
}

/// A worker process's HTTP: `/healthz` for the orchestrator's probes (and `/metrics` with
/// its token).
pub fn health_only(state: AppState) -> Router {
    health_route(state.clone()).merge(metrics_route(&state))
}

/// `/healthz` alone.
pub fn health_route(state: AppState) -> Router {
    Router::new().route("/healthz", get(healthz)).with_state(state)
}

/// `/metrics` on the main address, when a token is configured (else it does not exist here).
fn metrics_route(state: &AppState) -> Router {
    match &state.ctx.settings.metrics_token {
        Some(token) => Router::new()
            .route("/metrics", get(crate::metrics::scrape))
            .with_state(crate::metrics::MetricsState::new(state.ctx.pool.clone(), Some(token.clone()))),
        None => Router::new(),
    }
}

/// 200 with the Postgres version while the database answers, else 503 (no error text).
async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    // Its own connections: a pool full of requests does not make a live server look dead.
    match engine::db::server_version(&state.ctx.reserved).await {
        Ok(version) => {
            (StatusCode::OK, Json(serde_json::json!({ "status": "ok", "database": "ok", "postgres": version })))
        }
        Err(e) => {
            // The details go to the log, not to anonymous callers.
            tracing::warn!(error = %e, "health check: the database does not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({ "status": "degraded", "database": "unreachable" })),
            )
        }
    }
}
