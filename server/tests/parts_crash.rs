//! A worker process killed (-9) in the middle of a long document: the parts it finished are
//! never done again; another worker takes the job from the part that was running, and the
//! job ends done with one debit. Real processes, a real Postgres, the fake provider.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use fakeprovider::{FakeProvider, Reply};
use sqlx::PgPool;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A server process, killed when dropped so a failing assertion leaves nothing running.
struct Process {
    child: Child,
    port: u16,
}

impl Process {
    fn kill_9(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

fn start(role: &str, url: &str, data: &std::path::Path, provider: &str) -> Process {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_server"))
        .arg(role)
        .env("DATABASE_URL", url)
        .env("SLUICE_BIND", format!("127.0.0.1:{port}"))
        .env("SLUICE_DATA_DIR", data)
        .env("SLUICE_WORKERS", "4")
        .env("SLUICE_LEASE_SECS", "2")
        .env("SLUICE_HEARTBEAT_SECS", "0.5")
        .env("SLUICE_PROVIDER", "anthropic")
        .env("SLUICE_PROVIDER_URL", provider)
        .env("SLUICE_PROVIDER_API_KEY", "crash-test-key")
        .env("SLUICE_PROVIDER_CONTEXT_TOKENS", "1000")
        .env("SLUICE_LOG", "warn")
        .spawn()
        .expect("start the server");
    Process { child, port }
}

async fn healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("port {port} did not become healthy");
}

async fn wait_until(timeout: Duration, pool: &PgPool, sql: &str) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if sqlx::query_scalar::<_, bool>(sql).fetch_one(pool).await.unwrap_or(false) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_document_never_redoes_a_finished_part() {
    let cluster = tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-parts-crash")).await.unwrap().unwrap();
    cluster.cluster.create_database("sluice").unwrap();
    let url = cluster.cluster.url("sluice");
    let data = std::env::temp_dir().join(format!("sluice-parts-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let fake = FakeProvider::start().await;
    // Every call takes 400 ms, so the kill lands while a part is with the provider.
    fake.push((0..200).map(|_| Reply::Hang { millis: 400 }));

    let web = start("web", &url, &data, &fake.base_url());
    let mut first_worker = start("worker", &url, &data, &fake.base_url());
    healthy(web.port).await;
    healthy(first_worker.port).await;
    let pool = PgPool::connect(&url).await.unwrap();

    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up = browser
        .post(format!("http://127.0.0.1:{}/api/sign_up", web.port))
        .form(&[("email", "crash@example.com"), ("password", "a long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_up.status(), 200);
    let text: String = (1..=400)
        .map(|i| format!("Section {i} sets out the terms. Each party keeps its copy of section {i}.\n\n"))
        .collect();
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(text.into_bytes()).file_name("contract.txt"))
        .text("preset", "summarize");
    let accepted = browser.post(format!("http://127.0.0.1:{}/api/v1/jobs", web.port)).multipart(form).send().await.unwrap();
    assert_eq!(accepted.status(), 202);
    let id: uuid::Uuid = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().parse().unwrap();

    // Kill the worker once three parts are done and the fourth is with the provider.
    let three_done = format!(
        "SELECT parts_done >= 3 AND parts_stage = 'parts' AND state = 'running' AND stage = 'waiting_for_provider' FROM jobs WHERE id = '{id}'"
    );
    assert!(wait_until(Duration::from_secs(60), &pool, &three_done).await, "three parts done");
    first_worker.kill_9();
    let finished_before: Vec<(i32, uuid::Uuid)> = sqlx::query_as(
        "SELECT idx, attempt_id FROM job_parts WHERE job_id = $1 AND level = 0 AND output IS NOT NULL ORDER BY idx",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    let total: i32 = sqlx::query_scalar("SELECT parts_total FROM jobs WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
    assert!(finished_before.len() >= 3 && (finished_before.len() as i32) < total, "{finished_before:?} of {total}");

    let _second_worker = start("worker", &url, &data, &fake.base_url());
    let done = format!("SELECT state = 'done' FROM jobs WHERE id = '{id}'");
    assert!(wait_until(Duration::from_secs(90), &pool, &done).await, "another worker finishes the job");

    // The parts finished before the kill kept their output from the first worker's attempts.
    let after: Vec<(i32, uuid::Uuid)> = sqlx::query_as(
        "SELECT idx, attempt_id FROM job_parts WHERE job_id = $1 AND level = 0 AND idx = ANY($2) ORDER BY idx",
    )
    .bind(id)
    .bind(finished_before.iter().map(|(i, _)| *i).collect::<Vec<_>>())
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(after, finished_before);
    // One successful attempt per part and per combining step (and one writing the result);
    // the provider saw each part once, but for the one the kill interrupted.
    let (parts, succeeded): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM job_parts WHERE job_id = $1),
                (SELECT count(*) FROM job_attempts WHERE job_id = $1 AND outcome = 'succeeded')",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(succeeded, parts + 1);
    assert!(fake.calls() as i64 <= parts + 1, "{} provider calls for {parts} parts", fake.calls());
    let ledger: Vec<(String, i64)> = sqlx::query_as("SELECT kind, amount::int8 FROM ledger WHERE job_id = $1")
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ledger.len(), 1, "one debit, no refund: {ledger:?}");
    let _ = std::fs::remove_dir_all(&data);
}
