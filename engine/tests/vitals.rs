//! Vital signs and retention on scripted data.

use std::time::Duration;

use engine::queue::policy::drain::DrainEstimate;
use engine::queue::retention::{prune, Retention};
use engine::queue::vitals;
use engine::testing::{job, JobOpts};
use engine::JobState;
use sqlx::PgPool;

/// A job in `state` with explicit times (seconds ago; None = unset).
async fn scripted(pool: &PgPool, state: JobState, accepted_ago: f64, finished_ago: Option<f64>, run_at_ago: f64) {
    job(pool, &JobOpts { state, accepted_ago, finished_ago, run_at_ago: Some(run_at_ago), ..Default::default() }).await;
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn vital_signs_on_scripted_data(pool: PgPool) {
    // Waiting: 3 queued (the oldest due 100 s ago), 1 retry already due, 1 retry due later.
    scripted(&pool, JobState::Queued, 100.0, None, 100.0).await;
    scripted(&pool, JobState::Queued, 30.0, None, 30.0).await;
    scripted(&pool, JobState::Queued, 10.0, None, 10.0).await;
    scripted(&pool, JobState::Retrying, 400.0, None, 5.0).await;
    scripted(&pool, JobState::Retrying, 400.0, None, -60.0).await;
    scripted(&pool, JobState::Running, 20.0, None, 20.0).await;
    // Done in the last minute: acceptance-to-done 10 s, 20 s, 30 s, 40 s.
    for (i, secs) in [10.0, 20.0, 30.0, 40.0].into_iter().enumerate() {
        let finished = 5.0 + i as f64;
        scripted(&pool, JobState::Done, finished + secs, Some(finished), finished + secs).await;
    }
    // Two failed: one in the DLQ, one discarded.
    scripted(&pool, JobState::Failed, 600.0, Some(590.0), 600.0).await;
    scripted(&pool, JobState::Failed, 600.0, Some(590.0), 600.0).await;
    sqlx::query("UPDATE jobs SET discarded_at = now() WHERE id = (SELECT id FROM jobs WHERE state = 'failed' LIMIT 1)")
        .execute(&pool)
        .await
        .unwrap();

    let v = vitals::read(&pool).await.unwrap();
    assert_eq!(v.backlog, 4);
    assert_eq!(v.scheduled_retries, 1);
    assert_eq!(v.running, 1);
    let oldest = v.oldest_waiting_secs.unwrap();
    assert!((99.0..102.0).contains(&oldest), "oldest waiting {oldest}");
    assert_eq!(v.dlq_depth, 1);
    // Intake in the last minute: 3 queued (10 s, 30 s ago), running (20 s), done (accepted 15..49 s ago).
    // accepted within 60 s: queued 30, queued 10, running 20, done 15, 26, 37, 48 = 7 jobs.
    assert!((v.intake.m1 - 7.0 / 60.0).abs() < 1e-9, "intake {:?}", v.intake);
    // Completions: 4 done in the last minute; the failed ones finished ~10 minutes ago.
    assert!((v.completions.m1 - 4.0 / 60.0).abs() < 1e-9);
    assert!((v.completions.m15 - 6.0 / 900.0).abs() < 1e-9);
    assert!((v.time_to_done_p50_secs.unwrap() - 25.0).abs() < 0.5, "{:?}", v.time_to_done_p50_secs);
    assert!((v.time_to_done_p95_secs.unwrap() - 38.5).abs() < 0.5, "{:?}", v.time_to_done_p95_secs);
    // 5-minute rates: intake 7 + the two retrying accepted 400 s ago are outside = 7/300;
    // completions 4/300; intake >= completions, so not draining.
    assert_eq!(v.drain, DrainEstimate::NotDraining);

    let chart = vitals::history(&pool, 60).await.unwrap();
    assert_eq!(chart.len(), 60);
    assert_eq!(chart.iter().map(|m| m.completions).sum::<i64>(), 6);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn draining_queue_reports_an_estimate(pool: PgPool) {
    // 10 waiting (accepted long ago), 30 completed in the last 5 minutes, 0 new intake.
    for _ in 0..10 {
        scripted(&pool, JobState::Queued, 3600.0, None, 3600.0).await;
    }
    for _ in 0..30 {
        scripted(&pool, JobState::Done, 3600.0, Some(60.0), 3600.0).await;
    }
    let v = vitals::read(&pool).await.unwrap();
    // 10 / (30/300 - 0) = 100 s.
    assert_eq!(v.drain, DrainEstimate::DrainsIn(Duration::from_secs(100)));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn retention_prunes_old_done_and_failed_jobs_only(pool: PgPool) {
    let day = 86_400.0;
    scripted(&pool, JobState::Done, 31.0 * day, Some(31.0 * day), 31.0 * day).await; // pruned
    scripted(&pool, JobState::Done, 29.0 * day, Some(29.0 * day), 29.0 * day).await; // kept
    scripted(&pool, JobState::Failed, 91.0 * day, Some(91.0 * day), 91.0 * day).await; // pruned
    scripted(&pool, JobState::Failed, 89.0 * day, Some(89.0 * day), 89.0 * day).await; // kept
    scripted(&pool, JobState::Queued, 200.0 * day, None, 200.0 * day).await; // never pruned while waiting
    let pruned = prune(&pool, Retention::default()).await.unwrap();
    assert_eq!(pruned.len(), 2);
    let left: Vec<String> = sqlx::query_scalar("SELECT state FROM jobs ORDER BY state").fetch_all(&pool).await.unwrap();
    assert_eq!(left, vec!["done", "failed", "queued"]);
    // Shorter retention is configuration.
    let short = Retention {
        done: Duration::from_secs(day as u64),
        failed: Duration::from_secs(day as u64),
        ..Retention::default()
    };
    assert_eq!(prune(&pool, short).await.unwrap().len(), 2);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_documents_age_runs_from_its_acceptance_across_its_parts_but_does_not_close_intake(pool: PgPool) {
    use engine::accounts::admission::{precheck, AdmissionConfig};
    use engine::accounts::{users, Role};
    // Accepted two hours ago, begun in parts, back in line just now (its claim's turn over).
    job(
        &pool,
        &JobOpts { state: JobState::Queued, accepted_ago: 7_200.0, run_at_ago: Some(1.0), ..Default::default() },
    )
    .await;
    sqlx::query("UPDATE jobs SET parts_total = 40, parts_done = 12, parts_stage = 'parts'")
        .execute(&pool)
        .await
        .unwrap();

    let v = vitals::read(&pool).await.unwrap();
    assert!(v.oldest_waiting_secs.unwrap() >= 7_100.0, "shown from its acceptance: {:?}", v.oldest_waiting_secs);
    let seen = engine::alerts::observe(&pool).await.unwrap();
    assert!(seen.oldest_wait_secs.unwrap() >= 7_100.0, "alerted from its acceptance: {:?}", seen.oldest_wait_secs);
    // The intake bound counts waits since jobs fell due: a long document in progress does not
    // refuse everyone's uploads.
    let user = users::create_user(&pool, "u@example.com", "password123", Role::User, 20).await.unwrap();
    let config = AdmissionConfig { max_oldest_wait: Duration::from_secs(1_800), ..AdmissionConfig::default() };
    assert_eq!(precheck(&pool, &config, user.id, 1, 0).await.unwrap(), None);
}

/// Issue 58: the vital signs count documents whose deadline is at risk now (still waiting near
/// their latest start) and deadlines missed in the last day (done late, ended without a result,
/// or not done at their deadline); met and far deadlines, and older misses, are not counted.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn deadlines_at_risk_and_missed_in_the_last_day_are_counted(pool: PgPool) {
    let insert = |state: &'static str, due: &'static str, start: &'static str, finished: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            sqlx::query(&format!(
                "INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, due_by, latest_start, finished_at,
                                   lease_token, lease_expires_at, failure_kind, failure_reason)
                 VALUES (1, '{state}', '{{}}', now() - interval '2 days', now() - interval '2 days',
                         now() + interval '{due}', now() + interval '{start}', {},
                         CASE WHEN '{state}' = 'running' THEN gen_random_uuid() END,
                         CASE WHEN '{state}' = 'running' THEN now() + interval '1 hour' END,
                         CASE WHEN '{state}' = 'failed' THEN 'retries_exhausted' END,
                         CASE WHEN '{state}' = 'failed' THEN 'provider overloaded' END)",
                finished.map_or("NULL".to_string(), |f| format!("now() + interval '{f}'"))
            ))
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    insert("queued", "10 minutes", "2 minutes", None).await; // at risk
    insert("queued", "3 hours", "2 hours", None).await; // on track
    insert("running", "10 minutes", "-1 minute", None).await; // running: not at risk of starting late
    insert("done", "-1 hour", "-2 hours", Some("-2 hours")).await; // met
    insert("done", "-3 hours", "-4 hours", Some("-2 hours")).await; // missed: done late
    insert("failed", "-1 hour", "-2 hours", Some("-3 hours")).await; // missed: no result
    insert("queued", "-5 minutes", "-20 minutes", None).await; // missed: still waiting
    insert("done", "-3 days", "-3 days", Some("-2 days")).await; // missed, but not in the last day
    let v = vitals::read(&pool).await.unwrap();
    assert_eq!((v.deadlines_at_risk, v.deadlines_missed_last_day), (1, 3));
}
