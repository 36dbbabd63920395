//! The fair claim reads its owners from `owner_heads` (each owner's first waiting job, kept by
//! triggers). These tests hold it to the plain definition of fairness, and hold the heads to
//! the waiting jobs through every path into and out of the line.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::queue::dlq::{self, Selection};
use engine::queue::hooks::NoHooks;
use engine::queue::policy::retry::{ErrorClass, RetryPolicy};
use engine::queue::{self, JobError, JobOutput, JobState};
use engine::testing::{enqueue_many, job, JobOpts};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::PgPool;
use uuid::Uuid;

/// Fairness as defined, over every waiting job: a due job's score is its owner's running jobs,
/// each weighed by its tokens (one per started 25,000), plus its rank among the owner's due
/// jobs; the lowest (score, run_at, id) go first.
async fn fairest(pool: &PgPool, n: i64) -> HashSet<Uuid> {
    sqlx::query_scalar(
        "WITH served AS (
             SELECT owner_id, sum(greatest(1, ceil((est_input_tokens + extra_tokens) / 25000.0))) AS running
             FROM jobs WHERE state = 'running' GROUP BY owner_id
         )
         SELECT id FROM (
             SELECT j.id, j.run_at, coalesce(s.running, 0)
                    + row_number() OVER (PARTITION BY j.owner_id ORDER BY j.run_at, j.id) AS score
             FROM waiting_jobs j LEFT JOIN served s ON s.owner_id = j.owner_id
             WHERE j.run_at <= now()
         ) x ORDER BY score, run_at, id LIMIT $1",
    )
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// Owners whose stored head differs from their first waiting job recomputed from scratch.
async fn wrong_heads(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "WITH truth AS (
             SELECT DISTINCT ON (owner_id) owner_id, run_at, id FROM waiting_jobs ORDER BY owner_id, run_at, id
         ),
         stored AS (SELECT owner_id, run_at, job_id AS id FROM owner_heads WHERE job_id IS NOT NULL)
         SELECT coalesce(t.owner_id, s.owner_id) FROM truth t FULL JOIN stored s ON s.owner_id = t.owner_id
         WHERE (t.run_at, t.id) IS DISTINCT FROM (s.run_at, s.id)",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn assert_heads_true(pool: &PgPool, after: &str) {
    assert_eq!(wrong_heads(pool).await, Vec::<i64>::new(), "owners with a wrong head after {after}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_claim_takes_the_fairest_jobs_on_random_lines(pool: PgPool) {
    queue::switches::set_gate_size(&pool, 64, "test").await.unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    let mut running = Vec::new();
    for round in 0..40 {
        // New waiting jobs for a few of 30 owners: most due (at various ages), some retrying later.
        for _ in 0..rng.random_range(1..6) {
            let owner = rng.random_range(1..=30);
            let run_at_ago =
                if rng.random_bool(0.2) { -rng.random_range(10.0..100.0) } else { rng.random_range(0.0..50.0) };
            let state = if run_at_ago < 0.0 || rng.random_bool(0.3) { JobState::Retrying } else { JobState::Queued };
            for _ in 0..rng.random_range(1..4) {
                // Small documents mostly, and some parts of long ones (up to 200K tokens).
                let est_input_tokens =
                    if rng.random_bool(0.3) { rng.random_range(25_000..200_000) } else { rng.random_range(0..25_000) };
                let opts = JobOpts {
                    owner_id: owner,
                    state,
                    run_at_ago: Some(run_at_ago),
                    est_input_tokens,
                    ..Default::default()
                };
                job(&pool, &opts).await;
            }
        }
        // Claim a random batch; it must be exactly the fairest jobs. Batches of up to 40 across
        // 30 owners: the pick's bound cuts owners at their share (small batches), and it is read
        // again without it when owners with few jobs leave the batch short (large ones).
        let n = rng.random_range(1..40);
        let expected = fairest(&pool, n).await;
        let claimed = queue::claim(&pool, "w", n, Duration::from_secs(60)).await.unwrap();
        let got: HashSet<Uuid> = claimed.iter().map(|j| j.id).collect();
        assert_eq!(got, expected, "round {round}: claimed {n}");
        running.extend(claimed);
        // Some running jobs finish, so owners' running counts go up and down.
        while running.len() > 12 {
            let done = running.swap_remove(rng.random_range(0..running.len()));
            queue::complete(&pool, &NoHooks, &done, &JobOutput::default()).await.unwrap();
        }
        assert_heads_true(&pool, &format!("round {round}")).await;
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn owners_are_weighed_by_the_tokens_they_have_running_not_by_their_jobs(pool: PgPool) {
    // A runs one 100K-token part (weight 4), B two small documents (weight 2). Counting jobs,
    // A's next job would go first (1 + 1 < 2 + 1); weighing tokens, B's does (2 + 1 < 4 + 1).
    let running = |owner_id, est_input_tokens| JobOpts {
        owner_id,
        state: JobState::Running,
        est_input_tokens,
        ..Default::default()
    };
    job(&pool, &running(1, 100_000)).await;
    job(&pool, &running(2, 2_000)).await;
    job(&pool, &running(2, 2_000)).await;
    let a_next =
        job(&pool, &JobOpts { owner_id: 1, run_at_ago: Some(60.0), est_input_tokens: 100_000, ..Default::default() })
            .await;
    let b_next =
        job(&pool, &JobOpts { owner_id: 2, run_at_ago: Some(1.0), est_input_tokens: 2_000, ..Default::default() })
            .await;
    let claimed = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![b_next],
        "the owner with fewer tokens running goes first"
    );
    let claimed = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a_next]);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn owner_heads_follow_every_path_into_and_out_of_the_line(pool: PgPool) {
    let policy = RetryPolicy::default();
    let a = enqueue_many(&pool, 1, 3).await;
    enqueue_many(&pool, 2, 2).await;
    assert_heads_true(&pool, "enqueue").await;
    let head: Uuid =
        sqlx::query_scalar("SELECT job_id FROM owner_heads WHERE owner_id = 1").fetch_one(&pool).await.unwrap();
    assert_eq!(head, a[0], "the oldest job heads its owner's line");

    let claimed = queue::claim(&pool, "w", 5, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 5);
    assert_heads_true(&pool, "a claim of every waiting job").await;
    let heads: i64 =
        sqlx::query_scalar("SELECT count(*) FROM owner_heads WHERE job_id IS NOT NULL").fetch_one(&pool).await.unwrap();
    assert_eq!(heads, 0, "nobody waits");

    // Retry later (a future run_at), then hand back, then complete.
    let transient = JobError::new(ErrorClass::Overloaded, "busy");
    queue::fail(&pool, &NoHooks, &policy, &claimed[0], &transient).await.unwrap();
    assert_heads_true(&pool, "a transient failure").await;
    queue::hand_back(&pool, &[claimed[1].lease_token]).await.unwrap();
    assert_heads_true(&pool, "a hand-back").await;
    queue::complete(&pool, &NoHooks, &claimed[2], &JobOutput::default()).await.unwrap();
    assert_heads_true(&pool, "a completion").await;

    // A retry made due at once (the run_at moves), a cancel, a permanent failure and its replay.
    sqlx::query("UPDATE jobs SET run_at = now() - interval '1 hour' WHERE id = $1")
        .bind(claimed[0].id)
        .execute(&pool)
        .await
        .unwrap();
    assert_heads_true(&pool, "a run_at change").await;
    queue::cancel(&pool, &NoHooks, claimed[1].id, "test", false).await.unwrap();
    assert_heads_true(&pool, "a cancel").await;
    let permanent = JobError::new(ErrorClass::InvalidInput, "no text");
    queue::fail(&pool, &NoHooks, &policy, &claimed[3], &permanent).await.unwrap();
    dlq::replay(&pool, &NoHooks, &Selection::Job(claimed[3].id), "test").await.unwrap();
    assert_heads_true(&pool, "a replay").await;

    // Rows deleted, and the whole table truncated.
    sqlx::query("DELETE FROM jobs WHERE id = $1").bind(claimed[3].id).execute(&pool).await.unwrap();
    assert_heads_true(&pool, "a delete").await;
    sqlx::query("TRUNCATE jobs, job_attempts, job_parts, reviews").execute(&pool).await.unwrap();
    assert_heads_true(&pool, "a truncate").await;
    enqueue_many(&pool, 1, 1).await;
    assert_heads_true(&pool, "an enqueue after the truncate").await;
    assert_eq!(queue::claim(&pool, "w", 5, Duration::from_secs(60)).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn heads_stay_true_under_concurrent_enqueues_claims_and_completions(pool: PgPool) {
    queue::switches::set_gate_size(&pool, 8, "test").await.unwrap();
    let pool = engine::testing::wider_pool(&pool, 20).await;
    let enqueuing = Arc::new(AtomicBool::new(true));
    let mut enqueuers = Vec::new();
    for owner in 1..=8 {
        let pool = pool.clone();
        enqueuers.push(tokio::spawn(async move {
            for _ in 0..20 {
                enqueue_many(&pool, owner, 2).await;
            }
        }));
    }
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let (pool, enqueuing) = (pool.clone(), enqueuing.clone());
        claimers.push(tokio::spawn(async move {
            loop {
                let more_to_come = enqueuing.load(Ordering::SeqCst);
                let jobs = queue::claim(&pool, "w", 3, Duration::from_secs(60)).await.unwrap();
                if jobs.is_empty() && !more_to_come {
                    break;
                }
                for job in &jobs {
                    queue::complete(&pool, &NoHooks, job, &JobOutput::default()).await.unwrap();
                }
            }
        }));
    }
    for task in enqueuers {
        task.await.unwrap();
    }
    enqueuing.store(false, Ordering::SeqCst);
    for task in claimers {
        task.await.unwrap();
    }
    assert_heads_true(&pool, "concurrent traffic").await;
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'done'").fetch_one(&pool).await.unwrap();
    assert_eq!(done, 320, "every job was claimed and finished");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_claim_racing_an_enqueue_of_the_same_owner_leaves_the_new_job_its_head(pool: PgPool) {
    let first = enqueue_many(&pool, 7, 1).await[0];
    // An upload for owner 7 has inserted its job but not committed yet.
    let mut upload = pool.begin().await.unwrap();
    let second: Uuid = sqlx::query_scalar("INSERT INTO jobs (owner_id, payload) VALUES (7, '{}') RETURNING id")
        .fetch_one(&mut *upload)
        .await
        .unwrap();
    // Meanwhile a claim takes owner 7's only committed job; refreshing the head, it waits for
    // the upload's lock on owner 7's row.
    let claimer = {
        let pool = pool.clone();
        tokio::spawn(async move { queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claimer.is_finished(), "the claim waits for the upload's lock on the head");
    upload.commit().await.unwrap();
    let claimed = claimer.await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![first]);
    // The claim read the heads after the upload committed: the new job heads the line (a head
    // computed before the wait would be empty, and the job would never be claimed).
    assert_heads_true(&pool, "a claim racing an enqueue").await;
    let next = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), vec![second]);
}

/// Gate slots in use: running jobs, and their calls beyond the first (parts side by side).
async fn slots_in_use(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) + coalesce(sum(extra_calls), 0) FROM jobs WHERE state = 'running'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Owners other than `owner` with a due waiting job.
async fn other_owners_waiting(pool: &PgPool, owner: i64) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT owner_id) FROM waiting_jobs WHERE run_at <= now() AND owner_id <> $1")
        .bind(owner)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn documents_in_parts_side_by_side_keep_the_claim_fair_and_a_slot_for_every_other_owner(pool: PgPool) {
    use engine::queue::parts::{PartStore, StoredPart};
    const GATE: i64 = 24;
    queue::switches::set_gate_size(&pool, GATE as i32, "test").await.unwrap();
    let parts = PartStore::new(pool.clone());
    let mut rng = StdRng::seed_from_u64(33);
    // Claimed jobs, each with its calls in flight (documents in parts ask for more).
    let mut running: Vec<(queue::ClaimedJob, usize)> = Vec::new();
    let mut granted = 0;
    for round in 0..60 {
        for _ in 0..rng.random_range(0..4) {
            let owner = rng.random_range(1..=12);
            let est_input_tokens =
                if rng.random_bool(0.3) { rng.random_range(25_000..200_000) } else { rng.random_range(500..25_000) };
            let opts = JobOpts {
                owner_id: owner,
                run_at_ago: Some(rng.random_range(0.0..30.0)),
                est_input_tokens,
                ..Default::default()
            };
            job(&pool, &opts).await;
        }
        // The claim takes exactly the fairest jobs, the parts in flight weighed by their tokens.
        let free = GATE - slots_in_use(&pool).await;
        let n = rng.random_range(1..6).min(free.max(0));
        if n > 0 {
            let expected = fairest(&pool, n).await;
            let claimed = queue::claim(&pool, "w", n, Duration::from_secs(60)).await.unwrap();
            let got: HashSet<Uuid> = claimed.iter().map(|j| j.id).collect();
            assert_eq!(got, expected, "round {round}: claimed {n}");
            running.extend(claimed.into_iter().map(|j| (j, 1)));
        }
        // Documents ask to run more parts at once.
        for k in 0..running.len() {
            if !rng.random_bool(0.5) {
                continue;
            }
            let (doc, calls) = &running[k];
            let wants: Vec<(i64, i64)> =
                (0..rng.random_range(1..20)).map(|_| (rng.random_range(1_000..30_000), 1_000)).collect();
            let (before, others) = (slots_in_use(&pool).await, other_owners_waiting(&pool, doc.owner_id).await);
            let grant = parts.calls(doc, *calls, &wants).await.unwrap();
            assert!(grant.go_on);
            let after = slots_in_use(&pool).await;
            assert!(after <= GATE, "round {round}: the gate holds with parts side by side: {after}");
            let room_for_others = (GATE - before - others).max(0);
            assert!(
                after - before <= room_for_others,
                "round {round}: a document took {} slots with {others} other owners waiting and {} free",
                after - before,
                GATE - before
            );
            running[k].1 += grant.granted;
            granted += grant.granted;
        }
        // Calls end: a part's slot comes back; a job with none left ends.
        for k in (0..running.len()).rev() {
            if rng.random_bool(0.4) {
                let (doc, calls) = &mut running[k];
                let part = StoredPart {
                    level: 0,
                    idx: 0,
                    output: "",
                    input_tokens: None,
                    output_tokens: None,
                    reserved_tokens: 1_000,
                };
                assert!(parts.store_output(doc, &part).await.unwrap());
                *calls = calls.saturating_sub(1);
                if *calls == 0 {
                    let (done, _) = running.swap_remove(k);
                    queue::complete(&pool, &NoHooks, &done, &JobOutput::default()).await.unwrap();
                }
            }
        }
        assert_heads_true(&pool, &format!("round {round}")).await;
    }
    assert!(granted > 20, "documents did run parts side by side: {granted} calls granted");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_document_between_parts_gives_its_slot_back_when_the_gate_is_full_and_another_owner_waits(pool: PgPool) {
    use engine::queue::parts::PartStore;
    queue::switches::set_gate_size(&pool, 1, "test").await.unwrap();
    let parts = PartStore::new(pool.clone());
    job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 4_000, ..Default::default() }).await;
    let doc = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    // Nobody else waits: its next part goes on its own slot.
    let alone = parts.calls(&doc, 0, &[(4_000, 100)]).await.unwrap();
    assert_eq!((alone.granted, alone.go_on), (1, true));
    // Another owner waits and the gate (1) is full: between parts, the document yields.
    job(&pool, &JobOpts { owner_id: 2, est_input_tokens: 2_000, ..Default::default() }).await;
    let crowded = parts.calls(&doc, 0, &[(4_000, 100)]).await.unwrap();
    assert_eq!((crowded.granted, crowded.go_on), (0, false));
    // While a call runs, it keeps what it has, and gets no more.
    let running = parts.calls(&doc, 1, &[(4_000, 100)]).await.unwrap();
    assert_eq!((running.granted, running.go_on), (0, true));
}
