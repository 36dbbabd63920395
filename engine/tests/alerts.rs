//! Alerts and outgoing webhooks on scripted data, with a real HTTP receiver: each rule fires
//! once and resolves once, each transition is delivered once, signed; failed deliveries are
//! retried with backoff and given up; one evaluator at a time; callbacks cannot reach private
//! addresses.

use std::time::Duration;

use engine::alerts::{self, AlertConfig, Rule};
use engine::webhooks::outbox::{self, deliver_due, DeliveryConfig};
use engine::webhooks::signing::verify;
use engine::webhooks::TargetPolicy;
use fakeprovider::receiver::{Received, WebhookReceiver};
use sqlx::PgPool;

const SECRET: &str = "alert-secret";

async fn exec(pool: &PgPool, statements: &[&str]) {
    for sql in statements {
        sqlx::query(sql).execute(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

fn delivery_config() -> DeliveryConfig {
    DeliveryConfig { alert_secret: Some(SECRET.into()), timeout: Duration::from_secs(2), ..DeliveryConfig::default() }
}

/// The signature checks out with the secret, and the body is the alert event.
fn assert_signed_alert(received: &Received, event: &str, rule: Rule) -> serde_json::Value {
    let now = chrono::Utc::now().timestamp();
    assert_eq!(verify(SECRET, &received.header("sluice-signature"), &received.body, now, 300), Ok(()));
    let body = received.json();
    assert_eq!(body["event"], event);
    assert_eq!(body["alert"]["rule"], rule.as_str());
    let suffix = if event == "alert.fired" { "fired" } else { "resolved" };
    assert_eq!(received.header("sluice-delivery"), format!("alert:{}:{suffix}", body["alert"]["id"]));
    assert_eq!(body["delivery"], received.header("sluice-delivery"), "the event key is signed too");
    body
}

/// (rule, statements that make it fire and nothing else, statements that resolve it).
fn scripts() -> Vec<(Rule, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        (
            Rule::OldestWait,
            vec![
                "INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, finished_at)
                 VALUES (1, 'done', '{}', now(), now(), now())",
                "INSERT INTO jobs (owner_id, payload, accepted_at, run_at)
                 VALUES (1, '{}', now() - interval '16 minutes', now() - interval '16 minutes')",
            ],
            vec!["DELETE FROM jobs"],
        ),
        (
            Rule::NotDraining,
            vec![
                "INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, finished_at)
                 VALUES (1, 'done', '{}', now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour')",
                "INSERT INTO jobs (owner_id, payload, accepted_at, run_at)
                 VALUES (1, '{}', now() - interval '11 minutes', now() - interval '11 minutes')",
            ],
            vec!["DELETE FROM jobs WHERE state = 'queued'"],
        ),
        (
            Rule::DlqDepth,
            vec!["INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, finished_at, failure_kind, failure_reason)
                  SELECT 1, 'failed', '{}', now() - interval '3 hours', now() - interval '3 hours',
                         now() - interval '2 hours', 'retries_exhausted', 'provider overloaded'
                  FROM generate_series(1, 101)"],
            vec!["UPDATE jobs SET discarded_at = now() WHERE state = 'failed'"],
        ),
        (
            Rule::DlqGrowth,
            vec!["INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, finished_at, failure_kind, failure_reason)
                  SELECT 1, 'failed', '{}', now() - interval '20 minutes', now() - interval '20 minutes',
                         now() - interval '10 minutes', 'invalid_input', 'not a document'
                  FROM generate_series(1, 21)"],
            vec!["UPDATE jobs SET finished_at = now() - interval '2 hours' WHERE state = 'failed'"],
        ),
        (
            Rule::ProviderFailures,
            vec![
                "INSERT INTO job_attempts (id, job_id, attempt, worker, finished_at, outcome, error_class)
                 SELECT gen_random_uuid(), (SELECT id FROM jobs LIMIT 1), g, 'w', now() - interval '1 minute',
                        CASE WHEN g <= 11 THEN 'retry_scheduled' ELSE 'succeeded' END,
                        CASE WHEN g <= 11 THEN 'overloaded' END
                 FROM generate_series(1, 20) g",
                // A document's own fault is not the provider's: these do not count.
                "INSERT INTO job_attempts (id, job_id, attempt, worker, finished_at, outcome, error_class)
                 SELECT gen_random_uuid(), (SELECT id FROM jobs LIMIT 1), g, 'w', now(), 'failed', 'invalid_input'
                 FROM generate_series(1, 50) g",
            ],
            vec!["UPDATE job_attempts SET finished_at = now() - interval '1 hour'"],
        ),
        (
            Rule::DeadlineAtRisk,
            vec![
                // Due in an hour, must start within the hour: not at risk yet.
                "INSERT INTO jobs (owner_id, payload, accepted_at, run_at, due_by, latest_start)
                 VALUES (1, '{}', now(), now(), now() + interval '1 hour', now() + interval '50 minutes')",
                // Must start within two minutes (inside the five-minute lead): at risk.
                "INSERT INTO jobs (owner_id, payload, accepted_at, run_at, due_by, latest_start)
                 VALUES (1, '{}', now(), now(), now() + interval '10 minutes', now() + interval '2 minutes')",
            ],
            // Started: no longer waiting, so no longer at risk of not starting in time.
            vec!["UPDATE jobs SET state = 'running', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour',
                  started_at = now() WHERE due_by IS NOT NULL"],
        ),
        (
            Rule::PrimaryResting,
            vec![
                // The second has failed long; only the first is the primary.
                "INSERT INTO provider_deployments (name, position, kind, resting_since)
                 VALUES ('second', 1, 'openai', now() - interval '1 hour')",
                "INSERT INTO provider_deployments (name, position, kind, resting_since, resting_until, failures_in_a_row)
                 VALUES ('primary', 0, 'anthropic', now() - interval '6 minutes', now() + interval '1 minute', 5)",
            ],
            // Its first answer ends its failing.
            vec!["UPDATE provider_deployments SET resting_since = NULL, resting_until = NULL, failures_in_a_row = 0
                  WHERE name = 'primary'"],
        ),
        (
            Rule::ReconciliationDrift,
            vec!["INSERT INTO reconciliation_reports (started_at, actor, checks, discrepancies, found)
                  VALUES (now(), 'test', '[]', '[]', 3)"],
            vec!["INSERT INTO reconciliation_reports (started_at, actor, checks, discrepancies, found)
                  VALUES (now(), 'test', '[]', '[]', 0)"],
        ),
    ]
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn each_rule_fires_once_and_resolves_once_with_a_signed_webhook_each_time(pool: PgPool) {
    let receiver = WebhookReceiver::start().await;
    // No hold: each script resolves on the next round (the hold has its own unit test).
    let thresholds = engine::alerts::Thresholds { min_firing_secs: 0.0, ..Default::default() };
    let config = AlertConfig { webhook_url: Some(receiver.url("/alerts")), thresholds, ..AlertConfig::default() };
    let delivery = delivery_config();
    let quiet = alerts::evaluate_once(&pool, &config).await.unwrap().expect("no one else evaluates");
    assert!(quiet.fired.is_empty() && quiet.resolved.is_empty(), "an empty queue fires nothing: {quiet:?}");

    let mut expected_deliveries = 0;
    for (rule, fire, resolve) in scripts() {
        exec(&pool, &fire).await;
        let first = alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
        let fired: Vec<Rule> = first.fired.iter().map(|r| r.rule).collect();
        assert_eq!(fired, vec![rule], "{rule:?}'s script fires it alone");
        let firing = alerts::firing(&pool).await.unwrap();
        assert_eq!(firing.len(), 1);
        assert_eq!((firing[0].rule.as_str(), firing[0].threshold), (rule.as_str(), first.fired[0].threshold));
        assert!(firing[0].value > firing[0].threshold, "{rule:?}: shows the value past the threshold");

        let again = alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
        assert!(again.fired.is_empty() && again.still.len() == 1, "{rule:?} fires once, not on every round");

        exec(&pool, &resolve).await;
        let resolved = alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
        assert_eq!(resolved.resolved, vec![rule]);
        assert!(alerts::firing(&pool).await.unwrap().is_empty());
        let quiet = alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
        assert!(quiet.fired.is_empty() && quiet.resolved.is_empty(), "{rule:?} resolves once");

        // Delivered: once on firing, once on resolving, signed (sent side by side, so in any order).
        while deliver_due(&pool, &delivery, 10).await.unwrap() > 0 {}
        expected_deliveries += 2;
        let received = receiver.wait_for(expected_deliveries, Duration::from_secs(5)).await;
        assert_eq!(received.len(), expected_deliveries, "{rule:?}: exactly one delivery per transition");
        let latest = &received[expected_deliveries - 2..];
        let sent = |suffix: &str| latest.iter().find(|r| r.header("sluice-delivery").ends_with(suffix)).expect(suffix);
        let fired = assert_signed_alert(sent(":fired"), "alert.fired", rule);
        let resolved = assert_signed_alert(sent(":resolved"), "alert.resolved", rule);
        assert_eq!(fired["alert"]["id"], resolved["alert"]["id"]);
        assert!(resolved["alert"]["resolved_at"].is_string());
    }
    let history = alerts::recent(&pool, 20).await.unwrap();
    assert_eq!(history.len(), 8);
    assert!(history.iter().all(|f| f.resolved_at.is_some()));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn one_process_evaluates_at_a_time(pool: PgPool) {
    exec(&pool, &scripts()[5].1).await;
    let mut other = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)").bind(alerts::EVALUATOR_LOCK).execute(&mut *other).await.unwrap();
    assert!(alerts::evaluate_once(&pool, &AlertConfig::default()).await.unwrap().is_none());
    assert!(alerts::firing(&pool).await.unwrap().is_empty(), "the round that did not get the lock wrote nothing");
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(alerts::EVALUATOR_LOCK).execute(&mut *other).await.unwrap();
    // Many at once: exactly one firing row (the partial unique index backs the lock up).
    let rounds: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { alerts::evaluate_once(&pool, &AlertConfig::default()).await })
        })
        .collect();
    for round in rounds {
        round.await.unwrap().unwrap();
    }
    assert_eq!(alerts::recent(&pool, 10).await.unwrap().len(), 1);
}

async fn enqueue(pool: &PgPool, key: &str, url: &str, token_id: Option<i64>) {
    let mut tx = pool.begin().await.unwrap();
    outbox::enqueue(&mut tx, key, url, token_id, &serde_json::json!({ "event": "test", "key": key })).await.unwrap();
    tx.commit().await.unwrap();
}

async fn delivery(pool: &PgPool, key: &str) -> (i32, Option<i32>, bool, bool, f64) {
    sqlx::query_as(
        "SELECT attempts, last_status, delivered_at IS NOT NULL, gave_up_at IS NOT NULL,
                extract(epoch FROM next_attempt_at - now())::float8
         FROM webhook_deliveries WHERE event_key = $1",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn failed_deliveries_are_retried_with_backoff_and_given_up_in_the_end(pool: PgPool) {
    let receiver = WebhookReceiver::start().await;
    let config = DeliveryConfig { max_attempts: 3, ..delivery_config() };
    receiver.answer_with([500, 503]);
    enqueue(&pool, "e1", &receiver.url("/a"), None).await;
    enqueue(&pool, "e1", &receiver.url("/a"), None).await; // the same event again: ignored

    assert_eq!(deliver_due(&pool, &config, 10).await.unwrap(), 1);
    let (attempts, status, delivered, gave_up, wait) = delivery(&pool, "e1").await;
    assert_eq!((attempts, status, delivered, gave_up), (1, Some(500), false, false));
    assert!((8.0..=10.5).contains(&wait), "the first retry waits about 10 s, not {wait}");
    assert_eq!(deliver_due(&pool, &config, 10).await.unwrap(), 0, "not due yet");

    // Time passes (or the sender crashed and its lease ran out): another sender takes it.
    exec(&pool, &["UPDATE webhook_deliveries SET next_attempt_at = now()"]).await;
    deliver_due(&pool, &config, 10).await.unwrap();
    let (attempts, _, _, _, wait) = delivery(&pool, "e1").await;
    assert!((18.0..=20.5).contains(&wait) && attempts == 2, "then about 20 s, not {wait}");
    exec(&pool, &["UPDATE webhook_deliveries SET next_attempt_at = now()"]).await;
    deliver_due(&pool, &config, 10).await.unwrap();
    let (attempts, status, delivered, _, _) = delivery(&pool, "e1").await;
    assert_eq!((attempts, status, delivered), (3, Some(200), true), "the third attempt got 200");
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.header("sluice-delivery") == "e1"), "one event key on every retry");

    // A receiver that never answers costs one timeout per attempt, then the delivery is given up.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", silent.local_addr().unwrap());
    enqueue(&pool, "e2", &url, None).await;
    for _ in 0..3 {
        exec(&pool, &["UPDATE webhook_deliveries SET next_attempt_at = now() WHERE event_key = 'e2'"]).await;
        let started = std::time::Instant::now();
        deliver_due(&pool, &config, 10).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(8), "bounded by the timeout");
    }
    let (attempts, _, delivered, gave_up, _) = delivery(&pool, "e2").await;
    assert_eq!((attempts, delivered, gave_up), (3, false, true));
    exec(&pool, &["UPDATE webhook_deliveries SET next_attempt_at = now() WHERE event_key = 'e2'"]).await;
    assert_eq!(deliver_due(&pool, &config, 10).await.unwrap(), 0, "given up for good");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn callbacks_never_reach_private_addresses_unless_allowed(pool: PgPool) {
    let receiver = WebhookReceiver::start().await;
    let user =
        engine::accounts::users::create_user(&pool, "cb@example.com", "password123", engine::accounts::Role::User, 5)
            .await
            .unwrap();
    let (token, _) = engine::accounts::tokens::create(&pool, user.id, "ci").await.unwrap();
    let lab = TargetPolicy { allow_private: true, ..TargetPolicy::default() };
    let registered =
        engine::webhooks::completion::register(&pool, &lab, user.id, token.id, &receiver.url("/done")).await.unwrap();
    assert!(registered.secret.starts_with("whsec_"));
    // Registering a private address under the default policy is refused.
    let refused =
        engine::webhooks::completion::register(&pool, &TargetPolicy::default(), user.id, token.id, &receiver.url("/x"))
            .await;
    assert!(matches!(refused, Err(engine::EngineError::Invalid(_))), "{refused:?}");

    // A name that resolves to loopback is refused where it resolves, at delivery time.
    let by_name = format!("http://localhost:{}/done", receiver.addr.port());
    enqueue(&pool, "to-localhost", &by_name, Some(token.id)).await;
    deliver_due(&pool, &DeliveryConfig { policy: TargetPolicy::default(), ..delivery_config() }, 10).await.unwrap();
    let (_, _, delivered, gave_up, _) = delivery(&pool, "to-localhost").await;
    assert_eq!((delivered, gave_up), (false, true));
    assert!(receiver.received().is_empty(), "nothing reached the private address");

    // Allowed (a lab): delivered, signed with the token's secret.
    enqueue(&pool, "allowed", &by_name, Some(token.id)).await;
    deliver_due(&pool, &DeliveryConfig { policy: lab.clone(), ..delivery_config() }, 10).await.unwrap();
    let received = receiver.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 1);
    let now = chrono::Utc::now().timestamp();
    assert_eq!(
        verify(&registered.secret, &received[0].header("sluice-signature"), &received[0].body, now, 300),
        Ok(())
    );

    // A name that does not resolve (now) is tried again later, not given up.
    enqueue(&pool, "no-such-host", "http://no-such-host.invalid/hook", Some(token.id)).await;
    deliver_due(&pool, &DeliveryConfig { policy: lab.clone(), ..delivery_config() }, 10).await.unwrap();
    let (attempts, _, delivered, gave_up, _) = delivery(&pool, "no-such-host").await;
    assert_eq!((attempts, delivered, gave_up), (1, false, false));

    // A revoked token's deliveries are not sent.
    engine::accounts::tokens::revoke(&pool, user.id, token.id).await.unwrap();
    enqueue(&pool, "revoked", &by_name, Some(token.id)).await;
    deliver_due(&pool, &DeliveryConfig { policy: lab, ..delivery_config() }, 10).await.unwrap();
    assert!(delivery(&pool, "revoked").await.3, "given up");
    assert_eq!(receiver.received().len(), 1);
}

/// One account's flood, over however many tokens, does not delay another account's callback:
/// due deliveries are taken an account at a time. An account's waiting deliveries are bounded
/// whichever token they are for, its tokens are bounded, and ended deliveries are pruned.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_outbox_takes_accounts_in_turn_bounds_each_and_prunes_what_ended(pool: PgPool) {
    use engine::accounts::tokens::{self, MAX_TOKENS_PER_ACCOUNT};
    let receiver = WebhookReceiver::start().await;
    let lab = TargetPolicy { allow_private: true, ..TargetPolicy::default() };
    let config = DeliveryConfig { policy: lab.clone(), ..delivery_config() };
    let mut tokens_of = Vec::new();
    for (email, names) in [("flood@example.com", vec!["f0", "f1", "f2", "f3", "f4"]), ("quiet@example.com", vec!["q"])]
    {
        let user = engine::accounts::users::create_user(&pool, email, "password123", engine::accounts::Role::User, 0)
            .await
            .unwrap();
        let mut tokens = Vec::new();
        for name in names {
            let (token, _) = tokens::create(&pool, user.id, name).await.unwrap();
            engine::webhooks::completion::register(&pool, &lab, user.id, token.id, &receiver.url(&format!("/{name}")))
                .await
                .unwrap();
            tokens.push(token.id);
        }
        tokens_of.push((user.id, tokens));
    }
    let (flooder, flood) = tokens_of[0].clone();
    let quiet = tokens_of[1].1[0];
    // The flood's 40, over five tokens, are older than the quiet account's one: taken a token
    // at a time, the flood's five firsts would come before it.
    for n in 0..40 {
        enqueue(&pool, &format!("flood-{n}"), &receiver.url("/flood"), Some(flood[n % flood.len()])).await;
    }
    exec(&pool, &["UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute'"]).await;
    enqueue(&pool, "quiet-0", &receiver.url("/quiet"), Some(quiet)).await;
    assert_eq!(deliver_due(&pool, &config, 4).await.unwrap(), 4);
    let first: Vec<String> =
        receiver.wait_for(4, Duration::from_secs(5)).await.iter().map(|r| r.header("sluice-delivery")).collect();
    assert!(first.contains(&"quiet-0".to_string()), "the quiet account's turn comes in the first batch: {first:?}");

    // The bound: an account with MAX_PENDING_PER_ACCOUNT waiting gets a new one given up,
    // with why, whichever of its tokens it is for.
    let waiting = outbox::MAX_PENDING_PER_ACCOUNT - 37;
    sqlx::query(
        "INSERT INTO webhook_deliveries (event_key, url, token_id, body)
         SELECT 'bulk-' || n, 'http://127.0.0.1:9/x', $1, '{}' FROM generate_series(1, $2) n",
    )
    .bind(flood[0])
    .bind(waiting)
    .execute(&pool)
    .await
    .unwrap();
    enqueue(&pool, "one-too-many", &receiver.url("/flood"), Some(flood[4])).await;
    let (_, _, delivered, gave_up, _) = delivery(&pool, "one-too-many").await;
    assert_eq!((delivered, gave_up), (false, true), "refused by the account's bound, on another of its tokens");
    let why: String = sqlx::query_scalar("SELECT last_error FROM webhook_deliveries WHERE event_key = 'one-too-many'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(why.contains("waiting for this account"), "{why}");
    enqueue(&pool, "quiet-1", &receiver.url("/quiet"), Some(quiet)).await;
    assert!(!delivery(&pool, "quiet-1").await.3, "another account is not bound by the flood's");

    // Tokens are bounded per account: past the bound, a new one is refused in words until one
    // is revoked.
    for n in flood.len() as i64..MAX_TOKENS_PER_ACCOUNT {
        tokens::create(&pool, flooder, &format!("more-{n}")).await.unwrap();
    }
    let refused = tokens::create(&pool, flooder, "one-more").await;
    assert!(
        matches!(&refused, Err(engine::EngineError::Invalid(why)) if why.contains("at most 20 API tokens")),
        "{refused:?}"
    );
    tokens::revoke(&pool, flooder, flood[1]).await.unwrap();
    tokens::create(&pool, flooder, "one-more").await.unwrap();

    // Pruning: what ended more than the retention ago goes; what waits stays.
    exec(
        &pool,
        &[
            "UPDATE webhook_deliveries SET delivered_at = now() - interval '8 days' WHERE delivered_at IS NOT NULL",
            "UPDATE webhook_deliveries SET gave_up_at = now() - interval '8 days' WHERE gave_up_at IS NOT NULL",
        ],
    )
    .await;
    let pruned = outbox::prune(&pool, Duration::from_secs(7 * 86_400)).await.unwrap();
    assert_eq!(pruned, 5, "four delivered and one given up");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries").fetch_one(&pool).await.unwrap();
    assert_eq!(left, 37 + waiting + 1, "every waiting delivery stays");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_acknowledged_alert_says_who_and_why_and_its_resolving_webhook_carries_it(pool: PgPool) {
    use engine::acks::{acknowledge, Acked};
    let thresholds = engine::alerts::Thresholds { min_firing_secs: 0.0, ..Default::default() };
    let config =
        AlertConfig { webhook_url: Some("http://127.0.0.1:9/alerts".into()), thresholds, ..AlertConfig::default() };
    let (rule, fire, resolve) = scripts().pop().unwrap();
    exec(&pool, &fire).await;
    alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
    let firing = alerts::firing(&pool).await.unwrap().remove(0);
    assert_eq!(firing.rule, rule.as_str());
    assert!(matches!(
        acknowledge(&pool, Acked::Alert(firing.id + 100), "", "x").await,
        Err(engine::error::EngineError::NotFound)
    ));
    assert!(acknowledge(&pool, Acked::Alert(firing.id), &"n".repeat(2001), "x").await.is_err());
    let ack =
        acknowledge(&pool, Acked::Alert(firing.id), "  looking at the ledger  ", "ops@example.com").await.unwrap();
    assert_eq!((ack.by.as_str(), ack.note.as_deref()), ("ops@example.com", Some("looking at the ledger")));
    let shown = alerts::firing(&pool).await.unwrap().remove(0);
    assert_eq!(
        (shown.acked_by.as_deref(), shown.ack_note.as_deref()),
        (Some("ops@example.com"), Some("looking at the ledger"))
    );

    exec(&pool, &resolve).await;
    alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
    let body: serde_json::Value = sqlx::query_scalar("SELECT body FROM webhook_deliveries WHERE event_key = $1")
        .bind(format!("alert:{}:resolved", firing.id))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(body["alert"]["acked_by"], "ops@example.com");
    assert_eq!(body["alert"]["ack_note"], "looking at the ledger");
    assert!(body["alert"]["acked_at"].is_string());

    // A reconciliation report too; the newest report shows it.
    let report = engine::reconcile::latest(&pool).await.unwrap().unwrap();
    assert!(report.acknowledged.is_none());
    acknowledge(&pool, Acked::Report(report.id), "", "lead@example.com").await.unwrap();
    let report = engine::reconcile::latest(&pool).await.unwrap().unwrap();
    let ack = report.acknowledged.unwrap();
    assert_eq!((ack.by.as_str(), ack.note), ("lead@example.com", None));
}

/// Where `needle` is still found: every table of the schema, each row as text.
async fn found_anywhere(pool: &PgPool, needle: &str) -> Vec<String> {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut found = Vec::new();
    for table in tables {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table} t WHERE t::text LIKE $1"))
            .bind(format!("%{needle}%"))
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            found.push(format!("{table}: {n}"));
        }
    }
    found
}

/// An admin who reviewed a job, acknowledged an alert and a report, and was named in an
/// alert leaves no trace of their address once their account is deleted: not in the reviews,
/// the acknowledgements, the alert's detail, nor the alert webhooks' bodies.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_deleted_admins_address_is_erased_from_reviews_acknowledgements_alerts_and_their_webhooks(pool: PgPool) {
    use engine::accounts::{deletion, users, Role};
    use engine::acks::{acknowledge, Acked};
    use engine::queue::reviews::{self, Subject};
    const LEAD: &str = "lead@example.com";
    let lead = users::create_user(&pool, LEAD, "password123", Role::Admin, 0).await.unwrap();
    let owner = users::create_user(&pool, "owner@example.com", "password123", Role::User, 0).await.unwrap();
    let job: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, accepted_at, run_at, finished_at, failure_kind, failure_reason)
         VALUES ($1, 'failed', '{}', now(), now(), now(), 'provider_rejected', 'refused') RETURNING id",
    )
    .bind(owner.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let review = reviews::mark(&pool, &Subject::Job(job), &format!("ask {LEAD} first"), lead.id, LEAD).await.unwrap();
    reviews::resolve_without_action(&pool, review.id, &format!("{LEAD} saw it"), LEAD).await.unwrap();

    let thresholds = engine::alerts::Thresholds { min_firing_secs: 0.0, ..Default::default() };
    let config =
        AlertConfig { webhook_url: Some("http://127.0.0.1:9/alerts".into()), thresholds, ..AlertConfig::default() };
    let (_, fire, resolve) = scripts().pop().unwrap();
    exec(&pool, &fire).await;
    alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
    let firing = alerts::firing(&pool).await.unwrap().remove(0);
    sqlx::query("UPDATE alert_firings SET detail = detail || $2 WHERE id = $1")
        .bind(firing.id)
        .bind(format!(" (paged {LEAD})"))
        .execute(&pool)
        .await
        .unwrap();
    acknowledge(&pool, Acked::Alert(firing.id), &format!("{LEAD} is on it"), LEAD).await.unwrap();
    exec(&pool, &resolve).await;
    alerts::evaluate_once(&pool, &config).await.unwrap().unwrap();
    let report = engine::reconcile::latest(&pool).await.unwrap().unwrap();
    acknowledge(&pool, Acked::Report(report.id), &format!("checked by {LEAD}"), LEAD).await.unwrap();
    for place in ["reviews", "alert_firings", "reconciliation_reports", "webhook_deliveries"] {
        assert!(found_anywhere(&pool, LEAD).await.iter().any(|f| f.starts_with(place)), "{place} names the admin");
    }

    let blobs = engine::testing::TempBlobs::new("erase-admin");
    deletion::delete_account(&pool, &blobs.blobs, lead.id).await.unwrap();
    let left = found_anywhere(&pool, LEAD).await;
    assert!(left.is_empty(), "the address is still in {left:?}");
    let acked_by: Option<String> = sqlx::query_scalar("SELECT acked_by FROM alert_firings WHERE id = $1")
        .bind(firing.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(acked_by.as_deref(), Some(format!("deleted user {}", lead.id).as_str()));
}

/// Each statement an account's deletion runs to erase an address finds its rows by an index:
/// with sequential scans made as dear as the planner allows, none is left in any plan (a
/// table without a usable index would still be scanned whole).
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn erasing_an_address_scans_no_table_whole(pool: PgPool) {
    use engine::accounts::deletion::{
        containing, whole_address_pattern, ACCOUNT_THROTTLE_ROWS, ADDRESS_COLUMNS, ADDRESS_TEXTS,
    };
    const EMAIL: &str = "gone@example.com";
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await.unwrap();
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let (pattern, like) = (whole_address_pattern(EMAIL), containing(EMAIL));
    let mut statements: Vec<String> = ADDRESS_COLUMNS
        .iter()
        .map(|sql| sql.replace("$1", &quote(EMAIL)).replace("$2", &quote("deleted user 1")))
        .collect();
    statements.extend(ADDRESS_TEXTS.iter().map(|sql| {
        sql.replace("$1", &quote(&pattern)).replace("$2", &quote("deleted user 1")).replace("$3", &quote(&like))
    }));
    statements.push(ACCOUNT_THROTTLE_ROWS.replace("$1", &quote("0123456789abcdef")));
    for sql in statements {
        let plan: serde_json::Value = sqlx::query_scalar(&format!("EXPLAIN (FORMAT JSON) {sql}"))
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let plan = plan.to_string();
        // queue_settings is one row.
        let whole = plan.contains("\"Seq Scan\"") && !sql.contains("queue_settings");
        assert!(!whole, "a whole-table scan: {sql}\n{plan}");
    }
}
