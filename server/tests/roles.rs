//! Process roles: two `server web` processes and one `server worker` on one Postgres. Uploads
//! through either web process are worked off by the worker process; the kill switch, flipped
//! from the command line, holds across all of them; the operator commands read and change the
//! queue; a worker killed mid-document never redoes a finished part.

use std::process::{Child, Command, Output};
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
    /// Its separate `/metrics` address.
    metrics_port: u16,
}

impl Process {
    /// As a crash would: no graceful shutdown, no hand-back.
    fn kill_9(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Only a process still running: a reaped one's pid may be someone else's by now.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
            let _ = self.child.wait();
        }
    }
}

fn start(role: &str, url: &str, data: &std::path::Path) -> Process {
    start_logging(role, url, data, "warn", std::process::Stdio::inherit())
}

fn start_logging(role: &str, url: &str, data: &std::path::Path, log: &str, stdout: std::process::Stdio) -> Process {
    start_with(role, url, data, log, stdout, &[])
}

/// A server process with these environment variables set besides the usual ones.
fn start_with(
    role: &str,
    url: &str,
    data: &std::path::Path,
    log: &str,
    stdout: std::process::Stdio,
    env: &[(&str, &str)],
) -> Process {
    let (port, metrics_port) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_server"))
        .arg(role)
        .env("DATABASE_URL", url)
        .env("SLUICE_BIND", format!("127.0.0.1:{port}"))
        .env("SLUICE_METRICS_BIND", format!("127.0.0.1:{metrics_port}"))
        .env("SLUICE_DATA_DIR", data)
        .env("SLUICE_WORKERS", "2")
        .env("SLUICE_LOG", log)
        .env("SLUICE_LOG_FORMAT", "json")
        // These flows sign up and upload at once: the grant comes without confirming the
        // address (verification has its own tests, tests/api/mail.rs).
        .env("SLUICE_REQUIRE_EMAIL_VERIFICATION", "false")
        .envs(env.iter().copied())
        .stdout(stdout)
        .spawn()
        .expect("start the server");
    Process { child, port, metrics_port }
}

fn operator(url: &str, data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_server"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("SLUICE_DATA_DIR", data)
        .env("SLUICE_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
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

async fn state_of(client: &reqwest::Client, port: u16, id: &str) -> String {
    let job: serde_json::Value =
        client.get(format!("http://127.0.0.1:{port}/api/v1/jobs/{id}")).send().await.unwrap().json().await.unwrap();
    job["state"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn web_and_worker_processes_share_one_queue_and_one_kill_switch() {
    let cluster = tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-roles")).await.unwrap().unwrap();
    cluster.cluster.create_database("sluice").unwrap();
    let url = cluster.cluster.url("sluice");
    let data = std::env::temp_dir().join(format!("sluice-roles-data-{}", std::process::id()));
    std::fs::create_dir_all(&data).unwrap();

    assert!(stdout(&operator(&url, &data, &["migrate"])).contains("migrations applied"));
    // The worker logs JSON, with its job lines at debug, to a file this test reads.
    let worker_log = data.join("worker.log");
    let worker = start_logging(
        "worker",
        &url,
        &data,
        "warn,engine::queue::worker=debug",
        std::fs::File::create(&worker_log).unwrap().into(),
    );
    let (web_a, web_b) = (start("web", &url, &data), start("web", &url, &data));
    for port in [web_a.port, web_b.port, worker.port] {
        healthy(port).await;
    }
    let page = reqwest::get(format!("http://127.0.0.1:{}/", worker.port)).await.unwrap();
    assert_eq!(page.status(), 404, "a worker process serves no pages");

    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up = browser
        .post(format!("http://127.0.0.1:{}/api/sign_up", web_a.port))
        .form(&[("email", "roles@example.com"), ("password", "a long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_up.status(), 200);
    let upload = |port: u16, n: u32| {
        let form = reqwest::multipart::Form::new()
            .part(
                "file",
                reqwest::multipart::Part::bytes(format!("Document {n}. It has two sentences.\n").into_bytes())
                    .file_name(format!("doc{n}.txt")),
            )
            .text("preset", "summarize");
        browser.post(format!("http://127.0.0.1:{port}/api/v1/jobs")).multipart(form).send()
    };

    // Each process records itself: the two web processes and the worker, with its slots.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let processes = || async {
        let mut rows: Vec<(String, i32, bool)> = engine::queue::processes::list(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|p| (p.role, p.slots, p.alive))
            .collect();
        rows.sort();
        rows
    };
    let seen = processes().await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!((seen[0].0.as_str(), seen[0].2), ("web", true));
    assert_eq!((seen[1].0.as_str(), seen[1].2), ("web", true));
    assert!(seen[2].0 == "worker" && seen[2].1 > 0 && seen[2].2, "{seen:?}");

    // Paused from the command line for ten minutes: uploads are still accepted, nothing runs.
    let refused = operator(&url, &data, &["pause", "--reason", "x", "--for", "10 fortnights"]);
    assert!(!refused.status.success());
    let paused = stdout(&operator(&url, &data, &["pause", "--reason", "provider incident", "--for", "10m"]));
    assert!(paused.contains("paused until"), "{paused}");
    let resume_in: f64 = sqlx::query_scalar("SELECT extract(epoch FROM resume_at - now())::float8 FROM queue_settings")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!((590.0..=600.0).contains(&resume_in), "{resume_in}");
    let accepted = upload(web_a.port, 1).await.unwrap();
    assert_eq!(accepted.status(), 202, "a pause does not refuse uploads");
    let paused_job = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(state_of(&browser, web_b.port, &paused_job).await, "queued", "no process runs it while paused");

    assert!(stdout(&operator(&url, &data, &["gate", "5"])).contains("gate: 5"));
    assert!(stdout(&operator(&url, &data, &["resume", "--reason", "incident over"])).contains("resumed"));
    let ended: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT resume_at FROM queue_settings").fetch_one(&pool).await.unwrap();
    assert_eq!(ended, None, "a manual resume ends the timed pause");
    let second = upload(web_b.port, 2).await.unwrap();
    assert_eq!(second.status(), 202);
    let second = second.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    for id in [&paused_job, &second] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while state_of(&browser, web_a.port, id).await != "done" {
            assert!(Instant::now() < deadline, "job {id} was not done in time");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Only the worker process has workers, so it ran the job.
        let shown = stdout(&operator(&url, &data, &["jobs", "show", id]));
        assert!(shown.contains("done") && shown.contains("roles@example.com"), "{shown}");
        assert!(shown.contains(&format!("-{}-", worker.child.id())), "run by the worker process: {shown}");
    }
    // Every worker line is JSON; the job's lines carry its id, attempt and owner.
    let log = std::fs::read_to_string(&worker_log).unwrap();
    let lines: Vec<serde_json::Value> =
        log.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect(l)).collect();
    let finished = lines
        .iter()
        .find(|l| l["fields"]["message"] == "attempt finished" && l["span"]["job_id"] == paused_job.as_str())
        .unwrap_or_else(|| panic!("a line for job {paused_job}:\n{log}"));
    assert_eq!((finished["span"]["attempt"].as_i64(), finished["span"]["user_id"].is_i64()), (Some(1), true));
    // The worker's own metrics address: its attempts, and the queue's gauges from Postgres.
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", worker.metrics_port)).await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("sluice_attempts_total{") && l.contains("outcome=\"succeeded\"")),
        "{metrics}"
    );
    assert!(metrics.lines().any(|l| l == "sluice_gate_size 5"), "{metrics}");
    // The operator's address answers health checks too (no stranger's connections reach it).
    let health = reqwest::get(format!("http://127.0.0.1:{}/healthz", web_a.metrics_port)).await.unwrap();
    assert_eq!(health.status(), 200);
    let web_metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", web_a.metrics_port)).await.unwrap();
    assert!(
        web_metrics.text().await.unwrap().lines().any(|l| l == "sluice_gate_size 5"),
        "the same gauge from every process"
    );
    // The books add up after all that, and a finished job cannot be canceled.
    let reconciled = stdout(&operator(&url, &data, &["reconcile"]));
    assert!(reconciled.contains("balance_matches_ledger") && reconciled.contains("stored"), "{reconciled}");
    assert!(stdout(&operator(&url, &data, &["cancel", &second])).contains("had already ended (done)"));
    let listed = stdout(&operator(&url, &data, &["dlq", "list"]));
    assert!(listed.lines().count() == 1, "no dead letters: {listed}");
    // A broken counter is reported, not fixed, until an operator repairs it (on the record).
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("UPDATE users SET in_flight = in_flight + 2 WHERE email = 'roles@example.com'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(!operator(&url, &data, &["reconcile"]).status.success(), "reconciliation reports the drift");
    let repaired = stdout(&operator(&url, &data, &["repair", "counters"]));
    assert!(repaired.contains(": in_flight ") && repaired.contains("1 counter(s) repaired"), "{repaired}");
    assert!(operator(&url, &data, &["reconcile"]).status.success());
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'repair_in_flight'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    assert!(stdout(&operator(&url, &data, &["repair", "orphans"])).contains("0 document(s)"));
    // (The drift alert may have fired meanwhile: the evaluators run every half minute.)
    let alerts = stdout(&operator(&url, &data, &["alerts"]));
    assert!(alerts.contains("nothing is firing") || alerts.contains("reconciliation_drift"), "{alerts}");
    pool.close().await;
    let _ = std::fs::remove_dir_all(&data);
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

/// A worker process killed (-9) in the middle of a long document: the parts it finished are
/// never done again; another worker takes the job from the part that was running, and the
/// job ends done with one debit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_document_never_redoes_a_finished_part() {
    let cluster =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-parts-crash")).await.unwrap().unwrap();
    cluster.cluster.create_database("sluice").unwrap();
    let url = cluster.cluster.url("sluice");
    let data = std::env::temp_dir().join(format!("sluice-parts-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let fake = FakeProvider::start().await;
    // Parts run side by side: the first three calls take 300 ms, every other 3 s, so the kill
    // lands with three parts done and the others with the provider.
    fake.push((0..3).map(|_| Reply::Hang { millis: 300 }));
    fake.push((0..200).map(|_| Reply::Hang { millis: 3_000 }));

    let provider = fake.base_url();
    let env = [
        ("SLUICE_WORKERS", "4"),
        ("SLUICE_LEASE_SECS", "2"),
        ("SLUICE_HEARTBEAT_SECS", "0.5"),
        ("SLUICE_RETRY_DELAYS", "1,1"),
        ("SLUICE_PROVIDER", "anthropic"),
        ("SLUICE_PROVIDER_URL", provider.as_str()),
        ("SLUICE_PROVIDER_API_KEY", "crash-test-key"),
        ("SLUICE_PROVIDER_CONTEXT_TOKENS", "1000"),
    ];
    let start = |role| start_with(role, &url, &data, "warn", std::process::Stdio::inherit(), &env);
    let web = start("web");
    let mut first_worker = start("worker");
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
    let accepted =
        browser.post(format!("http://127.0.0.1:{}/api/v1/jobs", web.port)).multipart(form).send().await.unwrap();
    assert_eq!(accepted.status(), 202);
    let id: uuid::Uuid = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().parse().unwrap();

    // Kill the worker once three parts are done and the others are with the provider.
    let three_done = format!(
        "SELECT parts_done >= 3 AND parts_done < parts_total AND parts_stage = 'parts' AND state = 'running' FROM jobs WHERE id = '{id}'"
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
    let total: i32 =
        sqlx::query_scalar("SELECT parts_total FROM jobs WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
    assert!(finished_before.len() >= 3 && (finished_before.len() as i32) < total, "{finished_before:?} of {total}");

    let _second_worker = start("worker");
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
    // The second worker's one claim did the rest (the parts side by side, then combining);
    // the provider saw each part finished before the kill once, and no part more than twice.
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM attempt_history WHERE job_id = $1 AND outcome = 'succeeded'")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(succeeded, 1);
    for idx in 0..total {
        let calls = fake.calls_matching(&format!("part {} of {total}.", idx + 1));
        let finished = finished_before.iter().any(|(i, _)| *i == idx);
        assert!(if finished { calls == 1 } else { (1..=2).contains(&calls) }, "part {}: {calls} calls", idx + 1);
    }
    let ledger: Vec<(String, i64)> = sqlx::query_as("SELECT kind, amount::int8 FROM ledger WHERE job_id = $1")
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ledger.len(), 1, "one debit, no refund: {ledger:?}");
    let _ = std::fs::remove_dir_all(&data);
}

/// The documented topology on one machine: one web-only process and two worker-only processes
/// on one Postgres and one S3-compatible store (a real one: `s3s-fs`, signatures checked).
/// Uploads go through the web process into the bucket, both workers claim, one is killed (-9)
/// mid-job, the other finishes everything, the global gate holds across them throughout, the
/// originals come back from S3 through the web process, and the reconciliation run is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_web_and_two_workers_on_one_postgres_and_s3_lose_nothing_when_a_worker_dies() {
    let cluster =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-topology")).await.unwrap().unwrap();
    cluster.cluster.create_database("sluice").unwrap();
    let url = cluster.cluster.url("sluice");
    let data = std::env::temp_dir().join(format!("sluice-topology-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let s3 = fakeprovider::s3::S3Server::start("sluice-documents").await;
    let fake = FakeProvider::start().await;
    // Each call takes 600 ms, so the kill lands while jobs are with the provider.
    fake.push((0..200).map(|_| Reply::Hang { millis: 600 }));

    let provider = fake.base_url();
    let blob_store = s3.url("sluice");
    let options = s3.options();
    let mut env: Vec<(String, String)> = options.iter().map(|(k, v)| (k.to_uppercase(), v.clone())).collect();
    for (k, v) in [
        ("SLUICE_BLOB_STORE", blob_store.as_str()),
        ("SLUICE_WORKERS", "3"),
        ("SLUICE_LEASE_SECS", "2"),
        ("SLUICE_HEARTBEAT_SECS", "0.5"),
        ("SLUICE_RETRY_DELAYS", "1,1"),
        ("SLUICE_PROVIDER", "anthropic"),
        ("SLUICE_PROVIDER_URL", provider.as_str()),
        ("SLUICE_PROVIDER_API_KEY", "topology-key"),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let start = |role| start_with(role, &url, &data, "warn", std::process::Stdio::inherit(), &env);
    assert!(stdout(&operator(&url, &data, &["migrate"])).contains("migrations applied"));
    const GATE: i64 = 4;
    assert!(operator(&url, &data, &["gate", &GATE.to_string()]).status.success());
    let web = start("web");
    let mut doomed = start("worker");
    let survivor = start("worker");
    for port in [web.port, doomed.port, survivor.port] {
        healthy(port).await;
    }
    let pool = PgPool::connect(&url).await.unwrap();
    // Paused while the uploads arrive, so the workers meet a full queue when it resumes.
    assert!(operator(&url, &data, &["pause", "--reason", "topology test"]).status.success());

    // Four users, five documents each: twenty jobs through the web process into the bucket.
    let mut uploaded = Vec::new();
    for user in 0..4 {
        let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
        let signed_up = browser
            .post(format!("http://127.0.0.1:{}/api/sign_up", web.port))
            .form(&[("email", format!("user{user}@example.com")), ("password", "a long password".into())])
            .send()
            .await
            .unwrap();
        assert_eq!(signed_up.status(), 200);
        for n in 0..5 {
            let text = format!("Document {n} of user {user}.\n").repeat(200);
            let form = reqwest::multipart::Form::new()
                .part("file", reqwest::multipart::Part::bytes(text.clone().into_bytes()).file_name("notes.txt"))
                .text("preset", "summarize");
            let answer = browser
                .post(format!("http://127.0.0.1:{}/api/v1/jobs", web.port))
                .multipart(form)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 202);
            let id = answer.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
            uploaded.push((browser.clone(), id, text));
        }
    }
    assert!(s3.stored_files() >= 20, "the documents are in the bucket, not on a local disk");

    // The gate bounds the attempts running at once (issue 38: a row whose result is still being
    // written holds no slot), so the provider counts the calls it answers at once; kill one
    // worker once it has a job with the provider.
    assert!(operator(&url, &data, &["resume", "--reason", "topology test"]).status.success());
    // Attempts ended, and those running (an attempt's row is written when it ends).
    let both_claimed = "SELECT count(DISTINCT worker) >= 2
                        FROM (SELECT worker FROM attempt_history UNION SELECT lease_owner FROM jobs WHERE state = 'running') w";
    assert!(wait_until(Duration::from_secs(60), &pool, both_claimed).await, "both workers claim");
    let doomed_busy = format!(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'running' AND stage = 'waiting_for_provider' AND lease_owner LIKE '%-{}-%')",
        doomed.child.id()
    );
    assert!(wait_until(Duration::from_secs(60), &pool, &doomed_busy).await, "the doomed worker holds a job");
    doomed.kill_9();
    let all_done = "SELECT count(*) = 20 FROM jobs WHERE state = 'done'";
    assert!(wait_until(Duration::from_secs(120), &pool, all_done).await, "the survivor finishes every job");
    let most_running = fake.most_at_once() as i64;
    assert!(most_running <= GATE, "the gate ({GATE}) held across the processes: {most_running} ran at once");
    assert!(most_running >= 2, "jobs did run side by side ({most_running})");
    let survivor_finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attempt_history WHERE outcome = 'succeeded' AND worker LIKE '%-' || $1::text || '-%'",
    )
    .bind(survivor.child.id().to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(survivor_finished > 0);

    // The originals come back from the bucket through the web process, byte for byte.
    for (browser, id, text) in uploaded.iter().step_by(5) {
        let original =
            browser.get(format!("http://127.0.0.1:{}/api/v1/jobs/{id}/original", web.port)).send().await.unwrap();
        assert_eq!(original.status(), 200);
        assert_eq!(original.bytes().await.unwrap(), text.as_bytes());
    }
    // Books and documents add up (the check lists the bucket for documents without a job).
    let mut reconcile = Command::new(env!("CARGO_BIN_EXE_server"));
    reconcile.arg("reconcile").env("DATABASE_URL", &url).env("SLUICE_DATA_DIR", &data).envs(env.iter().copied());
    let out = reconcile.output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&data);
}

/// A loopback OTLP/HTTP collector: every `POST /v1/traces` body (OTLP JSON), kept.
async fn collector() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(serde_json::from_slice(&body).expect("OTLP JSON"));
                axum::Json(serde_json::json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, received)
}

/// Every span the collector received, flattened.
fn spans(received: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut spans = Vec::new();
    for export in received {
        for resource in export["resourceSpans"].as_array().into_iter().flatten() {
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                spans.extend(scope["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    spans
}

fn attribute<'s>(span: &'s serde_json::Value, key: &str) -> Option<&'s serde_json::Value> {
    span["attributes"].as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

#[tokio::test]
async fn an_uploads_trace_follows_its_job_through_every_attempt_to_the_provider() {
    let cluster =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-traces")).await.unwrap().unwrap();
    cluster.cluster.create_database("sluice").unwrap();
    let url = cluster.cluster.url("sluice");
    let data = std::env::temp_dir().join(format!("sluice-traces-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let (collector_port, received) = collector().await;
    let fake = FakeProvider::start().await;
    // The first attempt meets an overloaded provider; the retry succeeds.
    fake.push([Reply::Overloaded, Reply::Success { text: "A summary.".into(), input_tokens: 40, output_tokens: 5 }]);
    let provider = fake.base_url();
    let endpoint = format!("http://127.0.0.1:{collector_port}");
    let env = [
        ("SLUICE_RETRY_DELAYS", "1,1"),
        ("SLUICE_PROVIDER", "anthropic"),
        ("SLUICE_PROVIDER_URL", provider.as_str()),
        ("SLUICE_PROVIDER_API_KEY", "trace-test-key"),
        ("SLUICE_OTLP_ENDPOINT", endpoint.as_str()),
        // Send batches quickly, so the test need not wait for the default 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    // Logging at `warn` does not turn traces off.
    let web = start_with("web", &url, &data, "warn", std::process::Stdio::inherit(), &env);
    let worker = start_with("worker", &url, &data, "warn", std::process::Stdio::inherit(), &env);
    healthy(web.port).await;
    healthy(worker.port).await;

    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up = browser
        .post(format!("http://127.0.0.1:{}/api/sign_up", web.port))
        .form(&[("email", "traces@example.com"), ("password", "a long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_up.status(), 200);
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(b"Traced document. Two sentences.\n".to_vec()).file_name("t.txt"))
        .text("preset", "summarize");
    let accepted =
        browser.post(format!("http://127.0.0.1:{}/api/v1/jobs", web.port)).multipart(form).send().await.unwrap();
    assert_eq!(accepted.status(), 202);
    let id = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while state_of(&browser, web.port, &id).await != "done" {
        assert!(Instant::now() < deadline, "job {id} was not done in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pool = PgPool::connect(&url).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT trace_parent FROM jobs WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .expect("the job carries its upload's trace");
    let (trace_id, upload_span_id) = (&stored[3..35], &stored[36..52]);

    // Wait for the worker's batch to arrive: two attempts and their provider calls.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = spans(&received.lock().unwrap());
        let provider_calls = spans.iter().filter(|s| s["name"] == "provider call" && s["traceId"] == trace_id).count();
        if provider_calls >= 2 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let named = |name: &str| -> Vec<&serde_json::Value> {
        spans.iter().filter(|s| s["name"] == name && s["traceId"] == trace_id).collect()
    };
    // The upload: the web process's request span is the one stored with the job.
    let upload = named("POST /api/v1/jobs");
    assert_eq!(upload.len(), 1, "{spans:#?}");
    assert_eq!(upload[0]["spanId"], upload_span_id);
    // Each attempt is a child of the upload, linked to it, with its queue wait.
    let attempts = named("attempt");
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for attempt in &attempts {
        assert_eq!(attempt["parentSpanId"], upload_span_id);
        let links = attempt["links"].as_array().expect("a link");
        assert!(links.iter().any(|l| l["traceId"] == trace_id && l["spanId"] == upload_span_id), "{attempt:#}");
        assert_eq!(attribute(attempt, "job_id").unwrap()["stringValue"], id.as_str());
        assert!(attribute(attempt, "queue_wait_ms").is_some(), "{attempt:#}");
    }
    let numbers: Vec<String> = attempts
        .iter()
        .map(|a| attribute(a, "attempt").unwrap()["intValue"].to_string().trim_matches('"').to_string())
        .collect();
    assert!(numbers.contains(&"1".to_string()) && numbers.contains(&"2".to_string()), "{numbers:?}");
    // Each provider call is a child of an attempt: the overloaded one says so.
    let calls = named("provider call");
    assert_eq!(calls.len(), 2, "{spans:#?}");
    let attempt_ids: Vec<&serde_json::Value> = attempts.iter().map(|a| &a["spanId"]).collect();
    assert!(calls.iter().all(|c| attempt_ids.contains(&&c["parentSpanId"])), "{calls:#?}");
    assert!(
        calls.iter().any(|c| attribute(c, "provider_status").map(|v| v.to_string().contains("529")) == Some(true)),
        "{calls:#?}"
    );
    // The document was read inside the first attempt.
    assert!(named("read document").iter().any(|r| attempt_ids.contains(&&r["parentSpanId"])), "{spans:#?}");
    // The processes name themselves.
    let roles: Vec<String> = received
        .lock()
        .unwrap()
        .iter()
        .flat_map(|e| e["resourceSpans"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| {
            r["resource"]["attributes"]
                .as_array()?
                .iter()
                .find(|a| a["key"] == "sluice.role")
                .map(|a| a["value"]["stringValue"].as_str().unwrap_or("").to_string())
        })
        .collect();
    assert!(roles.contains(&"web".to_string()) && roles.contains(&"worker".to_string()), "{roles:?}");
    pool.close().await;
    drop((web, worker));
    let _ = std::fs::remove_dir_all(&data);
}

/// The restore drill: a backup taken while jobs are queued, running and retrying, the machine
/// lost, the backup restored into a new cluster and blob store, and every job accepted before
/// the backup finishes there, charged once and refunded never, with the books reconciled.
#[tokio::test]
async fn a_backup_taken_under_load_restores_into_a_new_cluster_and_every_job_finishes_once() {
    let source =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-backup-a")).await.unwrap().unwrap();
    source.cluster.create_database("sluice").unwrap();
    let target =
        tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-backup-b")).await.unwrap().unwrap();
    target.cluster.create_database("sluice").unwrap();
    let (url_a, url_b) = (source.cluster.url("sluice"), target.cluster.url("sluice"));
    let root = std::env::temp_dir().join(format!("sluice-backup-drill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (data_a, data_b, backup) = (root.join("a"), root.join("b"), root.join("backup"));
    for d in [&data_a, &data_b] {
        std::fs::create_dir_all(d).unwrap();
    }
    let fake = FakeProvider::start().await;
    // The first call meets an overloaded provider (that job retries in 8 s); the next two
    // hang long enough for the backup to find them running.
    fake.push([Reply::Overloaded, Reply::Hang { millis: 6_000 }, Reply::Hang { millis: 6_000 }]);
    let provider = fake.base_url();
    let env = [
        ("SLUICE_WORKERS", "2"),
        ("SLUICE_LEASE_SECS", "3"),
        ("SLUICE_HEARTBEAT_SECS", "1"),
        ("SLUICE_RETRY_DELAYS", "8,8"),
        ("SLUICE_PROVIDER", "anthropic"),
        ("SLUICE_PROVIDER_URL", provider.as_str()),
        ("SLUICE_PROVIDER_API_KEY", "drill-key"),
    ];
    let mut first = start_with("serve", &url_a, &data_a, "warn", std::process::Stdio::inherit(), &env);
    healthy(first.port).await;
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let signed_up = browser
        .post(format!("http://127.0.0.1:{}/api/sign_up", first.port))
        .form(&[("email", "drill@example.com"), ("password", "a long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_up.status(), 200);
    let mut ids = Vec::new();
    for n in 0..5 {
        let form = reqwest::multipart::Form::new()
            .part(
                "file",
                reqwest::multipart::Part::bytes(format!("Drill document {n}. Two sentences here.\n").into_bytes())
                    .file_name(format!("drill-{n}.txt")),
            )
            .text("preset", "summarize");
        let accepted =
            browser.post(format!("http://127.0.0.1:{}/api/v1/jobs", first.port)).multipart(form).send().await.unwrap();
        assert_eq!(accepted.status(), 202);
        ids.push(accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string());
        // One at a time, so the first call is the first job's.
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let pool_a = PgPool::connect(&url_a).await.unwrap();
    let mixed =
        "SELECT count(*) FILTER (WHERE state = 'running') = 2 AND count(*) FILTER (WHERE state = 'retrying') = 1
                        AND count(*) FILTER (WHERE state = 'queued') = 2 FROM jobs";
    assert!(wait_until(Duration::from_secs(20), &pool_a, mixed).await, "queued, running and retrying jobs");
    let taken = operator(&url_a, &data_a, &["backup", "--to", backup.to_str().unwrap()]);
    let said = stdout(&taken);
    println!("{said}");
    assert!(said.contains("5 jobs, 5 documents"), "{said}");
    assert_private(&backup);
    // The machine is lost: the server dies where it stands.
    first.kill_9();
    pool_a.close().await;

    // A restore into a database that is not empty is refused; into the new one it goes.
    let refused = operator(&url_a, &data_b, &["restore", "--from", backup.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not empty"));
    let restored = stdout(&operator(&url_b, &data_b, &["restore", "--from", backup.to_str().unwrap()]));
    assert!(restored.contains("5 jobs, 5 documents"), "{restored}");
    let healthy_provider = FakeProvider::start().await;
    let provider_b = healthy_provider.base_url();
    let env_b = [
        ("SLUICE_WORKERS", "2"),
        ("SLUICE_LEASE_SECS", "3"),
        ("SLUICE_HEARTBEAT_SECS", "1"),
        ("SLUICE_RETRY_DELAYS", "1,1"),
        ("SLUICE_PROVIDER", "anthropic"),
        ("SLUICE_PROVIDER_URL", provider_b.as_str()),
        ("SLUICE_PROVIDER_API_KEY", "drill-key"),
    ];
    let second = start_with("serve", &url_b, &data_b, "warn", std::process::Stdio::inherit(), &env_b);
    healthy(second.port).await;
    let pool_b = PgPool::connect(&url_b).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(60), &pool_b, "SELECT count(*) = 5 AND bool_and(state = 'done') FROM jobs")
            .await,
        "every job accepted before the backup finishes after the restore"
    );
    // The backup held no session: the old one is a stranger there, and its owner logs in again.
    let stale = browser.get(format!("http://127.0.0.1:{}/api/v1/jobs/{}/original", second.port, ids[0])).send().await;
    assert_eq!(stale.unwrap().status(), 401, "a session from before the backup opens nothing");
    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = browser
        .post(format!("http://127.0.0.1:{}/api/log_in", second.port))
        .form(&[("email", "drill@example.com"), ("password", "a long password")])
        .send()
        .await
        .unwrap();
    assert_eq!(logged_in.status(), 200);
    for id in &ids {
        let original =
            browser.get(format!("http://127.0.0.1:{}/api/v1/jobs/{id}/original", second.port)).send().await.unwrap();
        assert_eq!(original.status(), 200, "{id}");
    }
    // Charged once each, refunded never; the books reconcile.
    let (debits, refunds): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'debit'), count(*) FILTER (WHERE kind = 'refund' AND amount <> 0) FROM ledger",
    )
    .fetch_one(&pool_b)
    .await
    .unwrap();
    assert_eq!((debits, refunds), (5, 0));
    let reconciled = operator(&url_b, &data_b, &["reconcile"]);
    assert!(reconciled.status.success(), "{}", String::from_utf8_lossy(&reconciled.stdout));
    pool_b.close().await;
    drop(second);
    let _ = std::fs::remove_dir_all(&root);
}

/// Everything under `dir` is its owner's only: folders 0700, files 0600.
fn assert_private(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{} is {mode:o}", dir.display());
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            assert_private(&path);
        } else {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{} is {mode:o}", path.display());
        }
    }
}
