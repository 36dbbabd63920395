//! Postgres itself crashes and restarts under a busy worker pool: nothing is lost, nothing is
//! done twice. Uses its own private cluster, since it stops the server.

use std::sync::Arc;
use std::time::Duration;

use engine::maintenance::MaintenanceConfig;
use engine::queue::hooks::NoHooks;
use engine::queue::worker::WorkerPool;
use engine::queue::{ClaimedJob, JobError, JobOutput, JobState};
use engine::testing::{count_in_state, enqueue_many, fast_worker, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_run_loses_nothing_and_finishes_each_job_once() {
    let mut temp = tokio::task::spawn_blocking(|| pgcluster::TempCluster::start("sluice-crash-test"))
        .await
        .unwrap()
        .expect("a private cluster");
    let url = temp.cluster.url("postgres");
    let pool = engine::db::connect(&url, 30).await.unwrap();
    enqueue_many(&pool, 1, 60).await;
    enqueue_many(&pool, 2, 60).await;

    let processor = |_job: ClaimedJob| async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok::<_, JobError>(JobOutput { result: serde_json::json!("ok"), ..Default::default() })
    };
    let mut config = fast_worker("crashy", 8);
    config.lease = Duration::from_secs(3);
    engine::testing::log_done_writes(&pool).await;
    let workers =
        WorkerPool::start(pool.clone(), config.clone(), Arc::new(processor), Arc::new(engine::testing::LOG_DONE));
    let maintenance = MaintenanceConfig { rescue_every: Duration::from_millis(500), ..Default::default() };
    let rescue = tokio::spawn(engine::maintenance::run(
        pool.clone(),
        Arc::new(NoHooks),
        config.policy.clone(),
        maintenance,
        None,
    ));
    assert!(wait_for(Duration::from_secs(20), || async { count_in_state(&pool, JobState::Done).await >= 20 }).await);

    let _temp = tokio::task::spawn_blocking(move || {
        temp.cluster.crash().expect("crash Postgres");
        std::thread::sleep(Duration::from_millis(1500));
        temp.cluster.restart().expect("restart Postgres");
        temp
    })
    .await
    .unwrap();

    let all_done = wait_for(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE state = 'done'")
            .fetch_one(&pool)
            .await
            .map(|n| n == 120)
            .unwrap_or(false)
    })
    .await;
    rescue.abort();
    workers.shutdown().await;
    assert!(all_done, "every job reaches done after the restart");
    let double = engine::testing::jobs_done_twice(&pool).await;
    assert_eq!(double, 0, "no job has two successful attempts");
    let results: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE result IS NOT NULL").fetch_one(&pool).await.unwrap();
    assert_eq!(results, 120);
    pool.close().await;
}
