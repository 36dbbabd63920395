//! Throttles on what strangers can do often (guess passwords, sign up): a window of events per
//! key. Taking an event is atomic: the count and the insert happen under a per-key advisory
//! lock, so however many requests race, at most `limit` get through in a window.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::{EngineError, Result};

/// Pure: given the events counted in the window and the oldest one's age, how long until
/// another is allowed (None = allowed now).
pub fn wait_for(count: i64, oldest_age: Duration, limit: i64, window: Duration) -> Option<Duration> {
    (count >= limit).then(|| window.saturating_sub(oldest_age).max(Duration::from_secs(1)))
}

/// Pure: the network a throttle subject belongs to, for limits one network shares: an IPv4
/// address's /24, an IPv6 /64's /48 (what one site is given). Anything else is its own network.
pub fn network_of(subject: &str) -> String {
    if let Ok(std::net::IpAddr::V4(v4)) = subject.parse::<std::net::IpAddr>() {
        let [a, b, c, _] = v4.octets();
        return format!("{a}.{b}.{c}.0/24");
    }
    match subject.strip_suffix("::/64").map(|prefix| prefix.split(':').collect::<Vec<_>>()) {
        Some(segments) if segments.len() == 4 => format!("{}:{}:{}::/48", segments[0], segments[1], segments[2]),
        _ => subject.to_string(),
    }
}

/// One counted event, to give back if it turns out not to count (a successful log-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken(i64);

#[derive(sqlx::FromRow)]
struct Window {
    count: i64,
    oldest_secs: f64,
}

/// Take one event under `key` if fewer than `limit` happened in `window`; otherwise
/// `RateLimited` with the wait.
pub async fn take(pool: &PgPool, key: &str, limit: i64, window: Duration) -> Result<Taken> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))").bind(key).execute(&mut *tx).await?;
    let seen: Window = sqlx::query_as(
        "SELECT count(*) AS count, coalesce(extract(epoch FROM now() - min(at)), 0)::float8 AS oldest_secs
         FROM throttle_events WHERE key = $1 AND at > now() - make_interval(secs => $2)",
    )
    .bind(key)
    .bind(window.as_secs_f64())
    .fetch_one(&mut *tx)
    .await?;
    if let Some(wait) = wait_for(seen.count, Duration::from_secs_f64(seen.oldest_secs.max(0.0)), limit, window) {
        return Err(EngineError::RateLimited { retry_after_secs: wait.as_secs().max(1) });
    }
    let id: i64 = sqlx::query_scalar("INSERT INTO throttle_events (key) VALUES ($1) RETURNING id")
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Taken(id))
}

/// Take one event in each `(key, limit)` window, or none: a refusal gives back those already
/// taken. Returns the events taken, to give back if the attempt turns out not to count.
pub async fn take_all(pool: &PgPool, windows: &[(String, i64)], window: Duration) -> Result<Vec<Taken>> {
    let mut taken = Vec::with_capacity(windows.len());
    for (key, limit) in windows {
        match take(pool, key, *limit, window).await {
            Ok(t) => taken.push(t),
            Err(e) => {
                for t in taken {
                    give_back(pool, t).await?;
                }
                return Err(e);
            }
        }
    }
    Ok(taken)
}

/// Give one event back.
pub async fn give_back(pool: &PgPool, taken: Taken) -> Result<()> {
    sqlx::query("DELETE FROM throttle_events WHERE id = $1").bind(taken.0).execute(pool).await?;
    Ok(())
}

/// Forget every event under `key` (a successful log-in clears the account's failures).
pub async fn clear(pool: &PgPool, key: &str) -> Result<()> {
    sqlx::query("DELETE FROM throttle_events WHERE key = $1").bind(key).execute(pool).await?;
    Ok(())
}

/// Forget events older than `age` (called by maintenance).
pub async fn prune(pool: &PgPool, age: Duration) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM throttle_events WHERE at < now() - make_interval(secs => $1)")
        .bind(age.as_secs_f64())
        .execute(pool)
        .await?
        .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_the_ipv4_24_and_the_ipv6_48() {
        assert_eq!(network_of("198.51.100.7"), "198.51.100.0/24");
        assert_eq!(network_of("198.51.100.250"), network_of("198.51.100.1"));
        assert_ne!(network_of("198.51.101.1"), network_of("198.51.100.1"));
        assert_eq!(network_of("2001:db8:1:2::/64"), "2001:db8:1::/48");
        assert_eq!(network_of("unknown"), "unknown");
    }

    #[test]
    fn the_wait_ends_when_the_oldest_event_leaves_the_window() {
        let window = Duration::from_secs(900);
        assert_eq!(wait_for(4, Duration::from_secs(10), 5, window), None);
        assert_eq!(wait_for(5, Duration::from_secs(100), 5, window), Some(Duration::from_secs(800)));
        assert_eq!(wait_for(9, Duration::from_secs(900), 5, window), Some(Duration::from_secs(1)));
    }
}
