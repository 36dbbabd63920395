//! Fairness between owners: start-time fair queuing by tokens (`policy::fair_tags`, where the
//! bound is proven on random lines). These tests hold the database to that model: the tags it
//! gives on every path into the line, the virtual time its claims move, and the claim's order;
//! and show that tagging neither deadlocks nor holds up a claim under concurrent traffic.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::queue::dlq::{self, Selection};
use engine::queue::hooks::NoHooks;
use engine::queue::parts::PartsProgress;
use engine::queue::policy::fair_tags::Tags;
use engine::queue::policy::retry::{ErrorClass, RetryPolicy};
use engine::queue::{self, ClaimedJob, JobError, JobOutput, JobState};
use engine::testing::{enqueue_many, job, JobOpts};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::PgPool;
use uuid::Uuid;

/// The `n` due waiting jobs the claim must take: the lowest (tag, run_at, id).
async fn lowest_tags(pool: &PgPool, n: i64) -> HashSet<Uuid> {
    sqlx::query_scalar("SELECT id FROM waiting_jobs WHERE run_at <= now() ORDER BY fair_tag, run_at, id LIMIT $1")
        .bind(n)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn tag_of(pool: &PgPool, job: Uuid) -> u64 {
    let tag: i64 =
        sqlx::query_scalar("SELECT fair_tag FROM jobs WHERE id = $1").bind(job).fetch_one(pool).await.unwrap();
    tag as u64
}

async fn virtual_time(pool: &PgPool) -> u64 {
    let at: i64 = sqlx::query_scalar("SELECT virtual_time FROM queue_settings").fetch_one(pool).await.unwrap();
    at as u64
}

/// The model follows a claim: the virtual time moves to the highest tag served.
async fn served(pool: &PgPool, model: &mut Tags, claimed: &[ClaimedJob]) {
    for job in claimed {
        model.served(tag_of(pool, job.id).await);
    }
    assert_eq!(virtual_time(pool).await, model.virtual_time, "the claim moved the virtual time");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_claim_follows_the_tags_of_the_fair_model_on_random_lines(pool: PgPool) {
    queue::switches::set_gate_size(&pool, 64, "test").await.unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    let mut model = Tags::default();
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
                let id = job(&pool, &opts).await;
                assert_eq!(tag_of(&pool, id).await, model.enter(owner, est_input_tokens), "round {round}");
            }
        }
        // Claim a random batch: exactly the due jobs with the lowest tags.
        let n = rng.random_range(1..40);
        let expected = lowest_tags(&pool, n).await;
        let claimed = queue::claim(&pool, "w", n, Duration::from_secs(60)).await.unwrap();
        let got: HashSet<Uuid> = claimed.iter().map(|j| j.id).collect();
        assert_eq!(got, expected, "round {round}: claimed {n}");
        served(&pool, &mut model, &claimed).await;
        running.extend(claimed);
        while running.len() > 12 {
            let done = running.swap_remove(rng.random_range(0..running.len()));
            queue::complete(&pool, &NoHooks, &done, &JobOutput::default()).await.unwrap();
        }
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_owners_tokens_push_its_next_job_back_and_a_newcomer_goes_first(pool: PgPool) {
    let small = |owner_id| JobOpts { owner_id, est_input_tokens: 2_000, ..Default::default() };
    // A sends a 490K-token document (weight 20) and then a small job; B then sends 20 small jobs.
    let document = job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 490_000, ..Default::default() }).await;
    let a_next = job(&pool, &small(1)).await;
    let mut b = Vec::new();
    for _ in 0..20 {
        b.push(job(&pool, &small(2)).await);
    }
    let claim = |n| {
        let pool = pool.clone();
        async move { queue::claim(&pool, "w", n, Duration::from_secs(60)).await.unwrap() }
    };
    assert_eq!(claim(1).await[0].id, document, "first come");
    let first_b: Vec<Uuid> = claim(5).await.iter().map(|j| j.id).collect();
    assert_eq!(first_b, b[..5], "B's jobs, not A's next: A pays for the document's tokens");
    // C comes now, tagged at the virtual time: before the rest of B's line.
    let c = job(&pool, &small(3)).await;
    assert_eq!(claim(1).await[0].id, c, "the newcomer goes first");
    let rest: Vec<Uuid> = claim(15).await.iter().map(|j| j.id).collect();
    assert_eq!(rest, b[5..], "the rest of B's line, in order");
    assert_eq!(claim(1).await[0].id, a_next, "A's next job once B was served the document's weight");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn every_path_into_the_line_tags_the_job_as_the_model_does(pool: PgPool) {
    let policy = RetryPolicy::default();
    let mut model = Tags::default();
    let a = enqueue_many(&pool, 1, 4).await;
    let b = enqueue_many(&pool, 2, 2).await;
    for (owner, ids) in [(1, &a), (2, &b)] {
        for id in ids.iter() {
            assert_eq!(tag_of(&pool, *id).await, model.enter(owner, 0), "admission");
        }
    }
    let claimed = queue::claim(&pool, "w", 6, Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 6);
    served(&pool, &mut model, &claimed).await;
    let of = |id: Uuid| claimed.iter().find(|j| j.id == id).unwrap().clone();
    let expect_new = |model: &mut Tags, owner: i64| model.enter(owner, 0);

    // A transient failure: a retry is a new arrival.
    let transient = JobError::new(ErrorClass::Overloaded, "busy");
    queue::fail(&pool, &NoHooks, &policy, &of(a[0]), &transient).await.unwrap();
    assert_eq!(tag_of(&pool, a[0]).await, expect_new(&mut model, 1), "a retry");
    // Handed back at shutdown (several owners at once): new tags, at the end of their lines.
    queue::hand_back(&pool, &[of(a[1]).lease_token, of(b[0]).lease_token]).await.unwrap();
    assert_eq!(tag_of(&pool, a[1]).await, expect_new(&mut model, 1), "a hand-back");
    assert_eq!(tag_of(&pool, b[0]).await, expect_new(&mut model, 2), "a hand-back");
    // A claim undone before its job started (fetched ahead): its place, so its tag, is kept.
    let before = tag_of(&pool, b[1]).await;
    queue::unclaim(&pool, &[of(b[1]).lease_token]).await.unwrap();
    assert_eq!(tag_of(&pool, b[1]).await, before, "an undone claim keeps its place");
    // A document's parts back in line (stopped between parts): a new arrival of its next part.
    let progress =
        JobOutput { part: Some(PartsProgress { next_est_tokens: 60_000, wait: None }), ..JobOutput::default() };
    assert_eq!(queue::complete(&pool, &NoHooks, &of(a[2]), &progress).await.unwrap(), queue::Recorded::PartDone);
    assert_eq!(tag_of(&pool, a[2]).await, model.enter(1, 60_000), "parts back in line");
    // A failure while processing is paused goes back without using its attempt: a new arrival.
    queue::switches::set_processing(&pool, false, "test").await.unwrap();
    queue::fail(&pool, &NoHooks, &policy, &of(a[3]), &transient).await.unwrap();
    assert_eq!(tag_of(&pool, a[3]).await, expect_new(&mut model, 1), "a paused requeue");
    queue::switches::set_processing(&pool, true, "test").await.unwrap();

    // A permanent failure and its replay from the dead-letter queue.
    let again = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    served(&pool, &mut model, &again).await;
    let permanent = JobError::new(ErrorClass::InvalidInput, "no text");
    queue::fail(&pool, &NoHooks, &policy, &again[0], &permanent).await.unwrap();
    dlq::replay(&pool, &NoHooks, &Selection::Job(again[0].id), "test").await.unwrap();
    assert_eq!(tag_of(&pool, again[0].id).await, expect_new(&mut model, again[0].owner_id), "a replay");
    // Moving a waiting job's run_at (a retry made due now) is not an entry: the tag stays.
    let before = tag_of(&pool, a[0]).await;
    sqlx::query("UPDATE jobs SET run_at = now() - interval '1 hour' WHERE id = $1")
        .bind(a[0])
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(tag_of(&pool, a[0]).await, before, "a run_at change within the line");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn tags_stay_true_to_each_owners_order_under_concurrent_entries_claims_and_hand_backs(pool: PgPool) {
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
    // Claimers hand back every other batch (several owners' jobs back into the line in one
    // statement, locking their lines) while enqueues lock the same lines: no deadlock, no loss.
    let mut claimers = Vec::new();
    for c in 0..4 {
        let (pool, enqueuing) = (pool.clone(), enqueuing.clone());
        claimers.push(tokio::spawn(async move {
            let mut turn = c;
            loop {
                let more_to_come = enqueuing.load(Ordering::SeqCst);
                let jobs = queue::claim(&pool, "w", 3, Duration::from_secs(60)).await.unwrap();
                if jobs.is_empty() && !more_to_come {
                    break;
                }
                turn += 1;
                if turn % 2 == 0 {
                    let tokens: Vec<Uuid> = jobs.iter().map(|j| j.lease_token).collect();
                    queue::hand_back(&pool, &tokens).await.unwrap();
                    continue;
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
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'done'").fetch_one(&pool).await.unwrap();
    assert_eq!(done, 320, "every job was claimed and finished");
    // Each owner's finish tag is past every tag it gave, and no two of an owner's jobs share one
    // (each entry, a hand-back's too, moved the finish tag on under the line's lock).
    let lines: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT l.owner_id, l.finish_tag, max(j.fair_tag) FROM owner_lines l JOIN jobs j ON j.owner_id = l.owner_id
         GROUP BY l.owner_id, l.finish_tag",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(lines.len(), 8);
    for (owner, finish, highest) in lines {
        assert!(finish > highest, "owner {owner}: finish {finish}, a job tagged {highest}");
    }
    // Jobs never handed back keep the tags they came with: each owner's in the order they came.
    let kept: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT owner_id, fair_tag FROM jobs j
         WHERE NOT EXISTS (SELECT 1 FROM job_attempts a WHERE a.job_id = j.id AND a.outcome = 'handed_back')
         ORDER BY owner_id, accepted_at, id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(kept.len() > 100, "most jobs were never handed back: {}", kept.len());
    for pair in kept.windows(2) {
        if pair[0].0 == pair[1].0 {
            assert!(pair[0].1 < pair[1].1, "owner {}: tags {} then {}", pair[0].0, pair[0].1, pair[1].1);
        }
    }
    let shared: HashMap<(i64, i64), i64> =
        sqlx::query_as("SELECT owner_id, fair_tag, count(*) FROM jobs GROUP BY 1, 2 HAVING count(*) > 1")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(o, t, n): (i64, i64, i64)| ((o, t), n))
            .collect();
    assert!(shared.is_empty(), "tags given twice within an owner's line: {shared:?}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_claim_never_waits_for_an_upload_holding_its_owners_line(pool: PgPool) {
    let first = enqueue_many(&pool, 7, 1).await[0];
    // An upload for owner 7 holds its line (admission locks it) and has not committed.
    let mut upload = pool.begin().await.unwrap();
    queue::lock_line(&mut *upload, 7).await.unwrap();
    let second: Uuid = sqlx::query_scalar("INSERT INTO jobs (owner_id, payload) VALUES (7, '{}') RETURNING id")
        .fetch_one(&mut *upload)
        .await
        .unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(5), queue::claim(&pool, "w", 2, Duration::from_secs(60)))
        .await
        .expect("the claim does not wait for the upload")
        .unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![first], "only what is committed");
    upload.commit().await.unwrap();
    let next = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), vec![second]);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_canceled_backlog_costs_its_owner_no_place_later(pool: PgPool) {
    // Owner 1 uploads 30 documents by mistake and cancels them; owner 2 has 10 waiting.
    let mistakes = enqueue_many(&pool, 1, 30).await;
    let others = enqueue_many(&pool, 2, 10).await;
    for id in &mistakes {
        assert_eq!(queue::cancel(&pool, &NoHooks, *id, "test", false).await.unwrap(), queue::Canceled::Now);
    }
    // The right one is tagged at the virtual time, not behind the 30 canceled.
    let right = enqueue_many(&pool, 1, 1).await[0];
    let next: HashSet<Uuid> =
        queue::claim(&pool, "w", 2, Duration::from_secs(60)).await.unwrap().iter().map(|j| j.id).collect();
    assert_eq!(next, HashSet::from([others[0], right]));
    // Canceling a job in the middle of a line leaves the jobs after it their tags.
    let line = enqueue_many(&pool, 3, 3).await;
    let last = tag_of(&pool, line[2]).await;
    queue::cancel(&pool, &NoHooks, line[1], "test", false).await.unwrap();
    assert_eq!(tag_of(&pool, enqueue_many(&pool, 3, 1).await[0]).await, last + 1, "after the line's last job");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_result_batch_with_parts_back_in_line_and_a_rescue_of_one_of_its_jobs_do_not_deadlock(pool: PgPool) {
    let pool = engine::testing::wider_pool(&pool, 6).await;
    enqueue_many(&pool, 1, 2).await;
    let claimed = queue::claim(&pool, "w", 2, Duration::from_secs(60)).await.unwrap();
    // A rescue holds one of the batch's jobs: its row, not yet its owner's line.
    let mut rescue = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(claimed[1].id).execute(&mut *rescue).await.unwrap();
    // The batch: the other job stopped between parts (back in line, taking the owner's line),
    // and this one done.
    let writer = {
        let (pool, jobs) = (pool.clone(), claimed.clone());
        tokio::spawn(async move {
            let part =
                JobOutput { part: Some(PartsProgress { next_est_tokens: 1_000, wait: None }), ..JobOutput::default() };
            queue::complete_many(&pool, &NoHooks, &[(&jobs[0], &part), (&jobs[1], &JobOutput::default())]).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The rescue sends its job back to the line: its new tag takes the owner's line.
    let retry = sqlx::query(
        "UPDATE jobs SET state = 'retrying', run_at = now() + interval '30 seconds', lease_token = NULL,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $1",
    )
    .bind(claimed[1].id)
    .execute(&mut *rescue);
    tokio::time::timeout(Duration::from_secs(5), retry).await.expect("the rescue is not held by the writer").unwrap();
    rescue.commit().await.unwrap();
    let recorded = writer.await.unwrap().expect("the batch is written, not chosen as a deadlock's victim");
    assert_eq!(recorded, [queue::Recorded::PartDone, queue::Recorded::Stale]);
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
        // The claim takes the due jobs with the lowest tags, parts in flight or not.
        let free = GATE - slots_in_use(&pool).await;
        let n = rng.random_range(1..6).min(free.max(0));
        if n > 0 {
            let expected = lowest_tags(&pool, n).await;
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

/// Lanes (issue 58): the caps the claim and the part grants use are the policy's.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_lane_caps_in_the_database_are_the_policys(pool: PgPool) {
    use engine::queue::policy::lanes::{caps, part_share, LaneShares};
    let mut rng = StdRng::seed_from_u64(58);
    for _ in 0..300 {
        let gate = rng.random_range(0..=70i64);
        let shares = LaneShares { urgent_share: rng.random_range(0.0..=0.9), bulk_floor: rng.random_range(0.0..=0.9) };
        let demand = rng.random_range(0..=80i64);
        let (urgent, bulk): (i64, i64) = sqlx::query_as("SELECT * FROM sluice_lane_caps($1, $2, $3, $4)")
            .bind(gate)
            .bind(shares.urgent_share)
            .bind(shares.bulk_floor)
            .bind(demand)
            .fetch_one(&pool)
            .await
            .unwrap();
        let expected = caps(gate, shares, demand);
        assert_eq!((urgent, bulk), (expected.urgent, expected.bulk), "gate {gate}, {shares:?}, demand {demand}");
        let owners = rng.random_range(0..=30i64);
        let share: i64 = sqlx::query_scalar("SELECT sluice_part_share($1, $2)")
            .bind(bulk)
            .bind(owners)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(share, part_share(bulk, owners));
    }
}

async fn set_lanes(pool: &PgPool, urgent_share: f64, bulk_floor: f64) {
    let shares = engine::queue::policy::lanes::LaneShares { urgent_share, bulk_floor };
    let config = engine::queue::lanes::LaneConfig { shares, ..Default::default() };
    engine::queue::lanes::configure(pool, &config).await.unwrap();
}

/// A large document alone takes all it may of the gate, and still leaves the urgent lane its
/// reserve: 20 small documents arriving after it start six at once. Without the reserve
/// (share 0, as before lanes) it takes every slot and they start none.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_large_document_in_parts_leaves_the_urgent_lanes_reserve_to_small_ones(pool: PgPool) {
    use engine::queue::parts::PartStore;
    queue::switches::set_gate_size(&pool, 24, "test").await.unwrap();
    let parts = PartStore::new(pool.clone());
    for (share, small_started) in [(0.25, 6), (0.0, 0)] {
        sqlx::query("TRUNCATE jobs, owner_lines CASCADE").execute(&pool).await.unwrap();
        set_lanes(&pool, share, 0.25).await;
        job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 10_000, bulk: true, ..Default::default() }).await;
        let big = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap().remove(0);
        let grant = parts.calls(&big, 1, &[(10_000, 12_000); 30]).await.unwrap();
        assert_eq!(grant.granted, 23 - small_started, "urgent share {share}");
        for owner in 2..22 {
            job(&pool, &JobOpts { owner_id: owner, est_input_tokens: 2_000, ..Default::default() }).await;
        }
        let small = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap();
        assert_eq!(small.len(), small_started as usize, "urgent share {share}");
    }
}

/// The token buckets have a reserve of their own (`urgent_budget_share`), apart from the gate's:
/// a large document's parts leave it, and a small document's calls take it. A part larger than
/// what the bulk lane may take still goes each time the buckets are full, however many of its
/// job's calls run (before, only when none ran: one part at a time).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_large_document_leaves_the_urgent_lanes_share_of_the_buckets_and_goes_at_their_pace(pool: PgPool) {
    use engine::queue::capacity::{self, CapacityConfig, ProviderLimits};
    use engine::queue::parts::PartStore;
    queue::switches::set_gate_size(&pool, 24, "test").await.unwrap();
    // A bucket of 20K output tokens (120K a minute in 10 s), all of it planned for; claims hold
    // nothing of it here, so only the parts' calls draw it.
    let limits = ProviderLimits { output_tokens_per_min: Some(120_000), ..Default::default() };
    let budget =
        CapacityConfig { limits, burst: Duration::from_secs(10), output_reserve: 0, share: 1.0, ..Default::default() };
    capacity::configure(&pool, &budget).await.unwrap();
    let parts = PartStore::new(pool.clone());
    let fill = || async {
        sqlx::query("UPDATE queue_settings SET level_output = 20000, levels_at = clock_timestamp()")
            .execute(&pool)
            .await
            .unwrap();
    };
    for (budget_share, big_first, small_calls) in [(0.75, 1, 3), (0.0, 3, 0)] {
        sqlx::query("TRUNCATE jobs, owner_lines CASCADE").execute(&pool).await.unwrap();
        let config = engine::queue::lanes::LaneConfig { urgent_budget_share: budget_share, ..Default::default() };
        engine::queue::lanes::configure(&pool, &config).await.unwrap();
        fill().await;
        job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 100_000, bulk: true, ..Default::default() }).await;
        let big = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap().remove(0);
        // Parts answering 6K each: with the reserve the bulk lane may take 5K of the 20K, so only
        // the full bucket lets one go; without it, three go at once.
        let grant = parts.calls(&big, 1, &[(1_000, 6_000); 10]).await.unwrap();
        assert_eq!(grant.granted, big_first, "urgent budget share {budget_share}");
        job(&pool, &JobOpts { owner_id: 2, est_input_tokens: 2_000, ..Default::default() }).await;
        let small = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap().remove(0);
        let grant = parts.calls(&small, 1, &[(500, 4_000); 10]).await.unwrap();
        assert_eq!(grant.granted, small_calls, "the small one's calls in what is left: {budget_share}");
    }
    // The bucket full again with two of the large document's calls running: one more goes,
    // larger than the 5K the bulk lane may take.
    sqlx::query("TRUNCATE jobs, owner_lines CASCADE").execute(&pool).await.unwrap();
    let config = engine::queue::lanes::LaneConfig { urgent_budget_share: 0.75, ..Default::default() };
    engine::queue::lanes::configure(&pool, &config).await.unwrap();
    fill().await;
    job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 100_000, bulk: true, ..Default::default() }).await;
    let big = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap().remove(0);
    assert_eq!(parts.calls(&big, 1, &[(1_000, 6_000); 10]).await.unwrap().granted, 1);
    assert_eq!(parts.calls(&big, 2, &[(1_000, 6_000); 10]).await.unwrap().granted, 0, "the bucket is not full");
    fill().await;
    assert_eq!(parts.calls(&big, 2, &[(1_000, 6_000); 10]).await.unwrap().granted, 1, "full: one more goes");
    // Not while another owner's work is due: a full bucket is theirs first.
    job(&pool, &JobOpts { owner_id: 3, est_input_tokens: 100_000, bulk: true, ..Default::default() }).await;
    fill().await;
    assert_eq!(parts.calls(&big, 3, &[(1_000, 6_000); 10]).await.unwrap().granted, 0, "another owner waits");
}

/// "Run next": an operator puts a waiting job first in line; the next claim takes it before
/// every other owner's, it is audited, and a job not waiting is left as it is.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn run_next_puts_a_waiting_job_first_in_line(pool: PgPool) {
    use engine::queue::run_next::{run_next, RunNext};
    for owner in 1..=5 {
        job(&pool, &JobOpts { owner_id: owner, est_input_tokens: 2_000, ..Default::default() }).await;
    }
    // The last owner's second job: behind all five.
    let late = job(&pool, &JobOpts { owner_id: 5, est_input_tokens: 2_000, ..Default::default() }).await;
    assert!(!lowest_tags(&pool, 5).await.contains(&late));
    assert_eq!(run_next(&pool, late, "ops@example.com").await.unwrap(), RunNext::Next);
    let first = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), vec![late], "it went first");
    assert_eq!(
        run_next(&pool, late, "ops@example.com").await.unwrap(),
        RunNext::NotWaiting(JobState::Running),
        "a running job is not moved"
    );
    assert!(matches!(run_next(&pool, Uuid::new_v4(), "ops").await, Err(engine::EngineError::NotFound)));
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'run_next' AND actor = 'ops@example.com'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 1);
    // The rest keep their order.
    let rest = queue::claim(&pool, "w", 5, Duration::from_secs(60)).await.unwrap();
    assert_eq!(rest.len(), 5);
    // A job not yet due (a retry's backoff, an economy document's batch) keeps its due time.
    let later = job(&pool, &JobOpts { owner_id: 9, est_input_tokens: 2_000, ..Default::default() }).await;
    sqlx::query("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE id = $1")
        .bind(later)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(run_next(&pool, later, "ops@example.com").await.unwrap(), RunNext::Next);
    assert!(queue::claim(&pool, "w", 5, Duration::from_secs(60)).await.unwrap().is_empty(), "not due yet");
}

/// Small documents in a burst leave large ones their floor: a large document waiting behind
/// 30 small ones (its tag after theirs) is claimed in the same claim, not after them all.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_bulk_lane_keeps_its_floor_under_a_burst_of_small_documents(pool: PgPool) {
    queue::switches::set_gate_size(&pool, 24, "test").await.unwrap();
    for (floor, big_claimed) in [(0.25, true), (0.0, false)] {
        sqlx::query("TRUNCATE jobs, owner_lines CASCADE").execute(&pool).await.unwrap();
        set_lanes(&pool, 0.25, floor).await;
        for owner in 1..=30 {
            job(
                &pool,
                &JobOpts { owner_id: owner, est_input_tokens: 2_000, run_at_ago: Some(60.0), ..Default::default() },
            )
            .await;
        }
        let big =
            job(&pool, &JobOpts { owner_id: 99, est_input_tokens: 10_000, bulk: true, ..Default::default() }).await;
        let claimed = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap();
        assert_eq!(claimed.len(), 24);
        assert_eq!(claimed.iter().any(|j| j.id == big), big_claimed, "bulk floor {floor}");
    }
}

/// Two owners' documents in parts share the bulk lane's part slots, whoever asked first, and
/// every part granted moves its owner's finish tag (its next job is tagged behind them).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn two_owners_documents_in_parts_share_the_lane_and_every_part_is_charged(pool: PgPool) {
    use engine::queue::parts::PartStore;
    queue::switches::set_gate_size(&pool, 24, "test").await.unwrap();
    let parts = PartStore::new(pool.clone());
    job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 10_000, bulk: true, ..Default::default() }).await;
    job(&pool, &JobOpts { owner_id: 2, est_input_tokens: 10_000, bulk: true, ..Default::default() }).await;
    let docs = queue::claim(&pool, "w", 24, Duration::from_secs(60)).await.unwrap();
    assert_eq!(docs.len(), 2);
    let finish = |owner: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT finish_tag FROM owner_lines WHERE owner_id = $1")
                .bind(owner)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let before = finish(docs[0].owner_id).await;
    // The first asks for 30 parts at once: it gets its share of the 18 bulk slots, not all.
    let first = parts.calls(&docs[0], 1, &[(10_000, 12_000); 30]).await.unwrap();
    assert_eq!(first.granted, 8, "9 calls: half the lane");
    assert_eq!(finish(docs[0].owner_id).await, before + 8, "each 10K-token part weighs one");
    let second = parts.calls(&docs[1], 1, &[(10_000, 12_000); 30]).await.unwrap();
    assert_eq!(second.granted, 8);
    // The owner's next document is tagged behind the parts it was granted.
    let next = job(&pool, &JobOpts { owner_id: docs[0].owner_id, est_input_tokens: 2_000, ..Default::default() }).await;
    assert!(tag_of(&pool, next).await >= (before + 8) as u64);
}

/// Within fairness, work whose deadline is near is claimed first, nearest first; a deadline
/// does not lift work whose owner has taken far more than its share.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_near_deadline_is_claimed_first_within_fairness(pool: PgPool) {
    queue::switches::set_gate_size(&pool, 1, "test").await.unwrap();
    let plain = job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 2_000, ..Default::default() }).await;
    let later = job(&pool, &JobOpts { owner_id: 2, due_in: Some((600.0, 200.0)), ..Default::default() }).await;
    let sooner = job(&pool, &JobOpts { owner_id: 3, due_in: Some((300.0, 100.0)), ..Default::default() }).await;
    let relaxed = job(&pool, &JobOpts { owner_id: 4, due_in: Some((7_200.0, 7_000.0)), ..Default::default() }).await;
    // An owner far ahead of its share: 20 weights (500K tokens) already served to it.
    sqlx::query("INSERT INTO owner_lines (owner_id, finish_tag) VALUES (5, 20)").execute(&pool).await.unwrap();
    let greedy = job(&pool, &JobOpts { owner_id: 5, due_in: Some((60.0, 10.0)), ..Default::default() }).await;
    let mut order = Vec::new();
    for _ in 0..5 {
        let claimed = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap().remove(0);
        order.push(claimed.id);
        queue::complete(&pool, &NoHooks, &claimed, &JobOutput::default()).await.unwrap();
    }
    assert_eq!(order[..2], [sooner, later], "near deadlines first, nearest first");
    assert_eq!(order[2..4].iter().collect::<HashSet<_>>(), [plain, relaxed].iter().collect(), "then the line's order");
    assert_eq!(order[4], greedy, "a deadline buys no more than the fair window");
}

/// A job's lane is decided when it is admitted: by its document's size against the operator's
/// threshold, by the upload's flag, or by its owner's account.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_jobs_lane_is_its_size_its_uploads_flag_or_its_accounts(pool: PgPool) {
    use engine::accounts::{users, Role};
    use engine::queue::{LaneRequest, NewJob};
    let plain = users::create_user(&pool, "plain@example.com", "password123", Role::User, 10).await.unwrap();
    let vip = users::create_user(&pool, "vip@example.com", "password123", Role::User, 10).await.unwrap();
    assert!(engine::queue::lanes::set_account_urgent(&pool, vip.id, true).await.unwrap());
    let lane_of = |owner: i64, lane: LaneRequest| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            let id =
                queue::enqueue(&mut conn, &NewJob { lane, ..NewJob::new(owner, serde_json::json!({})) }).await.unwrap();
            sqlx::query_scalar::<_, bool>("SELECT urgent FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let sized = |tokens: i64| LaneRequest { document_tokens: tokens, ..Default::default() };
    assert!(lane_of(plain.id, sized(16_000)).await, "at the threshold: urgent");
    assert!(!lane_of(plain.id, sized(16_001)).await, "past it: bulk");
    assert!(lane_of(plain.id, LaneRequest { urgent: true, ..sized(64_000) }).await, "asked for");
    // Anyone may ask: a large document asking stays in the bulk lane (the reserve is for small work).
    assert!(!lane_of(plain.id, LaneRequest { urgent: true, ..sized(400_000) }).await, "asked for, too large");
    assert!(lane_of(vip.id, sized(400_000)).await, "the account's lane");
    let config = engine::queue::lanes::LaneConfig { urgent_max_tokens: 1_000, ..Default::default() };
    engine::queue::lanes::configure(&pool, &config).await.unwrap();
    assert!(!lane_of(plain.id, sized(2_000)).await, "the operator's threshold");
}

/// A spent quota recorded on some of an owner's jobs while its document's parts are granted:
/// the failure brings its job back into the owner's line and holds processing, the grant
/// charges the owner's line and reads the settings; both take the line before the settings
/// row, so many of each at once never deadlock.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn spent_quotas_recorded_while_parts_are_granted_never_deadlock(pool: PgPool) {
    use engine::queue::parts::PartStore;
    let pool = engine::testing::wider_pool(&pool, 40).await;
    queue::switches::set_gate_size(&pool, 70, "test").await.unwrap();
    job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 10_000, bulk: true, ..Default::default() }).await;
    let doc = queue::claim(&pool, "w", 1, Duration::from_secs(60)).await.unwrap().remove(0);
    for _ in 0..30 {
        job(&pool, &JobOpts { owner_id: 1, est_input_tokens: 1_000, ..Default::default() }).await;
    }
    let others = queue::claim(&pool, "w", 30, Duration::from_secs(60)).await.unwrap();
    assert_eq!(others.len(), 30);
    let quota = JobError::new(ErrorClass::QuotaExhausted, "the provider's quota is spent");
    let policy = RetryPolicy::default();
    let parts = PartStore::new(pool.clone());
    let fails = others.iter().map(|job| {
        let (pool, quota, policy) = (pool.clone(), quota.clone(), policy.clone());
        async move { queue::fail(&pool, &NoHooks, &policy, job, &quota).await.map(|_| ()) }
    });
    let grants = (0..30).map(|_| {
        let (parts, doc) = (parts.clone(), doc.clone());
        async move { parts.calls(&doc, 1, &[(1_000, 100)]).await.map(|_| ()) }
    });
    let (failed, granted) = tokio::join!(futures::future::join_all(fails), futures::future::join_all(grants));
    for result in failed.iter().chain(&granted) {
        assert!(result.is_ok(), "{result:?}");
    }
}
