//! The queue engine against a real Postgres (`#[sqlx::test]` gives each test its own database).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::queue::dlq::{self, Selection};
use engine::queue::hooks::{HookResult, NoHooks, TerminalHooks, TerminalJob};
use engine::queue::policy::retry::ErrorClass;
use engine::queue::switches;
use engine::queue::worker::{work_once, WorkerConfig, WorkerPool};
use engine::queue::{self, ClaimedJob, JobError, JobOutput, JobState, Recorded};
use engine::testing::{count_in_state, enqueue_many, fast_worker, job, wait_for, wider_pool, JobOpts};
use engine::FailureKind;
use sluice_types::AttemptOutcome;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

fn ok_output() -> JobOutput {
    JobOutput { result: serde_json::json!({"ok": true}), input_tokens: Some(3), output_tokens: Some(4), part: None }
}

/// Hooks that record each call in a table, inside the engine's transaction.
struct RecordingHooks;

impl RecordingHooks {
    async fn install(pool: &PgPool) {
        sqlx::query("CREATE TABLE hook_calls (job_id uuid NOT NULL, event text NOT NULL)").execute(pool).await.unwrap();
    }
    async fn calls(pool: &PgPool, job: Uuid, event: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM hook_calls WHERE job_id = $1 AND event = $2")
            .bind(job)
            .bind(event)
            .fetch_one(pool)
            .await
            .unwrap()
    }
}

fn record<'a>(tx: &'a mut PgConnection, job: &'a TerminalJob, event: &'static str) -> HookResult<'a> {
    Box::pin(async move {
        sqlx::query("INSERT INTO hook_calls VALUES ($1, $2)").bind(job.id).bind(event).execute(tx).await?;
        Ok(())
    })
}

impl TerminalHooks for RecordingHooks {
    fn on_done<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        record(tx, job, "done")
    }
    fn on_failed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        record(tx, job, "failed")
    }
    fn on_replayed<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        record(tx, job, "replayed")
    }
    fn on_canceled<'a>(&'a self, tx: &'a mut PgConnection, job: &'a TerminalJob) -> HookResult<'a> {
        record(tx, job, "canceled")
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn gate_holds_across_four_pools_and_every_job_runs_once(pool: PgPool) {
    let pool = wider_pool(&pool, 80).await;
    switches::set_gate_size(&pool, 5, "test").await.unwrap();
    let ids = enqueue_many(&pool, 1, 150).await;

    let in_processor = Arc::new(AtomicUsize::new(0));
    let max_in_processor = Arc::new(AtomicUsize::new(0));
    let runs: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let processor = {
        let (now, max, runs) = (in_processor.clone(), max_in_processor.clone(), runs.clone());
        move |job: queue::ClaimedJob| {
            let (now, max, runs) = (now.clone(), max.clone(), runs.clone());
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(n, Ordering::SeqCst);
                *runs.lock().unwrap().entry(job.id).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(15)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(ok_output())
            }
        }
    };
    let processor: Arc<dyn engine::queue::worker::Processor> = Arc::new(processor);
    let pools: Vec<WorkerPool> = (0..4)
        .map(|i| {
            WorkerPool::start(pool.clone(), fast_worker(&format!("pool-{i}"), 16), processor.clone(), Arc::new(NoHooks))
        })
        .collect();

    // The gate bounds the attempts running at once, across every pool (issue 38): a row whose
    // result is still being written, or fetched ahead, holds no slot, so the count of rows in
    // `running` may pass the gate for a moment; the processors never do.
    let all_done =
        wait_for(Duration::from_secs(60), || async { count_in_state(&pool, JobState::Done).await == 150 }).await;
    for p in pools {
        p.shutdown().await;
    }
    assert!(all_done, "every job done in time");
    let peak = max_in_processor.load(Ordering::SeqCst);
    assert!(peak <= 5, "processors peaked at {peak}");
    assert!(peak >= 3, "the gate should be used, peak was {peak}");
    {
        let runs = runs.lock().unwrap();
        assert_eq!(runs.len(), 150);
        assert!(ids.iter().all(|id| runs.get(id) == Some(&1)), "every job ran exactly once");
    }
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempt_history").fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 150);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn claims_are_fair_across_owners(pool: PgPool) {
    let a = enqueue_many(&pool, 10, 5).await;
    let b = enqueue_many(&pool, 20, 1).await;
    // A's jobs are all older than B's; B's one job still goes out second, not sixth.
    let first = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    let second = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(first[0].id, a[0]);
    assert_eq!(second[0].id, b[0]);
    // In one batch of two from a fresh start, both owners are served.
    let pool2 = pool.clone();
    sqlx::query("UPDATE jobs SET state = 'queued', attempts = 0, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL")
        .execute(&pool2)
        .await
        .unwrap();
    let batch = queue::claim(&pool, "w", 2, Duration::from_secs(60)).await.unwrap();
    let owners: Vec<i64> = batch.iter().map(|j| j.owner_id).collect();
    assert!(owners.contains(&10) && owners.contains(&20), "{owners:?}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn one_claim_hands_out_its_jobs_in_line_order_with_and_without_a_provider_budget(pool: PgPool) {
    use engine::queue::capacity::{self, CapacityConfig, ProviderLimits};
    switches::set_gate_size(&pool, 30, "test").await.unwrap();
    for budgeted in [false, true] {
        sqlx::query("DELETE FROM jobs").execute(&pool).await.unwrap();
        // A budget that every job fits: the claim then takes its running sums.
        let limits = ProviderLimits { requests_per_min: Some(1_000_000), ..Default::default() };
        let limits = if budgeted { limits } else { ProviderLimits::default() };
        capacity::configure(&pool, &CapacityConfig { limits, ..CapacityConfig::default() }).await.unwrap();
        // Each owner's jobs lie together in the table; the line takes the owners in turns.
        for owner in [10, 20, 30] {
            enqueue_many(&pool, owner, 6).await;
        }
        let line: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM waiting_jobs ORDER BY fair_tag, run_at, id")
            .fetch_all(&pool)
            .await
            .unwrap();
        let batch = queue::claim(&pool, "w", 18, Duration::from_secs(60)).await.unwrap();
        let claimed: Vec<Uuid> = batch.iter().map(|j| j.id).collect();
        assert_eq!(claimed, line, "with a budget: {budgeted}");
        let owners: Vec<i64> = batch.iter().take(3).map(|j| j.owner_id).collect();
        assert_eq!(owners, [10, 20, 30], "with a budget: {budgeted}");
    }
}

/// A rollout: a process of the previous release claims through `sluice_claim`, as it was
/// (same columns, so its prepared statements stay valid), beside this release's claims.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_previous_releases_claim_still_works_beside_this_ones(pool: PgPool) {
    let ids = enqueue_many(&pool, 1, 4).await;
    let old: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, lease_token FROM sluice_claim(2, 'old', 60)").fetch_all(&pool).await.unwrap();
    let columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.routines r
         JOIN information_schema.parameters p ON p.specific_name = r.specific_name
         WHERE r.routine_name = 'sluice_claim' AND p.parameter_mode = 'OUT'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(columns, 9, "the previous release's claim returns what it always did");
    let new = queue::claim(&pool, "new", 4, Duration::from_secs(60)).await.unwrap();
    let mut claimed: Vec<Uuid> = old.iter().map(|(id, _)| *id).chain(new.iter().map(|j| j.id)).collect();
    claimed.sort();
    let mut all = ids.clone();
    all.sort();
    assert_eq!(claimed, all, "each job claimed once, by one release or the other");
    for job in &new {
        assert_eq!(queue::complete(&pool, &NoHooks, job, &ok_output()).await.unwrap(), Recorded::Done);
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn results_are_written_where_the_claim_left_each_row_or_found_by_id_when_it_moved(pool: PgPool) {
    let lease = Duration::from_secs(60);
    enqueue_many(&pool, 1, 4).await;
    let jobs = queue::claim(&pool, "w", 4, lease).await.unwrap();
    assert_eq!(jobs.len(), 4);
    let place_of = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT ctid::text FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    for job in &jobs {
        assert_eq!(job.place.as_deref(), Some(place_of(job.id).await.as_str()), "the claim says where the row is");
    }
    let (still, moved, misplaced, stale) = (&jobs[0], &jobs[1], &jobs[2], &jobs[3]);
    // A heartbeat moves a row; a place can be wrong (another job's row); a token can be stale.
    queue::heartbeat(&pool, &[moved.lease_token], &[], lease).await.unwrap();
    assert_ne!(moved.place.as_deref(), Some(place_of(moved.id).await.as_str()));
    let misplaced = ClaimedJob { place: still.place.clone(), ..misplaced.clone() };
    let stale = ClaimedJob { lease_token: Uuid::new_v4(), ..stale.clone() };
    let output = |n: i64| JobOutput { result: serde_json::json!({ "n": n }), ..ok_output() };
    let outputs: Vec<JobOutput> = (0..4).map(output).collect();
    let items = [still, moved, &misplaced, &stale];
    let items: Vec<(&ClaimedJob, &JobOutput)> = items.into_iter().zip(&outputs).collect();
    let recorded = queue::complete_many(&pool, &NoHooks, &items).await.unwrap();
    assert_eq!(recorded, [Recorded::Done, Recorded::Done, Recorded::Done, Recorded::Stale]);
    for (n, job) in jobs.iter().enumerate().take(3) {
        let view = queue::get(&pool, job.id).await.unwrap();
        assert_eq!(view.state, JobState::Done);
        assert_eq!(view.result, Some(serde_json::json!({ "n": n })), "each result on its own job");
    }
    assert_eq!(queue::get(&pool, jobs[3].id).await.unwrap().state, JobState::Running);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn crashed_worker_job_is_rescued_and_done_once_and_stale_write_is_rejected(pool: PgPool) {
    RecordingHooks::install(&pool).await;
    let id = enqueue_many(&pool, 1, 1).await[0];
    let mut config = fast_worker("doomed", 4);
    config.lease = Duration::from_millis(600);
    config.heartbeat = Duration::from_millis(150);

    // The processor hangs, and the worker is then aborted as if its process died.
    let claimed: Arc<Mutex<Option<queue::ClaimedJob>>> = Arc::default();
    let processor = {
        let claimed = claimed.clone();
        move |job: queue::ClaimedJob| {
            *claimed.lock().unwrap() = Some(job);
            futures::future::pending::<Result<JobOutput, JobError>>()
        }
    };
    let doomed = WorkerPool::start(pool.clone(), config.clone(), Arc::new(processor), Arc::new(RecordingHooks));
    assert!(wait_for(Duration::from_secs(5), || async { claimed.lock().unwrap().is_some() }).await);
    // Heartbeats keep the lease alive well past its length while the worker lives.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(engine::queue::rescue::rescue_expired(&pool, &RecordingHooks, &config.policy).await.unwrap().is_empty());
    drop(doomed);

    assert!(
        wait_for(Duration::from_secs(5), || async {
            !engine::queue::rescue::rescue_expired(&pool, &RecordingHooks, &config.policy).await.unwrap().is_empty()
        })
        .await
    );
    let job = queue::get(&pool, id).await.unwrap();
    assert_eq!(job.state, JobState::Retrying);
    assert_eq!(job.attempts, 1, "the lost attempt counts");

    // A healthy worker finishes it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let reports =
        work_once(&pool, &config, Arc::new(|_| async { Ok(ok_output()) }), Arc::new(RecordingHooks), 5).await.unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].recorded, Recorded::Done);

    // The dead worker's late write is fenced off by its old lease token.
    let stale = claimed.lock().unwrap().clone().unwrap();
    let late = JobOutput { result: serde_json::json!({"stale": true}), ..ok_output() };
    assert_eq!(queue::complete(&pool, &RecordingHooks, &stale, &late).await.unwrap(), Recorded::Stale);
    let failed_late = JobError::new(ErrorClass::Rejected, "late");
    assert_eq!(
        queue::fail(&pool, &RecordingHooks, &config.policy, &stale, &failed_late).await.unwrap(),
        Recorded::Stale
    );

    let job = queue::get(&pool, id).await.unwrap();
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.result, Some(serde_json::json!({"ok": true})));
    assert_eq!(RecordingHooks::calls(&pool, id, "done").await, 1);
    assert_eq!(RecordingHooks::calls(&pool, id, "failed").await, 0);
    let outcomes: Vec<Option<AttemptOutcome>> =
        queue::attempts(&pool, id).await.unwrap().into_iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, vec![Some(AttemptOutcome::LeaseExpired), Some(AttemptOutcome::Succeeded)]);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn expired_lease_on_the_last_attempt_fails_as_timed_out(pool: PgPool) {
    RecordingHooks::install(&pool).await;
    let id = enqueue_many(&pool, 1, 1).await[0];
    sqlx::query("UPDATE jobs SET attempts = 2").execute(&pool).await.unwrap();
    let config = fast_worker("w", 1);
    queue::claim(&pool, "w", 1, Duration::from_millis(10)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rescued = engine::queue::rescue::rescue_expired(&pool, &RecordingHooks, &config.policy).await.unwrap();
    assert_eq!(rescued, vec![(id, Recorded::Failed(FailureKind::TimedOut))]);
    assert_eq!(RecordingHooks::calls(&pool, id, "failed").await, 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn kill_switch_stops_claims_at_once_keeps_attempts_and_resume_drains(pool: PgPool) {
    let pool = wider_pool(&pool, 40).await;
    // One job is running when processing is paused; it then fails transiently.
    let release = Arc::new(tokio::sync::Notify::new());
    let processor = {
        let release = release.clone();
        move |job: queue::ClaimedJob| {
            let release = release.clone();
            async move {
                if job.payload["slow"] == true {
                    release.notified().await;
                    return Err(JobError::new(ErrorClass::Overloaded, "provider overloaded").with_status(529));
                }
                Ok(ok_output())
            }
        }
    };
    let slow: Uuid =
        queue::enqueue(&mut *pool.acquire().await.unwrap(), &queue::NewJob::new(1, serde_json::json!({"slow": true})))
            .await
            .unwrap();
    let workers = WorkerPool::start(pool.clone(), fast_worker("w", 8), Arc::new(processor), Arc::new(NoHooks));
    assert!(
        wait_for(Duration::from_secs(5), || async {
            queue::get(&pool, slow).await.unwrap().state == JobState::Running
        })
        .await
    );

    switches::set_processing(&pool, false, "operator@example.com").await.unwrap();
    let paused_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&pool).await.unwrap();
    // Jobs keep arriving while paused.
    for owner in 0..15 {
        enqueue_many(&pool, 100 + owner, 2).await;
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    release.notify_one();
    assert!(
        wait_for(Duration::from_secs(5), || async { queue::get(&pool, slow).await.unwrap().state == JobState::Queued })
            .await
    );
    // Every claim leaves its time on the job (an attempt's row is written only when it ends).
    let claimed_after_pause: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE claimed_at > $1")
        .bind(paused_at)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(claimed_after_pause, 0, "no claims after the pause");
    assert_eq!(count_in_state(&pool, JobState::Queued).await, 31);
    let slow_job = queue::get(&pool, slow).await.unwrap();
    assert_eq!(slow_job.attempts, 0, "a failure while paused does not use an attempt");

    let audit = engine::audit::recent(&pool, 10).await.unwrap();
    assert_eq!(audit[0].action, "processing");
    assert_eq!(audit[0].actor, "operator@example.com");
    assert_eq!((audit[0].old_value.as_deref(), audit[0].new_value.as_deref()), (Some("on"), Some("off")));

    // Resume: the slow job now fails transiently once more is fine; everything else drains.
    switches::set_processing(&pool, true, "operator@example.com").await.unwrap();
    release.notify_waiters();
    assert!(wait_for(Duration::from_secs(10), || async { count_in_state(&pool, JobState::Done).await == 30 }).await);
    workers.shutdown().await;
}

/// How jobs fetched ahead leave a pool's memory without starting: on a pause, or after waiting
/// `fetched_ahead_wait`.
#[derive(Clone, Copy, PartialEq)]
enum GoBack {
    OnAPause,
    AfterWaiting,
}

/// 100 instant jobs (the pool learns its jobs are short and fetches a batch ahead), then jobs
/// that hold their slot until released: 4 hold the gate's 4 slots and the rest of the batch
/// waits in memory until `go_back` sends it back to the line.
async fn fetched_ahead_jobs_go_back(pool: PgPool, go_back: GoBack) {
    let pool = wider_pool(&pool, 20).await;
    switches::set_gate_size(&pool, 4, "test").await.unwrap();
    enqueue_many(&pool, 1, 1_000).await;
    let (holding, release) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let processor = {
        let (holding, release, released) = (holding.clone(), release.clone(), released.clone());
        move |job: queue::ClaimedJob| {
            let (holding, release, released) = (holding.clone(), release.clone(), released.clone());
            async move {
                if job.payload["n"].as_i64().unwrap() > 100 && !released.load(Ordering::SeqCst) {
                    holding.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                }
                Ok::<_, JobError>(ok_output())
            }
        }
    };
    let wait = if go_back == GoBack::OnAPause { Duration::from_secs(60) } else { Duration::from_millis(300) };
    let config = WorkerConfig { fetched_ahead_wait: wait, ..fast_worker("ahead", 4) };
    engine::testing::log_done_writes(&pool).await;
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(engine::testing::LOG_DONE));
    let held = wait_for(Duration::from_secs(10), || {
        std::future::ready(holding.load(Ordering::SeqCst) == 4 && workers.queued_locally() > 0)
    })
    .await;
    assert!(held, "4 attempts hold the gate with jobs fetched ahead behind them");
    let running = count_in_state(&pool, JobState::Running).await;
    assert!(running > 4, "the jobs fetched ahead are the pool's, under its lease ({running} running)");

    if go_back == GoBack::OnAPause {
        switches::set_processing(&pool, false, "operator@example.com").await.unwrap();
    }
    let back = wait_for(Duration::from_secs(5), || async {
        workers.queued_locally() == 0 && count_in_state(&pool, JobState::Running).await == 4
    })
    .await;
    assert!(back, "the jobs fetched ahead go back; only the 4 started ones run");
    assert_eq!(holding.load(Ordering::SeqCst), 4, "none of them started");
    let queued = count_in_state(&pool, JobState::Queued).await;
    assert_eq!(queued, 1_000 - 100 - 4, "nothing lost");
    // As if never claimed: no attempt used, no attempt row (the 100 done have theirs; the 4
    // running will when they end), their place in line kept.
    let (used, rows): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(attempts), 0) FROM jobs WHERE state = 'queued'), (SELECT count(*) FROM attempt_history)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((used, rows), (0, 100));
    let first_waiting: i64 =
        sqlx::query_scalar("SELECT (payload->>'n')::bigint FROM waiting_jobs ORDER BY run_at, id LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(first_waiting, 105, "the first job back in line is the first not started");

    if go_back == GoBack::OnAPause {
        switches::set_processing(&pool, true, "operator@example.com").await.unwrap();
    }
    released.store(true, Ordering::SeqCst);
    let all_done = wait_for(Duration::from_secs(30), || {
        release.notify_waiters();
        async { count_in_state(&pool, JobState::Done).await == 1_000 }
    })
    .await;
    workers.shutdown().await;
    assert!(all_done, "everything runs once released");
    let double = engine::testing::jobs_done_twice(&pool).await;
    assert_eq!(double, 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_pause_sends_the_jobs_fetched_ahead_back_unstarted(pool: PgPool) {
    fetched_ahead_jobs_go_back(pool, GoBack::OnAPause).await;
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn jobs_fetched_ahead_that_wait_too_long_go_back_to_the_line(pool: PgPool) {
    fetched_ahead_jobs_go_back(pool, GoBack::AfterWaiting).await;
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn retries_follow_the_schedule_and_retry_after_floor_then_exhaust(pool: PgPool) {
    RecordingHooks::install(&pool).await;
    let id = enqueue_many(&pool, 1, 1).await[0];
    let calls = Arc::new(AtomicUsize::new(0));
    let processor = {
        let calls = calls.clone();
        move |_job: queue::ClaimedJob| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let err = JobError::new(ErrorClass::RateLimited, "rate limited by the provider").with_status(429);
                // The second failure carries a Retry-After longer than the schedule's delay.
                Err(if n == 2 { err.with_retry_after(Duration::from_millis(900)) } else { err })
            }
        }
    };
    let config = fast_worker("w", 2); // delays 200 ms, 400 ms
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(RecordingHooks));
    assert!(
        wait_for(Duration::from_secs(10), || async { queue::get(&pool, id).await.unwrap().state == JobState::Failed })
            .await
    );
    workers.shutdown().await;

    let job = queue::get(&pool, id).await.unwrap();
    assert_eq!(job.failure_kind, Some(FailureKind::RetriesExhausted));
    assert_eq!(job.attempts, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "at most three provider calls");
    let attempts = queue::attempts(&pool, id).await.unwrap();
    assert_eq!(attempts.len(), 3);
    let gap = |i: usize| (attempts[i].started_at - attempts[i - 1].finished_at.unwrap()).num_milliseconds();
    assert!(gap(1) >= 200, "first retry waited {} ms", gap(1));
    assert!(gap(2) >= 900, "Retry-After is a floor: waited {} ms", gap(2));
    assert_eq!(attempts[1].retry_after_ms, Some(900));
    assert_eq!(attempts[2].outcome, Some(AttemptOutcome::Failed));
    assert_eq!(RecordingHooks::calls(&pool, id, "failed").await, 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn permanent_errors_fail_at_once(pool: PgPool) {
    RecordingHooks::install(&pool).await;
    let id = enqueue_many(&pool, 1, 1).await[0];
    let config = fast_worker("w", 1);
    let reports = work_once(
        &pool,
        &config,
        Arc::new(|_| async { Err(JobError::new(ErrorClass::InvalidInput, "the PDF is encrypted")) }),
        Arc::new(RecordingHooks),
        1,
    )
    .await
    .unwrap();
    assert_eq!(reports[0].recorded, Recorded::Failed(FailureKind::InvalidInput));
    let job = queue::get(&pool, id).await.unwrap();
    assert_eq!(job.failure_reason.as_deref(), Some("the PDF is encrypted"));
    assert_eq!(RecordingHooks::calls(&pool, id, "failed").await, 1);
}

/// A hook that fails rolls the whole transition back: the job is not `done` without it.
const FAILING_HOOKS: engine::testing::OnDone =
    engine::testing::OnDone(|_, _| Box::pin(async { Err(sqlx::Error::Protocol("ledger unavailable".into())) }));

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_failing_hook_rolls_the_transition_back(pool: PgPool) {
    let id = enqueue_many(&pool, 1, 1).await[0];
    let job = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    assert!(queue::complete(&pool, &FAILING_HOOKS, &job, &ok_output()).await.is_err());
    let view = queue::get(&pool, id).await.unwrap();
    assert_eq!(view.state, JobState::Running);
    assert_eq!(view.result, None);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn replaying_the_same_dlq_job_twice_at_once_requeues_it_once(pool: PgPool) {
    RecordingHooks::install(&pool).await;
    let pool = wider_pool(&pool, 20).await;
    let ids = enqueue_many(&pool, 1, 3).await;
    let config = fast_worker("w", 3);
    work_once(
        &pool,
        &config,
        Arc::new(|_| async { Err(JobError::new(ErrorClass::Rejected, "400 bad request")) }),
        Arc::new(RecordingHooks),
        3,
    )
    .await
    .unwrap();
    let groups = dlq::groups(&pool).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].failure_kind, groups[0].jobs), (FailureKind::ProviderRejected, 3));
    let listed = dlq::group_jobs(&pool, groups[0].failure_kind, &groups[0].failure_reason, 20).await.unwrap();
    assert_eq!(listed.len(), 3, "the group's jobs can be listed");

    let one = Selection::Job(ids[0]);
    let (a, b) = tokio::join!(
        dlq::replay(&pool, &RecordingHooks, &one, "admin"),
        dlq::replay(&pool, &RecordingHooks, &one, "admin")
    );
    assert_eq!(a.unwrap().ids.len() + b.unwrap().ids.len(), 1);
    let job = queue::get(&pool, ids[0]).await.unwrap();
    assert_eq!((job.state, job.attempts, job.replays), (JobState::Queued, 0, 1));
    assert_eq!(RecordingHooks::calls(&pool, ids[0], "replayed").await, 1);

    // A whole group, twice at once: the other two jobs come back once each.
    let group = Selection::Group { kind: FailureKind::ProviderRejected, reason: "400 bad request".into() };
    let (a, b) = tokio::join!(
        dlq::replay(&pool, &RecordingHooks, &group, "admin"),
        dlq::replay(&pool, &RecordingHooks, &group, "admin")
    );
    assert_eq!(a.unwrap().ids.len() + b.unwrap().ids.len(), 2);
    assert_eq!(dlq::depth(&pool).await.unwrap(), 0);

    // They run to done; discard takes a failed job out of the DLQ without deleting it.
    work_once(&pool, &config, Arc::new(|_| async { Ok(ok_output()) }), Arc::new(RecordingHooks), 3).await.unwrap();
    assert_eq!(count_in_state(&pool, JobState::Done).await, 3);
    let extra = enqueue_many(&pool, 2, 1).await[0];
    work_once(
        &pool,
        &config,
        Arc::new(|_| async { Err(JobError::new(ErrorClass::InvalidInput, "no text")) }),
        Arc::new(NoHooks),
        1,
    )
    .await
    .unwrap();
    assert_eq!(dlq::discard(&pool, &NoHooks, &Selection::Job(extra), "admin").await.unwrap(), 1);
    assert_eq!(dlq::depth(&pool).await.unwrap(), 0);
    assert_eq!(queue::get(&pool, extra).await.unwrap().state, JobState::Failed);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn graceful_shutdown_hands_unfinished_jobs_back_without_using_an_attempt(pool: PgPool) {
    let ids = enqueue_many(&pool, 1, 2).await;
    let mut config = fast_worker("w", 2);
    config.shutdown_timeout = Duration::from_millis(300);
    let processor = |_job: queue::ClaimedJob| futures::future::pending::<Result<JobOutput, JobError>>();
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(NoHooks));
    assert!(wait_for(Duration::from_secs(5), || async { count_in_state(&pool, JobState::Running).await == 2 }).await);
    let report = workers.shutdown().await;
    assert_eq!(report.handed_back, 2);
    for id in ids {
        let job = queue::get(&pool, id).await.unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Queued, 0));
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_attempt_past_its_deadline_is_stopped_and_frees_its_slot(pool: PgPool) {
    // One gate slot: a hung attempt that kept it would starve the other job for ever.
    switches::set_gate_size(&pool, 1, "test").await.unwrap();
    let hung = enqueue_many(&pool, 1, 1).await[0];
    let fine = enqueue_many(&pool, 2, 1).await[0];
    let mut config = fast_worker("w", 2);
    config.attempt_deadline = Duration::from_millis(300);
    let processor = move |job: queue::ClaimedJob| async move {
        if job.id == hung {
            futures::future::pending::<()>().await;
        }
        Ok::<_, JobError>(ok_output())
    };
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(NoHooks));
    let ended = wait_for(Duration::from_secs(15), || async {
        count_in_state(&pool, JobState::Done).await + count_in_state(&pool, JobState::Failed).await == 2
    })
    .await;
    workers.shutdown().await;
    assert!(ended, "both jobs ended");
    assert_eq!(queue::get(&pool, fine).await.unwrap().state, JobState::Done);
    let job = queue::get(&pool, hung).await.unwrap();
    assert_eq!((job.state, job.failure_kind, job.attempts), (JobState::Failed, Some(FailureKind::RetriesExhausted), 3));
    let attempts = queue::attempts(&pool, hung).await.unwrap();
    assert!(attempts.iter().all(|a| a.error_class == Some(ErrorClass::Timeout)), "{attempts:?}");
    assert_eq!(attempts[0].error.as_deref(), Some("the attempt took longer than 0.3 s and was stopped"));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_huge_retry_after_is_capped_and_never_panics_the_worker(pool: PgPool) {
    let id = enqueue_many(&pool, 1, 1).await[0];
    let config = fast_worker("w", 1);
    let processor = |_job: queue::ClaimedJob| async {
        Err::<JobOutput, _>(JobError::new(ErrorClass::RateLimited, "slow down").with_retry_after(Duration::MAX))
    };
    let reports = work_once(&pool, &config, Arc::new(processor), Arc::new(NoHooks), 1).await.unwrap();
    let Recorded::Retrying { at } = reports[0].recorded else { panic!("{:?}", reports[0].recorded) };
    let wait = (at - chrono::Utc::now()).to_std().unwrap();
    assert!(wait <= config.policy.max_retry_after && wait > config.policy.max_retry_after - Duration::from_secs(60));
    let job = queue::get(&pool, id).await.unwrap();
    assert_eq!(job.state, JobState::Retrying, "not stuck in running");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_group_replay_skips_documents_uploaded_again_or_released_and_requeues_the_rest(pool: PgPool) {
    let failed = |key: &str| {
        let (pool, key) = (pool.clone(), key.to_string());
        async move {
            let id =
                job(&pool, &JobOpts { state: JobState::Failed, finished_ago: Some(10.0), ..Default::default() }).await;
            sqlx::query("UPDATE jobs SET idempotency_key = $2 WHERE id = $1")
                .bind(id)
                .bind(key)
                .execute(&pool)
                .await
                .unwrap();
            id
        }
    };
    let reuploaded = failed("doc-a").await;
    let other = failed("doc-b").await;
    // Its replay window ended and its document was released: nothing to run again.
    let released = failed("doc-c").await;
    sqlx::query("UPDATE jobs SET document_released_at = now() WHERE id = $1")
        .bind(released)
        .execute(&pool)
        .await
        .unwrap();
    // The owner uploaded doc-a again: a live job holds its key now.
    let newer = job(&pool, &JobOpts::default()).await;
    sqlx::query("UPDATE jobs SET idempotency_key = 'doc-a' WHERE id = $1").bind(newer).execute(&pool).await.unwrap();

    let group = Selection::Group { kind: FailureKind::RetriesExhausted, reason: "provider overloaded".into() };
    let replayed = dlq::replay(&pool, &NoHooks, &group, "admin").await.unwrap();
    assert_eq!(replayed.ids, vec![other]);
    assert_eq!(replayed.already_reuploaded, vec![(reuploaded, newer)]);
    assert_eq!(replayed.document_released, vec![released], "says so instead of failing again");
    assert_eq!(queue::get(&pool, released).await.unwrap().state, JobState::Failed);
    assert_eq!(queue::get(&pool, reuploaded).await.unwrap().state, JobState::Failed);
    assert_eq!(queue::get(&pool, other).await.unwrap().state, JobState::Queued);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn gate_size_is_validated_and_audited(pool: PgPool) {
    assert!(switches::set_gate_size(&pool, 0, "a").await.is_err());
    assert!(switches::set_gate_size(&pool, 71, "a").await.is_err());
    let s = switches::set_gate_size(&pool, 70, "a").await.unwrap();
    assert_eq!(s.gate_size, 70);
    let audit = engine::audit::recent(&pool, 5).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].old_value.as_deref(), audit[0].new_value.as_deref()), (Some("24"), Some("70")));
    // A gate of 1 lets exactly one job run.
    switches::set_gate_size(&pool, 1, "a").await.unwrap();
    enqueue_many(&pool, 1, 3).await;
    assert_eq!(queue::claim(&pool, "w", 3, Duration::from_secs(60)).await.unwrap().len(), 1);
    assert_eq!(queue::claim(&pool, "w", 3, Duration::from_secs(60)).await.unwrap().len(), 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn pickup_is_woken_by_notify_not_the_poll(pool: PgPool) {
    let mut config = fast_worker("w", 2);
    config.poll_interval = Duration::from_secs(30);
    let started = Arc::new(Mutex::new(None));
    let processor = {
        let started = started.clone();
        move |_job: queue::ClaimedJob| {
            *started.lock().unwrap() = Some(std::time::Instant::now());
            async { Ok(ok_output()) }
        }
    };
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(NoHooks));
    tokio::time::sleep(Duration::from_millis(500)).await; // idle, listening
    let enqueued = std::time::Instant::now();
    enqueue_many(&pool, 1, 1).await;
    assert!(
        wait_for(Duration::from_secs(5), || async { started.lock().unwrap().is_some() }).await,
        "picked up without the 30 s poll"
    );
    let latency = started.lock().unwrap().unwrap() - enqueued;
    assert!(latency < Duration::from_secs(2), "pickup took {latency:?}");
    workers.shutdown().await;
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_place_in_line_matches_the_order_jobs_are_claimed_in(pool: PgPool) {
    enqueue_many(&pool, 20, 2).await;
    enqueue_many(&pool, 30, 1).await;
    // Owner 10's jobs are the newest: where their tags tie with others', the others go first.
    let mine = enqueue_many(&pool, 10, 4).await;
    switches::set_gate_size(&pool, 9, "test").await.unwrap();
    let line = queue::waiting_line(&pool, 10, &mine).await.unwrap();
    assert_eq!(line.free_slots, 9, "the gate, with nothing running");
    assert!(line.processing_enabled);

    // Claim one at a time (slow jobs: each keeps running), noting when each of owner 10's goes.
    let mut claimed_before = HashMap::new();
    let mut claimed = Vec::new();
    for n in 0..7u64 {
        let job = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap().remove(0);
        if job.owner_id == 10 {
            claimed_before.insert(job.id, n);
        }
        claimed.push(job);
    }
    for id in &mine {
        assert_eq!(line.ahead[id], claimed_before[id], "job {id}");
    }
    for job in &claimed {
        assert_eq!(queue::complete(&pool, &NoHooks, job, &ok_output()).await.unwrap(), Recorded::Done);
    }

    // Seven finished in the last five minutes: a rate to estimate with, and nothing waits now.
    let after = queue::waiting_line(&pool, 10, &mine).await.unwrap();
    assert!((after.finishing_per_sec - 7.0 / 300.0).abs() < 1e-9);
    assert!(after.ahead.is_empty());

    // With the gate full, a new job waits for one to finish; paused, there is no estimate.
    switches::set_gate_size(&pool, 1, "test").await.unwrap();
    let running = enqueue_many(&pool, 20, 1).await;
    queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    let waiting = enqueue_many(&pool, 10, 1).await[0];
    let full = queue::waiting_line(&pool, 10, &[waiting, running[0]]).await.unwrap();
    assert_eq!(full.free_slots, 0);
    assert_eq!(full.ahead[&waiting], 0);
    let wait = full.estimated_start(waiting).unwrap();
    assert!((wait.as_secs_f64() - 300.0 / 7.0).abs() < 0.01, "{wait:?}");
    assert_eq!(full.estimated_start(running[0]), None, "a running job has no place in line");
    switches::set_processing(&pool, false, "test").await.unwrap();
    let paused = queue::waiting_line(&pool, 10, &[waiting]).await.unwrap();
    assert!(!paused.processing_enabled);
    assert_eq!(paused.estimated_start(waiting), None);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_users_jobs_come_a_page_at_a_time_filtered_by_state_and_name(pool: PgPool) {
    use engine::queue::{page_for_owner, JobFilter};
    // The queue needs no account: an owner is a number.
    let owner: i64 = 7;
    sqlx::query(
        "INSERT INTO jobs (owner_id, payload, accepted_at, state, finished_at)
         SELECT $1, jsonb_build_object('document', jsonb_build_object('name', 'report-' || g || '.pdf')),
                now() - make_interval(secs => g), CASE WHEN g % 3 = 0 THEN 'done' ELSE 'queued' END,
                CASE WHEN g % 3 = 0 THEN now() END
         FROM generate_series(1, 120) g",
    )
    .bind(owner)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO jobs (owner_id, payload) VALUES ($1, '{\"document\": {\"name\": \"100%_Sure.TXT\"}}')")
        .bind(owner)
        .execute(&pool)
        .await
        .unwrap();
    let name = |j: &queue::JobView| j.payload["document"]["name"].as_str().unwrap().to_string();

    let all = JobFilter::default();
    let (first, more) = page_for_owner(&pool, owner, &all, 0, 50).await.unwrap();
    assert_eq!((first.len(), more), (50, true));
    assert_eq!(name(&first[0]), "100%_Sure.TXT", "newest first");
    let (last, more) = page_for_owner(&pool, owner, &all, 100, 50).await.unwrap();
    assert_eq!((last.len(), more), (21, false));

    let done = JobFilter { state: Some(JobState::Done), ..JobFilter::default() };
    let (jobs, _) = page_for_owner(&pool, owner, &done, 0, 100).await.unwrap();
    assert_eq!(jobs.len(), 40);
    assert!(jobs.iter().all(|j| j.state == JobState::Done));

    let search = |text: &str| JobFilter { name_contains: Some(text.into()), ..JobFilter::default() };
    let (jobs, _) = page_for_owner(&pool, owner, &search("REPORT-11"), 0, 50).await.unwrap();
    let mut names: Vec<String> = jobs.iter().map(name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "report-11.pdf",
            "report-110.pdf",
            "report-111.pdf",
            "report-112.pdf",
            "report-113.pdf",
            "report-114.pdf",
            "report-115.pdf",
            "report-116.pdf",
            "report-117.pdf",
            "report-118.pdf",
            "report-119.pdf"
        ]
    );
    // `%` and `_` are literal, not wildcards.
    let (jobs, _) = page_for_owner(&pool, owner, &search("0%_s"), 0, 50).await.unwrap();
    assert_eq!(jobs.iter().map(name).collect::<Vec<_>>(), ["100%_Sure.TXT"]);
    let (jobs, _) = page_for_owner(&pool, owner, &search("%"), 0, 50).await.unwrap();
    assert_eq!(jobs.len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_shared_snapshot_of_the_line_answers_as_the_database_does(pool: PgPool) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    switches::set_gate_size(&pool, 30, "test").await.unwrap();
    for round in 0..4 {
        // Owners with random backlogs, some running, some retries scheduled later.
        for owner in 0..25i64 {
            let n = rng.random_range(0..12);
            enqueue_many(&pool, owner, n).await;
        }
        let claimed = queue::claim(&pool, "w", rng.random_range(0..20), Duration::from_secs(60)).await.unwrap();
        sqlx::query(
            "UPDATE jobs SET state = 'retrying', run_at = now() + interval '1 hour'
             WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' ORDER BY random() LIMIT 5)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let snapshot = queue::LineSnapshot::read(&pool).await.unwrap().expect("small enough for a snapshot");
        for owner in 0..25i64 {
            let mine: Vec<Uuid> =
                sqlx::query_scalar("SELECT id FROM jobs WHERE owner_id = $1 AND state IN ('queued', 'retrying')")
                    .bind(owner)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let asked = queue::waiting_line(&pool, owner, &mine).await.unwrap();
            let shared = snapshot.line_for(owner, &mine).expect("every waiting job is in the snapshot");
            assert_eq!(shared, asked, "round {round}, owner {owner}");
        }
        // A job newer than the snapshot is not answered from it (the caller asks the database).
        let newer = enqueue_many(&pool, 3, 1).await;
        assert!(snapshot.line_for(3, &newer).is_none());
        let line = queue::SharedLine::default();
        assert_eq!(
            line.waiting_line(&pool, 3, &newer).await.unwrap(),
            queue::waiting_line(&pool, 3, &newer).await.unwrap()
        );
        for job in &claimed {
            queue::complete(&pool, &NoHooks, job, &ok_output()).await.unwrap();
        }
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn worker_slots_follow_the_gate_on_one_process_and_are_counted_alive(pool: PgPool) {
    let pool = wider_pool(&pool, 30).await;
    switches::set_gate_size(&pool, 40, "test").await.unwrap();
    enqueue_many(&pool, 1, 30).await;
    enqueue_many(&pool, 2, 30).await;
    let processor = |_job: ClaimedJob| async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        Ok::<_, JobError>(JobOutput::default())
    };
    // One process with the default slots (70): the gate, not the process, decides.
    let config = WorkerConfig { concurrency: WorkerConfig::default().concurrency, ..fast_worker("slots", 0) };
    assert_eq!(config.concurrency, 70);
    let workers = WorkerPool::start(pool.clone(), config, Arc::new(processor), Arc::new(NoHooks));
    let forty_running =
        wait_for(Duration::from_secs(10), || async { count_in_state(&pool, JobState::Running).await == 40 }).await;
    assert!(forty_running, "the gate of 40 is used in full by one process");
    let live = queue::processes::live(&pool).await.unwrap();
    assert_eq!((live.processes, live.slots), (1, 70));
    assert_eq!(queue::processes::effective_concurrency(40, live), 40);
    workers.shutdown().await;
    assert_eq!(queue::processes::live(&pool).await.unwrap().slots, 0, "a process that stopped is not counted");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_retry_budget_counts_time_the_job_could_run_not_a_long_pause(pool: PgPool) {
    use engine::queue::policy::retry::RetryPolicy;
    // Accepted 7 days and an hour ago; processing was paused for 7 days of that.
    let id = job(&pool, &JobOpts { accepted_ago: 7.0 * 86_400.0 + 3_600.0, ..Default::default() }).await;
    sqlx::query(
        "INSERT INTO processing_pauses (paused_at, resumed_at)
         VALUES (now() - interval '7 days 50 minutes', now() - interval '50 minutes')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let claimed = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let error = JobError::new(ErrorClass::ServerError, "the provider had an error (500)");
    let recorded = queue::fail(&pool, &NoHooks, &RetryPolicy::default(), &claimed[0], &error).await.unwrap();
    assert!(
        matches!(recorded, Recorded::Retrying { .. }),
        "one transient error after a long pause retries: {recorded:?}"
    );

    // Without the pause, the same age is past the 6-hour budget: it fails as retries exhausted.
    sqlx::query("DELETE FROM processing_pauses").execute(&pool).await.unwrap();
    sqlx::query("UPDATE jobs SET run_at = now() WHERE id = $1").bind(id).execute(&pool).await.unwrap();
    let claimed = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    let recorded = queue::fail(&pool, &NoHooks, &RetryPolicy::default(), &claimed[0], &error).await.unwrap();
    assert_eq!(recorded, Recorded::Failed(FailureKind::RetriesExhausted));
}

/// Jobs missing from the listing, listing rows without their job, and rows whose owner or
/// acceptance time differs from their job's.
async fn listing_drift(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs j FULL JOIN job_listing l ON l.job_id = j.id
         WHERE j.id IS NULL OR l.job_id IS NULL OR l.owner_id <> j.owner_id OR l.accepted_at <> j.accepted_at",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_listing_follows_every_job_from_insert_to_delete_and_lists_them_newest_first(pool: PgPool) {
    use engine::queue::{page_for_owner, search, JobFilter, JobSearch};
    let owner: i64 = sqlx::query_scalar(
        "INSERT INTO users (email, password_hash, balance) VALUES ('lister@example.com', 'x', 0) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // By every way jobs come in: the bulk helper, one at a time, and a day old.
    let recent = enqueue_many(&pool, owner, 5).await;
    let old = job(&pool, &JobOpts { owner_id: owner, accepted_ago: 86_400.0, ..JobOpts::default() }).await;
    let done_long_ago = job(
        &pool,
        &JobOpts {
            owner_id: owner,
            state: JobState::Done,
            accepted_ago: 90.0 * 86_400.0,
            finished_ago: Some(90.0 * 86_400.0),
            ..JobOpts::default()
        },
    )
    .await;
    assert_eq!(listing_drift(&pool).await, 0);
    let ids = |jobs: &[queue::JobView]| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
    let (page, _) = page_for_owner(&pool, owner, &JobFilter::default(), 0, 10).await.unwrap();
    assert_eq!(ids(&page)[5..], [old, done_long_ago], "newest first");

    // A job's acceptance time moved (a repair; tests age jobs so) moves its place in the list.
    sqlx::query("UPDATE jobs SET accepted_at = now() + interval '1 minute' WHERE id = $1")
        .bind(old)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(listing_drift(&pool).await, 0);
    let (page, _) = page_for_owner(&pool, owner, &JobFilter::default(), 0, 10).await.unwrap();
    assert_eq!(page[0].id, old, "moved to the top");

    // The admin's search by acceptance time reads the listing's range.
    let last_week = JobSearch { from: Some(chrono::Utc::now() - chrono::Duration::days(7)), ..JobSearch::default() };
    let (found, _) = search(&pool, &last_week, 0, 25).await.unwrap();
    let mut expected = recent.clone();
    expected.push(old);
    let mut found: Vec<Uuid> = found.into_iter().map(|f| f.job.id).collect();
    found.sort();
    expected.sort();
    assert_eq!(found, expected);
    let before = JobSearch { until: Some(chrono::Utc::now() - chrono::Duration::days(7)), ..JobSearch::default() };
    let (found, _) = search(&pool, &before, 0, 25).await.unwrap();
    assert_eq!(found.iter().map(|f| f.job.id).collect::<Vec<_>>(), [done_long_ago]);
    let by_id = JobSearch { text: Some(recent[2].to_string()), ..JobSearch::default() };
    let (found, _) = search(&pool, &by_id, 0, 25).await.unwrap();
    assert_eq!(found.iter().map(|f| f.job.id).collect::<Vec<_>>(), [recent[2]]);

    // Pruned by retention, deleted, truncated: the listing's rows go with their jobs.
    let pruned = queue::retention::prune(
        &pool,
        queue::retention::Retention {
            done: Duration::from_secs(86_400),
            failed: Duration::from_secs(86_400),
            failed_documents: Duration::from_secs(86_400),
        },
    )
    .await
    .unwrap();
    assert_eq!(pruned.iter().map(|p| p.id).collect::<Vec<_>>(), [done_long_ago]);
    sqlx::query("DELETE FROM jobs WHERE id = $1").bind(recent[0]).execute(&pool).await.unwrap();
    assert_eq!(listing_drift(&pool).await, 0);
    let listed: i64 = sqlx::query_scalar("SELECT count(*) FROM job_listing").fetch_one(&pool).await.unwrap();
    assert_eq!(listed, 5);
    sqlx::query(
        "TRUNCATE jobs, job_attempts, job_parts, parts_read, job_writing, reviews, kept_answers, kept_scan_texts",
    )
    .execute(&pool)
    .await
    .unwrap();
    let listed: i64 = sqlx::query_scalar("SELECT count(*) FROM job_listing").fetch_one(&pool).await.unwrap();
    assert_eq!(listed, 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_jobs_attempts_go_with_it_however_it_goes(pool: PgPool) {
    let attempts = |pool: PgPool| async move {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts").fetch_one(&pool).await.unwrap();
        n
    };
    let ids = enqueue_many(&pool, 1, 6).await;
    let claimed = queue::claim(&pool, "w", 6, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 6);
    // Attempts that end in a retry (a success is kept on the job's own row, which goes anyway).
    let error = JobError::new(ErrorClass::ServerError, "the provider had an error (500)");
    for job in &claimed {
        queue::fail(&pool, &NoHooks, &engine::queue::policy::retry::RetryPolicy::default(), job, &error).await.unwrap();
    }
    assert_eq!(attempts(pool.clone()).await, 6);
    // One job, then several in one statement: only theirs go.
    sqlx::query("DELETE FROM jobs WHERE id = $1").bind(ids[0]).execute(&pool).await.unwrap();
    assert_eq!(attempts(pool.clone()).await, 5);
    sqlx::query("DELETE FROM jobs WHERE id = ANY($1)").bind(&ids[1..4]).execute(&pool).await.unwrap();
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT job_id FROM job_attempts ORDER BY job_id").fetch_all(&pool).await.unwrap();
    let mut expected = ids[4..].to_vec();
    expected.sort();
    assert_eq!(left, expected);
    // The table emptied, the attempts with it (they may not be named).
    sqlx::query("TRUNCATE jobs, job_parts, parts_read, job_writing, reviews, kept_answers, kept_scan_texts")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(attempts(pool.clone()).await, 0);
}

/// A job without a stored document writes nothing into the documents' key index, however
/// often its row is rewritten (claimed, done).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_job_without_a_document_writes_no_document_key(pool: PgPool) {
    let ids = enqueue_many(&pool, 1, 200).await;
    let mut done = 0;
    while done < ids.len() {
        let claimed = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap();
        assert!(!claimed.is_empty(), "{done} of {} done and nothing to claim", ids.len());
        for job in &claimed {
            assert_eq!(queue::complete(&pool, &NoHooks, job, &ok_output()).await.unwrap(), Recorded::Done);
        }
        done += claimed.len();
    }
    // An index never written holds its meta page alone.
    let key_index: i64 =
        sqlx::query_scalar("SELECT pg_relation_size('jobs_document_key')").fetch_one(&pool).await.unwrap();
    assert_eq!(key_index, 8192, "jobs without a document wrote entries into the documents' key index");
}

/// Issue 38: an attempt's row is written once, when the attempt ends, from the job's lease (a
/// successful one is kept on the job's own row); while it runs, the timeline shows it from the
/// lease.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_attempts_row_is_written_once_when_it_ends_and_the_running_one_shows_from_the_lease(pool: PgPool) {
    use engine::queue::policy::retry::RetryPolicy;
    let rows = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM attempt_history").fetch_one(&pool).await.unwrap()
    };
    let table_rows = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM job_attempts").fetch_one(&pool).await.unwrap()
    };
    enqueue_many(&pool, 1, 3).await;
    let claimed = queue::claim(&pool, "worker-a", 3, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 3);
    assert_eq!(rows(pool.clone()).await, 0, "a claim writes no attempt row");
    let running = queue::attempts(&pool, claimed[0].id).await.unwrap();
    assert_eq!(running.len(), 1, "{running:?}");
    let (shown, started) = (&running[0], running[0].started_at);
    assert_eq!((shown.id, shown.attempt, shown.worker.as_str()), (claimed[0].lease_token, 1, "worker-a"));
    assert!(shown.finished_at.is_none() && shown.outcome.is_none(), "it runs: {shown:?}");

    // Done, failed for a retry, handed back: one row each, with the attempt's own start.
    queue::complete(&pool, &NoHooks, &claimed[0], &JobOutput::default()).await.unwrap();
    let error = JobError::new(ErrorClass::ServerError, "the provider had an error (500)");
    queue::fail(&pool, &NoHooks, &RetryPolicy::default(), &claimed[1], &error).await.unwrap();
    queue::hand_back(&pool, &[claimed[2].lease_token]).await.unwrap();
    type EndedRow = (Uuid, Uuid, i32, String, chrono::DateTime<chrono::Utc>, String, Option<String>);
    let ended: Vec<EndedRow> = sqlx::query_as(
        "SELECT id, job_id, attempt, worker, started_at, outcome, error FROM attempt_history
         WHERE finished_at IS NOT NULL ORDER BY outcome",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows(pool.clone()).await, 3, "one row an attempt");
    assert_eq!(table_rows(pool.clone()).await, 2, "the success is kept on the job's row, not in job_attempts");
    let timeline = queue::attempts(&pool, claimed[0].id).await.unwrap();
    assert_eq!(timeline.len(), 1, "{timeline:?}");
    let succeeded = &timeline[0];
    assert_eq!(
        (succeeded.id, succeeded.attempt, succeeded.worker.as_str(), succeeded.started_at, succeeded.outcome),
        (claimed[0].lease_token, 1, "worker-a", started, Some(AttemptOutcome::Succeeded))
    );
    assert!(succeeded.finished_at.is_some_and(|end| end >= started), "{succeeded:?}");
    let by_outcome: HashMap<&str, _> = ended.iter().map(|r| (r.5.as_str(), r)).collect();
    let done = by_outcome["succeeded"];
    assert_eq!(
        (done.0, done.1, done.2, done.3.as_str(), done.4),
        (claimed[0].lease_token, claimed[0].id, 1, "worker-a", started)
    );
    let retried = by_outcome["retry_scheduled"];
    assert_eq!((retried.0, retried.6.as_deref()), (claimed[1].lease_token, Some("the provider had an error (500)")));
    assert_eq!(by_outcome["handed_back"].0, claimed[2].lease_token);
    // A stale worker's late result writes nothing: the lease is the fence.
    queue::complete(&pool, &NoHooks, &claimed[1], &JobOutput::default()).await.unwrap();
    assert_eq!(rows(pool.clone()).await, 3);
    // A row is an ended attempt: an open one (as the previous release's claim wrote) is refused.
    let open =
        sqlx::query("INSERT INTO job_attempts (id, job_id, attempt, worker) VALUES (gen_random_uuid(), $1, 1, 'old')")
            .bind(claimed[2].id)
            .execute(&pool)
            .await;
    assert!(open.is_err(), "an open attempt row is refused");
}

/// The crash tests' "nothing done twice" sees a result written twice: a job's row keeps one
/// success (a second would overwrite it), so the check counts the done hook's writes.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_result_written_twice_is_caught_by_the_done_log(pool: PgPool) {
    engine::testing::log_done_writes(&pool).await;
    let ids = enqueue_many(&pool, 1, 2).await;
    let claimed = queue::claim(&pool, "w", 2, Duration::from_secs(60)).await.unwrap();
    for job in &claimed {
        queue::complete(&pool, &engine::testing::LOG_DONE, job, &ok_output()).await.unwrap();
    }
    // A stale worker's late result is refused by the lease: nothing logged.
    queue::complete(&pool, &engine::testing::LOG_DONE, &claimed[0], &ok_output()).await.unwrap();
    assert_eq!(engine::testing::jobs_done_twice(&pool).await, 0);
    // As a broken fence would: the done hook runs again for a job already done.
    let job = TerminalJob { id: ids[0], owner_id: 1, cost: 0, attempts: 1, failure: None };
    let mut tx = pool.begin().await.unwrap();
    engine::testing::log_done_write(&mut tx, &job).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(engine::testing::jobs_done_twice(&pool).await, 1);
}

/// Issue 58: a process that stops beating is noticed without waiting for its leases. What it
/// had fetched ahead and never started goes back to its place in line with no attempt used;
/// what it started (its heartbeat said so, or a document's attempt recorded it before calling
/// anyone) is rescued at once with its attempt counted. A job fetched ahead by dying processes
/// again and again goes back free at most three times.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_dead_processs_work_fetched_ahead_comes_back_unstarted_and_the_rest_is_rescued_at_once(pool: PgPool) {
    use engine::queue::rescue::{rescue_dead_processes, rescue_expired, MAX_UNSTARTED_RETURNS};
    switches::set_gate_size(&pool, 24, "test").await.unwrap();
    let dead = "dead-proc";
    let stop_beating = |pool: PgPool| async move {
        sqlx::query(
            "INSERT INTO worker_processes (name, role, version, slots, running, heartbeat_secs, seen_at)
             VALUES ($1, 'all', 'test', 4, 3, 1, now() - interval '1 hour')
             ON CONFLICT (name) DO UPDATE SET seen_at = now() - interval '1 hour'",
        )
        .bind("dead-proc")
        .execute(&pool)
        .await
        .unwrap();
    };
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            job(&pool, &JobOpts { owner_id: 1 + i, run_at_ago: Some(30.0 - i as f64), ..Default::default() }).await,
        );
    }
    let tags: Vec<i64> = sqlx::query_scalar("SELECT fair_tag FROM jobs WHERE id = ANY($1) ORDER BY run_at")
        .bind(&ids)
        .fetch_all(&pool)
        .await
        .unwrap();
    // One slot free in the process (23 busy): the first starts, two are fetched ahead.
    let batch = queue::claim_batch(&pool, dead, 3, Duration::from_secs(600), 23, 2).await.unwrap();
    assert_eq!(batch.jobs.len(), 3);
    let ahead: Vec<bool> = sqlx::query_scalar("SELECT fetched_ahead FROM jobs WHERE id = ANY($1) ORDER BY run_at")
        .bind(&ids)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ahead, [false, true, true], "the claim knows which it fetched ahead");
    // The second started, and the heartbeat said so; then the process dies.
    let tokens: Vec<Uuid> = batch.jobs.iter().map(|j| j.lease_token).collect();
    queue::heartbeat(&pool, &tokens, &[batch.jobs[1].lease_token], Duration::from_secs(600)).await.unwrap();
    stop_beating(pool.clone()).await;

    let back = rescue_dead_processes(&pool).await.unwrap();
    assert_eq!(back.returned_unstarted, vec![batch.jobs[2].id]);
    assert_eq!(back.leases_ended, 2, "the started ones are rescued now, not in ten minutes");
    let rescued = rescue_expired(&pool, &NoHooks, &Default::default()).await.unwrap();
    assert_eq!(rescued.len(), 2);
    let unstarted = queue::get(&pool, batch.jobs[2].id).await.unwrap();
    assert_eq!((unstarted.state, unstarted.attempts), (JobState::Queued, 0), "no attempt used");
    let tag: i64 = sqlx::query_scalar("SELECT fair_tag FROM jobs WHERE id = $1")
        .bind(unstarted.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tag, tags[2], "back in its place in line");
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts WHERE job_id = $1")
        .bind(unstarted.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 0, "no attempt row: it never ran");
    for started in &batch.jobs[..2] {
        let view = queue::get(&pool, started.id).await.unwrap();
        assert_eq!((view.state, view.attempts), (JobState::Retrying, 1), "started: the attempt counts");
    }

    // A claim of two with one slot free: an older job (started at once), then `ahead`, fetched
    // ahead.
    let claim_behind_another = |pool: PgPool, owner: i64| async move {
        job(&pool, &JobOpts { owner_id: owner, run_at_ago: Some(1_000.0), ..Default::default() }).await;
        let batch = queue::claim_batch(&pool, "dead-proc", 2, Duration::from_secs(600), 23, 1).await.unwrap();
        assert_eq!(batch.jobs.len(), 2);
        batch.jobs[1].clone()
    };
    // Fetched ahead by dying processes again and again: free three times in all (once above),
    // then it counts.
    for round in 1..=MAX_UNSTARTED_RETURNS {
        let ahead = claim_behind_another(pool.clone(), 100 + i64::from(round)).await;
        assert_eq!(ahead.id, unstarted.id, "round {round}");
        stop_beating(pool.clone()).await;
        let back = rescue_dead_processes(&pool).await.unwrap();
        rescue_expired(&pool, &NoHooks, &Default::default()).await.unwrap();
        let view = queue::get(&pool, ahead.id).await.unwrap();
        if round < MAX_UNSTARTED_RETURNS {
            assert_eq!(back.returned_unstarted.len(), 1, "round {round}");
            assert_eq!(view.attempts, 0, "round {round}");
        } else {
            assert!(back.returned_unstarted.is_empty(), "round {round}: it counts now");
            assert_eq!((view.state, view.attempts), (JobState::Retrying, 1));
        }
    }

    // A document's attempt records its start before it calls anyone: it is never returned free.
    let doc = job(&pool, &JobOpts { owner_id: 9, ..Default::default() }).await;
    let ahead = claim_behind_another(pool.clone(), 200).await;
    assert_eq!(ahead.id, doc);
    assert!(queue::mark_started(&pool, &ahead).await.unwrap());
    stop_beating(pool.clone()).await;
    assert!(rescue_dead_processes(&pool).await.unwrap().returned_unstarted.is_empty());
    // A process that was only slow finds the job it had fetched ahead gone: it must not start it.
    let fetched = job(&pool, &JobOpts { owner_id: 301, ..Default::default() }).await;
    let slow = claim_behind_another(pool.clone(), 300).await;
    assert_eq!(slow.id, fetched);
    stop_beating(pool.clone()).await;
    assert_eq!(rescue_dead_processes(&pool).await.unwrap().returned_unstarted, vec![slow.id]);
    assert!(!queue::mark_started(&pool, &slow).await.unwrap(), "its attempt may not begin");
}
