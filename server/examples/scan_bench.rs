//! The web while a scan is read: `cargo xtask bench scan` (release build). A 40-page scanned PDF
//! (no text layer) is uploaded; its owner's page polls its status (8 connections, each every
//! 50 ms) and small text uploads come (5 a second), for 10 seconds, twice in the same run:
//!
//! 1. the reference: processing paused, the scan waiting;
//! 2. the same while a worker reads the scan by OCR (Tesseract in the sandboxed readers, one
//!    page at a time, as `server serve` runs them); only the time it is reading counts.
//!
//! Prints p50 / p99 of polls and uploads in each and the pages read meanwhile, per run, and a
//! `RESULT` line of the runs' medians. Client, server, readers and Postgres share the machine's
//! cores: the figure is the system's. Options: --runs N (3), --seconds N (10).

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::{users, Role};
use engine::documents::ocr::OcrConfig;
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, ProviderConfig};
use engine::documents::sandbox::SandboxConfig;
use engine::hooks::SluiceHooks;
use engine::queue::worker::{WorkerConfig, WorkerPool};
use engine::testing::{pdf_of_pages, TestPage};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// What the web answered in one phase: polls' and uploads' latencies (ms), sorted.
struct Phase {
    polls: Vec<f64>,
    uploads: Vec<f64>,
}

impl Phase {
    fn line(&self, name: &str) -> String {
        format!(
            "{name}: {} polls p50 {:.1} ms p99 {:.1} ms; {} uploads p50 {:.1} ms p99 {:.1} ms",
            self.polls.len(),
            percentile(&self.polls, 0.5),
            percentile(&self.polls, 0.99),
            self.uploads.len(),
            percentile(&self.uploads, 0.5),
            percentile(&self.uploads, 0.99)
        )
    }
}

/// Polls of `job` and uploads as its owner, until `until` says stop (checked every poll).
async fn measure(
    addr: std::net::SocketAddr,
    token: &str,
    job: &str,
    first_upload: usize,
    until: impl Fn() -> bool + Send + Sync + 'static,
) -> Phase {
    let until = Arc::new(until);
    let client = reqwest::Client::new();
    let mut pollers = Vec::new();
    for _ in 0..8 {
        let (client, token, url, until) =
            (client.clone(), token.to_string(), format!("http://{addr}/api/v1/jobs/{job}"), until.clone());
        pollers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while !until() {
                let sent = Instant::now();
                let answer = client.get(&url).bearer_auth(&token).send().await.unwrap();
                assert_eq!(answer.status(), 200);
                answer.bytes().await.unwrap();
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            latencies
        }));
    }
    let uploader = {
        let (client, token, until) = (client.clone(), token.to_string(), until.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = first_upload;
            while !until() {
                let text = format!("Note {n}: the survey team visits on Monday.\n").repeat(200);
                let form = reqwest::multipart::Form::new()
                    .part("file", reqwest::multipart::Part::bytes(text.into_bytes()).file_name(format!("note-{n}.txt")))
                    .text("preset", "summarize");
                let sent = Instant::now();
                let answer = client
                    .post(format!("http://{addr}/api/v1/jobs"))
                    .bearer_auth(&token)
                    .multipart(form)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), 202, "{}", answer.text().await.unwrap_or_default());
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            latencies
        })
    };
    let mut polls: Vec<f64> = Vec::new();
    for poller in pollers {
        polls.extend(poller.await.unwrap());
    }
    let mut uploads = uploader.await.unwrap();
    polls.sort_by(|a, b| a.partial_cmp(b).unwrap());
    uploads.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Phase { polls, uploads }
}

#[tokio::main]
async fn main() {
    let (runs, seconds) = (arg("--runs", 3).max(1), arg("--seconds", 10));
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 40).await.unwrap();
    sqlx::query("TRUNCATE jobs, job_attempts, ledger, api_tokens, notices, users CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    let user =
        users::create_user(&pool, "scan-bench@example.com", "bench password", Role::User, 100_000).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 10000 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
    let token = engine::accounts::tokens::create(&pool, user.id, "bench").await.unwrap().1;

    // The readers as `server serve` runs them: the release reader, OCR in English.
    let extractor = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("sluice-extract");
    let mut reader = SandboxConfig::new(extractor, Vec::new());
    let tools = engine::documents::ocr::probe("/usr/bin/tesseract".as_ref(), "/usr/bin/pdftoppm".as_ref())
        .expect("Tesseract and pdftoppm (cargo xtask setup installs them)");
    println!("OCR: {} ({} readers at once on {} cores)", tools.version, reader.max_readers(), num_cores());
    reader.ocr = Some(Arc::new(OcrConfig::new(vec!["eng".into()])));
    let reader = Arc::new(reader);
    let settings = WebSettings {
        survey_reader: Some(reader.clone()),
        max_uploads_per_user: 1024,
        max_uploads_per_address: 1024,
        ..Default::default()
    };
    let blob_dir = std::env::temp_dir().join(format!("sluice-scan-bench-{}", std::process::id()));
    let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
    let addr = server::spawn_web(pool.clone(), settings, blobs.clone()).await.unwrap();
    engine::queue::switches::set_processing(&pool, false, "bench").await.unwrap();
    let processor = DocumentProcessor {
        blobs,
        provider: providers::build(&ProviderConfig::default()),
        sandbox: reader,
        stages: engine::queue::stages::StageLog::new(pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::new(pool.clone()),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let workers = WorkerConfig { name: "scan-bench".into(), concurrency: 8, ..WorkerConfig::default() };
    let handle = WorkerPool::start(pool.clone(), workers, Arc::new(processor), Arc::new(SluiceHooks));
    let mut results = Vec::new();
    for run in 1..=runs {
        println!("run {run} of {runs}");
        results.push(one_run(&pool, addr, &token, run, seconds).await);
    }
    handle.shutdown().await;
    let of = |i: usize| median(results.iter().map(|r| r[i]).collect());
    println!(
        "RESULT scan_polls_p99_ratio={:.2} reading_poll_p99={:.1} idle_poll_p99={:.1} reading_upload_p99={:.1} \
         idle_upload_p99={:.1} pages_per_sec={:.2} (medians of {runs} runs)",
        of(0),
        of(1),
        of(2),
        of(3),
        of(4),
        of(5)
    );
    let _ = std::fs::remove_dir_all(&blob_dir);
}

/// One run: a fresh 40-page scan waits while the web is measured, then is read while it is
/// measured again. Returns [poll p99 ratio, reading poll p99, idle poll p99, reading upload
/// p99, idle upload p99, pages a second].
async fn one_run(pool: &sqlx::PgPool, addr: std::net::SocketAddr, token: &str, run: u64, seconds: u64) -> [f64; 6] {
    engine::queue::switches::set_processing(pool, false, "bench").await.unwrap();
    let pages: Vec<TestPage> = (1..=40)
        .map(|n| {
            TestPage::Scanned(vec![format!("Survey {run}, page {n}."), format!("Finding {n}: the roof needs repair.")])
        })
        .collect();
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(pdf_of_pages(&pages)).file_name("survey.pdf"))
        .text("preset", "summarize");
    let client = reqwest::Client::new();
    let answer =
        client.post(format!("http://{addr}/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap();
    assert_eq!(answer.status(), 202);
    let job = answer.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let first_upload = run as usize * 1_000_000;

    let ends = Instant::now() + Duration::from_secs(seconds);
    let idle = measure(addr, token, &job, first_upload, move || Instant::now() >= ends).await;
    println!("{}", idle.line("scan waiting (idle)"));
    engine::queue::switches::set_processing(pool, true, "bench").await.unwrap();
    let page_of = |pool: sqlx::PgPool, job: String| async move {
        sqlx::query_scalar::<_, Option<i32>>("SELECT reading_page FROM jobs WHERE id = $1::uuid")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    while page_of(pool.clone(), job.clone()).await.is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let first_page = page_of(pool.clone(), job.clone()).await.unwrap_or(1);
    // Measured while it reads, for as long as the reference was (or until it is read).
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (pool, job, reading) = (pool.clone(), job.clone(), reading.clone());
        tokio::spawn(async move {
            while started.elapsed() < Duration::from_secs(seconds) && page_of(pool.clone(), job.clone()).await.is_some()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            reading.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let flag = reading.clone();
    let busy =
        measure(addr, token, &job, first_upload + 500_000, move || !flag.load(std::sync::atomic::Ordering::SeqCst))
            .await;
    watcher.await.unwrap();
    let measured = started.elapsed().as_secs_f64();
    let last_page = page_of(pool.clone(), job.clone()).await.unwrap_or(40);
    println!("{}", busy.line(&format!("scan read by OCR (pages {first_page} to {last_page} in {measured:.1} s)")));
    let read = wait_done(pool, &job).await;
    let ratio = percentile(&busy.polls, 0.99) / percentile(&idle.polls, 0.99);
    println!("poll p99 while reading over idle: {ratio:.2}; {read:.2} pages a second");
    [
        ratio,
        percentile(&busy.polls, 0.99),
        percentile(&idle.polls, 0.99),
        percentile(&busy.uploads, 0.99),
        percentile(&idle.uploads, 0.99),
        read,
    ]
}

/// Wait for the scan's job to end; its 40 pages' reading pace (pages a second).
async fn wait_done(pool: &sqlx::PgPool, job: &str) -> f64 {
    let started = Instant::now();
    loop {
        let (state, report): (String, Option<serde_json::Value>) =
            sqlx::query_as("SELECT state::text, scan_report FROM jobs WHERE id = $1::uuid")
                .bind(job)
                .fetch_one(pool)
                .await
                .unwrap();
        if state == "done" {
            let read = report.and_then(|r| r["read"].as_array().map(Vec::len)).unwrap_or(0);
            assert_eq!(read, 40, "every page was read");
            let (secs,): (f64,) = sqlx::query_as(
                "SELECT extract(epoch FROM finished_at - started_at)::float8 FROM jobs WHERE id = $1::uuid",
            )
            .bind(job)
            .fetch_one(pool)
            .await
            .unwrap();
            return read as f64 / secs.max(0.001);
        }
        assert!(started.elapsed() < Duration::from_secs(600), "the scan was not read in 10 minutes ({state})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
