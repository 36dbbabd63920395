//! Web answers while the workers work: `cargo xtask bench busy` (release build). Uploads come
//! in an open loop (50 a second, 256 KiB text documents, as many users would send them, each
//! on its own schedule) for 10 seconds, twice in the same run:
//!
//! 1. the reference: processing paused, a backlog of 600 documents waiting;
//! 2. the same while a worker pool (70 slots, the gate at 24) drains that backlog with the
//!    `local` provider, whose analysis is CPU work, and the readers extract every document.
//!
//! Prints p50 / p95 / p99 upload latency of each and a `RESULT` line. Client, server, workers
//! and Postgres share the machine's cores: the figure is the whole system's.
//! Options: --rate N (50 uploads a second), --seconds N (10), --backlog N (600).

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::{users, Role};
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, ProviderConfig, ProviderKind};
use engine::documents::sandbox::SandboxConfig;
use engine::hooks::SluiceHooks;
use engine::queue::worker::{WorkerConfig, WorkerPool};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A 256 KiB text of plain sentences, different for each `n` (the analysis has real work).
fn document(n: usize) -> Vec<u8> {
    const WORDS: [&str; 24] = [
        "revenue",
        "grew",
        "region",
        "costs",
        "fell",
        "percent",
        "quarter",
        "the",
        "team",
        "shipped",
        "report",
        "customers",
        "asked",
        "for",
        "faster",
        "answers",
        "and",
        "lower",
        "prices",
        "while",
        "margins",
        "held",
        "steady",
        "overall",
    ];
    let mut state = (n as u64).wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut text = format!("Report {n}\n\n");
    while text.len() < 256 * 1024 {
        for i in 0..12 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let word = WORDS[(state >> 33) as usize % WORDS.len()];
            text.push_str(if i == 0 { "The " } else { " " });
            text.push_str(word);
        }
        text.push_str(".\n");
    }
    text.into_bytes()
}

async fn upload(client: &reqwest::Client, addr: std::net::SocketAddr, token: &str, n: usize) -> f64 {
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(document(n)).file_name(format!("report-{n}.txt")))
        .text("preset", "summarize");
    let sent = Instant::now();
    let answer =
        client.post(format!("http://{addr}/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap();
    assert_eq!(answer.status(), 202, "{}", answer.text().await.unwrap_or_default());
    sent.elapsed().as_secs_f64() * 1000.0
}

/// Uploads started every `1/rate` s for `seconds`, whatever the earlier ones are doing (an open
/// loop); returns their latencies, sorted.
async fn open_loop(
    addr: std::net::SocketAddr,
    tokens: &[String],
    first: usize,
    rate: usize,
    seconds: usize,
) -> Vec<f64> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let total = rate * seconds;
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
        let (client, token) = (client.clone(), tokens[i % tokens.len()].clone());
        tasks.push(tokio::spawn(async move { upload(&client, addr, &token, first + i).await }));
    }
    let mut latencies = Vec::with_capacity(total);
    for task in tasks {
        latencies.push(task.await.unwrap());
    }
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    latencies
}

fn line(name: &str, l: &[f64]) -> String {
    format!(
        "{name}: {} uploads, p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms",
        l.len(),
        percentile(l, 0.5),
        percentile(l, 0.95),
        percentile(l, 0.99)
    )
}

#[tokio::main]
async fn main() {
    let (rate, seconds, backlog) = (arg("--rate", 50), arg("--seconds", 10), arg("--backlog", 600));
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 40).await.unwrap();
    sqlx::query("TRUNCATE jobs, job_attempts, ledger, api_tokens, notices, users CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for u in 0..50 {
        let user = users::create_user(&pool, &format!("busy{u}@example.com"), "bench password", Role::User, 100_000)
            .await
            .unwrap();
        sqlx::query("UPDATE users SET max_in_flight = 10000 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
        tokens.push(engine::accounts::tokens::create(&pool, user.id, "bench").await.unwrap().1);
    }
    let settings = WebSettings {
        admission: AdmissionConfig {
            max_backlog: i64::MAX,
            max_oldest_wait: Duration::from_secs(86_400),
            ..Default::default()
        },
        max_uploads_per_address: 1024,
        max_uploads_per_user: 1024,
        max_concurrent_uploads: 256,
        ..Default::default()
    };
    let blob_dir = std::env::temp_dir().join(format!("sluice-busy-bench-{}", std::process::id()));
    let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
    let addr = server::spawn_web(pool.clone(), settings, blobs.clone()).await.unwrap();

    engine::queue::switches::set_processing(&pool, false, "bench").await.unwrap();
    engine::queue::switches::set_gate_size(&pool, 24, "bench").await.unwrap();
    let client = reqwest::Client::new();
    for chunk in (0..backlog).collect::<Vec<_>>().chunks(16) {
        let sent: Vec<_> = chunk.iter().map(|n| upload(&client, addr, &tokens[n % tokens.len()], *n)).collect();
        futures::future::join_all(sent).await;
    }
    let paused = open_loop(addr, &tokens, backlog, rate, seconds).await;
    println!("{}", line("processing paused", &paused));

    // The workers as `server serve` runs them: the local provider, the readers in their sandbox.
    let extractor = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("sluice-extract");
    let processor = DocumentProcessor {
        blobs,
        provider: providers::build(&ProviderConfig {
            kind: ProviderKind::Local,
            base_url: String::new(),
            api_key: None,
            model: String::new(),
            max_tokens: 0,
            timeout: Duration::from_secs(60),
            timeout_per_100k_tokens: Duration::ZERO,
            stream: true,
            stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
        }),
        sandbox: Arc::new(SandboxConfig::new(extractor, Vec::new())),
        stages: engine::queue::stages::StageLog::new(pool.clone()),
        budget: engine::queue::capacity::Budget::new(pool.clone(), &Default::default()),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::new(pool.clone()),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let workers = WorkerConfig { name: "busy-bench".into(), concurrency: 70, ..WorkerConfig::default() };
    let pool_handle = WorkerPool::start(pool.clone(), workers, Arc::new(processor), Arc::new(SluiceHooks));
    engine::queue::switches::set_processing(&pool, true, "bench").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let done_before: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'done'").fetch_one(&pool).await.unwrap();
    let busy = open_loop(addr, &tokens, backlog + rate * seconds, rate, seconds).await;
    let done_after: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'done'").fetch_one(&pool).await.unwrap();
    pool_handle.shutdown().await;
    let drained = done_after - done_before;
    assert!(drained > 0, "the workers finished no document while the uploads came: nothing was measured");
    println!("{} (the workers finished {drained} documents meanwhile)", line("workers draining the backlog", &busy));
    println!(
        "RESULT busy_p95={:.1} paused_p95={:.1} busy_p50={:.1} paused_p50={:.1} drained={drained}",
        percentile(&busy, 0.95),
        percentile(&paused, 0.95),
        percentile(&busy, 0.5),
        percentile(&paused, 0.5)
    );
    let _ = std::fs::remove_dir_all(&blob_dir);
}
