//! Parts benchmark: `cargo xtask bench parts` (release build, private Postgres).
//!
//! One 500K-token text document (seed 000's p99 is 492K) through the real worker pool, in parts
//! of at most 50K tokens, to the fake provider holding callers to 3M input tokens a minute
//! (50K a second, buckets of two seconds); Sluice's token budget is told the same limit. The
//! provider answers at once, so the limit is the only thing that should take time: the
//! end-to-end time is set against the ideal, the tokens sent divided by the limit (less what
//! the full bucket at the start lets through at once), as a ratio (1.0 = the limit kept busy
//! all the time; Sluice plans to use 95 % of a limit, so that is its ceiling).
//!
//! Prints `RESULT parts_ratio=..` and a line for the README. Needs `sluice-extract` built beside
//! this example (`cargo build --release -p engine --bin sluice-extract`; the xtask does it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::documents::blobs::Blobs;
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, ProviderConfig, ProviderKind};
use engine::documents::sandbox::SandboxConfig;
use engine::queue::capacity::{self, Budget, CapacityConfig, ProviderLimits};
use engine::queue::hooks::NoHooks;
use engine::queue::parts::PartStore;
use engine::queue::worker::{WorkerConfig, WorkerPool};
use engine::queue::{self, NewJob};
use fakeprovider::FakeProvider;

const PER_MIN: u64 = 3_000_000;
const BURST: Duration = Duration::from_secs(2);
const CONTEXT: u64 = 50_000;
const DOCUMENT_TOKENS: usize = 500_000;

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let pool = engine::db::connect(&url, 20).await.unwrap();
    engine::db::MIGRATOR.run(&pool).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-parts-bench-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let fake = FakeProvider::start().await;
    fake.limit_input_tokens(PER_MIN, BURST);
    let config = CapacityConfig {
        limits: ProviderLimits { input_tokens_per_min: Some(PER_MIN), ..Default::default() },
        burst: BURST,
        output_reserve: 64,
        ..CapacityConfig::default()
    };
    capacity::configure(&pool, &config).await.unwrap();

    // About four characters a token, in paragraphs of a few sentences.
    let paragraph = "The supplier delivers the goods named in schedule A by the agreed date. Payment follows within thirty days of delivery. ";
    let text: String =
        paragraph.repeat(DOCUMENT_TOKENS * 4 / paragraph.len() + 1).chars().take(DOCUMENT_TOKENS * 4).collect();
    let text = text.replace("delivery. The", "delivery.\n\nThe");
    let key = Blobs::new_key();
    blobs.put(&key, text.clone().into_bytes().into()).await.unwrap();
    let payload = serde_json::json!({
        "document": { "key": key, "type": "plain_text", "sha256": "bench", "size": text.len(), "name": "long.txt" },
        "preset": "summarize",
    });
    let extractor = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("sluice-extract");
    let processor = DocumentProcessor {
        blobs,
        provider: providers::build(&ProviderConfig {
            kind: ProviderKind::Anthropic,
            base_url: fake.base_url(),
            api_key: Some("bench".into()),
            model: "m".into(),
            max_tokens: 64,
            timeout: Duration::from_secs(30),
            timeout_per_100k_tokens: Duration::ZERO,
        }),
        sandbox: Arc::new(SandboxConfig::new(extractor, Vec::new())),
        stages: queue::stages::StageLog::new(pool.clone()),
        budget: Budget::new(pool.clone(), &config),
        context_tokens: Some(CONTEXT),
        parts: PartStore::new(pool.clone()),
        max_document_tokens: None,
        settle_pdfs: None,
    };
    let workers = WorkerConfig { name: "parts-bench".into(), concurrency: 24, ..WorkerConfig::default() };
    let started = Instant::now();
    let mut tx = pool.begin().await.unwrap();
    let job = NewJob { est_input_tokens: CONTEXT as i64, ..NewJob::new(1, payload) };
    let id = queue::enqueue(&mut tx, &job).await.unwrap();
    tx.commit().await.unwrap();
    let pool_handle = WorkerPool::start(pool.clone(), workers, Arc::new(processor), Arc::new(NoHooks));
    let view = loop {
        let view = queue::get(&pool, id).await.unwrap();
        if view.state.is_terminal() {
            break view;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the document ends within 5 minutes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let secs = started.elapsed().as_secs_f64();
    pool_handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(view.state, queue::JobState::Done, "{view:?}");

    let report = fake.limit_report();
    let sent: u64 = report.accepted.iter().map(|(_, t)| t).sum();
    let per_sec = PER_MIN as f64 / 60.0;
    let initial = per_sec * BURST.as_secs_f64();
    let ideal = (sent as f64 - initial).max(0.0) / per_sec;
    let ratio = ideal / secs;
    println!(
        "parts: a {}K-token document in {} parts (+{} combining calls), {}K tokens sent at {}K tokens/min: {secs:.1} s against the ideal {ideal:.1} s, ratio {ratio:.2}, {} refused (429)",
        DOCUMENT_TOKENS / 1000,
        view.parts_total.unwrap_or(1),
        report.accepted.len() as i64 - i64::from(view.parts_total.unwrap_or(1)),
        sent / 1000,
        PER_MIN / 1000,
        report.refused
    );
    println!("RESULT parts_ratio={ratio:.3}");
}
