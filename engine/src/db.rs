//! Connecting to Postgres and running the engine's migrations.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::error::Result;

/// The engine's migrations, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A pooled connection idle longer than this is pinged before use.
const IDLE_BEFORE_PING: Duration = Duration::from_millis(500);

/// Connect a pool sized for `connections` and run the migrations.
pub async fn connect(url: &str, connections: u32) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(10))
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
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// The server's version string, for `/healthz`.
pub async fn server_version(pool: &PgPool) -> Result<String> {
    Ok(sqlx::query_scalar("SHOW server_version").fetch_one(pool).await?)
}
