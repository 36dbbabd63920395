//! Admission: the one conditional write that takes the credits and counts the job in flight,
//! the job insert and the ledger debit, all in one transaction. Refusals store nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{EngineError, Result};
use crate::queue::{self, NewJob};
use sluice_types::capacity::PriceTable;

use super::backlog::{BacklogGauge, BACKLOG_READING_AGE};
use super::ledger;

/// What admission charges and where it draws the line.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// Credits by the document's estimated size.
    pub prices: PriceTable,
    /// The most estimated tokens a document may have (longer than one provider call is done
    /// in parts): larger texts are refused at upload (413).
    pub max_document_tokens: Option<u64>,
    /// The most input tokens one provider call carries (its context): a longer document is
    /// done in parts, one call per claim, so its claims reserve no more than this.
    pub max_call_tokens: Option<u64>,
    /// The global intake bound: refuse new work (503) past this many waiting jobs...
    pub max_backlog: i64,
    /// ...or when the oldest waiting job has waited longer than this.
    pub max_oldest_wait: Duration,
    /// `Retry-After` for 429 (the user's in-flight limit).
    pub retry_after_busy: Duration,
    /// `Retry-After` for 503 (the intake bound).
    pub retry_after_overloaded: Duration,
    /// Attempts each admitted job gets, the first included.
    pub max_attempts: i32,
    /// The most bytes of documents one user may have stored (jobs that still keep theirs; a
    /// document shared by several jobs counts once): past it, uploads get 413 unread.
    pub storage_quota_bytes: Option<u64>,
    /// How long a client's `Idempotency-Key` names its job: a repeat within it answers that
    /// job; after it the key is forgotten and names nothing.
    pub client_key_lifetime: Duration,
    /// How long a count of the backlog under `max_backlog` stands for it ([`backlog`](super::backlog)).
    pub backlog_reading_age: Duration,
    /// This process's reading of the backlog (shared by the clones of this config).
    pub backlog: Arc<BacklogGauge>,
    /// The economy lane's terms, when the provider has a batch API (none: it is not offered).
    pub economy: Option<sluice_types::capacity::EconomyTerms>,
}

/// The default lifetime of a client's `Idempotency-Key` (Stripe's and most APIs' figure).
pub const CLIENT_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            prices: PriceTable::flat(1),
            max_document_tokens: None,
            max_call_tokens: None,
            max_backlog: 10_000,
            max_oldest_wait: Duration::from_secs(30 * 60),
            retry_after_busy: Duration::from_secs(15),
            retry_after_overloaded: Duration::from_secs(60),
            max_attempts: 3,
            storage_quota_bytes: None,
            client_key_lifetime: CLIENT_KEY_LIFETIME,
            backlog_reading_age: BACKLOG_READING_AGE,
            backlog: Arc::default(),
            economy: None,
        }
    }
}

/// A document to admit.
#[derive(Clone, Debug)]
pub struct Submission {
    pub user_id: i64,
    pub payload: Value,
    /// Same user + same bytes + same options = same job while that job is not failed.
    pub content_key: String,
    /// A REST client's `Idempotency-Key`, if sent.
    pub client_key: Option<String>,
    /// Identifies the request's payload, to tell a reused `Idempotency-Key` apart.
    pub fingerprint: String,
    /// Credits it costs (from the price table and its size).
    pub cost: i64,
    /// Input tokens its provider request is estimated at.
    pub est_input_tokens: i64,
    /// The stored document it shares with earlier jobs ("run again"), if any: admitted only
    /// while that document is still kept (checked under the document's lock, so a release
    /// cannot delete it in between).
    pub shared_document: Option<String>,
    /// What it costs if it is never settled to its text, when that is less than `cost` (a
    /// PDF's price by size: its cost is a hold). None: its cost is its price.
    pub price_by_size: Option<i64>,
    /// Its lane and deadline.
    pub lane: queue::LaneRequest,
}

/// Why a document was not admitted; nothing was stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// 402: waiting would not help.
    OutOfCredits { balance: i64, cost: i64 },
    /// 429: wait for one of your jobs to finish.
    TooManyInFlight { in_flight: i32, limit: i32, retry_after_secs: u64 },
    /// 503: the system is not accepting work now; nothing was stored.
    Overloaded { retry_after_secs: u64 },
    /// 413: the user's stored documents would pass their quota; nothing was stored.
    StorageFull { used_bytes: u64, quota_bytes: u64 },
}

/// What admission decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Accepted {
        job_id: Uuid,
    },
    /// An earlier job with the same key: no second job, no second debit.
    Existing {
        job_id: Uuid,
    },
    Refused(Refusal),
}

/// Pure: why the compound check matched no row. A short balance wins: waiting would not help.
pub fn refusal_reason(balance: i64, in_flight: i32, limit: i32, cost: i64, retry_after: Duration) -> Refusal {
    if balance < cost {
        Refusal::OutOfCredits { balance, cost }
    } else {
        Refusal::TooManyInFlight { in_flight, limit, retry_after_secs: retry_after.as_secs().max(1) }
    }
}

/// Pure: is the global intake bound exceeded?
pub fn intake_refusal(backlog: i64, oldest_wait: Option<Duration>, config: &AdmissionConfig) -> Option<Refusal> {
    let too_old = oldest_wait.is_some_and(|w| w > config.max_oldest_wait);
    (backlog >= config.max_backlog || too_old)
        .then(|| Refusal::Overloaded { retry_after_secs: config.retry_after_overloaded.as_secs().max(1) })
}

/// How the oldest waiting job's wait is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitSince {
    /// Since it fell due: what the intake bound holds (a long document in progress must not
    /// refuse everyone's uploads).
    Due,
    /// A document begun in parts from its acceptance, across all its parts (what the vital
    /// signs show and the alert fires on); any other job since it fell due.
    AcceptanceAcrossParts,
}

/// Backlog (counted up to the bound only) and the oldest waiting job's wait, not counting
/// the time processing was paused (seed 003: pause processing without refusing uploads).
pub(crate) async fn intake_state(pool: &PgPool, bound: i64, since: WaitSince) -> Result<(i64, Option<Duration>)> {
    // A document in parts waiting again (its claim's turn over, a pause, a retry) is found by
    // its own small index (`jobs_waiting_in_parts`).
    let (backlog, oldest, now): (i64, Option<DateTime<Utc>>, DateTime<Utc>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM waiting_jobs WHERE run_at <= now() LIMIT $1) b),
                least((SELECT min(run_at) FROM waiting_jobs WHERE run_at <= now()),
                      (SELECT min(accepted_at) FROM jobs
                       WHERE $2 AND state IN ('queued', 'retrying') AND parts_total IS NOT NULL AND run_at <= now()
                         -- An economy document waited for its batch, not in line.
                         AND NOT coalesce((payload ->> 'economy')::boolean, false))),
                now()",
    )
    .bind(bound)
    .bind(since == WaitSince::AcceptanceAcrossParts)
    .fetch_one(pool)
    .await?;
    let Some(oldest) = oldest else { return Ok((backlog, None)) };
    let pauses: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT paused_at, resumed_at FROM processing_pauses WHERE resumed_at IS NULL OR resumed_at > $1",
    )
    .bind(oldest)
    .fetch_all(pool)
    .await?;
    Ok((backlog, Some(wait_excluding_pauses(oldest, now, &pauses))))
}

/// Pure: the time from `since` to `now` that processing was not paused, given the pauses
/// (start, end or `None` while still paused), which may overlap `since` or each other.
pub fn wait_excluding_pauses(
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    pauses: &[(DateTime<Utc>, Option<DateTime<Utc>>)],
) -> Duration {
    let mut intervals: Vec<(DateTime<Utc>, DateTime<Utc>)> = pauses
        .iter()
        .map(|&(start, end)| (start.max(since), end.unwrap_or(now).min(now)))
        .filter(|(start, end)| start < end)
        .collect();
    intervals.sort();
    let mut paused = chrono::Duration::zero();
    let mut covered_until = since;
    for (start, end) in intervals {
        let start = start.max(covered_until);
        if end > start {
            paused += end - start;
            covered_until = end;
        }
    }
    (now - since - paused).to_std().unwrap_or_default()
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("23505"))
}

/// Before an upload's body is read: would this user be refused now, for a document costing
/// at least `cost`? Answers 402 / 429 / 503 without the server reading, storing or hashing a
/// byte. Only a hint: the conditional write in [`submit`] still decides (a check that passes
/// here can still end 402 / 429 there).
pub async fn precheck(
    pool: &PgPool,
    config: &AdmissionConfig,
    user_id: i64,
    cost: i64,
    incoming_bytes: u64,
) -> Result<Option<Refusal>> {
    let (backlog, oldest) = intake_for_admission(pool, config).await?;
    if let Some(refusal) = intake_refusal(backlog, oldest, config) {
        return Ok(Some(refusal));
    }
    if let Some(quota) = config.storage_quota_bytes {
        let used = storage_used(&mut *pool.acquire().await?, user_id).await?;
        if let Some(refusal) = storage_refusal(used, incoming_bytes, quota) {
            return Ok(Some(refusal));
        }
    }
    let (balance, in_flight, limit): (i64, i32, i32) =
        sqlx::query_as("SELECT balance, in_flight, max_in_flight FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(pool)
            .await?
            .ok_or(EngineError::NotFound)?;
    let refused = balance < cost || in_flight >= limit;
    Ok(refused.then(|| refusal_reason(balance, in_flight, limit, cost, config.retry_after_busy)))
}

/// Pure: refused when `incoming` more bytes would take a user's stored documents past `quota`.
pub fn storage_refusal(used: u64, incoming: u64, quota: u64) -> Option<Refusal> {
    let past = used.checked_add(incoming).is_none_or(|total| total > quota);
    past.then_some(Refusal::StorageFull { used_bytes: used, quota_bytes: quota })
}

/// Bytes `user_id` has stored: documents of jobs that keep theirs, a document shared by several
/// jobs ("run again") counted once, and the text and answers of their jobs' parts: the sum of
/// the deltas triggers append with every admission, release, deletion and part written
/// (migration `storage_counters`), folded hourly ([`fold_storage_deltas`]); the
/// reconciliation checks it against the rows.
pub async fn storage_used(conn: &mut sqlx::PgConnection, user_id: i64) -> Result<u64> {
    let used: i64 = sqlx::query_scalar("SELECT coalesce(sum(bytes), 0)::int8 FROM storage_deltas WHERE user_id = $1")
        .bind(user_id)
        .fetch_one(conn)
        .await?;
    Ok(used.max(0) as u64)
}

/// Fold each owner's storage deltas into one row (the upkeep; up to 1,000 owners a call).
/// Deltas appended meanwhile are not seen by the fold and stay beside its row. Returns how
/// many rows went.
pub async fn fold_storage_deltas(pool: &PgPool) -> Result<u64> {
    let folded: Option<i64> = sqlx::query_scalar(
        "WITH owners AS (SELECT user_id FROM storage_deltas GROUP BY user_id HAVING count(*) > 1 LIMIT 1000),
              gone AS (DELETE FROM storage_deltas d USING owners o WHERE d.user_id = o.user_id
                       RETURNING d.user_id, d.bytes),
              kept AS (INSERT INTO storage_deltas (user_id, bytes)
                       SELECT user_id, sum(bytes) FROM gone GROUP BY user_id HAVING sum(bytes) <> 0)
         SELECT count(*) FROM gone",
    )
    .fetch_one(pool)
    .await?;
    Ok(folded.unwrap_or(0).max(0) as u64)
}

/// Whether this user already has a job under this client `Idempotency-Key`: such a request is
/// a retry (200 with that job) or a conflict (422), which only the body can tell, so it skips
/// [`precheck`] and goes the whole way.
pub async fn client_key_used(pool: &PgPool, user_id: i64, key: &str, lifetime: Duration) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE owner_id = $1 AND client_key = $2
                                             AND accepted_at > now() - make_interval(secs => $3))",
    )
    .bind(user_id)
    .bind(key)
    .bind(lifetime.as_secs_f64())
    .fetch_one(pool)
    .await?)
}

/// When the client key of `job_id` stops naming it (None without a key).
pub async fn client_key_expires_at(
    pool: &PgPool,
    job_id: Uuid,
    key: &str,
    lifetime: Duration,
) -> Result<Option<DateTime<Utc>>> {
    // None when the job holds no key or another one (a duplicate found by its content).
    Ok(sqlx::query_scalar("SELECT accepted_at + make_interval(secs => $2) FROM jobs WHERE id = $1 AND client_key = $3")
        .bind(job_id)
        .bind(lifetime.as_secs_f64())
        .bind(key)
        .fetch_optional(pool)
        .await?)
}

/// Forget client keys older than `lifetime` (they name nothing any more; this frees them
/// for reuse and leaves no key behind). Returns how many were forgotten.
pub async fn forget_client_keys(pool: &PgPool, lifetime: Duration) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE jobs SET client_key = NULL
         WHERE client_key IS NOT NULL AND accepted_at <= now() - make_interval(secs => $1)",
    )
    .bind(lifetime.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

/// A new upload's stored document is locked until the admission commits: an abandoned
/// upload's cleanup then sees the job, or none.
async fn lock_new_document(tx: &mut sqlx::PgConnection, s: &Submission) -> Result<()> {
    match s.payload.pointer("/document/key").and_then(|v| v.as_str()) {
        Some(key) => crate::documents::custody::lock_new_document(tx, key).await,
        None => Ok(()),
    }
}

/// Admit a document: 202-worthy only after the commit.
pub async fn submit(pool: &PgPool, config: &AdmissionConfig, submission: &Submission) -> Result<Admission> {
    let (backlog, oldest) = intake_for_admission(pool, config).await?;
    if let Some(refusal) = intake_refusal(backlog, oldest, config) {
        return Ok(Admission::Refused(refusal));
    }
    // A concurrent twin (same key) may win the unique index; then the retry finds its job.
    let admitted = match try_submit(pool, config, submission).await {
        Err(EngineError::Database(e)) if is_unique_violation(&e) => try_submit(pool, config, submission).await,
        other => other,
    };
    if let Ok(Admission::Accepted { .. }) = admitted {
        config.backlog.admitted();
    }
    admitted
}

/// The backlog and the oldest wait the intake bound is checked against: the backlog from this
/// process's reading while it stands ([`backlog`](super::backlog)), else counted (up to the
/// bound) and kept; the oldest wait always read (it costs two index lookups).
async fn intake_for_admission(pool: &PgPool, config: &AdmissionConfig) -> Result<(i64, Option<Duration>)> {
    let now = Instant::now();
    if let Some(backlog) = config.backlog.estimate(now, config.max_backlog, config.backlog_reading_age) {
        let (_, oldest) = intake_state(pool, 0, WaitSince::Due).await?;
        return Ok((backlog, oldest));
    }
    let (backlog, oldest) = intake_state(pool, config.max_backlog, WaitSince::Due).await?;
    config.backlog.record(now, backlog);
    Ok((backlog, oldest))
}

async fn try_submit(pool: &PgPool, config: &AdmissionConfig, s: &Submission) -> Result<Admission> {
    let mut tx = pool.begin().await?;
    if let Some(key) = &s.client_key {
        // A key past its lifetime names nothing: forget it here, so it is exact to the second
        // (the periodic sweep forgets the rest).
        sqlx::query(
            "UPDATE jobs SET client_key = NULL
             WHERE owner_id = $1 AND client_key = $2 AND accepted_at <= now() - make_interval(secs => $3)",
        )
        .bind(s.user_id)
        .bind(key)
        .bind(config.client_key_lifetime.as_secs_f64())
        .execute(&mut *tx)
        .await?;
        let earlier: Option<(Uuid, Option<String>)> =
            sqlx::query_as("SELECT id, request_fingerprint FROM jobs WHERE owner_id = $1 AND client_key = $2")
                .bind(s.user_id)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((job_id, fingerprint)) = earlier {
            if fingerprint.as_deref() != Some(s.fingerprint.as_str()) {
                return Err(EngineError::IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request".into(),
                ));
            }
            return Ok(Admission::Existing { job_id });
        }
    }
    let live: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE owner_id = $1 AND idempotency_key = $2 AND state NOT IN ('failed', 'canceled')",
    )
    .bind(s.user_id)
    .bind(&s.content_key)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(job_id) = live {
        return Ok(Admission::Existing { job_id });
    }

    match (&s.shared_document, config.storage_quota_bytes) {
        (Some(key), _) => {
            if !crate::documents::custody::still_kept(&mut tx, key).await? {
                return Err(EngineError::NotFound);
            }
        }
        // Checked again with the stored size (the upload's declared length was only a hint);
        // uploads racing past it at once overshoot by at most the user's uploads in progress.
        (None, Some(quota)) => {
            lock_new_document(&mut tx, s).await?;
            let incoming = s.payload.pointer("/document/size").and_then(|v| v.as_u64()).unwrap_or(0);
            let used = storage_used(&mut tx, s.user_id).await?;
            if let Some(refusal) = storage_refusal(used, incoming, quota) {
                return Ok(Admission::Refused(refusal));
            }
        }
        (None, None) => lock_new_document(&mut tx, s).await?,
    }
    // The owner's line (its finish tag) before the owner's row, in the order every path into
    // the line takes them.
    queue::lock_line(&mut tx, s.user_id).await?;
    // The compound check: one conditional write.
    let taken = sqlx::query(
        "UPDATE users SET balance = balance - $2, in_flight = in_flight + 1
         WHERE id = $1 AND in_flight < max_in_flight AND balance >= $2 AND deleted_at IS NULL RETURNING balance",
    )
    .bind(s.user_id)
    .bind(s.cost)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(balance_after): Option<i64> = taken.map(|row| sqlx::Row::get(&row, 0)) else {
        let (balance, in_flight, limit): (i64, i32, i32) =
            sqlx::query_as("SELECT balance, in_flight, max_in_flight FROM users WHERE id = $1 AND deleted_at IS NULL")
                .bind(s.user_id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(EngineError::NotFound)?;
        return Ok(Admission::Refused(refusal_reason(balance, in_flight, limit, s.cost, config.retry_after_busy)));
    };
    let job = NewJob {
        owner_id: s.user_id,
        kind: "document".into(),
        payload: s.payload.clone(),
        idempotency_key: Some(s.content_key.clone()),
        cost: s.cost as i32,
        est_input_tokens: s.est_input_tokens,
        max_attempts: config.max_attempts,
        client_key: s.client_key.clone(),
        request_fingerprint: Some(s.fingerprint.clone()),
        lane: s.lane.clone(),
    };
    let job_id = queue::enqueue(&mut tx, &job).await?;
    if let Some(price) = s.price_by_size.filter(|p| *p < s.cost) {
        // A PDF's cost is a hold: until its text is read, its price is its size's.
        sqlx::query("UPDATE jobs SET settled_cost = $2 WHERE id = $1")
            .bind(job_id)
            .bind(price.max(0) as i32)
            .execute(&mut *tx)
            .await?;
    }
    ledger::debit_for_job(&mut tx, s.user_id, job_id, s.cost).await?;
    if crate::mail::compose::fell_low(balance_after + s.cost, balance_after) {
        let detail = crate::mail::compose::Detail { balance: Some(balance_after), ..Default::default() };
        // Once a day per account: a refund lifts the balance again, so without the day in
        // the key every upload and cancel would mail once more.
        let key = format!("credits_low:{}:{}", s.user_id, chrono::Utc::now().date_naive());
        super::notices::mail_if_chosen(&mut tx, s.user_id, crate::mail::MailKind::CreditsLow, &key, &detail).await?;
    }
    tx.commit().await?;
    Ok(Admission::Accepted { job_id })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn storage_is_refused_only_past_the_quota() {
        assert_eq!(storage_refusal(900, 100, 1000), None, "up to the quota exactly");
        assert_eq!(storage_refusal(900, 101, 1000), Some(Refusal::StorageFull { used_bytes: 900, quota_bytes: 1000 }));
        assert!(storage_refusal(u64::MAX, 1, u64::MAX).is_some(), "no overflow");
    }

    #[test]
    fn short_balance_is_402_even_at_the_in_flight_limit() {
        let r = refusal_reason(0, 5, 5, 1, Duration::from_secs(15));
        assert_eq!(r, Refusal::OutOfCredits { balance: 0, cost: 1 });
    }

    #[test]
    fn enough_credits_at_the_limit_is_429() {
        let r = refusal_reason(3, 5, 5, 1, Duration::from_secs(15));
        assert_eq!(r, Refusal::TooManyInFlight { in_flight: 5, limit: 5, retry_after_secs: 15 });
    }

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap() + chrono::Duration::minutes(minute)
    }

    #[test]
    fn paused_time_does_not_count_as_waiting() {
        let mins = |d: Duration| d.as_secs() / 60;
        // Waiting 40 minutes, 30 of them paused (still paused): 10 minutes count.
        assert_eq!(mins(wait_excluding_pauses(at(0), at(40), &[(at(10), None)])), 10);
        // A pause that began before the job arrived counts only from its arrival.
        assert_eq!(mins(wait_excluding_pauses(at(0), at(40), &[(at(-20), Some(at(15)))])), 25);
        // Overlapping and separate pauses are not counted twice.
        let pauses = [(at(5), Some(at(15))), (at(10), Some(at(20))), (at(30), Some(at(35)))];
        assert_eq!(mins(wait_excluding_pauses(at(0), at(40), &pauses)), 20);
        // Pauses that ended before the job arrived do not matter.
        assert_eq!(mins(wait_excluding_pauses(at(0), at(40), &[(at(-30), Some(at(-10)))])), 40);
    }

    proptest! {
        #[test]
        fn the_counted_wait_is_never_negative_nor_longer_than_the_wait(
            pauses in proptest::collection::vec((-60i64..60, proptest::option::of(0i64..60)), 0..6),
        ) {
            let pauses: Vec<_> = pauses.into_iter().map(|(s, len)| (at(s), len.map(|l| at(s + l)))).collect();
            let wait = wait_excluding_pauses(at(0), at(40), &pauses);
            prop_assert!(wait <= Duration::from_secs(40 * 60));
        }
    }

    #[test]
    fn intake_bound_by_size_or_age() {
        let c = AdmissionConfig { max_backlog: 100, max_oldest_wait: Duration::from_secs(60), ..Default::default() };
        assert_eq!(intake_refusal(99, Some(Duration::from_secs(59)), &c), None);
        assert!(intake_refusal(100, None, &c).is_some());
        assert!(intake_refusal(0, Some(Duration::from_secs(61)), &c).is_some());
    }

    proptest! {
        #[test]
        fn refusal_is_402_exactly_when_the_balance_is_short(balance in 0i64..10, in_flight in 0i32..10, limit in 1i32..10, cost in 1i64..5) {
            let r = refusal_reason(balance, in_flight, limit, cost, Duration::from_secs(15));
            prop_assert_eq!(matches!(r, Refusal::OutOfCredits { .. }), balance < cost);
        }
    }
}
