//! Helpers for tests and benchmarks (the engine's own and other crates'): enqueue in bulk,
//! wait for a condition, worker settings with short timings.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use crate::retry::RetryPolicy;
use crate::worker::WorkerConfig;

/// A second pool on the same database with room for `connections` (test pools are small).
pub async fn wider_pool(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .expect("a wider pool")
}

/// Enqueue `n` jobs for `owner` in one transaction; returns their ids in order.
pub async fn enqueue_many(pool: &PgPool, owner: i64, n: usize) -> Vec<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, payload, accepted_at, run_at)
         SELECT $1, jsonb_build_object('n', g), clock_timestamp(), clock_timestamp()
         FROM generate_series(1, $2) g RETURNING id",
    )
    .bind(owner)
    .bind(n as i32)
    .fetch_all(pool)
    .await
    .expect("enqueue")
}

pub async fn count_in_state(pool: &PgPool, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1").bind(state).fetch_one(pool).await.expect("count")
}

/// Poll `check` every 20 ms until it is true or `timeout` passes; returns whether it held.
pub async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Worker settings with timings short enough for tests.
pub fn fast_worker(name: &str, concurrency: usize) -> WorkerConfig {
    WorkerConfig {
        name: name.to_string(),
        concurrency,
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(400),
        poll_interval: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(5),
        policy: RetryPolicy {
            max_attempts: 3,
            delays: vec![Duration::from_millis(200), Duration::from_millis(400)],
            max_delay: Duration::from_secs(2),
            max_jitter: Duration::ZERO,
        },
    }
}
