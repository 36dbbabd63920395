//! Parts benchmark: `cargo xtask bench parts` (release build, private Postgres).
//!
//! Long documents through the real worker pool to the fake provider behaving like a hosted
//! model (issue 33): 2M input and 400K output tokens a minute in buckets of 10 s, 1,000 output
//! tokens a second per call, 500 ms to the first token, prompts read at 50K tokens a second,
//! answers cut at `max_tokens` (64,000, claude-sonnet-4-5's). Sluice's budget is told the same
//! limits. Rows: a 129K-token translation (seed 000's p90) and a 492K-token summary (its p99),
//! each alone and behind a backlog of small documents from 20 other users.
//!
//! The ideal for a document is the longer of (a) its tokens over the provider's limits (less
//! what the full buckets let through at once) and (b) one call's latency for its largest part
//! (first token, prompt, answer at the model's pace). The ratio ideal / measured is the
//! figure (1.0: as fast as the provider allows). For the backlog rows, the small documents'
//! p95 wait for their first claim is set against the same backlog without the big document.
//!
//! Then the same two documents, alone, to a provider that counts 15 % more tokens than
//! `o200k_base` (as Anthropic's tokenizer counts English prose) and refuses a prompt past its
//! 200K context ("prompt is too long"), with Sluice starting from a ratio of 1.0 (it knows
//! nothing of that tokenizer yet): both must end `done`, whole, with no attempt used by a
//! refusal. A second table gives the answer sizes asked for (`max_tokens`) against the 64,000
//! every call asked for before issue 56.
//!
//! With `lanes` (`cargo xtask bench lanes`), issue 58's cases instead: one 250K-token
//! translation and 20 other users' 2K-token ones a second later, with and without lanes; and
//! two 492K-token summaries with 20 small documents due in 60 s (deadlines missed, the small
//! ones' p95 wait to start, the large ones' slowdown against their time by themselves).
//!
//! With `translations` (`cargo xtask bench translations`; the full run has it too), issue 57's
//! row: a 129K-token translation into a language writing 35 % longer, to a provider counting
//! 15 % more: its calls, output billed over output kept (target at most 1.05), and its time.
//!
//! With `economy` (`cargo xtask bench economy`), issue 60's row: 50 documents of 20K tokens
//! in the standard lane, then in the economy lane against the fake's batch API (its batches
//! take 5 s, a time scale on which a day's window is a minute): provider calls and batches,
//! credits charged against the standard price (1 credit a 1,000 tokens here), time to result.
//!
//! Prints `RESULT ...` lines and tables for the book's Benchmarks chapter. Needs `sluice-extract` built beside
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
use engine::queue::policy::lanes::LaneShares;
use engine::queue::worker::{WorkerConfig, WorkerPool};
use engine::queue::{self, NewJob};
use fakeprovider::{FakeProvider, HostedModel};
use sqlx::PgPool;
use uuid::Uuid;

const INPUT_PER_MIN: u64 = 2_000_000;
const OUTPUT_PER_MIN: u64 = 400_000;
const BURST: Duration = Duration::from_secs(10);
const OUTPUT_PER_SEC: f64 = 1_000.0;
const PREFILL_PER_SEC: f64 = 50_000.0;
const FIRST_TOKEN_MS: u64 = 500;
const CONTEXT: u64 = 200_000;
const MAX_OUTPUT: u32 = 64_000;
const SMALL_OWNERS: i64 = 20;
const SMALL_EACH: usize = 5;
const SMALL_TOKENS: usize = 2_000;

/// Text of about `tokens` tokens, in paragraphs of a few sentences.
fn text_of(tokens: usize, tag: &str) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < tokens * 4 {
        i += 1;
        text.push_str(&format!(
            "Clause {i} of {tag}: the supplier delivers the goods named in schedule A by the agreed date. \
             Payment follows within thirty days of delivery.\n\n"
        ));
    }
    text
}

struct Bench {
    pool: PgPool,
    blobs: Blobs,
    extractor: std::path::PathBuf,
}

/// How the hosted model counts tokens: its tokenizer against ours, and its context (0: none);
/// and how much longer its translations write than their text.
#[derive(Clone, Copy)]
struct Tokenizer {
    inflation: f64,
    context: u64,
    growth: f64,
}

const OURS: Tokenizer = Tokenizer { inflation: 1.0, context: 0, growth: 1.0 };
const COUNTS_MORE: Tokenizer = Tokenizer { inflation: 1.15, context: CONTEXT, growth: 1.0 };
/// Issue 57's case: English into German (a third more words), counted 15 % more.
const WRITES_LONGER: Tokenizer = Tokenizer { inflation: 1.15, context: CONTEXT, growth: 1.35 };

/// What one run measured.
struct Run {
    big_secs: Option<f64>,
    ideal_secs: f64,
    parts: i32,
    small_waits: Vec<f64>,
    report: fakeprovider::ModelReport,
    /// The big document's attempts that did not succeed.
    failed_attempts: i64,
    /// Output tokens billed for the big document and not kept.
    discarded: i64,
}

impl Bench {
    async fn enqueue(&self, owner: i64, text: &str, preset: &str) -> Uuid {
        self.enqueue_due(owner, text, preset, None).await
    }

    /// Enqueue a document priced `cost`, in the economy lane when `economy`.
    async fn enqueue_priced(&self, owner: i64, text: &str, cost: i64, economy: bool) -> Uuid {
        let id = self.enqueue(owner, text, "summarize").await;
        sqlx::query("UPDATE jobs SET cost = $2, payload = payload || jsonb_build_object('economy', $3) WHERE id = $1")
            .bind(id)
            .bind(cost as i32)
            .bind(economy)
            .execute(&self.pool)
            .await
            .unwrap();
        id
    }

    /// Enqueue as admission does: its lane by its size, and its deadline, if any.
    async fn enqueue_due(
        &self,
        owner: i64,
        text: &str,
        preset: &str,
        due_by: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Uuid {
        let key = Blobs::new_key();
        self.blobs.put(&key, text.as_bytes().to_vec().into()).await.unwrap();
        let payload = serde_json::json!({
            "document": { "key": key, "type": "plain_text", "sha256": key, "size": text.len(), "name": "doc.txt" },
            "preset": preset,
            "language": "German",
        });
        let tokens = engine::documents::tokens::count(text) as i64;
        let mut tx = self.pool.begin().await.unwrap();
        let lane = queue::LaneRequest {
            document_tokens: tokens,
            due_by,
            // A small document's run at the model's pace: first token, prompt, answer.
            expected_run: Duration::from_secs_f64(
                FIRST_TOKEN_MS as f64 / 1000.0 + tokens as f64 / PREFILL_PER_SEC + tokens as f64 * 1.2 / OUTPUT_PER_SEC,
            ),
            ..Default::default()
        };
        let job = NewJob { est_input_tokens: tokens.min(CONTEXT as i64), lane, ..NewJob::new(owner, payload) };
        let id = queue::enqueue(&mut tx, &job).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// One run: optionally a big document (`preset`, `tokens`) from owner 1, optionally the
    /// small documents' backlog; until everything ends.
    async fn run(&self, big: Option<(&str, usize)>, backlog: bool, tokenizer: Tokenizer) -> Run {
        sqlx::query("TRUNCATE jobs CASCADE").execute(&self.pool).await.unwrap();
        let (fake, processor) = self.hosted(tokenizer).await;
        let mut small = Vec::new();
        if backlog {
            let text = text_of(SMALL_TOKENS, "a small contract");
            for owner in 0..SMALL_OWNERS {
                for _ in 0..SMALL_EACH {
                    small.push(self.enqueue(100 + owner, &text, "summarize").await);
                }
            }
        }
        let big_text = big.map(|(_, tokens)| text_of(tokens, "the long document"));
        let big_id = match (big, &big_text) {
            (Some((preset, _)), Some(text)) => Some(self.enqueue(1, text, preset).await),
            _ => None,
        };
        let started = Instant::now();
        let pool_handle = self.workers(processor);
        let mut big_secs = None;
        loop {
            // Counted before the big document is looked at: when nothing is open, it has ended.
            let open: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed')")
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if let (Some(id), None) = (big_id, big_secs) {
                let view = queue::get(&self.pool, id).await.unwrap();
                if view.state.is_terminal() {
                    assert_eq!(view.state, queue::JobState::Done, "{view:?}");
                    big_secs = Some(started.elapsed().as_secs_f64());
                    if big.is_some_and(|(preset, _)| preset == "translate") {
                        // Whole: every clause came back once, in order, its own paragraph.
                        let markdown = view.result.as_ref().unwrap()["markdown"].as_str().unwrap().to_string();
                        let paragraphs: Vec<&str> = markdown.split("\n\n").collect();
                        let clauses = big_text.as_deref().unwrap().matches("Clause ").count();
                        assert_eq!(paragraphs.len(), clauses, "the translation is whole");
                        for (i, paragraph) in paragraphs.iter().enumerate() {
                            assert!(paragraph.contains(&format!("Clause {} of", i + 1)), "clause {} in order", i + 1);
                        }
                    }
                }
            }
            if open == 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(900), "the run ends within 15 minutes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pool_handle.shutdown().await;
        let small_waits: Vec<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM started_at - accepted_at)::float8 FROM jobs WHERE id = ANY($1)",
        )
        .bind(&small)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let parts = match big_id {
            Some(id) => queue::get(&self.pool, id).await.unwrap().parts_total.unwrap_or(1),
            None => 0,
        };
        let report = fake.model_report();
        // The ideal, from what the big document sent (the backlog rows count its share only
        // roughly: the small documents' tokens are a few percent of it).
        let over = |tokens: u64, per_min: u64| {
            let per_sec = per_min as f64 / 60.0;
            (tokens as f64 - per_sec * BURST.as_secs_f64()).max(0.0) / per_sec
        };
        let latency = FIRST_TOKEN_MS as f64 / 1000.0
            + report.largest_prompt as f64 / PREFILL_PER_SEC
            + report.largest_answer as f64 / OUTPUT_PER_SEC;
        let ideal_secs =
            over(report.input_tokens, INPUT_PER_MIN).max(over(report.output_tokens, OUTPUT_PER_MIN)).max(latency);
        let failed_attempts = match big_id {
            Some(id) => {
                sqlx::query_scalar("SELECT count(*) FROM attempt_history WHERE job_id = $1 AND outcome <> 'succeeded'")
                    .bind(id)
                    .fetch_one(&self.pool)
                    .await
                    .unwrap()
            }
            None => 0,
        };
        let discarded: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(output_tokens), 0)::int8 FROM provider_output_discarded WHERE job_id = $1",
        )
        .bind(big_id)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        Run { big_secs, ideal_secs, parts, small_waits, report, failed_attempts, discarded }
    }

    fn workers(&self, processor: DocumentProcessor) -> WorkerPool {
        let workers = WorkerConfig {
            name: "parts-bench".into(),
            concurrency: 70,
            attempt_deadline: Duration::from_secs(900),
            ..WorkerConfig::default()
        };
        WorkerPool::start(self.pool.clone(), workers, Arc::new(processor), Arc::new(NoHooks))
    }

    /// Issue 58's mix: large documents (`bigs`: preset and tokens, each its own owner) at once,
    /// then after `small_after` 20 other owners' 2K-token translations, due `due_in` after
    /// they arrive, under `shares` of a 24-slot gate. Until everything ends.
    async fn lanes_run(
        &self,
        bigs: &[(&str, usize)],
        smalls: bool,
        small_after: Duration,
        due_in: Option<Duration>,
        config: &engine::queue::lanes::LaneConfig,
    ) -> MixRun {
        sqlx::query("TRUNCATE jobs, owner_lines CASCADE").execute(&self.pool).await.unwrap();
        queue::switches::set_gate_size(&self.pool, 24, "bench").await.unwrap();
        engine::queue::lanes::configure(&self.pool, config).await.unwrap();
        let (_fake, processor) = self.hosted(OURS).await;
        let workers = self.workers(processor);
        let started = Instant::now();
        let mut big_ids = Vec::new();
        for (n, (preset, tokens)) in bigs.iter().enumerate() {
            big_ids.push(self.enqueue(1 + n as i64, &text_of(*tokens, "the long document"), preset).await);
        }
        let mut small_ids = Vec::new();
        if smalls {
            tokio::time::sleep(small_after.saturating_sub(started.elapsed())).await;
            let due_by = due_in.map(|d| chrono::Utc::now() + chrono::TimeDelta::from_std(d).unwrap());
            let text = text_of(SMALL_TOKENS, "a short letter");
            for owner in 0..SMALL_OWNERS {
                small_ids.push(self.enqueue_due(100 + owner, &text, "translate", due_by).await);
            }
        }
        loop {
            let open: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed')")
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if open == 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(900), "the run ends within 15 minutes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        workers.shutdown().await;
        let secs = |ids: &[Uuid], what: &'static str| {
            let pool = self.pool.clone();
            let ids = ids.to_vec();
            async move {
                sqlx::query_scalar::<_, f64>(&format!(
                    "SELECT extract(epoch FROM {what})::float8 FROM jobs WHERE id = ANY($1) AND state = 'done'"
                ))
                .bind(&ids)
                .fetch_all(&pool)
                .await
                .unwrap()
            }
        };
        let misses: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND (state <> 'done' OR finished_at > due_by)",
        )
        .bind(&small_ids)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        MixRun {
            big_secs: secs(&big_ids, "finished_at - accepted_at").await,
            small_done: secs(&small_ids, "finished_at - accepted_at").await,
            small_start: secs(&small_ids, "started_at - accepted_at").await,
            misses: if due_in.is_some() { misses } else { 0 },
        }
    }

    /// The hosted model and a processor that calls it as a real deployment would.
    async fn hosted(&self, tokenizer: Tokenizer) -> (FakeProvider, DocumentProcessor) {
        let fake = FakeProvider::start().await;
        fake.behave_like(HostedModel {
            first_token_ms: FIRST_TOKEN_MS,
            prefill_tokens_per_sec: PREFILL_PER_SEC,
            output_tokens_per_sec: OUTPUT_PER_SEC,
            input_tokens_per_min: INPUT_PER_MIN,
            output_tokens_per_min: OUTPUT_PER_MIN,
            token_inflation: tokenizer.inflation,
            context_tokens: tokenizer.context,
            translation_growth: tokenizer.growth,
            ..HostedModel::default()
        });
        let config = CapacityConfig {
            limits: ProviderLimits {
                input_tokens_per_min: Some(INPUT_PER_MIN),
                output_tokens_per_min: Some(OUTPUT_PER_MIN),
                ..Default::default()
            },
            burst: BURST,
            output_reserve: 4_096,
            ..CapacityConfig::default()
        };
        capacity::configure(&self.pool, &config).await.unwrap();
        let processor = DocumentProcessor {
            blobs: self.blobs.clone(),
            provider: providers::build(&ProviderConfig {
                kind: ProviderKind::Anthropic,
                base_url: fake.base_url(),
                api_key: Some("bench".into()),
                model: "claude-sonnet-4-5".into(),
                max_tokens: MAX_OUTPUT,
                timeout: Duration::from_secs(300),
                timeout_per_100k_tokens: Duration::ZERO,
                stream: true,
                stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
            }),
            sandbox: Arc::new(SandboxConfig::new(self.extractor.clone(), Vec::new())),
            stages: queue::stages::StageLog::new(self.pool.clone()),
            budget: Budget::new(self.pool.clone(), &config),
            context_tokens: Some(CONTEXT),
            parts: PartStore::new(self.pool.clone()),
            max_document_tokens: None,
            settle_held: None,
            // Nothing known of the provider's tokenizer: it is learned as the run goes.
            token_ratio: engine::documents::ratio::TokenRatio::in_memory(1.0),
            writing: Default::default(),
            economy: None,
        };
        (fake, processor)
    }
}

/// What a run of issue 58's mix measured (seconds from each document's acceptance).
struct MixRun {
    big_secs: Vec<f64>,
    small_done: Vec<f64>,
    small_start: Vec<f64>,
    /// Small documents not done by their deadline.
    misses: i64,
}

/// `cargo xtask bench lanes`: issue 58's two cases.
async fn lanes(bench: &Bench) {
    use engine::queue::lanes::LaneConfig;
    let lanes = |urgent_share: f64, bulk_floor: f64, urgent_budget_share: f64| LaneConfig {
        shares: LaneShares { urgent_share, bulk_floor },
        urgent_budget_share,
        ..LaneConfig::default()
    };
    let defaults = LaneConfig::default();
    let none = lanes(0.0, 0.0, 0.0);
    let after = Duration::from_secs(1);
    let translation = [("translate", 250_000)];
    println!("| one 250K-token translation, then 20 users' 2K-token ones a second later (gate 24) | small documents' p95 time to done | against them alone | the translation's time | against it alone (same settings) |");
    println!("|---|---|---|---|---|");
    let alone = bench.lanes_run(&[], true, after, None, &defaults).await;
    let alone_p95 = p95(&alone.small_done);
    println!("| the small documents alone | {alone_p95:.1} s | 1.00x | | |");
    for (label, key, config) in [
        ("no lanes (as before issue 58)", "none", none.clone()),
        ("lanes, the buckets' reserve as the gate's (0.25, as before)", "gate_share", lanes(0.25, 0.25, 0.25)),
        ("lanes at their defaults (gate 0.25, buckets 0.5)", "default", defaults.clone()),
        ("buckets 0.75", "most", lanes(0.25, 0.25, 0.75)),
    ] {
        let by_itself = bench.lanes_run(&translation, false, after, None, &config).await;
        let run = bench.lanes_run(&translation, true, after, None, &config).await;
        let p = p95(&run.small_done);
        let (with, without) = (
            run.big_secs.first().copied().unwrap_or(f64::NAN),
            by_itself.big_secs.first().copied().unwrap_or(f64::NAN),
        );
        println!(
            "| {label} | {p:.1} s | **{:.2}x** | {with:.1} s | {:.2}x ({without:.1} s by itself) |",
            p / alone_p95.max(0.001),
            with / without.max(0.001),
        );
        println!("RESULT lanes_{key}_small_p95_vs_alone={:.3}", p / alone_p95.max(0.001));
        println!("RESULT lanes_{key}_translation_alone_secs={without:.1}");
    }
    println!();
    println!("| two users' 492K-token summaries, then 20 users' 2K-token translations due in 60 s (gate 24) | deadlines missed | small p95 wait to start | large documents' time against them alone |");
    println!("|---|---|---|---|");
    let bigs = [("summarize", 492_000), ("summarize", 492_000)];
    for (label, key, config) in [
        ("no lanes", "none", none.clone()),
        ("lanes at their defaults", "default", defaults),
        ("lanes, buckets 0.75", "most", lanes(0.25, 0.25, 0.75)),
    ] {
        let by_themselves = bench.lanes_run(&bigs, false, after, None, &config).await;
        let run = bench.lanes_run(&bigs, true, after, Some(Duration::from_secs(60)), &config).await;
        let slowest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let slowdown = slowest(&run.big_secs) / slowest(&by_themselves.big_secs).max(0.001);
        println!(
            "| {label} | {} of {} | {:.1} s | {slowdown:.2}x ({:.1} s against {:.1} s) |",
            run.misses,
            SMALL_OWNERS,
            p95(&run.small_start),
            slowest(&run.big_secs),
            slowest(&by_themselves.big_secs)
        );
        println!("RESULT lanes_{key}_deadline_misses={}", run.misses);
        println!("RESULT lanes_{key}_big_slowdown={slowdown:.3}");
    }
}

/// Issue 57's row (`cargo xtask bench translations` alone): a 129K-token translation into a
/// language writing 35 % longer, to a provider counting 15 % more tokens, Sluice knowing
/// neither: its calls, the output billed against the output kept, and its time.
async fn translation_writing_longer(bench: &Bench) {
    println!("| row (issue 57: a provider counting 15 % more, a language writing 35 % longer) | calls | parts | answers cut | output billed / kept | time to result | ideal (same run) | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    let run = bench.run(Some(("translate", 129_000)), false, WRITES_LONGER).await;
    let secs = run.big_secs.unwrap_or(f64::NAN);
    let billed = run.report.output_tokens as f64;
    let billed_over_kept = billed / (billed - run.discarded as f64).max(1.0);
    println!(
        "| 129K-token translation | {} | {} | {} | **{billed_over_kept:.3}** ({} billed, {} not kept) | {secs:.1} s | {:.1} s | **{:.2}** |",
        run.report.calls,
        run.parts,
        run.report.cut,
        run.report.output_tokens,
        run.discarded,
        run.ideal_secs,
        run.ideal_secs / secs
    );
    println!("RESULT parts_translate_writes_longer_billed_over_kept={billed_over_kept:.3}");
    println!("RESULT parts_translate_writes_longer_ratio={:.3}", run.ideal_secs / secs);
}

/// `cargo xtask bench economy`: issue 60's row.
async fn economy_lane(bench: &Bench) {
    const DOCUMENTS: usize = 50;
    const TOKENS: usize = 20_000;
    let prices: sluice_types::capacity::PriceTable = "1000:1".parse().unwrap();
    let terms = sluice_types::capacity::EconomyTerms { discount: 0.5, window_hours: 1.0 / 60.0 };
    println!("| {DOCUMENTS} documents of 20K tokens (summaries) | calls asked at once (interactive) | batches (requests in them) | credits charged | against the standard price | time to the last result | p50 |");
    println!("|---|---|---|---|---|---|---|");
    for economy in [false, true] {
        sqlx::query("TRUNCATE jobs, provider_batches CASCADE").execute(&bench.pool).await.unwrap();
        sqlx::query("TRUNCATE batch_requests").execute(&bench.pool).await.unwrap();
        let (fake, mut processor) = bench.hosted(OURS).await;
        fake.batch_timing(fakeprovider::BatchTiming { delay: Duration::from_secs(5), window: Duration::from_secs(60) });
        if economy {
            processor.economy =
                Some(engine::documents::economy::EconomyLane::new(bench.pool.clone(), Duration::from_secs(60)));
        }
        let standard: i64 = prices.price(TOKENS as u64);
        let cost = if economy { terms.price(standard) } else { standard };
        let mut ids = Vec::new();
        for n in 0..DOCUMENTS {
            let text = text_of(TOKENS, &format!("document {n}"));
            ids.push(bench.enqueue_priced(200 + (n % 10) as i64, &text, cost, economy).await);
        }
        let started = Instant::now();
        let poller = economy.then(|| {
            tokio::spawn(engine::documents::economy::run(
                bench.pool.clone(),
                processor.provider.clone(),
                Duration::from_millis(500),
            ))
        });
        let workers = bench.workers(processor);
        loop {
            let open: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed')")
                .fetch_one(&bench.pool)
                .await
                .unwrap();
            if open == 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(600), "the run ends within 10 minutes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let last = started.elapsed().as_secs_f64();
        workers.shutdown().await;
        if let Some(poller) = poller {
            poller.abort();
        }
        let (done, charged, p50): (i64, i64, f64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'done'), sum(cost)::int8,
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - accepted_at))::float8
             FROM jobs WHERE id = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&bench.pool)
        .await
        .unwrap();
        assert_eq!(done, DOCUMENTS as i64, "every document done");
        let batches: i64 =
            sqlx::query_scalar("SELECT count(*) FROM provider_batches").fetch_one(&bench.pool).await.unwrap();
        let interactive = fake.calls() - fake.batch_requests();
        let label = if economy { "economy lane (the provider's batch API)" } else { "standard lane" };
        println!(
            "| {label} | {interactive} | {batches} ({}) | {charged} | {:.2} | {last:.1} s | {p50:.1} s |",
            fake.batch_requests(),
            charged as f64 / (standard * DOCUMENTS as i64) as f64
        );
        let key = if economy { "economy" } else { "standard" };
        println!(
            "RESULT economy_{key}_credits_over_standard={:.3}",
            charged as f64 / (standard * DOCUMENTS as i64) as f64
        );
        println!("RESULT economy_{key}_interactive_calls={interactive}");
        println!("RESULT economy_{key}_batches={batches}");
        println!("RESULT economy_{key}_last_secs={last:.1}");
    }
}

fn p95(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * 0.95).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let pool = engine::db::connect(&url, 30).await.unwrap();
    engine::db::MIGRATOR.run(&pool).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-parts-bench-{}", std::process::id()));
    let extractor = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("sluice-extract");
    let bench = Bench { pool, blobs: Blobs::local(&dir).unwrap(), extractor };
    match std::env::args().nth(1).as_deref() {
        Some("lanes") => {
            lanes(&bench).await;
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Some("translations") => {
            translation_writing_longer(&bench).await;
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Some("economy") => {
            economy_lane(&bench).await;
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        _ => {}
    }

    println!(
        "| row | time to result | ideal (same run) | ratio | parts, most calls at once | 429s | small documents' p95 wait |"
    );
    println!("|---|---|---|---|---|---|---|");
    let baseline = bench.run(None, true, OURS).await;
    let base_p95 = p95(&baseline.small_waits);
    println!(
        "| backlog alone: {} small documents from {SMALL_OWNERS} users | | | | | {} | {base_p95:.2} s |",
        baseline.small_waits.len(),
        baseline.report.refused
    );
    let documents = [("129K-token translation", "translate", 129_000), ("492K-token summary", "summarize", 492_000)];
    let mut asks = Vec::new();
    for (label, preset, tokens) in documents {
        for backlog in [false, true] {
            let run = bench.run(Some((preset, tokens)), backlog, OURS).await;
            if !backlog {
                asks.push((label.to_string(), run.report.clone()));
            }
            let secs = run.big_secs.unwrap_or(f64::NAN);
            let ratio = run.ideal_secs / secs;
            let (waits, wait_ratio) = if backlog {
                let p = p95(&run.small_waits);
                (format!("{p:.2} s ({:.2}x the backlog alone)", p / base_p95.max(0.001)), p / base_p95.max(0.001))
            } else {
                (String::new(), 0.0)
            };
            let row = format!("{label}{}", if backlog { ", behind the backlog" } else { ", alone" });
            println!(
                "| {row} | {secs:.1} s | {:.1} s | **{ratio:.2}** | {}, {} | {} | {waits} |",
                run.ideal_secs, run.parts, run.report.most_at_once, run.report.refused
            );
            let key = format!("{}_{}", preset, if backlog { "backlog" } else { "alone" });
            println!("RESULT parts_{key}_ratio={ratio:.3}");
            if backlog {
                println!("RESULT parts_{key}_small_wait_p95_vs_alone={wait_ratio:.3}");
            }
        }
    }
    println!();
    println!("| row (a provider counting 15 % more tokens, 200K context) | time to result | ideal (same run) | ratio | parts | refused as too long | attempts failed |");
    println!("|---|---|---|---|---|---|---|");
    for (label, preset, tokens) in documents {
        let run = bench.run(Some((preset, tokens)), false, COUNTS_MORE).await;
        let secs = run.big_secs.unwrap_or(f64::NAN);
        let ratio = run.ideal_secs / secs;
        println!(
            "| {label} | {secs:.1} s | {:.1} s | **{ratio:.2}** | {} | {} | {} |",
            run.ideal_secs, run.parts, run.report.too_long, run.failed_attempts
        );
        assert_eq!(run.failed_attempts, 0, "no attempt is used by a refusal");
        println!("RESULT parts_{preset}_counts_more_ratio={ratio:.3}");
        asks.push((format!("{label}, counting 15 % more"), run.report));
    }
    println!();
    translation_writing_longer(&bench).await;
    println!();
    println!("| document | calls | answer size asked, largest | asked in all | before issue 56 (64,000 a call) | written in all |");
    println!("|---|---|---|---|---|---|");
    for (label, report) in asks {
        let before = report.calls * u64::from(MAX_OUTPUT);
        println!(
            "| {label} | {} | {} | {} | {} | {} |",
            report.calls, report.largest_ask, report.asked_tokens, before, report.output_tokens
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
