//! Upload acceptance over real HTTP on loopback: `cargo xtask bench` (release build).
//!
//! 32 concurrent clients post distinct 1 MiB PDFs through `POST /api/v1/jobs` (bearer token,
//! multipart, streamed, hashed, admitted in one transaction). Credits and limits are ample,
//! so every upload is accepted. Prints p50 / p95 / p99 latency and uploads per second for
//! each run and their medians. Options: --runs N (3), --uploads N (2000), --clients N (32).

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::admission::AdmissionConfig;
use engine::accounts::{users, Role};

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

#[tokio::main]
async fn main() {
    let (runs, uploads, clients) = (arg("--runs", 3), arg("--uploads", 2000), arg("--clients", 32));
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 64).await.unwrap();
    let settings = WebSettings {
        admission: AdmissionConfig {
            max_backlog: i64::MAX,
            max_oldest_wait: Duration::from_secs(86_400),
            ..Default::default()
        },
        ..Default::default()
    };
    let blob_dir = std::env::temp_dir().join(format!("sluice-bench-blobs-{}", std::process::id()));
    let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
    let addr = server::spawn_web(pool.clone(), settings, blobs).await.unwrap();
    let (mut p50s, mut p95s, mut p99s, mut rates) = (vec![], vec![], vec![], vec![]);
    for run in 1..=runs {
        sqlx::query("TRUNCATE jobs, job_attempts, ledger, api_tokens, notices, users CASCADE")
            .execute(&pool)
            .await
            .unwrap();
        let user =
            users::create_user(&pool, "bench@example.com", "bench password", Role::User, 1_000_000).await.unwrap();
        sqlx::query("UPDATE users SET max_in_flight = 1000000 WHERE id = $1")
            .bind(user.id)
            .execute(&pool)
            .await
            .unwrap();
        let (_, token) = engine::accounts::tokens::create(&pool, user.id, "bench").await.unwrap();
        let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..uploads).map(|n| pdf(run * uploads + n)).collect());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = reqwest::Client::new();
        let started = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (bodies, next, client, token) = (bodies.clone(), next.clone(), client.clone(), token.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    loop {
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if n >= bodies.len() {
                            return latencies;
                        }
                        let form = reqwest::multipart::Form::new()
                            .part("file", reqwest::multipart::Part::bytes(bodies[n].clone()).file_name("bench.pdf"));
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
        "median of {runs}: {:.0} uploads/s ({uploads} x 1 MiB, {clients} clients); p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        median(&mut rates),
        median(&mut p50s),
        median(&mut p95s),
        median(&mut p99s)
    );
}
