//! Connecting to Postgres and running the engine's migrations.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::error::Result;

/// The engine's migrations, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A pooled connection idle longer than this is pinged before use.
const IDLE_BEFORE_PING: Duration = Duration::from_millis(500);

/// How long the workers and the upkeep wait for a pooled connection.
pub const WORK_ACQUIRE: Duration = Duration::from_secs(10);
/// How long a web request waits for one before it is answered 503 with `Retry-After`: a full
/// pool says "busy" within a second, not after the workers' 10 s.
pub const REQUEST_ACQUIRE: Duration = Duration::from_secs(1);

/// Connect a pool sized for `connections` and run the migrations.
pub async fn connect(url: &str, connections: u32) -> Result<PgPool> {
    let pool = open_pool(url.parse()?, connections, WORK_ACQUIRE).await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Another pool to the database `options` name (already migrated), of `connections` that are
/// waited for at most `acquire`: the web requests' own, and the few kept for health checks
/// and the console, so neither waits behind the workers or the other.
pub async fn open_pool(options: PgConnectOptions, connections: u32, acquire: Duration) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(connections.max(1))
        .acquire_timeout(acquire)
        // sqlx pings every connection it hands out by default: a round trip per query (a status
        // poll made three instead of two). Only a connection idle for a while is checked, which
        // still drops the ones a Postgres restart broke (a restart takes longer than that).
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > IDLE_BEFORE_PING {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(options)
        .await?)
}

/// Whether every connection `pool` may open is open and in use: a request would wait its
/// acquire timeout for one. The web process then reads its caller's session and account on the
/// connections kept for health and the console, so the console still answers.
pub fn is_full(pool: &PgPool) -> bool {
    pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections()
}

/// Whether `error` is a pool's acquire timing out (every connection taken), however it was
/// wrapped into text by a library in between.
pub fn is_pool_timeout_text(error: &str) -> bool {
    error == sqlx::Error::PoolTimedOut.to_string()
}

/// The server's version string, for `/healthz`.
pub async fn server_version(pool: &PgPool) -> Result<String> {
    Ok(sqlx::query_scalar("SHOW server_version").fetch_one(pool).await?)
}
