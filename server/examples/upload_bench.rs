//! Uploads over real HTTP on loopback: `cargo xtask bench` (release build). Three parts, in
//! this order so the memory figure is this process's own:
//!
//! 1. Peak RSS of the whole process (server and clients) while 20 clients each upload 50 MiB
//!    at once and are accepted (streamed through the checks into the local blob store).
//! 2. Refusal latency: 200 uploads of 50 MiB from an account with no credits, 8 at a time;
//!    the time from the first byte sent until the 402 arrives (the client is still sending).
//! 3. Acceptance: 32 concurrent clients post distinct 1 MiB PDFs through `POST /api/v1/jobs`;
//!    p50 / p95 / p99 latency and uploads per second for each run and their medians. By
//!    default they are one user's (whose uploads are admitted at most 8 at a time, one debit
//!    commit at a time); `--users 32` makes each client a user of its own.
//!
//! Options: --runs N (3), --uploads N (2000), --clients N (32), --users N (1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::{users, Role};
use server::testing::{file_part, raw_upload};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pdf(n: usize) -> Vec<u8> {
    let mut bytes = format!("%PDF-1.7\n% upload {n}\n").into_bytes();
    bytes.resize(1024 * 1024, b'x');
    bytes
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// A user with `credits` and a token for it.
async fn user_with_token(pool: &sqlx::PgPool, email: &str, credits: i64) -> String {
    let user = users::create_user(pool, email, "bench password", Role::User, credits).await.unwrap();
    engine::accounts::tokens::create(pool, user.id, "bench").await.unwrap().1
}

async fn big_uploads_in_bounded_memory(pool: &sqlx::PgPool, addr: std::net::SocketAddr) {
    let mut tokens = Vec::new();
    for n in 0..20 {
        tokens.push(user_with_token(pool, &format!("big{n}@example.com"), 5).await);
    }
    let started = Instant::now();
    let uploads: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(n, token)| {
            tokio::task::spawn_blocking(move || {
                let head = format!("%PDF-1.7\n%{n}\n");
                raw_upload(addr, &token, &file_part("big.pdf"), head.as_bytes(), b'0', 50 << 20)
            })
        })
        .collect();
    for upload in uploads {
        assert_eq!(upload.await.unwrap().status, 202);
    }
    println!(
        "20 x 50 MiB accepted at once in {:.1} s: peak RSS of this process (server + clients) {} MiB",
        started.elapsed().as_secs_f64(),
        engine::testing::peak_rss_mib()
    );
}

async fn refusals_before_the_body(pool: &sqlx::PgPool, addr: std::net::SocketAddr) {
    let token = user_with_token(pool, "broke@example.com", 0).await;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (token, next) = (token.clone(), next.clone());
            tokio::task::spawn_blocking(move || {
                let mut took = Vec::new();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 200 {
                    let answer = raw_upload(addr, &token, &file_part("big.pdf"), b"%PDF-1.7\n", b'0', 50 << 20);
                    assert_eq!(answer.status, 402);
                    assert!(answer.sent < 50 << 20);
                    took.push(answer.took.as_secs_f64() * 1000.0);
                }
                took
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for client in clients {
        latencies.extend(client.await.unwrap());
    }
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "refusing 50 MiB uploads without credits (200, 8 at a time): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99)
    );
}

#[tokio::main]
async fn main() {
    let (runs, uploads, clients) = (arg("--runs", 3), arg("--uploads", 2000), arg("--clients", 32));
    let owners = arg("--users", 1).max(1);
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 64).await.unwrap();
    let settings = WebSettings {
        admission: AdmissionConfig {
            max_backlog: i64::MAX,
            max_oldest_wait: Duration::from_secs(86_400),
            ..Default::default()
        },
        // The clients stand for many people on their own addresses, all on loopback here.
        max_uploads_per_address: 1024,
        ..Default::default()
    };
    let blob_dir = std::env::temp_dir().join(format!("sluice-bench-blobs-{}", std::process::id()));
    let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
    let addr = server::spawn_web(pool.clone(), settings, blobs).await.unwrap();
    big_uploads_in_bounded_memory(&pool, addr).await;
    refusals_before_the_body(&pool, addr).await;
    let (mut p50s, mut p95s, mut p99s, mut rates) = (vec![], vec![], vec![], vec![]);
    for run in 1..=runs {
        sqlx::query("TRUNCATE jobs, job_attempts, ledger, api_tokens, notices, users CASCADE")
            .execute(&pool)
            .await
            .unwrap();
        let mut tokens = Vec::with_capacity(owners);
        for u in 0..owners {
            let email = format!("bench{u}@example.com");
            let user = users::create_user(&pool, &email, "bench password", Role::User, 1_000_000).await.unwrap();
            sqlx::query("UPDATE users SET max_in_flight = 1000000 WHERE id = $1")
                .bind(user.id)
                .execute(&pool)
                .await
                .unwrap();
            tokens.push(engine::accounts::tokens::create(&pool, user.id, "bench").await.unwrap().1);
        }
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = reqwest::Client::new();
        let started = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (next, client, token) = (next.clone(), client.clone(), tokens[c % owners].clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    loop {
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if n >= uploads {
                            return latencies;
                        }
                        let body = pdf(run * uploads + n);
                        let form = reqwest::multipart::Form::new()
                            .part("file", reqwest::multipart::Part::bytes(body).file_name("bench.pdf"));
                        let t = Instant::now();
                        let response = client
                            .post(format!("http://{addr}/api/v1/jobs"))
                            .bearer_auth(&token)
                            .multipart(form)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
                        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(uploads);
        for t in tasks {
            latencies.extend(t.await.unwrap());
        }
        let rate = uploads as f64 / started.elapsed().as_secs_f64();
        latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (p50, p95, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95), percentile(&latencies, 0.99));
        println!("run {run}: {rate:>7.0} uploads/s   p50 {p50:>6.2} ms  p95 {p95:>6.2} ms  p99 {p99:>6.2} ms");
        p50s.push(p50);
        p95s.push(p95);
        p99s.push(p99);
        rates.push(rate);
    }
    let _ = std::fs::remove_dir_all(&blob_dir);
    println!(
        "median of {runs}: {:.0} uploads/s ({uploads} x 1 MiB, {clients} clients of {owners} users); p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        median(&mut rates),
        median(&mut p50s),
        median(&mut p95s),
        median(&mut p99s)
    );
}
