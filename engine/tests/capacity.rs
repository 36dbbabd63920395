//! Provider capacity against the fake provider holding callers to an input-tokens-per-minute
//! limit (a real HTTP server): the token budget keeps a burst under the limit at the limit's
//! pace, and without it the same burst is refused; the adaptive gate halves on 429s and grows
//! back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::documents::blobs::Blobs;
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, ProviderConfig, ProviderKind};
use engine::documents::sandbox::SandboxConfig;
use engine::queue::capacity::{self, Budget, CapacityConfig, ProviderLimits};
use engine::queue::hooks::NoHooks;
use engine::queue::worker::WorkerPool;
use engine::queue::{self, switches, JobState, NewJob};
use engine::sizing::{estimate_input_tokens, SizeKind};
use engine::testing::{enqueue_many, fast_worker, wait_for, TempBlobs};
use fakeprovider::{FakeProvider, LimitReport, Reply};
use sqlx::PgPool;
use uuid::Uuid;

/// The limit the fake enforces and Sluice is told: 12,000 input tokens a second, in buckets
/// holding half a second of it.
const INPUT_TOKENS_PER_MIN: u64 = 720_000;
const BURST: Duration = Duration::from_millis(500);

fn docs(name: &str) -> TempBlobs {
    TempBlobs::new(&format!("capacity-{name}"))
}

/// `n` text documents of mixed sizes (300 B to 4 KB, a fixed pseudo-random mix), each a job
/// whose estimate is what upload would have given it. Returns the ids and the total bytes.
async fn enqueue_documents(pool: &PgPool, docs: &TempBlobs, owner: i64, n: usize) -> (Vec<Uuid>, u64) {
    let mut seed: u64 = 0x5eed;
    let mut ids = Vec::new();
    let mut total = 0;
    let mut tx = pool.begin().await.unwrap();
    for i in 0..n {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let size = 300 + (seed >> 33) as usize % 3_700;
        let text: String =
            format!("Document {i}. ").chars().chain("lorem ipsum dolor ".chars().cycle()).take(size).collect();
        let key = Blobs::new_key();
        docs.blobs.put(&key, text.clone().into_bytes().into()).await.unwrap();
        let payload = serde_json::json!({
            "document": { "key": key, "type": "plain_text", "sha256": "x", "size": size, "name": null },
            "preset": "summarize",
        });
        let job = NewJob {
            est_input_tokens: estimate_input_tokens(SizeKind::Text, size as u64) as i64,
            ..NewJob::new(owner, payload)
        };
        ids.push(queue::enqueue(&mut tx, &job).await.unwrap());
        total += size as u64;
    }
    tx.commit().await.unwrap();
    (ids, total)
}

fn workers(pool: &PgPool, docs: &TempBlobs, fake: &FakeProvider, budget: Budget, concurrency: usize) -> WorkerPool {
    let processor = DocumentProcessor {
        blobs: docs.blobs.clone(),
        provider: providers::build(&ProviderConfig {
            kind: ProviderKind::Anthropic,
            base_url: fake.base_url(),
            api_key: Some("k".into()),
            model: "m".into(),
            max_tokens: 64,
            timeout: Duration::from_secs(5),
            timeout_per_100k_tokens: Duration::ZERO,
            stream: true,
            stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
        }),
        sandbox: Arc::new(SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new())),
        stages: queue::stages::StageLog::disabled(),
        budget,
        context_tokens: None,
        parts: engine::queue::parts::PartStore::disabled(),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let mut config = fast_worker("capacity", concurrency);
    config.policy.max_delay = Duration::from_secs(3);
    WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(NoHooks))
}

async fn all_terminal(pool: &PgPool, ids: &[Uuid], timeout: Duration) -> bool {
    wait_for(timeout, || async {
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1) AND state NOT IN ('done', 'failed')")
                .bind(ids)
                .fetch_one(pool)
                .await
                .unwrap();
        open == 0
    })
    .await
}

async fn count(pool: &PgPool, ids: &[Uuid], state: JobState) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1) AND state = $2")
        .bind(ids)
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One burst of 200 jobs through the fake's limit, with or without Sluice's budget.
async fn burst(pool: &PgPool, with_budget: bool) -> (LimitReport, i64, i64, f64) {
    let docs = docs(if with_budget { "budget" } else { "nobudget" });
    let fake = FakeProvider::start().await;
    let limits = ProviderLimits { input_tokens_per_min: Some(INPUT_TOKENS_PER_MIN), ..Default::default() };
    let config = CapacityConfig {
        limits: if with_budget { limits } else { ProviderLimits::default() },
        burst: BURST,
        output_reserve: 64,
        recover_step: Duration::from_secs(1),
        ..CapacityConfig::default()
    };
    capacity::configure(pool, &config).await.unwrap();
    let (ids, _) = enqueue_documents(pool, &docs, 1, 200).await;
    fake.limit_input_tokens(INPUT_TOKENS_PER_MIN, BURST);
    let started = Instant::now();
    let budget = Budget::new(pool.clone(), &config);
    let pool_handle = workers(pool, &docs, &fake, budget, 24);
    assert!(all_terminal(pool, &ids, Duration::from_secs(90)).await, "the burst ends");
    let elapsed = started.elapsed().as_secs_f64();
    pool_handle.shutdown().await;
    (fake.limit_report(), count(pool, &ids, JobState::Done).await, count(pool, &ids, JobState::Failed).await, elapsed)
}

/// One line per run, for the book.
fn print_run(label: &str, report: &LimitReport, (done, failed): (i64, i64), of_limit: f64, secs: f64) {
    let calls = report.accepted.len() as u64 + report.refused;
    let rate = of_limit * INPUT_TOKENS_PER_MIN as f64 / 60.0;
    println!(
        "{label}: {done} done, {failed} failed, {} refused (429) of {calls} calls, {rate:.0} input tokens/s = {:.1} % of the limit, {secs:.1} s",
        report.refused,
        100.0 * of_limit
    );
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_token_budget_holds_a_burst_to_the_providers_limit_and_without_it_the_burst_is_refused(pool: PgPool) {
    let pool = engine::testing::wider_pool(&pool, 40).await;
    let limit_per_sec = INPUT_TOKENS_PER_MIN as f64 / 60.0;
    // What the bucket held at the start is a burst, not a rate.
    let initial = limit_per_sec * BURST.as_secs_f64();

    let (report, done, failed, secs) = burst(&pool, true).await;
    let rate = report.tokens_per_sec(initial);
    print_run("with the budget", &report, (done, failed), rate / limit_per_sec, secs);
    assert_eq!((done, failed), (200, 0));
    assert!(report.refused <= 4, "(almost) no 429s: {}", report.refused);
    assert!(
        (0.9..=1.1).contains(&(rate / limit_per_sec)),
        "throughput within 10 % of the limit: {rate:.0} tokens/s against {limit_per_sec:.0}"
    );
    let status = capacity::status(&pool).await.unwrap();
    assert_eq!(status.limits.input_tokens_per_min, Some(INPUT_TOKENS_PER_MIN));
    assert!(status.input_tokens_left.unwrap() <= limit_per_sec * BURST.as_secs_f64() + 1.0);

    // The same burst with no budget (the adaptive gate still on) runs into the limit.
    sqlx::query("UPDATE queue_settings SET adaptive_gate = NULL, adaptive_since = NULL").execute(&pool).await.unwrap();
    let (report, done, failed, secs) = burst(&pool, false).await;
    let rate = report.tokens_per_sec(initial);
    print_run("without the budget", &report, (done, failed), rate / limit_per_sec, secs);
    assert!(report.refused >= 20, "without the budget the provider refuses: {} 429s", report.refused);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_gate_halves_when_the_provider_refuses_and_grows_back(pool: PgPool) {
    switches::set_gate_size(&pool, 8, "test").await.unwrap();
    let config = CapacityConfig { recover_step: Duration::from_millis(400), ..CapacityConfig::default() };
    capacity::configure(&pool, &config).await.unwrap();

    // One refusal halves the gate; the rest of the same burst does not cut again.
    assert_eq!(capacity::provider_refused(&pool, Some(429)).await.unwrap(), Some(4));
    assert_eq!(capacity::provider_refused(&pool, Some(429)).await.unwrap(), None, "same burst");
    let status = capacity::status(&pool).await.unwrap();
    assert_eq!((status.configured_gate, status.effective_gate), (8, 4));
    let (reason, _) = status.reduced.expect("the admin page says why");
    assert!(reason.contains("429") && reason.contains("from 8 to 4"), "{reason}");
    // Claims obey the effective gate, in every process (it lives in the claim).
    enqueue_many(&pool, 1, 20).await;
    let claimed = queue::claim(&pool, "w", 100, Duration::from_secs(30)).await.unwrap();
    assert_eq!(claimed.len(), 4);
    // It grows back one slot per step, up to the configured gate and no further.
    assert!(
        wait_for(Duration::from_secs(5), || async { capacity::status(&pool).await.unwrap().effective_gate == 8 }).await
    );
    let more = queue::claim(&pool, "w", 100, Duration::from_secs(30)).await.unwrap();
    assert_eq!(more.len(), 4, "eight running now, the configured gate");
    assert!(capacity::status(&pool).await.unwrap().reduced.is_none());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_provider_answering_429_makes_the_effective_gate_drop_within_seconds_and_recover_after(pool: PgPool) {
    switches::set_gate_size(&pool, 8, "test").await.unwrap();
    let config = CapacityConfig { recover_step: Duration::from_millis(300), ..CapacityConfig::default() };
    capacity::configure(&pool, &config).await.unwrap();
    let docs = docs("adaptive");
    let fake = FakeProvider::start().await;
    fake.push((0..8).map(|_| Reply::RateLimitedSeconds { seconds: 0 }));
    let (ids, _) = enqueue_documents(&pool, &docs, 1, 16).await;
    let started = Instant::now();
    let pool_handle = workers(&pool, &docs, &fake, Budget::disabled(), 8);
    let dropped = wait_for(Duration::from_secs(5), || async {
        let status = capacity::status(&pool).await.unwrap();
        status.effective_gate < status.configured_gate
    })
    .await;
    assert!(dropped, "the effective gate drops within seconds of the 429s");
    println!("gate cut after {:.2} s", started.elapsed().as_secs_f64());
    assert!(all_terminal(&pool, &ids, Duration::from_secs(30)).await);
    assert_eq!(count(&pool, &ids, JobState::Done).await, 16, "the 429s were retried, nothing lost");
    let recovered =
        wait_for(Duration::from_secs(5), || async { capacity::status(&pool).await.unwrap().effective_gate == 8 }).await;
    assert!(recovered, "and it grows back once the provider answers");
    pool_handle.shutdown().await;
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_claim_takes_only_what_the_token_budget_holds_and_the_rest_waits_without_using_an_attempt(pool: PgPool) {
    // 60,000 input tokens a minute in a bucket holding one second: 1,000 tokens (950 planned).
    let config = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(60_000), ..Default::default() },
        burst: Duration::from_secs(1),
        ..CapacityConfig::default()
    };
    capacity::configure(&pool, &config).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for (owner, est) in [(1, 400), (2, 400), (3, 400), (4, 400)] {
        let job = NewJob { est_input_tokens: est, ..NewJob::new(owner, serde_json::json!({})) };
        queue::enqueue(&mut tx, &job).await.unwrap();
    }
    tx.commit().await.unwrap();
    let lease = Duration::from_secs(30);
    let first = queue::claim(&pool, "w", 10, lease).await.unwrap();
    assert_eq!(first.len(), 2, "two of 400 fit in 950, a third does not");
    assert!(first.iter().all(|j| j.est_input_tokens == 400));
    let left = capacity::status(&pool).await.unwrap().input_tokens_left.unwrap();
    assert!((150.0..200.0).contains(&left), "950 - 800, refilling at 950/min: {left}");
    // The others wait without using an attempt.
    let unclaimed: Vec<i32> =
        sqlx::query_scalar("SELECT attempts FROM jobs WHERE state = 'queued'").fetch_all(&pool).await.unwrap();
    assert_eq!(unclaimed, [0, 0]);
    assert!(queue::claim(&pool, "w", 10, lease).await.unwrap().is_empty(), "nothing fits yet");
    // The bucket refills at 950 a minute (about 16 a second): 10 short, one more within a second.
    sqlx::query("UPDATE queue_settings SET level_input = 390, levels_at = clock_timestamp()")
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || async { queue::claim(&pool, "w", 10, lease).await.unwrap().len() == 1 })
            .await
    );
    // A job larger than the whole bucket is not starved: it goes alone once the bucket is full.
    sqlx::query("UPDATE queue_settings SET level_input = 950").execute(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let big = queue::enqueue(&mut tx, &NewJob { est_input_tokens: 5_000, ..NewJob::new(9, serde_json::json!({})) })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query("UPDATE jobs SET run_at = now() - interval '1 hour' WHERE id = $1")
        .bind(big)
        .execute(&pool)
        .await
        .unwrap();
    let claimed = queue::claim(&pool, "w", 10, lease).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [big]);
    assert!(capacity::status(&pool).await.unwrap().input_tokens_left.unwrap() < 0.0, "in debt until it refills");
    // The kill switch still stops everything, budget or not.
    switches::set_processing(&pool, false, "test").await.unwrap();
    sqlx::query("UPDATE queue_settings SET level_input = 950").execute(&pool).await.unwrap();
    assert!(queue::claim(&pool, "w", 10, lease).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_provider_reporting_absurd_usage_cannot_stall_the_budget(pool: PgPool) {
    let config = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(INPUT_TOKENS_PER_MIN), ..Default::default() },
        burst: BURST,
        ..CapacityConfig::default()
    };
    capacity::configure(&pool, &config).await.unwrap();
    let docs = docs("absurd");
    let fake = FakeProvider::start().await;
    fake.push([Reply::Success { text: "ok".into(), input_tokens: 9_000_000_000_000_000, output_tokens: u64::MAX / 2 }]);
    let (ids, _) = enqueue_documents(&pool, &docs, 1, 3).await;
    let pool_handle = workers(&pool, &docs, &fake, Budget::new(pool.clone(), &config), 1);
    assert!(all_terminal(&pool, &ids, Duration::from_secs(30)).await, "the absurd answer does not stall the others");
    pool_handle.shutdown().await;
    assert_eq!(count(&pool, &ids, JobState::Done).await, 3);
    let left = capacity::status(&pool).await.unwrap().input_tokens_left.unwrap();
    assert!(left > -20_000.0, "an unbelievable count is taken as at most four times the estimate: {left}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_restart_with_the_same_limits_keeps_the_buckets_and_new_limits_start_them_full(pool: PgPool) {
    let config = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(60_000), ..Default::default() },
        burst: Duration::from_secs(60),
        ..CapacityConfig::default()
    };
    capacity::configure(&pool, &config).await.unwrap();
    // Spent down ten seconds ago: 950 tokens a second (95 % of 1,000) have come back since.
    sqlx::query("UPDATE queue_settings SET level_input = 0, levels_at = clock_timestamp() - interval '10 seconds'")
        .execute(&pool)
        .await
        .unwrap();
    capacity::configure(&pool, &config).await.unwrap();
    let left = capacity::status(&pool).await.unwrap().input_tokens_left.unwrap();
    assert!((9_500.0..10_500.0).contains(&left), "kept and refilled, not reset or lost: {left}");
    let doubled = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(120_000), ..Default::default() },
        ..config
    };
    capacity::configure(&pool, &doubled).await.unwrap();
    let left = capacity::status(&pool).await.unwrap().input_tokens_left.unwrap();
    assert!((113_999.0..=114_000.0).contains(&left), "a new limit starts full (95 % of a minute): {left}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn tokens_given_back_fill_the_bucket_no_further_than_full_and_a_call_takes_its_own_after(pool: PgPool) {
    let config = CapacityConfig {
        limits: ProviderLimits {
            input_tokens_per_min: Some(60_000),
            output_tokens_per_min: Some(6_000),
            ..Default::default()
        },
        burst: Duration::from_secs(60),
        ..CapacityConfig::default()
    };
    capacity::configure(&pool, &config).await.unwrap();
    // A claim reserved 40,000 input and 4,000 output tokens a minute ago; the buckets have
    // refilled since (to full) while the reservation was held.
    sqlx::query(
        "UPDATE queue_settings SET level_input = 57000 - 40000, level_output = 5700 - 4000,
             levels_at = clock_timestamp() - interval '60 seconds'",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The call turned out to need only 1,000 of them: the rest comes back.
    Budget::new(pool.clone(), &config).correct(-39_000, -4_000).await;
    // The levels as stored (the status view refills them, capped at full, and would hide it).
    let (input, output): (f64, f64) =
        sqlx::query_as("SELECT level_input::float8, level_output::float8 FROM queue_settings WHERE id = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    // Full is 95 % of a minute: the provider's bucket holds no more, so neither may ours (over
    // full, the next calls would go out together and the provider would refuse one).
    assert!((56_900.0..=57_000.0).contains(&input), "input bucket full, not over: {input}");
    assert!((5_690.0..=5_700.0).contains(&output), "output bucket full, not over: {output}");

    // Again a minute after a claim's 40,000: its first call of 30,000 goes out now. The
    // provider's bucket was full and gives 30,000: 27,000 is left, not 57,000 (the 10,000 held
    // too many coming back on top of a full bucket).
    sqlx::query("UPDATE queue_settings SET level_input = 17000, levels_at = clock_timestamp() - interval '60 seconds'")
        .execute(&pool)
        .await
        .unwrap();
    Budget::new(pool.clone(), &config).reserve_anew((40_000, 0), (30_000, 0)).await;
    let input: f64 = sqlx::query_scalar("SELECT level_input::float8 FROM queue_settings WHERE id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!((26_900.0..=27_000.0).contains(&input), "the call's own taken from a full bucket: {input}");
}
