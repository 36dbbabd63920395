//! One worker process for `engine/tests/processes.rs`: a worker pool on `DATABASE_URL` named
//! `WORKER_NAME`, whose processor appends each attempt's start and end (`+ NS` / `- NS`, the
//! system clock in nanoseconds, which every process on the machine shares) to the file
//! `PROBE_FILE`, so the test counts the attempts running across processes afterwards. One
//! result in eight takes a millisecond to write (a hook that waits inside the completion's
//! transaction, like a slow commit), so batches are in flight long enough to be caught. Every millisecond it prints
//! `HOLDING fetched=N completing=M`; it shuts down gracefully when its stdin closes.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use engine::queue::worker::WorkerPool;
use engine::queue::{ClaimedJob, JobError, JobOutput};
use engine::testing::OnDone;

/// A millisecond inside the completion's transaction for one job done in eight; every job
/// written as done is logged there too (`engine::testing::LOG_DONE`).
const SLOW_COMMIT: OnDone = OnDone(|tx, job| {
    Box::pin(async move {
        if job.id.as_bytes()[0] < 32 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        engine::testing::log_done_write(tx, job).await
    })
});

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let name = var("WORKER_NAME");
    let pool = engine::db::connect(&var("DATABASE_URL"), 8).await.expect("the database");
    let probe = Arc::new(File::options().create(true).append(true).open(var("PROBE_FILE")).expect("the probe file"));
    // One write per line (O_APPEND): lines from the pool's tasks never interleave.
    let mark = |probe: &File, sign: char| {
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos();
        (&*probe).write_all(format!("{sign} {ns}\n").as_bytes()).expect("probe");
    };
    let processor = {
        let (probe, name) = (probe.clone(), name.clone());
        move |job: ClaimedJob| {
            let (probe, name) = (probe.clone(), name.clone());
            async move {
                mark(&probe, '+');
                tokio::time::sleep(Duration::from_millis(1)).await;
                mark(&probe, '-');
                Ok::<_, JobError>(JobOutput {
                    result: serde_json::json!({ "by": name, "job": job.id }),
                    ..Default::default()
                })
            }
        }
    };
    let mut config = engine::testing::fast_worker(&name, 4);
    config.lease = Duration::from_secs(2);
    let workers = WorkerPool::start(pool, config, Arc::new(processor), Arc::new(SLOW_COMMIT));
    let (closed, mut stdin_closed) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            _ = &mut stdin_closed => break,
            _ = tokio::time::sleep(Duration::from_millis(1)) => {
                let line = format!("HOLDING fetched={} completing={}\n", workers.queued_locally(), workers.completing());
                if out.write_all(line.as_bytes()).and_then(|_| out.flush()).is_err() {
                    break;
                }
            }
        }
    }
    workers.shutdown().await;
}
