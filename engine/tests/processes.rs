//! Three worker processes with local queues share one gate; one is killed with -9 while it
//! holds jobs fetched ahead and results not yet written. Nothing is lost, nothing is done
//! twice, the attempts running across the processes never pass the gate, and the dead
//! process's jobs are back within the lease.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::maintenance::MaintenanceConfig;
use engine::queue::hooks::NoHooks;
use engine::queue::switches;
use engine::testing::{enqueue_many, wait_for};

const GATE: i64 = 6;
const JOBS_PER_OWNER: usize = 500;
const OWNERS: i64 = 8;
const LEASE: Duration = Duration::from_secs(2);

/// Attempts running now per process, and the most seen at once across all of them.
#[derive(Default)]
struct Probe {
    running: HashMap<String, i64>,
    peak: i64,
    starts: u64,
}

/// A worker process; `watched` pipes its reports to the test (the others' go nowhere, so that
/// a full pipe never stops them).
fn start_worker(url: &str, name: &str, port: u16, watched: bool) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice-test-worker"))
        .env("DATABASE_URL", url)
        .env("WORKER_NAME", name)
        .env("PROBE_PORT", port.to_string())
        .env("RUST_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(if watched { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::null())
        .spawn()
        .expect("a worker process")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_one_killed_holding_a_batch_lose_nothing_and_never_pass_the_gate() {
    let temp = tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-processes-test"))
        .await
        .unwrap()
        .expect("a private cluster");
    let url = temp.cluster.url("postgres");
    let pool = engine::db::connect(&url, 20).await.unwrap();
    switches::set_gate_size(&pool, GATE as i32, "test").await.unwrap();
    for owner in 1..=OWNERS {
        enqueue_many(&pool, owner, JOBS_PER_OWNER).await;
    }
    let total = (JOBS_PER_OWNER as i64) * OWNERS;

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    let probe: Arc<Mutex<Probe>> = Arc::default();
    {
        let probe = probe.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 128];
            while let Ok(n) = socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                let (sign, name) = text.split_at(1);
                let mut p = probe.lock().unwrap();
                let now = p.running.entry(name.to_string()).or_default();
                *now += if sign == "+" { 1 } else { -1 };
                if sign == "+" {
                    p.starts += 1;
                }
                let across: i64 = p.running.values().sum();
                p.peak = p.peak.max(across);
            }
        });
    }
    let rescue = tokio::spawn(engine::maintenance::run(
        pool.clone(),
        Arc::new(NoHooks),
        engine::testing::fast_worker("rescuer", 1).policy,
        MaintenanceConfig { rescue_every: Duration::from_millis(200), ..Default::default() },
        None,
    ));
    // proc-a starts first and gets going; it is killed, once the other two run too, the moment
    // it reports both jobs fetched ahead and results in flight.
    let mut victim = start_worker(&url, "proc-a", port, true);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stdout = victim.stdout.take().unwrap();
    let holding = {
        let armed = armed.clone();
        tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let Some(Ok(line)) = lines.next() else { return None };
                let count = |key: &str| -> usize {
                    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.parse().ok()).unwrap_or(0)
                };
                let (fetched, completing) = (count("fetched="), count("completing="));
                if armed.load(std::sync::atomic::Ordering::SeqCst) && fetched > 0 && completing > 0 {
                    victim.kill().expect("kill -9");
                    victim.wait().unwrap();
                    return Some((fetched, completing));
                }
            }
            None
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let workers: Vec<Child> = ["proc-b", "proc-c"].iter().map(|n| start_worker(&url, n, port, false)).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let holding = holding.await.unwrap();
    let killed_at = Instant::now();
    let (fetched, completing) = holding.expect("the victim held a fetched batch and a completion batch");
    // Its processors died with it: they hold no slot of the probe's any more (their rows still
    // count against the gate in the claims until the rescue).
    probe.lock().unwrap().running.insert("proc-a".into(), 0);
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'running' AND lease_owner = 'proc-a'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(held > 0, "the killed process held jobs ({fetched} fetched, {completing} completing reported)");

    let back = wait_for(Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE state = 'running' AND lease_owner = 'proc-a'")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    let back_after = killed_at.elapsed();
    assert!(back, "the killed process's jobs come back");
    // The lease, a rescue tick, and a moment for the claims that take them again.
    assert!(back_after <= LEASE + Duration::from_millis(1_500), "back after {back_after:?}");

    let all_done = wait_for(Duration::from_secs(90), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE state = 'done'").fetch_one(&pool).await.unwrap()
            == total
    })
    .await;
    for mut worker in workers {
        drop(worker.stdin.take());
        tokio::task::spawn_blocking(move || worker.wait()).await.unwrap().unwrap();
    }
    rescue.abort();
    assert!(all_done, "every job done");
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id FROM job_attempts WHERE outcome = 'succeeded' GROUP BY job_id HAVING count(*) > 1) d",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "no job has two successful attempts");
    let results: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE result IS NOT NULL").fetch_one(&pool).await.unwrap();
    assert_eq!(results, total);
    let rescued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_attempts WHERE worker = 'proc-a' AND outcome = 'lease_expired'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(rescued > 0, "the dead process's attempts were settled by the rescue");
    let probe = probe.lock().unwrap();
    assert!(probe.starts >= total as u64, "every job started at least once ({} starts)", probe.starts);
    assert!(probe.peak <= GATE, "attempts across the processes peaked at {}", probe.peak);
    assert!(probe.peak >= GATE - 2, "the gate was used ({} at most)", probe.peak);
    pool.close().await;
}
