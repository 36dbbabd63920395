//! Connecting to Postgres and running the engine's migrations.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::error::Result;

/// The engine's migrations, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Connect a pool sized for `connections` and run the migrations.
pub async fn connect(url: &str, connections: u32) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// The server's version string, for `/healthz`.
pub async fn server_version(pool: &PgPool) -> Result<String> {
    Ok(sqlx::query_scalar("SHOW server_version").fetch_one(pool).await?)
}
