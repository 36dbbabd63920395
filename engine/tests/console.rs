//! The operator console's rules against a real Postgres: bulk actions on a search (capped,
//! batched, refunds once, audited once), needs-review, retry now, the timed pause, outcomes
//! and cost, acknowledgements and the process list.

use std::sync::Arc;
use std::time::Duration;

use engine::accounts::admission::{self, Admission, AdmissionConfig};
use engine::accounts::{users, Role};
use engine::hooks::SluiceHooks;
use engine::queue::bulk::{self, BulkAction};
use engine::queue::dlq::{self, Selection};
use engine::queue::outcomes::{self, Period};
use engine::queue::reviews::{self, Subject};
use engine::queue::{self, switches, JobSearch, RetriedNow};
use engine::testing::{job, one_credit_document, wider_pool, JobOpts};
use engine::{FailureKind, JobState};
use sqlx::PgPool;
use uuid::Uuid;

async fn audit_entries(pool: &PgPool, action: &str) -> Vec<(String, Option<String>, Option<String>)> {
    sqlx::query_as("SELECT actor, subject, new_value FROM audit_log WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// `n` one-credit jobs of a new user, admitted as uploads are (debited, in flight).
async fn admitted_jobs(pool: &PgPool, email: &str, n: usize) -> (i64, Vec<Uuid>) {
    let user = users::create_user(pool, email, "password123", Role::User, n as i64).await.unwrap();
    sqlx::query("UPDATE users SET max_in_flight = $2 WHERE id = $1")
        .bind(user.id)
        .bind(n as i32)
        .execute(pool)
        .await
        .unwrap();
    let config = AdmissionConfig { max_backlog: 1_000_000, ..AdmissionConfig::default() };
    let mut ids = Vec::new();
    for i in 0..n {
        let submission = one_credit_document(user.id, &format!("{email}-{i}"));
        match admission::submit(pool, &config, &submission).await.unwrap() {
            Admission::Accepted { job_id } => ids.push(job_id),
            other => panic!("refused: {other:?}"),
        }
    }
    (user.id, ids)
}

async fn balance(pool: &PgPool, user: i64) -> (i64, i32) {
    sqlx::query_as("SELECT balance, in_flight FROM users WHERE id = $1").bind(user).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_bulk_cancel_of_thousands_refunds_each_job_once_and_is_audited_once(pool: PgPool) {
    let pool = wider_pool(&pool, 12).await;
    let (user, ids) = admitted_jobs(&pool, "many@example.com", 2_500).await;
    let (other, _) = admitted_jobs(&pool, "bystander@example.com", 3).await;
    assert_eq!(balance(&pool, user).await, (0, 2_500));
    let search = JobSearch { text: Some("many@".into()), state: Some(JobState::Queued), ..Default::default() };
    assert_eq!(bulk::preview(&pool, &search, 10_000).await.unwrap(), 2_500);

    // Past the cap, or past what the admin confirmed: refused whole, nothing touched.
    let refused = bulk::run(&pool, &SluiceHooks, &search, BulkAction::Cancel, (2_499, 10_000), "ops@example.com").await;
    assert!(refused.unwrap_err().to_string().contains("narrow"));
    let refused = bulk::run(&pool, &SluiceHooks, &search, BulkAction::Cancel, (10_000, 2_000), "ops@example.com").await;
    assert!(refused.unwrap_err().to_string().contains("more than the 2000 you confirmed"));
    assert_eq!(balance(&pool, user).await, (0, 2_500));
    assert!(audit_entries(&pool, "bulk_cancel").await.is_empty(), "nothing done, nothing recorded");

    // Two admins press at once: one runs (the other is told to wait, or finds nothing left),
    // and every job is canceled and refunded exactly once.
    let (a, b) = tokio::join!(
        bulk::run(&pool, &SluiceHooks, &search, BulkAction::Cancel, (10_000, 2_500), "ops@example.com"),
        bulk::run(&pool, &SluiceHooks, &search, BulkAction::Cancel, (10_000, 2_500), "lead@example.com"),
    );
    let acted: i64 = [&a, &b].iter().filter_map(|r| r.as_ref().ok()).map(|d| d.acted).sum();
    assert_eq!(acted, 2_500, "{a:?} {b:?}");
    for refused in [&a, &b].into_iter().filter_map(|r| r.as_ref().err()) {
        assert!(refused.to_string().contains("another bulk action is running"), "{refused}");
    }
    assert_eq!(balance(&pool, user).await, (2_500, 0), "refunded in full, nothing in flight");
    let refunds: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE kind = 'refund' AND job_id = ANY($1)")
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(refunds, 2_500);
    assert_eq!(balance(&pool, other).await, (0, 3), "the bystander's jobs are not in the search");
    let audited = audit_entries(&pool, "bulk_cancel").await;
    assert!((1..=2).contains(&audited.len()), "one entry per bulk action, not per job: {audited:?}");
    assert!(audited.iter().all(|(_, subject, _)| subject.as_deref() == Some("text \"many@\", state queued")));
    assert_eq!(audited[0].2.as_deref(), Some("2500 of 2500 matched"));
    assert!(audit_entries(&pool, "cancel").await.is_empty());
}

async fn failed_jobs(pool: &PgPool, owner: i64, n: i32, kind: FailureKind, reason: &str) -> Vec<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, finished_at, failure_kind, failure_reason)
         SELECT $1, 'failed', '{}', now(), $3, $4 FROM generate_series(1, $2) RETURNING id",
    )
    .bind(owner)
    .bind(n)
    .bind(kind)
    .bind(reason)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn bulk_replay_and_discard_act_on_the_dead_letters_a_search_matches_and_close_their_reviews(pool: PgPool) {
    let admin = users::create_user(&pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let owner = users::create_user(&pool, "owner@example.com", "password123", Role::User, 0).await.unwrap();
    let timeouts = failed_jobs(&pool, owner.id, 1_200, FailureKind::TimedOut, "took too long").await;
    let rejected = failed_jobs(&pool, owner.id, 800, FailureKind::ProviderRejected, "refused").await;
    reviews::mark(&pool, &Subject::Job(timeouts[0]), "why so slow?", admin.id, &admin.email).await.unwrap();
    let refused_group = Subject::Group { kind: FailureKind::ProviderRejected, reason: "refused".into() };
    reviews::mark(&pool, &refused_group, "all of them?", admin.id, &admin.email).await.unwrap();

    let search = JobSearch { failure_kind: Some(FailureKind::TimedOut), ..Default::default() };
    let done =
        bulk::run(&pool, &SluiceHooks, &search, BulkAction::Replay, (10_000, 1_200), &admin.email).await.unwrap();
    assert_eq!((done.matched, done.acted), (1_200, 1_200));
    assert_eq!(dlq::depth(&pool).await.unwrap(), 800);
    assert!(reviews::open_for(&pool, &refused_group).await.unwrap().is_some(), "its group still has jobs");
    let replays: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'queued' AND replays = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(replays, 1_200);
    let review = reviews::recent(&pool, 10).await.unwrap().into_iter().find(|r| r.job_id == Some(timeouts[0])).unwrap();
    assert_eq!(
        (review.resolution.as_deref(), review.resolved_by.as_deref()),
        (Some("replayed"), Some("ops@example.com"))
    );
    assert!(audit_entries(&pool, "dlq_replay").await.is_empty(), "batches are not audited one by one");

    let search = JobSearch { failure_kind: Some(FailureKind::ProviderRejected), ..Default::default() };
    let done = bulk::run(&pool, &SluiceHooks, &search, BulkAction::Discard, (10_000, 800), &admin.email).await.unwrap();
    assert_eq!((done.matched, done.acted), (800, 800));
    assert_eq!(dlq::depth(&pool).await.unwrap(), 0);
    assert!(reviews::open_for(&pool, &refused_group).await.unwrap().is_none(), "its group emptied: resolved");
    let discarded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1) AND discarded_at IS NOT NULL")
            .bind(&rejected)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(discarded, 800, "they stay failed, out of the DLQ");
    assert_eq!(audit_entries(&pool, "bulk_replay").await.len(), 1);
    assert_eq!(audit_entries(&pool, "bulk_discard").await.len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_review_names_an_admin_shows_who_and_since_when_and_ends_with_who_and_why(pool: PgPool) {
    let admin = users::create_user(&pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let lead = users::create_user(&pool, "lead@example.com", "password123", Role::Admin, 0).await.unwrap();
    let user = users::create_user(&pool, "user@example.com", "password123", Role::User, 0).await.unwrap();
    let jobs = failed_jobs(&pool, user.id, 3, FailureKind::InvalidInput, "not a document").await;
    let group = Subject::Group { kind: FailureKind::InvalidInput, reason: "not a document".into() };

    // Only an admin can be handed a review, only what is in the DLQ can need one, a note is required.
    let not_admin = users::admin_id(&pool, &user.email).await;
    assert!(not_admin.unwrap_err().to_string().contains("admin"));
    assert!(users::admin_id(&pool, "nobody@example.com").await.unwrap_err().to_string().contains("admin"));
    let running = job(&pool, &JobOpts { owner_id: user.id, state: JobState::Running, ..Default::default() }).await;
    assert!(matches!(
        reviews::mark(&pool, &Subject::Job(running), "look", lead.id, &admin.email).await,
        Err(engine::error::EngineError::NotFound)
    ));
    assert!(reviews::mark(&pool, &group, "   ", lead.id, &admin.email).await.is_err());

    let marked = reviews::mark(
        &pool,
        &group,
        "a parser regression?",
        users::admin_id(&pool, "LEAD@example.com").await.unwrap(),
        &admin.email,
    )
    .await
    .unwrap();
    assert_eq!((marked.assignee.as_deref(), marked.marked_by.as_str()), (Some("lead@example.com"), "ops@example.com"));
    assert!(marked.resolved_at.is_none());
    // Marked again: handed over, still one open review.
    let handed = reviews::mark(&pool, &group, "yours now", admin.id, &lead.email).await.unwrap();
    assert_eq!((handed.id, handed.assignee.as_deref()), (marked.id, Some("ops@example.com")));
    reviews::mark(&pool, &Subject::Job(jobs[0]), "this one first", lead.id, &admin.email).await.unwrap();
    let search = JobSearch { needs_review: true, ..Default::default() };
    let (found, _) = queue::search(&pool, &search, 0, 25).await.unwrap();
    assert_eq!(found.iter().map(|f| f.job.id).collect::<Vec<_>>(), vec![jobs[0]], "search finds what needs review");

    let resolved = reviews::resolve_without_action(&pool, handed.id, "fixed upstream", &lead.email).await.unwrap();
    assert_eq!(resolved.resolution.as_deref(), Some("no_action"));
    assert_eq!(
        (resolved.resolved_by.as_deref(), resolved.resolution_note.as_deref()),
        (Some("lead@example.com"), Some("fixed upstream"))
    );
    assert!(matches!(
        reviews::resolve_without_action(&pool, handed.id, "again", &lead.email).await,
        Err(engine::error::EngineError::NotFound)
    ));
    // Discarding the job resolves its review, by whoever discarded it.
    dlq::discard(&pool, &SluiceHooks, &Selection::Job(jobs[0]), &admin.email).await.unwrap();
    let job_review = reviews::recent(&pool, 10).await.unwrap().into_iter().find(|r| r.job_id == Some(jobs[0])).unwrap();
    assert_eq!(
        (job_review.resolution.as_deref(), job_review.resolved_by.as_deref()),
        (Some("discarded"), Some("ops@example.com"))
    );
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_log ORDER BY id").fetch_all(&pool).await.unwrap();
    assert_eq!(actions, ["review", "review", "review", "review_resolved", "dlq_discard"]);
}

/// The kinds and messages of a user's notices about `job`, oldest first.
async fn notices_of(pool: &PgPool, job: Uuid) -> Vec<(String, String)> {
    sqlx::query_as("SELECT kind, message FROM notices WHERE job_id = $1 ORDER BY id")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_owner_sees_an_operator_looking_into_a_failure_and_is_told_of_a_replay_or_a_discard(pool: PgPool) {
    let admin = users::create_user(&pool, "ops@example.com", "password123", Role::Admin, 0).await.unwrap();
    let owner = users::create_user(&pool, "owner@example.com", "password123", Role::User, 0).await.unwrap();
    let refused = failed_jobs(&pool, owner.id, 3, FailureKind::ProviderRejected, "refused").await;
    let timed_out = failed_jobs(&pool, owner.id, 2, FailureKind::TimedOut, "").await;
    let all: Vec<Uuid> = refused.iter().chain(&timed_out).copied().collect();
    assert!(reviews::under_review(&pool, &all).await.unwrap().is_empty(), "nobody is looking yet");

    // One job marked, and a whole group (its reason empty): those are looked into, not the rest.
    reviews::mark(&pool, &Subject::Job(refused[0]), "why?", admin.id, &admin.email).await.unwrap();
    let group = Subject::Group { kind: FailureKind::TimedOut, reason: String::new() };
    let group_review = reviews::mark(&pool, &group, "all slow?", admin.id, &admin.email).await.unwrap();
    let mut looked_into = reviews::under_review(&pool, &all).await.unwrap();
    looked_into.sort();
    let mut expected = vec![refused[0], timed_out[0], timed_out[1]];
    expected.sort();
    assert_eq!(looked_into, expected);
    reviews::resolve_without_action(&pool, group_review.id, "the provider was down", &admin.email).await.unwrap();
    assert_eq!(reviews::under_review(&pool, &all).await.unwrap(), vec![refused[0]], "a resolved review is over");

    // A replay and a discard each tell the owner what happened; the review ends with them.
    dlq::replay(&pool, &SluiceHooks, &Selection::Job(refused[0]), &admin.email).await.unwrap();
    dlq::discard(&pool, &SluiceHooks, &Selection::Job(refused[1]), &admin.email).await.unwrap();
    let replayed = notices_of(&pool, refused[0]).await;
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].0, "replayed");
    assert!(replayed[0].1.contains("running it again, at no cost to you"), "{}", replayed[0].1);
    let discarded = notices_of(&pool, refused[1]).await;
    assert_eq!(discarded.len(), 1);
    assert_eq!(discarded[0].0, "discarded");
    assert!(discarded[0].1.contains("will not be run again"), "{}", discarded[0].1);
    assert!(reviews::under_review(&pool, &all).await.unwrap().is_empty(), "replayed: no longer failed");
    assert!(notices_of(&pool, refused[2]).await.is_empty(), "nothing happened to the third");

    // A job its owner deleted is theirs no more: no notice about it.
    sqlx::query("UPDATE jobs SET deleted_at = now() WHERE id = $1").bind(refused[2]).execute(&pool).await.unwrap();
    dlq::discard(&pool, &SluiceHooks, &Selection::Job(refused[2]), &admin.email).await.unwrap();
    assert!(notices_of(&pool, refused[2]).await.is_empty());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn retry_now_makes_a_waiting_retry_due_without_an_extra_attempt_or_passing_the_gate(pool: PgPool) {
    let lease = Duration::from_secs(30);
    let retrying = job(
        &pool,
        &JobOpts {
            owner_id: 7,
            state: JobState::Retrying,
            attempts: 1,
            run_at_ago: Some(-3600.0),
            ..Default::default()
        },
    )
    .await;
    assert!(queue::claim(&pool, "w", 10, lease).await.unwrap().is_empty(), "not due for an hour");
    // Someone else's job is not found; a queued job is not retrying.
    assert!(matches!(queue::retry_now(&pool, retrying, Some(8), "x").await, Err(engine::error::EngineError::NotFound)));
    let queued = job(&pool, &JobOpts { owner_id: 7, run_at_ago: Some(-3600.0), ..Default::default() }).await;
    assert_eq!(queue::retry_now(&pool, queued, Some(7), "x").await.unwrap(), RetriedNow::NotRetrying(JobState::Queued));

    // The kill switch still holds it back.
    switches::set_processing(&pool, false, "ops").await.unwrap();
    assert_eq!(queue::retry_now(&pool, retrying, Some(7), "owner").await.unwrap(), RetriedNow::Due);
    assert!(queue::claim(&pool, "w", 10, lease).await.unwrap().is_empty(), "paused: not claimed");
    // So does a full gate.
    switches::set_processing(&pool, true, "ops").await.unwrap();
    switches::set_gate_size(&pool, 1, "ops").await.unwrap();
    job(&pool, &JobOpts { owner_id: 9, state: JobState::Running, ..Default::default() }).await;
    assert!(queue::claim(&pool, "w", 10, lease).await.unwrap().is_empty(), "the gate is full");
    sqlx::query("DELETE FROM jobs WHERE state = 'running'").execute(&pool).await.unwrap();

    let claimed = queue::claim(&pool, "w", 10, lease).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), vec![retrying]);
    assert_eq!(
        (claimed[0].attempt, claimed[0].max_attempts),
        (2, 3),
        "its second attempt, as the retry would have been"
    );
    assert!(audit_entries(&pool, "retry_now").await.is_empty(), "the owner's own retry is not in the admin audit");
    // An admin's is.
    let other = job(
        &pool,
        &JobOpts {
            owner_id: 7,
            state: JobState::Retrying,
            attempts: 2,
            run_at_ago: Some(-600.0),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(queue::retry_now(&pool, other, None, "ops@example.com").await.unwrap(), RetriedNow::Due);
    assert_eq!(audit_entries(&pool, "retry_now").await.len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_providers_quota_hold_only_ever_lengthens_an_operators_pause(pool: PgPool) {
    let hold = |secs: u64| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            switches::hold_for_provider(&mut tx, Duration::from_secs(secs)).await.unwrap();
            tx.commit().await.unwrap();
            switches::read(&pool).await.unwrap()
        }
    };
    // Running: held for a minute, by the provider; the other calls refused in the same moment
    // leave the hold as it is (one audit entry, not one per call).
    let held = hold(60).await;
    assert!(!held.processing_enabled);
    assert_eq!(held.processing_changed_by, switches::PROVIDER_HOLD_ACTOR);
    assert!((55.0..=60.0).contains(&held.resume_in_secs.unwrap()), "{held:?}");
    hold(90).await;
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor = $1")
        .bind(switches::PROVIDER_HOLD_ACTOR)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    // An operator pausing over the hold makes the pause theirs (the alert reads who paused).
    assert_eq!(switches::set_processing(&pool, false, "ops").await.unwrap().processing_changed_by, "ops");
    // An operator's pause for ten minutes is not shortened by a hold of one.
    switches::set_processing(&pool, true, "ops").await.unwrap();
    switches::pause_for(&pool, 10, "ops").await.unwrap();
    let kept = hold(60).await;
    assert!(kept.resume_in_secs.unwrap() > 590.0, "{kept:?}");
    assert_eq!(kept.processing_changed_by, "ops");
    // Nor is a pause without an end given one.
    switches::set_processing(&pool, true, "ops").await.unwrap();
    switches::set_processing(&pool, false, "ops").await.unwrap();
    let kept = hold(60).await;
    assert_eq!((kept.processing_enabled, kept.resume_at), (false, None));
    // A shorter timed pause is lengthened to the hold.
    switches::set_processing(&pool, true, "ops").await.unwrap();
    switches::pause_for(&pool, 1, "ops").await.unwrap();
    assert!(hold(300).await.resume_in_secs.unwrap() > 290.0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_timed_pause_resumes_by_itself_after_a_restart_and_a_manual_resume_ends_it_early(pool: PgPool) {
    assert!(switches::pause_for(&pool, 0, "ops").await.is_err());
    let paused = switches::pause_for(&pool, 10, "ops@example.com").await.unwrap();
    assert!(!paused.processing_enabled);
    let left = paused.resume_in_secs.unwrap();
    assert!((590.0..=600.0).contains(&left), "{left}");
    assert!(!switches::resume_if_due(&pool).await.unwrap(), "not yet");
    // The end passes while no process runs; the first maintenance loop to start resumes.
    sqlx::query("UPDATE queue_settings SET resume_at = now() - interval '1 second'").execute(&pool).await.unwrap();
    let config =
        engine::maintenance::MaintenanceConfig { rescue_every: Duration::from_millis(100), ..Default::default() };
    let hooks: Arc<dyn engine::queue::hooks::TerminalHooks> = Arc::new(SluiceHooks);
    let restarted = tokio::spawn(engine::maintenance::run(pool.clone(), hooks, Default::default(), config, None));
    let resumed = engine::testing::wait_for(Duration::from_secs(5), || async {
        switches::read(&pool).await.unwrap().processing_enabled
    })
    .await;
    restarted.abort();
    assert!(resumed);
    let settings = switches::read(&pool).await.unwrap();
    assert_eq!((settings.resume_at, settings.processing_changed_by.as_str()), (None, "timer (the timed pause ended)"));
    let values: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT actor, new_value FROM audit_log WHERE action = 'processing' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(values[0], ("ops@example.com".into(), Some("off for 10 min".into())));
    assert_eq!(values[1].1.as_deref(), Some("on"));

    // A manual resume ends a timed pause; it does not come back to pause again.
    switches::pause_for(&pool, 60, "ops").await.unwrap();
    let resumed = switches::set_processing(&pool, true, "ops").await.unwrap();
    assert!(resumed.processing_enabled && resumed.resume_at.is_none());
    // A pause without an end clears an earlier end.
    switches::pause_for(&pool, 60, "ops").await.unwrap();
    assert_eq!(switches::set_processing(&pool, false, "ops").await.unwrap().resume_at, None);
    // ...and someone's pause without an end is not turned into one that ends by itself.
    let refused = switches::pause_for(&pool, 10, "other@example.com").await.unwrap_err().to_string();
    assert!(refused.contains("already paused without an end (by ops)"), "{refused}");
    assert_eq!(switches::read(&pool).await.unwrap().resume_at, None);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn outcomes_and_cost_add_up_per_hour_and_per_day(pool: PgPool) {
    let user = users::create_user(&pool, "u@example.com", "password123", Role::User, 100).await.unwrap();
    let at = |hours_ago: f64| JobOpts {
        owner_id: user.id,
        finished_ago: Some(hours_ago * 3600.0),
        accepted_ago: hours_ago * 3600.0,
        ..Default::default()
    };
    // This hour: three done, one failed; two hours ago: one failed.
    let mut now_jobs = Vec::new();
    for _ in 0..3 {
        now_jobs.push(job(&pool, &JobOpts { state: JobState::Done, ..at(0.0) }).await);
    }
    let failed_now = job(&pool, &JobOpts { state: JobState::Failed, ..at(0.0) }).await;
    let failed_before = job(&pool, &JobOpts { state: JobState::Failed, ..at(2.0) }).await;
    for (job_id, kind, amount, hours) in [
        (now_jobs[0], "debit", -5, 0.0),
        (failed_now, "debit", -2, 0.0),
        (failed_now, "refund", 2, 0.0),
        (failed_before, "debit", -7, 2.0),
    ] {
        sqlx::query("INSERT INTO ledger (user_id, kind, amount, job_id, at) VALUES ($1, $2, $3, $4, now() - make_interval(secs => $5))")
            .bind(user.id)
            .bind(kind)
            .bind(amount as i64)
            .bind(job_id)
            .bind(hours * 3600.0)
            .execute(&pool)
            .await
            .unwrap();
    }
    for (job_id, outcome, tokens) in
        [(now_jobs[0], "succeeded", 1000), (failed_now, "retry_scheduled", 300), (failed_now, "failed", 200)]
    {
        sqlx::query(
            "INSERT INTO job_attempts (id, job_id, attempt, worker, finished_at, outcome, input_tokens, output_tokens)
             VALUES (gen_random_uuid(), $1, 1, 'w', now(), $2, $3, 10)",
        )
        .bind(job_id)
        .bind(outcome)
        .bind(tokens as i64)
        .execute(&pool)
        .await
        .unwrap();
    }
    // Of the input, 400 tokens this hour were read from the provider's prompt cache.
    sqlx::query("INSERT INTO provider_cache_reads (job_id, cached_input_tokens) VALUES ($1, 250), ($1, 150)")
        .bind(now_jobs[0])
        .execute(&pool)
        .await
        .unwrap();
    // Close to the top of an hour the "now" rows could straddle two hours: compare totals too.
    let hours = outcomes::read(&pool, Period::Hour, 3).await.unwrap();
    assert_eq!(hours.len(), 3);
    assert!(hours[0].start > hours[1].start, "newest first");
    let this_hour = &hours[0];
    assert_eq!((this_hour.done, this_hour.failed), (3, 1));
    assert_eq!((this_hour.credits_charged, this_hour.credits_refunded), (7, 2));
    assert_eq!((this_hour.input_tokens_succeeded, this_hour.output_tokens_succeeded), (1000, 10));
    assert_eq!((this_hour.input_tokens_failed, this_hour.output_tokens_failed), (500, 20), "input and output apart");
    assert_eq!((hours[2].failed, hours[2].credits_charged), (1, 7), "two hours ago");
    assert_eq!(hours[1].done + hours[1].failed, 0, "an empty hour still has its row");
    assert_eq!(outcomes::failure_share(this_hour.done, this_hour.failed), Some(0.25));
    assert_eq!((this_hour.cached_input_tokens, hours[2].cached_input_tokens), (400, 0));

    let days = outcomes::read(&pool, Period::Day, 2).await.unwrap();
    let total = |f: fn(&outcomes::Outcomes) -> i64| days.iter().map(f).sum::<i64>();
    assert_eq!((total(|d| d.done), total(|d| d.failed), total(|d| d.credits_charged)), (3, 2, 14));
    assert!(outcomes::read(&pool, Period::Hour, 169).await.is_err());
    assert!(outcomes::read(&pool, Period::Day, 0).await.is_err());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_process_list_shows_roles_slots_and_running_and_marks_a_silent_one(pool: PgPool) {
    use engine::queue::processes::{self, Announcement};
    let beat = Duration::from_millis(200);
    processes::announce(&pool, &Announcement { name: "web-1", role: "web", slots: 0, running: 0, heartbeat: beat })
        .await
        .unwrap();
    processes::announce(
        &pool,
        &Announcement { name: "worker-1", role: "worker", slots: 24, running: 5, heartbeat: beat },
    )
    .await
    .unwrap();
    processes::announce(
        &pool,
        &Announcement { name: "worker-2", role: "worker", slots: 24, running: 3, heartbeat: beat },
    )
    .await
    .unwrap();
    // worker-2 is killed: it stops beating.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    processes::announce(&pool, &Announcement { name: "web-1", role: "web", slots: 0, running: 0, heartbeat: beat })
        .await
        .unwrap();
    processes::announce(
        &pool,
        &Announcement { name: "worker-1", role: "worker", slots: 24, running: 4, heartbeat: beat },
    )
    .await
    .unwrap();
    let list = processes::list(&pool).await.unwrap();
    let seen: Vec<(&str, &str, i32, i32, bool)> =
        list.iter().map(|p| (p.name.as_str(), p.role.as_str(), p.slots, p.running, p.alive)).collect();
    assert!(seen.contains(&("worker-1", "worker", 24, 4, true)), "{seen:?}");
    assert!(seen.contains(&("web-1", "web", 0, 0, true)), "{seen:?}");
    assert!(seen.contains(&("worker-2", "worker", 24, 3, false)), "{seen:?}");
    assert!(!list.last().unwrap().alive, "stopped ones last");
    assert!(list.iter().all(|p| p.version == processes::VERSION));
    // Only live worker slots count toward the concurrency in effect; a web process has none.
    assert_eq!(processes::live(&pool).await.unwrap(), processes::LiveSlots { processes: 1, slots: 24 });
}
