//! The webhook outbox: enqueue a delivery with the event that caused it, and deliver due
//! ones from any process (claimed with `SKIP LOCKED` and a lease, so each is sent by one
//! process at a time and a crashed sender's delivery is picked up again).
//!
//! Fair and bounded: an account has at most [`MAX_PENDING_PER_ACCOUNT`] deliveries pending,
//! whichever of its tokens they are for (past it a new one is given up at once, on the
//! record); due deliveries are taken an account at a time (alerts first, then each account's
//! oldest, then each account's second...), so one account's thousand callbacks, over however
//! many tokens, do not delay another's one; delivered and given-up rows are pruned after a
//! retention period.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use super::signing::{sign, DELIVERY_HEADER, SIGNATURE_HEADER};
use super::target::TargetPolicy;
use crate::error::Result;

/// How deliveries are made.
#[derive(Clone, Debug)]
pub struct DeliveryConfig {
    /// Where job endings may be sent.
    pub policy: TargetPolicy,
    /// The secret alert deliveries are signed with (the alert URL is the operator's own).
    pub alert_secret: Option<String>,
    /// One POST's limit, connecting included: a slow receiver holds nothing for long.
    pub timeout: Duration,
    /// Attempts before a delivery is given up (with the default backoff, about a day).
    pub max_attempts: i32,
    /// How often due deliveries are looked for.
    pub poll_every: Duration,
    /// How long a claimed delivery is kept from other senders.
    pub lease: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            policy: TargetPolicy::default(),
            alert_secret: None,
            timeout: Duration::from_secs(10),
            max_attempts: 30,
            poll_every: Duration::from_secs(2),
            lease: Duration::from_secs(60),
        }
    }
}

/// Pure: the wait after failed attempt `attempt` (1-based): 10 s doubling to at most an hour.
pub fn retry_delay(attempt: i32) -> Duration {
    let doublings = attempt.clamp(1, 20) as u32 - 1;
    Duration::from_secs(10u64.saturating_mul(1 << doublings).min(3600))
}

/// Deliveries one account may have waiting (all its tokens together); past it, new ones are
/// given up at once.
pub const MAX_PENDING_PER_ACCOUNT: i64 = 1000;

/// Queue a delivery inside the caller's transaction; a second one for the same `event_key`
/// is ignored (each event is delivered once). `token_id` names whose secret signs it; `None`
/// means an alert, signed with the operator's secret. An account with
/// [`MAX_PENDING_PER_ACCOUNT`] deliveries waiting gets this one recorded as given up, with the
/// reason.
pub async fn enqueue(
    conn: &mut PgConnection,
    event_key: &str,
    url: &str,
    token_id: Option<i64>,
    body: &Value,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "WITH pending AS (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM webhook_deliveries
                 WHERE token_id IN (SELECT mine.id FROM api_tokens mine JOIN api_tokens this ON this.user_id = mine.user_id
                                    WHERE this.id = $3)
                   AND delivered_at IS NULL AND gave_up_at IS NULL LIMIT $5) p)
         INSERT INTO webhook_deliveries (event_key, url, token_id, body, gave_up_at, last_error)
         SELECT $1, $2, $3, $4, CASE WHEN pending.n >= $5 THEN now() END,
                CASE WHEN pending.n >= $5 THEN format('%s deliveries were already waiting for this account', $5) END
         FROM pending
         ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(event_key)
    .bind(url)
    .bind(token_id)
    .bind(body)
    .bind(MAX_PENDING_PER_ACCOUNT)
    .execute(conn)
    .await?;
    Ok(())
}

/// Delete delivered and given-up deliveries that ended more than `age` ago (maintenance).
pub async fn prune(pool: &PgPool, age: Duration) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM webhook_deliveries
         WHERE (delivered_at IS NOT NULL OR gave_up_at IS NOT NULL)
           AND coalesce(delivered_at, gave_up_at) < now() - make_interval(secs => $1)",
    )
    .bind(age.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

#[derive(sqlx::FromRow)]
struct Claimed {
    id: i64,
    event_key: String,
    url: String,
    token_id: Option<i64>,
    body: Value,
    attempts: i32,
}

/// Deliveries sent at once by one process: a slow receiver holds one lane, not all.
const LANES: usize = 8;

/// Claim up to `max` due deliveries in fair order, send them [`LANES`] at a time, and record
/// what happened; returns how many were tried.
pub async fn deliver_due(pool: &PgPool, config: &DeliveryConfig, max: i64) -> Result<usize> {
    use futures::StreamExt;
    let claimed = claim_due(pool, config, max).await?;
    let tried = claimed.len();
    let results: Vec<Result<()>> = futures::stream::iter(claimed)
        .map(|delivery| async move {
            let outcome = attempt(pool, config, &delivery).await;
            record(pool, config, &delivery, outcome).await
        })
        .buffer_unordered(LANES)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(tried)
}

/// Claim up to `max` due deliveries: alerts first, then an account at a time (each account's
/// oldest, then each one's second, ...). Each gets a lease that outlasts sending the whole
/// batch (a POST's timeout plus two name lookups, per round of [`LANES`]), so no other sender
/// takes it meanwhile; a crashed sender's are due again when it ends.
async fn claim_due(pool: &PgPool, config: &DeliveryConfig, max: i64) -> Result<Vec<Claimed>> {
    let rounds = (max.max(1) as u32).div_ceil(LANES as u32);
    let lease = config.lease.max((config.timeout + LOOKUP_TIMEOUT * 2) * rounds);
    Ok(sqlx::query_as(
        "UPDATE webhook_deliveries d
         SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $1)
         WHERE d.id IN (
             SELECT id FROM webhook_deliveries
             WHERE id IN (
                 SELECT id FROM (
                     SELECT w.id, t.user_id AS account, w.next_attempt_at,
                            row_number() OVER (PARTITION BY t.user_id ORDER BY w.next_attempt_at, w.id) AS turn
                     FROM webhook_deliveries w LEFT JOIN api_tokens t ON t.id = w.token_id
                     WHERE w.delivered_at IS NULL AND w.gave_up_at IS NULL AND w.next_attempt_at <= now()) due
                 ORDER BY account IS NOT NULL, turn, next_attempt_at, id LIMIT $2)
               AND delivered_at IS NULL AND gave_up_at IS NULL AND next_attempt_at <= now()
             FOR UPDATE SKIP LOCKED)
         RETURNING d.id, d.event_key, d.url, d.token_id, d.body, d.attempts",
    )
    .bind(lease.as_secs_f64())
    .bind(max.max(0))
    .fetch_all(pool)
    .await?)
}

/// How long looking up a callback's host may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// What one POST came to.
enum Outcome {
    Delivered(u16),
    /// Worth another try later (the receiver's status, if it answered).
    Failed(Option<u16>, String),
    /// Never worth retrying (the target is not allowed, the token is gone).
    Refused(String),
}

async fn attempt(pool: &PgPool, config: &DeliveryConfig, delivery: &Claimed) -> Outcome {
    let secret = match delivery.token_id {
        None => config.alert_secret.clone(),
        Some(token) => {
            let secret: Option<Option<String>> =
                match sqlx::query_scalar("SELECT callback_secret FROM api_tokens WHERE id = $1 AND revoked_at IS NULL")
                    .bind(token)
                    .fetch_optional(pool)
                    .await
                {
                    Ok(secret) => secret,
                    Err(e) => return Outcome::Failed(None, format!("reading the token: {e}")),
                };
            match secret.flatten() {
                Some(secret) => Some(secret),
                None => return Outcome::Refused("the token was revoked or has no callback secret".into()),
            }
        }
    };
    // The operator's alert URL is trusted; a user's callback is checked where it resolves,
    // and the connection goes to the very addresses checked (no second lookup to rebind).
    let pinned = match delivery.token_id {
        None => None,
        Some(_) => match resolve_checked(&config.policy, &delivery.url).await {
            Ok(pinned) => Some(pinned),
            Err(Unreachable::Refused(why)) => return Outcome::Refused(why),
            Err(Unreachable::Lookup(why)) => return Outcome::Failed(None, why),
        },
    };
    // The event key goes inside the signed body too, so a replay cannot pass as a new event.
    let mut body = delivery.body.clone();
    if let Some(object) = body.as_object_mut() {
        object.insert("delivery".into(), delivery.event_key.clone().into());
    }
    let body = serde_json::to_vec(&body).expect("JSON serialises");
    // No proxy from the environment: it would resolve the name itself, past the checks.
    let mut client =
        reqwest::Client::builder().timeout(config.timeout).redirect(reqwest::redirect::Policy::none()).no_proxy();
    if let Some((host, addrs)) = &pinned {
        client = client.resolve_to_addrs(host, addrs);
    }
    let client = match client.build() {
        Ok(client) => client,
        Err(e) => return Outcome::Failed(None, format!("building the HTTP client: {e}")),
    };
    let mut request = client
        .post(&delivery.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(reqwest::header::USER_AGENT, "Sluice-Webhook/1")
        .header(DELIVERY_HEADER, &delivery.event_key);
    if let Some(secret) = secret {
        request = request.header(SIGNATURE_HEADER, sign(&secret, Utc::now().timestamp(), &body));
    }
    // Only the status is read: a receiver's body is never buffered.
    match request.body(body).send().await {
        Ok(response) if response.status().is_success() => Outcome::Delivered(response.status().as_u16()),
        Ok(response) => Outcome::Failed(Some(response.status().as_u16()), format!("answered {}", response.status())),
        Err(e) if e.is_timeout() => Outcome::Failed(None, "no answer in time".into()),
        Err(e) => Outcome::Failed(None, format!("could not connect: {}", e.without_url())),
    }
}

/// Why a callback cannot be reached now: for good (the policy refuses it), or for now (its
/// name did not resolve; tried again later).
enum Unreachable {
    Refused(String),
    Lookup(String),
}

/// Resolve a callback's host and check every address it gives.
async fn resolve_checked(
    policy: &TargetPolicy,
    raw: &str,
) -> std::result::Result<(String, Vec<SocketAddr>), Unreachable> {
    let url = policy.check_url(raw).map_err(Unreachable::Refused)?;
    let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = url.port_or_known_default().ok_or_else(|| Unreachable::Refused("no port".into()))?;
    let addrs: Vec<SocketAddr> = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
        .await
        .map_err(|_| Unreachable::Lookup(format!("looking up {host} took too long")))?
        .map_err(|e| Unreachable::Lookup(format!("looking up {host}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(Unreachable::Lookup(format!("{host} has no address")));
    }
    for addr in &addrs {
        policy.check_address(addr.ip()).map_err(Unreachable::Refused)?;
    }
    Ok((host, addrs))
}

async fn record(pool: &PgPool, config: &DeliveryConfig, delivery: &Claimed, outcome: Outcome) -> Result<()> {
    let (status, error, delivered, give_up) = match outcome {
        Outcome::Delivered(status) => (Some(status), None, true, false),
        Outcome::Failed(status, error) => (status, Some(error), false, delivery.attempts >= config.max_attempts),
        Outcome::Refused(error) => (None, Some(error), false, true),
    };
    metrics::counter!("sluice_webhook_attempts_total",
        "outcome" => if delivered { "delivered" } else if give_up { "gave_up" } else { "retry" })
    .increment(1);
    if let Some(error) = &error {
        tracing::warn!(delivery = delivery.id, attempt = delivery.attempts, %error, "a webhook delivery failed");
    }
    sqlx::query(
        "UPDATE webhook_deliveries SET last_status = $2, last_error = $3,
                delivered_at = CASE WHEN $4 THEN now() END,
                gave_up_at = CASE WHEN $5 THEN now() END,
                next_attempt_at = now() + make_interval(secs => $6)
         WHERE id = $1 AND attempts = $7 AND delivered_at IS NULL AND gave_up_at IS NULL",
    )
    .bind(delivery.id)
    .bind(status.map(i32::from))
    .bind(error)
    .bind(delivered)
    .bind(give_up)
    .bind(retry_delay(delivery.attempts).as_secs_f64())
    // Only this claim's attempt is recorded: a later one (after a lost lease) is not undone.
    .bind(delivery.attempts)
    .execute(pool)
    .await?;
    Ok(())
}

/// Deliver due deliveries until aborted (every process runs one; claims keep them apart).
pub async fn run(pool: PgPool, config: DeliveryConfig) {
    let mut tick = tokio::time::interval(config.poll_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Drain what is due in batches before sleeping again.
        loop {
            match deliver_due(&pool, &config, LANES as i64 * 4).await {
                Ok(n) if n == LANES * 4 => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "delivering webhooks failed");
                    break;
                }
            }
        }
    }
}

/// A delivery as an operator (or a test) sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DeliveryStatus {
    pub event_key: String,
    pub url: String,
    pub attempts: i32,
    pub delivered_at: Option<DateTime<Utc>>,
    pub gave_up_at: Option<DateTime<Utc>>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
}

/// The newest `limit` deliveries, newest first.
pub async fn recent(pool: &PgPool, limit: i64) -> Result<Vec<DeliveryStatus>> {
    Ok(sqlx::query_as(
        "SELECT event_key, url, attempts, delivered_at, gave_up_at, last_status, last_error
         FROM webhook_deliveries ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_an_hour() {
        let secs: Vec<u64> = (1..=12).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600, 3600]);
        assert_eq!(retry_delay(i32::MAX).as_secs(), 3600);
        assert_eq!(retry_delay(0).as_secs(), 10);
    }
}
