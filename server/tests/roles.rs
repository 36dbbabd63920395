//! Process roles: two `server web` processes and one `server worker` on one Postgres. Uploads
//! through either web process are worked off by the worker process; the kill switch, flipped
//! from the command line, holds across all of them; the operator commands read and change the
//! queue.

use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

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

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

fn start(role: &str, url: &str, data: &std::path::Path) -> Process {
    start_logging(role, url, data, "warn", std::process::Stdio::inherit())
}

fn start_logging(role: &str, url: &str, data: &std::path::Path, log: &str, stdout: std::process::Stdio) -> Process {
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

    // Paused from the command line: uploads are still accepted, nothing runs.
    assert!(stdout(&operator(&url, &data, &["pause", "--reason", "provider incident"])).contains("paused"));
    let accepted = upload(web_a.port, 1).await.unwrap();
    assert_eq!(accepted.status(), 202, "a pause does not refuse uploads");
    let paused_job = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(state_of(&browser, web_b.port, &paused_job).await, "queued", "no process runs it while paused");

    assert!(stdout(&operator(&url, &data, &["gate", "5"])).contains("gate: 5"));
    assert!(stdout(&operator(&url, &data, &["resume", "--reason", "incident over"])).contains("resumed"));
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
        assert!(shown.contains(&format!("-{} ", worker.child.id())), "run by the worker process: {shown}");
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
