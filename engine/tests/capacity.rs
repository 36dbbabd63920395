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
use engine::testing::{enqueue_many, fast_worker, wait_for};
use fakeprovider::{FakeProvider, LimitReport, Reply};
use sqlx::PgPool;
use uuid::Uuid;

/// The limit the fake enforces and Sluice is told: 12,000 input tokens a second, in buckets
/// holding half a second of it.
const INPUT_TOKENS_PER_MIN: u64 = 720_000;
const BURST: Duration = Duration::from_millis(500);

struct Docs {
    blobs: Blobs,
    dir: std::path::PathBuf,
}

impl Drop for Docs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn docs(name: &str) -> Docs {
    let dir = std::env::temp_dir().join(format!("sluice-capacity-{name}-{}", std::process::id()));
    Docs { blobs: Blobs::local(&dir).unwrap(), dir }
}

/// `n` text documents of mixed sizes (300 B to 4 KB, a fixed pseudo-random mix), each a job
/// whose estimate is what upload would have given it. Returns the ids and the total bytes.
async fn enqueue_documents(pool: &PgPool, docs: &Docs, owner: i64, n: usize) -> (Vec<Uuid>, u64) {
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

fn workers(pool: &PgPool, docs: &Docs, fake: &FakeProvider, budget: Budget, concurrency: usize) -> WorkerPool {
    let processor = DocumentProcessor {
        blobs: docs.blobs.clone(),
        provider: providers::build(&ProviderConfig {
            kind: ProviderKind::Anthropic,
            base_url: fake.base_url(),
            api_key: Some("k".into()),
            model: "m".into(),
            max_tokens: 64,
            timeout: Duration::from_secs(5),
        }),
        sandbox: Arc::new(SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new())),
        stages: queue::stages::StageLog::disabled(),
        budget,
        context_tokens: None,
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

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_token_budget_holds_a_burst_to_the_providers_limit_and_without_it_the_burst_is_refused(pool: PgPool) {
    let pool = engine::testing::wider_pool(&pool, 40).await;
    let limit_per_sec = INPUT_TOKENS_PER_MIN as f64 / 60.0;
    // What the bucket held at the start is a burst, not a rate.
    let initial = limit_per_sec * BURST.as_secs_f64();

    let (report, done, failed, secs) = burst(&pool, true).await;
    let rate = report.tokens_per_sec(initial);
    println!(
        "with the budget: {done} done, {failed} failed, {} refused (429) of {} calls, {:.0} input tokens/s = {:.1} % of the limit, {secs:.1} s",
        report.refused,
        report.accepted.len() as u64 + report.refused,
        rate,
        100.0 * rate / limit_per_sec
    );
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
    println!(
        "without the budget: {done} done, {failed} failed, {} refused (429) of {} calls, {:.0} input tokens/s = {:.1} % of the limit, {secs:.1} s",
        report.refused,
        report.accepted.len() as u64 + report.refused,
        rate,
        100.0 * rate / limit_per_sec
    );
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
