//! Periodic work runs once per interval across processes, and old evidence is pruned.

use std::sync::Arc;
use std::time::Duration;

use engine::maintenance::{prune_evidence, MaintenanceConfig};
use engine::periodic::take_turn;
use engine::queue::hooks::NoHooks;
use engine::queue::policy::retry::RetryPolicy;
use engine::testing::wider_pool;
use sqlx::PgPool;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn of_many_processes_asking_at_once_exactly_one_gets_the_turn(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    for round in 0..3 {
        let asks = (0..16).map(|n| {
            let pool = pool.clone();
            tokio::spawn(async move {
                take_turn(&pool, "reconciliation", Duration::from_millis(300), &format!("process {n}")).await.unwrap()
            })
        });
        let turns = futures::future::join_all(asks).await.into_iter().filter(|t| *t.as_ref().unwrap()).count();
        assert_eq!(turns, 1, "round {round}");
        // Within the interval nobody gets another turn; after it, one does again.
        assert!(!take_turn(&pool, "reconciliation", Duration::from_millis(300), "late").await.unwrap());
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
    // Another task keeps its own clock.
    assert!(take_turn(&pool, "retention", Duration::from_secs(3600), "any").await.unwrap());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn two_processes_write_one_reconciliation_report_per_interval(pool: PgPool) {
    let config = MaintenanceConfig { reconcile_every: Duration::from_secs(1), ..Default::default() };
    // Two processes: two maintenance loops, each with its own connections.
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let own = wider_pool(&pool, 4).await;
                engine::maintenance::run(own, Arc::new(NoHooks), RetryPolicy::default(), config, None).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    for l in &loops {
        l.abort();
    }
    let reports: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reconciliation_reports").fetch_one(&pool).await.unwrap();
    // One a second, the first a second after start: 5 (a timer per process would write 10).
    assert!((4..=6).contains(&reports), "{reports} reports in 5.5 s");
    let gaps: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM finished_at - lag(finished_at) OVER (ORDER BY id))::float8
         FROM reconciliation_reports ORDER BY id OFFSET 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(gaps.iter().all(|g| *g > 0.8), "no two reports in one interval: {gaps:?}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn old_reports_resolved_alerts_audit_entries_and_notices_are_pruned_but_the_newest_report_stays(pool: PgPool) {
    for days_ago in [200, 100, 95] {
        sqlx::query(
            "INSERT INTO reconciliation_reports (started_at, finished_at, actor, checks, discrepancies, found)
             VALUES (now() - make_interval(days => $1), now() - make_interval(days => $1), 'test', '[]', '[]', 0)",
        )
        .bind(days_ago)
        .execute(&pool)
        .await
        .unwrap();
    }
    for (rule, resolved_days_ago) in [("dlq_depth", Some(100)), ("dlq_growth", Some(10)), ("oldest_wait", None)] {
        sqlx::query(
            "INSERT INTO alert_firings (rule, fired_at, resolved_at, value, threshold, detail)
             VALUES ($1, now() - interval '300 days', now() - make_interval(days => $2), 1, 1, '')",
        )
        .bind(rule)
        .bind(resolved_days_ago)
        .execute(&pool)
        .await
        .unwrap();
    }
    // The audit log and users' notices go by the same age (issue 58).
    let user =
        engine::accounts::users::create_user(&pool, "old@example.com", "password123", engine::accounts::Role::User, 0)
            .await
            .unwrap();
    for days_ago in [120, 10] {
        sqlx::query(
            "INSERT INTO audit_log (at, actor, action) VALUES (now() - make_interval(days => $1), 'cli', 'pause')",
        )
        .bind(days_ago)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO notices (user_id, kind, message, created_at)
             VALUES ($1, 'done', 'your document is done', now() - make_interval(days => $2))",
        )
        .bind(user.id)
        .bind(days_ago)
        .execute(&pool)
        .await
        .unwrap();
    }
    let pruned = prune_evidence(&pool, Duration::from_secs(90 * 86_400)).await.unwrap();
    assert_eq!(pruned, 5, "two old reports, one old resolved alert, an old audit entry and an old notice");
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM audit_log WHERE action = 'pause'),
                (SELECT count(*) FROM notices WHERE kind = 'done')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, (1, 1), "the recent audit entry and notice stay");
    let kept: Vec<i32> = sqlx::query_scalar(
        "SELECT extract(day FROM now() - finished_at)::int FROM reconciliation_reports ORDER BY finished_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(kept, vec![95], "the newest report stays, however old");
    let rules: Vec<String> =
        sqlx::query_scalar("SELECT rule FROM alert_firings ORDER BY rule").fetch_all(&pool).await.unwrap();
    assert_eq!(rules, ["dlq_growth", "oldest_wait"], "recent and still-firing alerts stay");
}
