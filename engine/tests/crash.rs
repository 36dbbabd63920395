//! Postgres itself crashes and restarts under a busy worker pool: nothing is lost, nothing is
//! done twice. Uses its own private cluster, since it stops the server.

use std::sync::Arc;
use std::time::Duration;

use engine::maintenance::MaintenanceConfig;
use engine::queue::hooks::NoHooks;
use engine::queue::worker::WorkerPool;
use engine::queue::{ClaimedJob, JobError, JobOutput, JobState};
use engine::testing::{count_in_state, enqueue_many, fast_worker, wait_for};

/// A private cluster (these tests stop it) and a pool on it; `slow_wal_writer`: asynchronous
/// commits wait 10 s to be flushed, so a crash loses them.
async fn private_cluster(name: &'static str, slow_wal_writer: bool) -> (pgcluster::TempCluster, sqlx::PgPool) {
    let temp = tokio::task::spawn_blocking(move || pgcluster::TempCluster::start(name))
        .await
        .unwrap()
        .expect("a private cluster");
    let pool = engine::db::connect(&temp.cluster.url("postgres"), 30).await.unwrap();
    if slow_wal_writer {
        sqlx::query("ALTER SYSTEM SET wal_writer_delay = '10s'").execute(&pool).await.unwrap();
        sqlx::query("SELECT pg_reload_conf()").execute(&pool).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (temp, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_run_loses_nothing_and_finishes_each_job_once() {
    let (mut temp, pool) = private_cluster("sluice-crash-test", false).await;
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

/// Issue 58: a claim and a part grant are durable before the provider is called. Postgres is
/// killed (`-m immediate`) while a document's parts are being called, with the WAL writer slowed
/// so an unflushed commit would be lost: after the restart the document ends done, and the
/// provider was called once per part, never twice (a lost claim would run its parts again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_while_parts_are_called_never_calls_a_part_twice() {
    use engine::documents::processor::DocumentProcessor;
    use engine::documents::providers::{self, ProviderConfig, ProviderKind};
    use engine::documents::sandbox::SandboxConfig;
    use engine::queue::{self, NewJob};
    use fakeprovider::{FakeProvider, HostedModel};

    // An asynchronous commit would wait up to 10 s for the WAL writer: a crash loses it.
    let (mut temp, pool) = private_cluster("sluice-crash-parts", true).await;

    let fake = FakeProvider::start().await;
    // Each part's answer takes about two seconds: calls are in flight when Postgres dies.
    fake.behave_like(HostedModel {
        first_token_ms: 50,
        prefill_tokens_per_sec: 1e9,
        output_tokens_per_sec: 150.0,
        ..HostedModel::default()
    });
    let docs = engine::testing::TempBlobs::new("crash-parts");
    let text: String = (1..=60)
        .map(|i| format!("Paragraph {i}: the supplier delivers the goods named in schedule A by the agreed date.\n\n"))
        .collect();
    let key = engine::documents::blobs::Blobs::new_key();
    docs.blobs.put(&key, text.as_bytes().to_vec().into()).await.unwrap();
    let payload = serde_json::json!({
        "document": { "key": key, "type": "plain_text", "sha256": key, "size": text.len(), "name": "contract.txt" },
        "preset": "translate",
        "language": "French",
    });
    let mut conn = pool.acquire().await.unwrap();
    let id = queue::enqueue(&mut conn, &NewJob { est_input_tokens: 300, ..NewJob::new(1, payload) }).await.unwrap();
    drop(conn);
    let processor = DocumentProcessor {
        blobs: docs.blobs.clone(),
        provider: providers::build(&ProviderConfig {
            kind: ProviderKind::Anthropic,
            base_url: fake.base_url(),
            api_key: Some("k".into()),
            model: "m".into(),
            // Small answers: the document goes in parts of a few paragraphs each.
            max_tokens: 1_024,
            timeout: Duration::from_secs(30),
            timeout_per_100k_tokens: Duration::ZERO,
            stream: true,
            stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
        }),
        sandbox: Arc::new(SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new())),
        stages: queue::stages::StageLog::new(pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: Some(200_000),
        parts: engine::queue::parts::PartStore::new(pool.clone()),
        max_document_tokens: Some(2_000_000),
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let mut config = fast_worker("crash-parts", 8);
    config.lease = Duration::from_secs(20);
    let workers = WorkerPool::start(pool.clone(), config.clone(), Arc::new(processor), Arc::new(NoHooks));
    let maintenance = MaintenanceConfig { rescue_every: Duration::from_millis(500), ..Default::default() };
    let rescue = tokio::spawn(engine::maintenance::run(
        pool.clone(),
        Arc::new(NoHooks),
        config.policy.clone(),
        maintenance,
        None,
    ));

    // Right after the claim and the first grants: parts are being called.
    assert!(wait_for(Duration::from_secs(20), || async { fake.calls() >= 3 }).await, "parts are called");
    let _temp = tokio::task::spawn_blocking(move || {
        temp.cluster.crash().expect("crash Postgres");
        std::thread::sleep(Duration::from_millis(500));
        temp.cluster.restart().expect("restart Postgres");
        temp
    })
    .await
    .unwrap();

    let done = wait_for(Duration::from_secs(90), || async {
        queue::get(&pool, id).await.map(|j| j.state == JobState::Done).unwrap_or(false)
    })
    .await;
    rescue.abort();
    workers.shutdown().await;
    let view = queue::get(&pool, id).await.unwrap();
    assert!(done, "the document ends done after the restart: {view:?}");
    let parts = view.parts_total.expect("done in parts") as u64;
    assert!(parts >= 4, "{parts} parts");
    assert_eq!(fake.model_report().cut, 0, "no answer was cut (a cut one is continued: another call)");
    assert_eq!(fake.calls(), parts + 1, "the provider was called once per part and once for its key terms, none twice");
    pool.close().await;
}

/// Issue 58: a claim and a part grant are on disk when they return (the WAL flushed past their
/// commit), even with the WAL writer slowed to 10 s, so a Postgres crash right after cannot
/// forget them while their provider calls are made. Before, both committed asynchronously.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_part_grants_are_flushed_before_they_return() {
    use engine::queue::parts::PartStore;
    let (_temp, pool) = private_cluster("sluice-durable-claims", true).await;
    // The WAL written but not flushed, in bytes.
    let unflushed = || async {
        sqlx::query_scalar::<_, f64>("SELECT (pg_current_wal_insert_lsn() - pg_current_wal_flush_lsn())::float8")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // An asynchronous commit stays unflushed: the check can tell.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL synchronous_commit = off").execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE queue_settings SET gate_size = 24").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert!(unflushed().await > 0.0, "an asynchronous commit waits for the WAL writer");

    enqueue_many(&pool, 1, 2).await;
    let claimed = engine::queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(unflushed().await, 0.0, "the claim is on disk when it returns");

    let parts = PartStore::new(pool.clone());
    let grant = parts.calls(&claimed[0], 1, &[(1_000, 100), (1_000, 100)]).await.unwrap();
    assert_eq!(grant.granted, 2);
    assert_eq!(unflushed().await, 0.0, "the grant is on disk when it returns");
    pool.close().await;
}
