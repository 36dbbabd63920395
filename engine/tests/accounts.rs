//! Accounts against a real Postgres: the ledger, refunds and in-flight counts stay exact
//! whatever the races and whatever the order of submits, completions, failures and replays.

use engine::accounts::admission::{self, Admission, AdmissionConfig, Submission};
use engine::accounts::{ledger, notices, users, AccountHooks, Role};
use engine::queue::dlq::{self, Selection};
use engine::queue::hooks::{TerminalHooks, TerminalJob};
use engine::queue::policy::retry::{ErrorClass, RetryPolicy};
use engine::queue::{self, JobError, JobOutput};
use engine::testing::{one_credit_document, wider_pool};
use engine::{FailureKind, JobStage, JobState};
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_refund_raced_from_many_transactions_happens_once(pool: PgPool) {
    let pool = wider_pool(&pool, 30).await;
    let user = users::create_user(&pool, "race@example.com", "password123", Role::User, 5).await.unwrap();
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: user.id,
        payload: serde_json::json!({}),
        content_key: "k".into(),
        client_key: None,
        fingerprint: "k".into(),
    };
    let Admission::Accepted { job_id } =
        admission::submit(&pool, &AdmissionConfig::default(), &submission).await.unwrap()
    else {
        panic!("accepted")
    };
    let job = TerminalJob {
        id: job_id,
        owner_id: user.id,
        cost: 1,
        attempts: 3,
        failure: Some((FailureKind::RetriesExhausted, "provider overloaded".into())),
    };
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (pool, job) = (pool.clone(), job.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let refunded = ledger::refund_job(&mut tx, &job, job.cost.into(), "boom").await.unwrap();
                notices::add_refund_notice(&mut tx, &job, job.cost.into(), None).await.unwrap();
                tx.commit().await.unwrap();
                refunded
            })
        })
        .collect();
    let mut refunds = 0;
    for t in tasks {
        refunds += t.await.unwrap() as usize;
    }
    assert_eq!(refunds, 1);
    assert_eq!(users::get(&pool, user.id).await.unwrap().balance, 5);
    assert_eq!(ledger::ledger_sum(&pool, user.id).await.unwrap(), 5);
    assert_eq!(notices::list(&pool, user.id, 10).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn monthly_totals_add_up_charges_refunds_and_tokens_per_month(pool: PgPool) {
    let user = users::create_user(&pool, "months@example.com", "password123", Role::User, 10).await.unwrap();
    let mut jobs = Vec::new();
    for n in 0..3 {
        let submission = Submission {
            price_by_size: None,
            lane: Default::default(),
            shared_document: None,
            cost: 1,
            est_input_tokens: 0,
            user_id: user.id,
            payload: serde_json::json!({ "n": n }),
            content_key: format!("k{n}"),
            client_key: None,
            fingerprint: format!("k{n}"),
        };
        let Admission::Accepted { job_id } =
            admission::submit(&pool, &AdmissionConfig::default(), &submission).await.unwrap()
        else {
            panic!("accepted")
        };
        jobs.push(job_id);
    }
    sqlx::query("UPDATE jobs SET input_tokens = 1000, output_tokens = 50 WHERE id = ANY($1)")
        .bind(&jobs)
        .execute(&pool)
        .await
        .unwrap();
    let failed = TerminalJob {
        id: jobs[0],
        owner_id: user.id,
        cost: 1,
        attempts: 3,
        failure: Some((FailureKind::RetriesExhausted, "provider overloaded".into())),
    };
    let mut tx = pool.begin().await.unwrap();
    assert!(ledger::refund_job(&mut tx, &failed, failed.cost.into(), "boom").await.unwrap());
    tx.commit().await.unwrap();
    // Last month's activity is its own row.
    sqlx::query("UPDATE ledger SET at = at - interval '40 days' WHERE job_id = $1 AND kind = 'debit'")
        .bind(jobs[2])
        .execute(&pool)
        .await
        .unwrap();

    let months = ledger::monthly_totals(&pool, user.id, 12).await.unwrap();
    assert_eq!(months.len(), 2, "{months:?}");
    let (this, last) = (&months[0], &months[1]);
    assert!(this.month > last.month, "newest first");
    assert_eq!((this.documents, this.charged, this.refunded), (2, 2, 1));
    assert_eq!((this.input_tokens, this.output_tokens), (3000, 150), "tokens follow the jobs' acceptance");
    assert_eq!((last.documents, last.charged, last.refunded), (1, 1, 0));
    assert!(ledger::monthly_totals(&pool, user.id, 1).await.unwrap().len() == 1);
}

/// Random sequences of submit / complete / fail / replay / cancel (waiting, or running with the
/// attempt ending after the request), checking after every step that the ledger sums to the
/// balance, the balance is never negative, in-flight equals the user's non-terminal jobs, and
/// every canceled job was refunded exactly once.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn ledger_and_in_flight_invariants_hold_over_random_sequences(pool: PgPool) {
    let hooks = AccountHooks;
    let policy = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let config = AdmissionConfig { max_backlog: 1_000_000, ..AdmissionConfig::default() };
    for seed in 0..12u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let user = users::create_user(
            &pool,
            &format!("p{seed}@example.com"),
            "password123",
            Role::User,
            rng.random_range(0..6),
        )
        .await
        .unwrap();
        for step in 0..40 {
            match rng.random_range(0..5) {
                0 => {
                    let key = format!("doc-{}", rng.random_range(0..8));
                    let s = one_credit_document(user.id, &key);
                    admission::submit(&pool, &config, &s).await.unwrap();
                }
                op @ (1 | 2) => {
                    if let Some(job) =
                        queue::claim(&pool, "prop", 1, std::time::Duration::from_secs(60)).await.unwrap().pop()
                    {
                        if rng.random_bool(0.25) {
                            // Canceled while running: the attempt's end makes it canceled.
                            let asked = queue::cancel(&pool, &hooks, job.id, "owner", false).await.unwrap();
                            assert_eq!(asked, queue::Canceled::Requested);
                        }
                        if op == 1 {
                            queue::complete(&pool, &hooks, &job, &JobOutput::default()).await.unwrap();
                        } else {
                            let class =
                                if rng.random_bool(0.5) { ErrorClass::Rejected } else { ErrorClass::Overloaded };
                            queue::fail(&pool, &hooks, &policy, &job, &JobError::new(class, "boom")).await.unwrap();
                        }
                    }
                }
                3 => {
                    let waiting: Option<uuid::Uuid> = sqlx::query_scalar(
                        "SELECT id FROM jobs WHERE owner_id = $1 AND state IN ('queued', 'retrying') LIMIT 1",
                    )
                    .bind(user.id)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
                    if let Some(id) = waiting {
                        assert_eq!(
                            queue::cancel(&pool, &hooks, id, "owner", false).await.unwrap(),
                            queue::Canceled::Now
                        );
                        let again = queue::cancel(&pool, &hooks, id, "owner", false).await.unwrap();
                        assert_eq!(again, queue::Canceled::AlreadyEnded(JobState::Canceled), "twice is once");
                    }
                }
                _ => {
                    let failed: Option<uuid::Uuid> =
                        sqlx::query_scalar("SELECT id FROM jobs WHERE owner_id = $1 AND state = 'failed' LIMIT 1")
                            .bind(user.id)
                            .fetch_optional(&pool)
                            .await
                            .unwrap();
                    if let Some(id) = failed {
                        // A live job with the same content key keeps it failed (reported, not an error).
                        let replayed = dlq::replay(&pool, &hooks as &dyn TerminalHooks, &Selection::Job(id), "admin")
                            .await
                            .unwrap();
                        assert_eq!(replayed.ids.len() + replayed.already_reuploaded.len(), 1);
                    }
                }
            }
            let u = users::get(&pool, user.id).await.unwrap();
            let sum = ledger::ledger_sum(&pool, user.id).await.unwrap();
            let live: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE owner_id = $1 AND state <> ALL($2)")
                .bind(user.id)
                .bind([JobState::Done, JobState::Failed, JobState::Canceled])
                .fetch_one(&pool)
                .await
                .unwrap();
            let unrefunded_cancels: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM jobs j WHERE owner_id = $1 AND state = 'canceled' AND cost > 0
                   AND (SELECT count(*) FROM ledger l WHERE l.job_id = j.id AND l.kind = 'refund') <> 1",
            )
            .bind(user.id)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(unrefunded_cancels, 0, "seed {seed} step {step}: each canceled job refunded exactly once");
            assert_eq!(sum, u.balance, "seed {seed} step {step}: ledger sum = balance");
            assert!(u.balance >= 0, "seed {seed} step {step}");
            assert_eq!(u.in_flight as i64, live, "seed {seed} step {step}: in-flight = non-terminal jobs");
        }
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_long_pause_does_not_turn_into_refusing_uploads(pool: PgPool) {
    use engine::queue::switches;
    use std::time::Duration;
    let user = users::create_user(&pool, "paused@example.com", "password123", Role::User, 10).await.unwrap();
    let config = AdmissionConfig { max_oldest_wait: Duration::from_secs(30 * 60), ..AdmissionConfig::default() };
    switches::set_processing(&pool, false, "ops@example.com").await.unwrap();
    // Paused 45 minutes ago; a job has waited 40 minutes, all of them paused.
    sqlx::query("UPDATE processing_pauses SET paused_at = now() - interval '45 minutes'").execute(&pool).await.unwrap();
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: user.id,
        payload: serde_json::json!({}),
        content_key: "old".into(),
        client_key: None,
        fingerprint: "old".into(),
    };
    let Admission::Accepted { job_id } = admission::submit(&pool, &config, &submission).await.unwrap() else {
        panic!("accepted")
    };
    sqlx::query("UPDATE jobs SET run_at = now() - interval '40 minutes' WHERE id = $1")
        .bind(job_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(admission::precheck(&pool, &config, user.id, 1, 0).await.unwrap(), None, "paused time does not count");

    // Resumed 35 minutes ago: the job has now waited 35 counted minutes, past the bound.
    switches::set_processing(&pool, true, "ops@example.com").await.unwrap();
    sqlx::query("UPDATE processing_pauses SET resumed_at = now() - interval '35 minutes', paused_at = now() - interval '45 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        matches!(
            admission::precheck(&pool, &config, user.id, 1, 0).await.unwrap(),
            Some(admission::Refusal::Overloaded { .. })
        ),
        "time waited while processing runs still counts"
    );
}

/// Cancel and complete racing on the same running jobs, and cancel racing the claim on waiting
/// ones: each job ends done (charged) or canceled (refunded once), never both, and the
/// balance, the ledger and in-flight agree.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn cancel_racing_claim_and_complete_keeps_money_and_jobs_exact(pool: PgPool) {
    let pool = wider_pool(&pool, 40).await;
    let hooks = AccountHooks;
    let user = users::create_user(&pool, "racer@example.com", "password123", Role::User, 60).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 100 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
    let config = AdmissionConfig::default();
    let mut ids = Vec::new();
    for n in 0..40 {
        let s = Submission {
            price_by_size: None,
            lane: Default::default(),
            shared_document: None,
            cost: 1,
            est_input_tokens: 0,
            user_id: user.id,
            payload: serde_json::json!({ "n": n }),
            content_key: format!("race-{n}"),
            client_key: None,
            fingerprint: format!("race-{n}"),
        };
        let Admission::Accepted { job_id } = admission::submit(&pool, &config, &s).await.unwrap() else { panic!() };
        ids.push(job_id);
    }
    // Half are claimed (running); cancels race their completions. The other half race a claim.
    let running = queue::claim(&pool, "racer", 20, std::time::Duration::from_secs(60)).await.unwrap();
    let mut tasks = Vec::new();
    for job in running {
        let (pool, job) = (pool.clone(), job.clone());
        tasks.push(tokio::spawn(async move {
            let output = JobOutput::default();
            let cancel = queue::cancel(&pool, &AccountHooks, job.id, "owner", false);
            let complete = queue::complete(&pool, &AccountHooks, &job, &output);
            let (c, d) = tokio::join!(cancel, complete);
            c.unwrap();
            d.unwrap();
        }));
    }
    for _ in 0..20 {
        let pool = pool.clone();
        let waiting: Vec<uuid::Uuid> = ids.clone();
        tasks.push(tokio::spawn(async move {
            let claim = queue::claim(&pool, "racer2", 1, std::time::Duration::from_secs(60));
            let cancels = async {
                for id in &waiting {
                    queue::cancel(&pool, &AccountHooks, *id, "owner", false).await.unwrap();
                }
            };
            let (claimed, ()) = tokio::join!(claim, cancels);
            for job in claimed.unwrap() {
                // A claim that won the race ends its attempt; a canceled request turns it canceled.
                queue::complete(&pool, &AccountHooks, &job, &JobOutput::default()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let _ = hooks;
    let states: Vec<(JobState, i64, i64)> = sqlx::query_as(
        "SELECT state, (SELECT count(*) FROM ledger l WHERE l.job_id = j.id AND l.kind = 'refund'),
                (SELECT count(*) FROM ledger l WHERE l.job_id = j.id AND l.kind = 'debit')
         FROM jobs j WHERE owner_id = $1",
    )
    .bind(user.id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(states.len(), 40);
    for (state, refunds, debits) in &states {
        assert_eq!(*debits, 1);
        match state {
            JobState::Done => assert_eq!(*refunds, 0, "a done job is charged"),
            JobState::Canceled => assert_eq!(*refunds, 1, "a canceled job is refunded once"),
            other => panic!("every job ended: {other:?}"),
        }
    }
    let u = users::get(&pool, user.id).await.unwrap();
    let done = states.iter().filter(|s| s.0 == JobState::Done).count() as i64;
    assert_eq!(u.balance, 60 - done, "charged exactly for the done jobs");
    assert_eq!(ledger::ledger_sum(&pool, user.id).await.unwrap(), u.balance);
    assert_eq!(u.in_flight, 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_cancel_before_the_provider_call_is_free_and_one_after_it_started_is_charged(pool: PgPool) {
    let hooks = AccountHooks;
    let user = users::create_user(&pool, "late@example.com", "password123", Role::User, 3).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        let s = Submission {
            price_by_size: None,
            lane: Default::default(),
            shared_document: None,
            cost: 1,
            est_input_tokens: 0,
            user_id: user.id,
            payload: serde_json::json!({ "n": n }),
            content_key: format!("late-{n}"),
            client_key: None,
            fingerprint: format!("late-{n}"),
        };
        let Admission::Accepted { job_id } = admission::submit(&pool, &AdmissionConfig::default(), &s).await.unwrap()
        else {
            panic!()
        };
        ids.push(job_id);
    }
    let mut running = queue::claim(&pool, "w", 2, std::time::Duration::from_secs(60)).await.unwrap();
    running.sort_by_key(|j| j.id);
    // The first is still reading its document; the second's provider call has started.
    let stage =
        |job: &queue::ClaimedJob, stage| engine::queue::stages::set_stage(&pool, job.id, job.lease_token, stage, None);
    assert!(stage(&running[0], JobStage::Reading).await.unwrap().written);
    assert!(stage(&running[1], JobStage::WaitingForProvider).await.unwrap().written);
    for job in &running {
        assert_eq!(queue::cancel(&pool, &hooks, job.id, "owner", false).await.unwrap(), queue::Canceled::Requested);
    }
    // One attempt brings a result, the other an error: both end canceled, without a result.
    let output = JobOutput { result: serde_json::json!({ "markdown": "late" }), ..JobOutput::default() };
    assert_eq!(queue::complete(&pool, &hooks, &running[0], &output).await.unwrap(), queue::Recorded::Canceled);
    let policy = RetryPolicy::default();
    let error = JobError::new(ErrorClass::Overloaded, "busy");
    assert_eq!(queue::fail(&pool, &hooks, &policy, &running[1], &error).await.unwrap(), queue::Recorded::Canceled);
    let views = [queue::get(&pool, running[0].id).await.unwrap(), queue::get(&pool, running[1].id).await.unwrap()];
    for view in &views {
        assert_eq!((view.state, view.result.is_none()), (JobState::Canceled, true));
    }
    assert_eq!((views[0].refunded, views[0].cancel_kept_credits), (1, 0), "canceled before the call: free");
    assert_eq!((views[1].refunded, views[1].cancel_kept_credits), (0, 1), "after the call started: charged");
    // The waiting one is canceled at once and free; a done job cannot be canceled.
    let waiting = ids.iter().find(|id| !running.iter().any(|j| j.id == **id)).unwrap();
    assert_eq!(queue::cancel(&pool, &hooks, *waiting, "owner", false).await.unwrap(), queue::Canceled::Now);
    let u = users::get(&pool, user.id).await.unwrap();
    assert_eq!((u.balance, u.in_flight), (2, 0), "one credit kept, the rest refunded, nothing in flight");
    assert_eq!(ledger::ledger_sum(&pool, user.id).await.unwrap(), 2);
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "the books add up: {:?}", report.discrepancies);

    // The same document uploaded again after a cancel is a new job (the key is free again).
    let again = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: user.id,
        payload: serde_json::json!({ "n": 0 }),
        content_key: "late-0".into(),
        client_key: None,
        fingerprint: "late-0".into(),
    };
    let admitted = admission::submit(&pool, &AdmissionConfig::default(), &again).await.unwrap();
    assert!(matches!(admitted, Admission::Accepted { job_id } if !ids.contains(&job_id)), "{admitted:?}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn reconciliation_reports_what_does_not_add_up_and_fixes_nothing(pool: PgPool) {
    use engine::documents::Blobs;
    use engine::reconcile;
    let dir = std::env::temp_dir().join(format!("sluice-reconcile-{}", Blobs::new_key().replace("documents/", "")));
    let blobs = Blobs::local(&dir).unwrap();
    let user = users::create_user(&pool, "books@example.com", "password123", Role::User, 5).await.unwrap();
    let mut jobs = Vec::new();
    for n in 0..3 {
        let key = Blobs::new_key();
        blobs.put(&key, bytes::Bytes::from_static(b"text")).await.unwrap();
        let s = Submission {
            price_by_size: None,
            lane: Default::default(),
            shared_document: None,
            cost: 1,
            est_input_tokens: 0,
            user_id: user.id,
            payload: serde_json::json!({ "document": { "key": key } }),
            content_key: format!("books-{n}"),
            client_key: None,
            fingerprint: format!("books-{n}"),
        };
        let Admission::Accepted { job_id } = admission::submit(&pool, &AdmissionConfig::default(), &s).await.unwrap()
        else {
            panic!()
        };
        jobs.push((job_id, key));
    }
    // A job that failed (refunded), was replayed (free) and then finished is in order.
    let extra = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: user.id,
        payload: serde_json::json!({}),
        content_key: "books-replayed".into(),
        client_key: None,
        fingerprint: "books-replayed".into(),
    };
    admission::submit(&pool, &AdmissionConfig::default(), &extra).await.unwrap();
    let policy = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let claimed = queue::claim(&pool, "books", 10, std::time::Duration::from_secs(60)).await.unwrap();
    let replayed = claimed.iter().find(|j| j.payload == serde_json::json!({})).unwrap().clone();
    for job in claimed.iter().filter(|j| j.id != replayed.id) {
        queue::hand_back(&pool, &[job.lease_token]).await.unwrap();
    }
    let boom = JobError::new(ErrorClass::Rejected, "boom");
    queue::fail(&pool, &AccountHooks, &policy, &replayed, &boom).await.unwrap();
    dlq::replay(&pool, &AccountHooks, &Selection::Job(replayed.id), "admin").await.unwrap();
    let again = queue::claim(&pool, "books", 10, std::time::Duration::from_secs(60)).await.unwrap();
    for job in &again {
        if job.id == replayed.id {
            queue::complete(&pool, &AccountHooks, job, &JobOutput::default()).await.unwrap();
        } else {
            queue::hand_back(&pool, &[job.lease_token]).await.unwrap();
        }
    }
    assert_eq!(queue::get(&pool, replayed.id).await.unwrap().state, JobState::Done);
    let clean = reconcile::run(&pool, Some(&blobs), "test").await.unwrap();
    assert!(clean.discrepancies.is_empty(), "{:?}", clean.discrepancies);
    assert_eq!(clean.checks.len(), 8);
    assert!(clean.checks.iter().all(|c| c.found == 0 && c.examined >= 0));

    // Break the books in every way a check looks for.
    sqlx::query("UPDATE users SET balance = balance + 5, in_flight = in_flight + 1 WHERE id = $1")
        .bind(user.id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM ledger WHERE job_id = $1 AND kind = 'debit'")
        .bind(jobs[0].0)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE jobs SET kind = 'document', state = 'running', lease_token = gen_random_uuid(),
                 lease_expires_at = now() + interval '1 day' WHERE id = $1",
    )
    .bind(jobs[1].0)
    .execute(&pool)
    .await
    .unwrap();
    blobs.delete(&jobs[2].1).await.unwrap();
    let report = reconcile::run(&pool, Some(&blobs), "ops@example.com").await.unwrap();
    let found = |check: &str| -> Vec<String> {
        report
            .discrepancies
            .iter()
            .filter(|d| d.check == check)
            .map(|d| format!("{}: {}", d.subject, d.detail))
            .collect()
    };
    assert_eq!(found("balance_matches_ledger"), [format!("user {}: balance 7, the ledger sums to 3", user.id)]);
    assert_eq!(found("in_flight_matches_open_jobs"), [format!("user {}: in flight 4, jobs not yet ended 3", user.id)]);
    assert_eq!(found("one_debit_per_job"), [format!("job {}: 0 debits", jobs[0].0)]);
    assert_eq!(found("no_lease_far_in_future").len(), 1);
    assert!(found("no_lease_far_in_future")[0].starts_with(&format!("job {}", jobs[1].0)));
    assert_eq!(
        found("live_jobs_have_documents"),
        [format!("job {}: its document {} is missing", jobs[2].0, jobs[2].1)]
    );

    // Evidence is kept, and nothing was repaired.
    let latest = reconcile::latest(&pool).await.unwrap().unwrap();
    assert_eq!((latest.id, latest.actor.as_str(), latest.discrepancies.len()), (report.id, "ops@example.com", 5));
    assert_eq!(users::get(&pool, user.id).await.unwrap().balance, 7, "a run fixes nothing");

    // Badly broken books: the count is exact, the report keeps the first hundred.
    sqlx::query("INSERT INTO users (email, password_hash, balance) SELECT 'broken' || g || '@example.com', 'x', 1 FROM generate_series(1, 150) g")
        .execute(&pool)
        .await
        .unwrap();
    let broken = reconcile::run(&pool, None, "test").await.unwrap();
    let balances = broken.checks.iter().find(|c| c.check == "balance_matches_ledger").unwrap();
    assert_eq!(balances.found, 151);
    assert_eq!(broken.discrepancies.iter().filter(|d| d.check == "balance_matches_ledger").count(), 100);
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn counter_repair_sets_balances_to_ledgers_and_in_flight_to_open_jobs_on_the_record(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    let config = AdmissionConfig::default();
    let mut users_ = Vec::new();
    for n in 0..4 {
        let user =
            users::create_user(&pool, &format!("repair{n}@example.com"), "password123", Role::User, 100).await.unwrap();
        sqlx::query("UPDATE users SET max_in_flight = 1000 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
        users_.push(user.id);
    }
    // Broken counters (what a bug or a hand-edit would leave).
    sqlx::query("UPDATE users SET balance = balance + 7, in_flight = in_flight + 3 WHERE id = ANY($1)")
        .bind(&users_[..2])
        .execute(&pool)
        .await
        .unwrap();
    // Admissions keep arriving while the repair runs: none may be lost from the counters.
    let admitting: Vec<_> = (0..40)
        .map(|n| {
            let (pool, config, user_id) = (pool.clone(), config.clone(), users_[n % 4]);
            tokio::spawn(async move {
                let s = Submission {
                    price_by_size: None,
                    lane: Default::default(),
                    shared_document: None,
                    cost: 1,
                    est_input_tokens: 0,
                    user_id,
                    payload: serde_json::json!({ "n": n }),
                    content_key: format!("repair-{n}"),
                    client_key: None,
                    fingerprint: format!("repair-{n}"),
                };
                admission::submit(&pool, &config, &s).await.unwrap()
            })
        })
        .collect();
    let repaired = engine::repair::repair_counters(&pool, "ops").await.unwrap();
    for a in admitting {
        assert!(matches!(a.await.unwrap(), Admission::Accepted { .. }));
    }
    let fixed_users: std::collections::BTreeSet<i64> = repaired.iter().map(|r| r.user_id).collect();
    assert_eq!(fixed_users.into_iter().collect::<Vec<_>>(), users_[..2].to_vec(), "only the broken ones");
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "after the repair the books add up: {:?}", report.discrepancies);
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE actor = 'ops' AND action IN ('repair_balance', 'repair_in_flight')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited, repaired.len() as i64);
    assert_eq!(repaired.len(), 4, "a balance and an in-flight count for each of the two");
    assert!(engine::repair::repair_counters(&pool, "ops").await.unwrap().is_empty(), "nothing left to repair");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_token_poll_is_a_read_last_used_is_written_at_most_once_a_minute(pool: PgPool) {
    use engine::accounts::tokens;
    let user = users::create_user(&pool, "poller@example.com", "password123", Role::User, 5).await.unwrap();
    let (token, secret) = tokens::create(&pool, user.id, "poller").await.unwrap();
    // A row's xmin changes with every write to it: the polls after the first must not write.
    let version = || async {
        sqlx::query_scalar::<_, String>("SELECT xmin::text FROM api_tokens WHERE id = $1")
            .bind(token.id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = version().await;
    let (found, token_id) =
        tokens::authenticate_token(&mut *pool.acquire().await.unwrap(), &secret).await.unwrap().unwrap();
    assert_eq!((found.id, token_id), (user.id, token.id));
    let after_first = version().await;
    assert_ne!(before, after_first, "the first use is recorded");
    for _ in 0..20 {
        assert!(tokens::authenticate_token(&mut *pool.acquire().await.unwrap(), &secret).await.unwrap().is_some());
    }
    assert_eq!(version().await, after_first, "polls within the minute write nothing");
    // A minute later, the next use is recorded again.
    sqlx::query("UPDATE api_tokens SET last_used_at = now() - interval '61 seconds' WHERE id = $1")
        .bind(token.id)
        .execute(&pool)
        .await
        .unwrap();
    let aged = version().await;
    tokens::authenticate_token(&mut *pool.acquire().await.unwrap(), &secret).await.unwrap().unwrap();
    assert_ne!(version().await, aged);
    let used: bool =
        sqlx::query_scalar("SELECT last_used_at > now() - interval '5 seconds' FROM api_tokens WHERE id = $1")
            .bind(token.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(used);
    // Revoked or wrong: nobody.
    assert!(tokens::authenticate_token(&mut *pool.acquire().await.unwrap(), "slc_wrong").await.unwrap().is_none());
    tokens::revoke(&pool, user.id, token.id).await.unwrap();
    assert!(tokens::authenticate_token(&mut *pool.acquire().await.unwrap(), &secret).await.unwrap().is_none());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn one_users_uploads_and_cancels_at_once_never_deadlock(pool: PgPool) {
    // Cancel changes the owner's line (the heads trigger) and then their row (the refund);
    // admission must take them in the same order, or the two wait on each other until Postgres
    // aborts one (a deadlock error here).
    let pool = wider_pool(&pool, 20).await;
    let user = users::create_user(&pool, "both@example.com", "password123", Role::User, 1_000).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 1000 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..4 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..25 {
                let key = format!("{t}-{n}");
                let s = one_credit_document(user.id, &key);
                assert!(matches!(
                    admission::submit(&pool, &AdmissionConfig::default(), &s).await.unwrap(),
                    Admission::Accepted { .. }
                ));
            }
        }));
    }
    for _ in 0..4 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let waiting: Option<uuid::Uuid> = sqlx::query_scalar(
                    "SELECT id FROM jobs WHERE owner_id = $1 AND state = 'queued' ORDER BY random() LIMIT 1",
                )
                .bind(user.id)
                .fetch_optional(&pool)
                .await
                .unwrap();
                if let Some(id) = waiting {
                    queue::cancel(&pool, &AccountHooks, id, "owner", false).await.unwrap();
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (balance, in_flight): (i64, i32) = sqlx::query_as("SELECT balance, in_flight FROM users WHERE id = $1")
        .bind(user.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let (queued, canceled): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'canceled') FROM jobs",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(queued + canceled, 100);
    assert_eq!(in_flight as i64, queued, "in flight = still waiting");
    assert_eq!(balance, 1_000 - queued, "canceled jobs refunded");
}

/// A document the reader could not read fails as unreadable even when its cancel was asked for
/// meanwhile (else canceling while it is read would make hostile files free past the daily
/// allowance); any other error of a canceled attempt still ends it canceled.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_cancel_does_not_turn_an_unreadable_document_into_a_free_one(pool: PgPool) {
    let hooks = AccountHooks;
    let user = users::create_user(&pool, "sly@example.com", "password123", Role::User, 5).await.unwrap();
    for n in 0..2 {
        admission::submit(&pool, &AdmissionConfig::default(), &one_credit_document(user.id, &format!("sly-{n}")))
            .await
            .unwrap();
    }
    let mut running = queue::claim(&pool, "w", 2, std::time::Duration::from_secs(60)).await.unwrap();
    running.sort_by_key(|j| j.id);
    for job in &running {
        assert_eq!(queue::cancel(&pool, &hooks, job.id, "owner", false).await.unwrap(), queue::Canceled::Requested);
    }
    let policy = RetryPolicy::default();
    let unreadable = JobError::new(ErrorClass::InvalidInput, "the document is too complex").unreadable();
    let recorded = queue::fail(&pool, &hooks, &policy, &running[0], &unreadable).await.unwrap();
    assert_eq!(recorded, queue::Recorded::Failed(FailureKind::InvalidInput));
    let busy = JobError::new(ErrorClass::Overloaded, "busy");
    assert_eq!(queue::fail(&pool, &hooks, &policy, &running[1], &busy).await.unwrap(), queue::Recorded::Canceled);
    let flagged: Vec<(JobState, bool)> =
        sqlx::query_as("SELECT state, failed_unreadable FROM jobs WHERE id = ANY($1) ORDER BY id")
            .bind(running.iter().map(|j| j.id).collect::<Vec<_>>())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(flagged, [(JobState::Failed, true), (JobState::Canceled, false)]);
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);
}

/// Admit a one-credit document, claim it, put it in the reading stage if `reading`, cancel it
/// as `actor` (`audited`: an admin's), end its attempt; returns what was refunded.
async fn cancel_one(pool: &PgPool, user: i64, name: &str, reading: bool, actor: &str, audited: bool) -> i64 {
    let hooks = AccountHooks;
    admission::submit(pool, &AdmissionConfig::default(), &one_credit_document(user, name)).await.unwrap();
    let job = queue::claim(pool, "w", 1, std::time::Duration::from_secs(60)).await.unwrap().pop().unwrap();
    if reading {
        queue::stages::set_stage(pool, job.id, job.lease_token, JobStage::Reading, None).await.unwrap();
    }
    assert_eq!(queue::cancel(pool, &hooks, job.id, actor, audited).await.unwrap(), queue::Canceled::Requested);
    let stopped = JobError::new(ErrorClass::Rejected, "canceled before it was finished");
    let recorded = queue::fail(pool, &hooks, &RetryPolicy::default(), &job, &stopped).await.unwrap();
    assert_eq!(recorded, queue::Recorded::Canceled);
    sqlx::query_scalar("SELECT coalesce(sum(amount), 0)::int8 FROM ledger WHERE job_id = $1 AND kind = 'refund'")
        .bind(job.id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A document canceled while the reader reads it spent the reader's work: it counts against the
/// day's free unreadable documents like one that failed unread, and past them it is charged.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn documents_canceled_while_read_count_against_the_daily_allowance(pool: PgPool) {
    use sluice_types::settlement::FREE_UNREADABLE_PER_DAY;
    let user = users::create_user(&pool, "reader@example.com", "password123", Role::User, 10).await.unwrap();
    let free = FREE_UNREADABLE_PER_DAY as usize;
    let mut refunds = Vec::new();
    for n in 0..=free {
        refunds.push(cancel_one(&pool, user.id, &format!("read-{n}"), true, "owner", false).await);
    }
    assert_eq!(refunds[..free], vec![1; free], "the day's allowance is refunded: {refunds:?}");
    assert_eq!(refunds[free], 0, "past it, a document canceled while read is charged: {refunds:?}");
    let before_reading = cancel_one(&pool, user.id, "not-read", false, "owner", false).await;
    assert_eq!(before_reading, 1, "canceled before the reader started: free whatever the count");
    // An admin's cancel while the reader reads costs the owner nothing, whatever the count.
    let by_admin = cancel_one(&pool, user.id, "read-by-admin", true, "ops@example.com", true).await;
    assert_eq!(by_admin, 1, "an admin's cancel is not the owner's reader work");
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);
}

/// The intake bound over one process's reading of the backlog (`accounts::backlog`): exact for
/// the process's own admissions, a refusal always from a fresh count (space a cancel frees is
/// taken at once), and another process's admissions seen once the reading's age has passed.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_intake_bound_holds_over_a_processs_reading_of_the_backlog(pool: PgPool) {
    use engine::accounts::admission::Refusal;
    let user = users::create_user(&pool, "bound@example.com", "password123", Role::User, 100).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 100").execute(&pool).await.unwrap();
    let age = std::time::Duration::from_secs(2);
    // Two web processes: each its own config, so its own reading.
    let here = AdmissionConfig { max_backlog: 3, backlog_reading_age: age, ..AdmissionConfig::default() };
    let there = AdmissionConfig { max_backlog: 3, backlog_reading_age: age, ..AdmissionConfig::default() };
    let submit = |config: &AdmissionConfig, key: &str| {
        let (pool, config, s) = (pool.clone(), config.clone(), one_credit_document(user.id, key));
        async move { admission::submit(&pool, &config, &s).await.unwrap() }
    };
    let overloaded = |a: &Admission| matches!(a, Admission::Refused(Refusal::Overloaded { .. }));
    let waiting = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE state IN ('queued', 'retrying')")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let cancel_one = || async {
        let id: uuid::Uuid =
            sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'queued' LIMIT 1").fetch_one(&pool).await.unwrap();
        assert_eq!(queue::cancel(&pool, &AccountHooks, id, "owner", false).await.unwrap(), queue::Canceled::Now);
    };

    for n in 0..3 {
        assert!(matches!(submit(&here, &format!("a{n}")).await, Admission::Accepted { .. }), "{n}");
    }
    assert!(overloaded(&submit(&here, "a3").await), "this process's own admissions are counted exactly");
    cancel_one().await;
    assert!(matches!(submit(&here, "a4").await, Admission::Accepted { .. }), "a refusal's count is fresh");
    assert!(overloaded(&submit(&there, "b0").await), "the other process counts for itself");

    cancel_one().await;
    cancel_one().await;
    assert!(matches!(submit(&here, "a5").await, Admission::Accepted { .. }), "1 waiting: counted afresh");
    assert!(matches!(submit(&there, "b1").await, Admission::Accepted { .. }), "3 waiting now");
    // `here` read 1 and added its own 1: its reading stands, and the other's admission is
    // not in it yet, so it admits past the bound...
    assert!(matches!(submit(&here, "a6").await, Admission::Accepted { .. }));
    assert_eq!(waiting().await, 4, "passed by what the other process admitted within the reading's age");
    // ...until the reading's age has passed.
    tokio::time::sleep(age).await;
    assert!(overloaded(&submit(&here, "a7").await), "counted again after its age");
    assert_eq!(waiting().await, 4);
}

/// Issue 55, item 5: the storage quota reads one counter, moved by every admission (a shared
/// document once), part written, release and deletion, from many transactions at once; the
/// reconciliation finds it equal to the rows it counts, and it is back to nothing when they go.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn stored_bytes_are_a_counter_the_transitions_move_and_the_books_check(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    let user = users::create_user(&pool, "quota@example.com", "password123", Role::User, 1_000).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = 100 WHERE id = $1").bind(user.id).execute(&pool).await.unwrap();
    let config = AdmissionConfig { storage_quota_bytes: Some(1 << 30), ..AdmissionConfig::default() };
    let counted = |pool: PgPool| async move {
        let mut conn = pool.acquire().await.unwrap();
        admission::storage_used(&mut conn, user.id).await.unwrap()
    };
    // 40 admissions at once over 20 documents (each shared by two jobs, as "run again" does).
    let admitted = futures::future::join_all((0..40).map(|n| {
        let (pool, config) = (pool.clone(), config.clone());
        async move {
            let document = serde_json::json!({ "key": format!("documents/doc-{}", n % 20), "size": 1_000 + n % 20 });
            let s = Submission {
                payload: serde_json::json!({ "document": document }),
                ..one_credit_document(user.id, &format!("quota-{n}"))
            };
            match admission::submit(&pool, &config, &s).await.unwrap() {
                Admission::Accepted { job_id } => job_id,
                other => panic!("{other:?}"),
            }
        }
    }))
    .await;
    let documents: u64 = (0..20).map(|k| 1_000 + k).sum();
    assert_eq!(counted(pool.clone()).await, documents, "each shared document once");

    // Parts written, answered and forgotten from many transactions at once.
    futures::future::join_all(admitted.iter().take(10).map(|job| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO job_parts (job_id, level, idx, body, est_tokens) SELECT $1, 0, i, repeat('x', 100), 10
                 FROM generate_series(0, 2) i",
            )
            .bind(job)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("UPDATE job_parts SET output = repeat('y', 50), done_at = now() WHERE job_id = $1 AND idx = 0")
                .bind(job)
                .execute(&pool)
                .await
                .unwrap();
        }
    }))
    .await;
    assert_eq!(counted(pool.clone()).await, documents + 10 * 350);
    sqlx::query("DELETE FROM job_parts WHERE job_id = $1").bind(admitted[0]).execute(&pool).await.unwrap();
    assert_eq!(counted(pool.clone()).await, documents + 9 * 350);

    // Folding an owner's deltas into one row changes nothing they add up to.
    let rows = || {
        let pool = pool.clone();
        async move { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM storage_deltas").fetch_one(&pool).await.unwrap() }
    };
    assert!(rows().await > 1);
    assert!(admission::fold_storage_deltas(&pool).await.unwrap() > 1);
    assert_eq!(rows().await, 1, "one row for the one owner");
    assert_eq!(counted(pool.clone()).await, documents + 9 * 350);
    // One holder of a document released: still held by the other; both: freed.
    let release = |job: uuid::Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query("UPDATE jobs SET document_released_at = now() WHERE id = $1")
                .bind(job)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    release(admitted[1]).await;
    assert_eq!(counted(pool.clone()).await, documents + 9 * 350, "doc-1 is still held by job 21");
    release(admitted[21]).await;
    assert_eq!(counted(pool.clone()).await, documents - 1_001 + 9 * 350);
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);

    // Jobs deleted with their parts (the cascade) in one statement: nothing is left counted.
    sqlx::query("DELETE FROM jobs WHERE owner_id = $1").bind(user.id).execute(&pool).await.unwrap();
    assert_eq!(counted(pool.clone()).await, 0);
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    let storage = |r: &engine::reconcile::Report| {
        r.checks.iter().find(|c| c.check == "stored_bytes_match_documents").unwrap().found
    };
    assert_eq!(storage(&report), 0, "{:?}", report.discrepancies);

    // The check catches a counter that drifted.
    sqlx::query("INSERT INTO storage_deltas (user_id, bytes) VALUES ($1, 5)")
        .bind(user.id)
        .execute(&pool)
        .await
        .unwrap();
    let report = engine::reconcile::run(&pool, None, "test").await.unwrap();
    assert_eq!(storage(&report), 1, "{:?}", report.discrepancies);
}
