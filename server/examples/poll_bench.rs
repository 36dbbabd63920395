//! Status polls over real HTTP on loopback: `cargo xtask bench poll` (release build). 1,000
//! users, each with a token and jobs waiting in line (10,000 jobs across them, a full gate
//! running), poll `GET /api/v1/jobs/{id}` from 64 connections for 10 seconds, as 10,000 users
//! polling every 2 s would; then the jobs page's poll, `list_jobs` through a logged-in session,
//! one browser per connection. Prints requests per second and p50 / p99 latency, per run and
//! the medians, beside the same client against `/healthz` in the same run (the HTTP stack and
//! one trivial query). Options: --runs N (3), --seconds N (10), --clients N (64).
//!
//! Client, server and Postgres share the machine's cores: the figure is the whole system's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::server::session::WebSettings;
use engine::accounts::{users, Role};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
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
    let (runs, seconds, clients) = (arg("--runs", 3), arg("--seconds", 10), arg("--clients", 64));
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (cargo xtask bench sets it)");
    let pool = engine::db::connect(&url, 64).await.unwrap();
    sqlx::query("TRUNCATE jobs, job_attempts, ledger, api_tokens, notices, users CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    // 1,000 users with a token each, 10 waiting jobs each, and a full gate running.
    let mut tokens = std::collections::HashMap::new();
    for n in 0..1000 {
        let user = users::create_user(&pool, &format!("poller{n}@example.com"), "bench password", Role::User, 0)
            .await
            .unwrap();
        let (_, token) = engine::accounts::tokens::create(&pool, user.id, "bench").await.unwrap();
        sqlx::query("INSERT INTO jobs (owner_id, payload) SELECT $1, '{}' FROM generate_series(1, 10)")
            .bind(user.id)
            .execute(&pool)
            .await
            .unwrap();
        tokens.insert(user.id, token);
    }
    engine::queue::claim(&pool, "bench", 24, Duration::from_secs(3600)).await.unwrap();
    // Each user polls one of their jobs still waiting (a gate's worth of first jobs run).
    let waiting: Vec<(i64, uuid::Uuid)> = sqlx::query_as(
        "SELECT DISTINCT ON (owner_id) owner_id, id FROM jobs WHERE state = 'queued' ORDER BY owner_id, run_at DESC, id DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let polls: Vec<(String, String)> =
        waiting.into_iter().map(|(owner, id)| (tokens[&owner].clone(), format!("/api/v1/jobs/{id}"))).collect();
    sqlx::query("VACUUM ANALYZE").execute(&pool).await.unwrap();
    let blob_dir = std::env::temp_dir().join(format!("sluice-poll-bench-{}", std::process::id()));
    let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
    let addr = server::spawn_web(pool.clone(), WebSettings::default(), blobs).await.unwrap();
    let polls: Arc<Vec<(Option<String>, String)>> =
        Arc::new(polls.into_iter().map(|(token, path)| (Some(token), path)).collect());
    // The reference, measured in the same run by the same client: `/healthz` is the whole HTTP
    // stack and one trivial query, the least any request that reads the database costs here.
    let health: Arc<Vec<(Option<String>, String)>> = Arc::new(vec![(None, "/healthz".to_string())]);
    // The jobs page's poll: one logged-in browser per connection. Each keeps the session
    // cookie its log-in was given and sends it back as it is (a cookie jar matching every
    // request's URL would be the load generator's cost on the server's cores, not Sluice's).
    let mut browsers = Vec::with_capacity(clients);
    for c in 0..clients {
        let browser = reqwest::Client::new();
        let email = format!("poller{}@example.com", c % 1000);
        let logged_in = browser
            .post(format!("http://{addr}/api/log_in"))
            .header("Origin", format!("http://{addr}"))
            .form(&[("email", email.as_str()), ("password", "bench password")])
            .send()
            .await
            .unwrap();
        assert_eq!(logged_in.status(), 200);
        let cookies: Vec<String> =
            logged_in.cookies().map(|cookie| format!("{}={}", cookie.name(), cookie.value())).collect();
        browsers.push((browser, cookies.join("; ")));
    }
    let (mut rates, mut p50s, mut p99s, mut references) = (vec![], vec![], vec![], vec![]);
    let (mut list_rates, mut list_p50s, mut list_p99s) = (vec![], vec![], vec![]);
    for run in 1..=runs {
        let (rate, p50, p99) = load(addr, &polls, seconds, clients).await;
        let (reference, ref_p50, ref_p99) = load(addr, &health, seconds, clients).await;
        eprintln!("run {run}: the jobs page's polls");
        let (list_rate, list_p50, list_p99) = load_jobs_page(addr, &browsers, seconds).await;
        println!(
            "run {run}: {rate:>6.0} polls/s  p50 {p50:>6.2} ms  p99 {p99:>6.2} ms; list_jobs {list_rate:>6.0}/s  p50 {list_p50:>6.2} ms  p99 {list_p99:>6.2} ms; /healthz {reference:>6.0}/s  p50 {ref_p50:>6.2} ms  p99 {ref_p99:>6.2} ms (ratios {:.2}, {:.2})",
            rate / reference,
            list_rate / reference
        );
        rates.push(rate);
        p50s.push(p50);
        p99s.push(p99);
        references.push(reference);
        list_rates.push(list_rate);
        list_p50s.push(list_p50);
        list_p99s.push(list_p99);
    }
    let ratios: Vec<f64> = rates.iter().zip(&references).map(|(a, b)| a / b).collect();
    let list_ratios: Vec<f64> = list_rates.iter().zip(&references).map(|(a, b)| a / b).collect();
    println!(
        "median of {runs}: status polls, {clients} connections, 1,000 users with 10,000 jobs waiting: {:.0} polls/s, p50 {:.2} ms, p99 {:.2} ms; /healthz in the same runs {:.0}/s; ratio {:.2}",
        median(&mut rates),
        median(&mut p50s),
        median(&mut p99s),
        median(&mut references),
        median(&mut ratios.clone())
    );
    println!(
        "median of {runs}: jobs page polls (list_jobs, a session each), {clients} connections: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms; ratio to /healthz {:.2}",
        median(&mut list_rates),
        median(&mut list_p50s),
        median(&mut list_p99s),
        median(&mut list_ratios.clone())
    );
    let _ = std::fs::remove_dir_all(&blob_dir);
}

/// What the load generator checks in an answer, and no more: it shares the machine's cores
/// with the server, so it parses each answer without building a tree of every field (the
/// same for `/healthz`, the reference).
#[derive(serde::Deserialize)]
struct Checked {
    jobs_ahead: Option<i64>,
}

#[derive(serde::Deserialize)]
struct JobsPage {
    jobs: Vec<serde::de::IgnoredAny>,
}

/// Requests per second since `started` and p50 / p99 latency in ms, over every client's
/// latencies.
async fn rate_and_latency(tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>, started: Instant) -> (f64, f64, f64) {
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (latencies.len() as f64 / elapsed, percentile(&latencies, 0.5), percentile(&latencies, 0.99))
}

/// Each browser (a session of its own) asks for its first page of jobs, as the jobs page polls,
/// for `seconds`; returns requests per second and p50 / p99 latency in ms.
async fn load_jobs_page(
    addr: std::net::SocketAddr,
    browsers: &[(reqwest::Client, String)],
    seconds: usize,
) -> (f64, f64, f64) {
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds as u64);
    let tasks: Vec<_> = browsers
        .iter()
        .cloned()
        .map(|(browser, cookies)| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let sent = Instant::now();
                    let answer = browser
                        .post(format!("http://{addr}/api/list_jobs"))
                        .header("Origin", format!("http://{addr}"))
                        .header("Cookie", &cookies)
                        .form(&[("page", "0")])
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(answer.status(), 200);
                    let page: JobsPage = answer.json().await.unwrap();
                    assert!(!page.jobs.is_empty(), "a page of the user's jobs");
                    latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    rate_and_latency(tasks, started).await
}

/// `clients` connections sending `requests` round-robin for `seconds`, each waiting for its
/// answer before the next; returns requests per second and p50 / p99 latency in ms.
async fn load(
    addr: std::net::SocketAddr,
    requests: &Arc<Vec<(Option<String>, String)>>,
    seconds: usize,
    clients: usize,
) -> (f64, f64, f64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(clients).build().unwrap();
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds as u64);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, requests) = (client.clone(), requests.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = c;
                while Instant::now() < until {
                    let (token, path) = &requests[i % requests.len()];
                    let sent = Instant::now();
                    let mut request = client.get(format!("http://{addr}{path}"));
                    if let Some(token) = token {
                        request = request.bearer_auth(token);
                    }
                    let answer = request.send().await.unwrap();
                    assert_eq!(answer.status(), 200, "{path}");
                    let body: Checked = answer.json().await.unwrap();
                    assert!(token.is_none() || body.jobs_ahead.is_some(), "a waiting job's place in line");
                    latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                    i += clients;
                }
                latencies
            })
        })
        .collect();
    rate_and_latency(tasks, started).await
}
