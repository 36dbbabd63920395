//! Roles against every console function: `support` reads and marks for review, `operator` also
//! acts on jobs and the kill switch, `admin` also the gate, credits and users; a plain user is
//! refused everything. What a role may not do answers 404, as if it did not exist. The table
//! here must name every function under `/api/admin/`, so a new one cannot go unchecked.

use std::collections::BTreeSet;

use app::server::session::WebSettings;
use engine::accounts::users::Permission;
use engine::accounts::{users, Role};
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

/// A logged-in browser for a new account with `role`.
async fn staff(app: &TestApp, role: Role) -> (reqwest::Client, String) {
    let email = format!("{}@example.com", role.as_str());
    users::create_user(&app.pool, &email, "password123", role, 0).await.unwrap();
    let client = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&client, app, "log_in", &[("email", &email), ("password", "password123")]).await;
    assert_eq!(logged_in.status(), StatusCode::OK);
    (client, email)
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn each_role_may_do_exactly_what_its_permissions_say_and_nothing_else_exists_for_it(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (owner_id, token) = app.user_with_token("owner@example.com", 10, 10).await;
    let upload = |n| app.upload(&token, doc(n), None);
    let job_id = |r: reqwest::Response| async move {
        r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string()
    };
    let failed = job_id(upload(1).await).await;
    let waiting = job_id(upload(2).await).await;
    let lead = users::create_user(&app.pool, "lead@example.com", "password123", Role::Operator, 0).await.unwrap();
    let owner = owner_id.to_string();
    // The console's actions change what they act on: each role starts from a failed job with an
    // open review.
    let fresh_failure = || async {
        sqlx::query(
            "UPDATE jobs SET state = 'failed', failure_kind = 'invalid_input', failure_reason = 'no text',
                    finished_at = now(), discarded_at = NULL
             WHERE id = $1::uuid",
        )
        .bind(&failed)
        .execute(&app.pool)
        .await
        .unwrap();
        let subject = engine::queue::reviews::Subject::Job(failed.parse().unwrap());
        let review =
            engine::queue::reviews::mark(&app.pool, &subject, "look at this", lead.id, "lead@example.com").await;
        review.unwrap().id.to_string()
    };
    use Permission::*;
    let review = fresh_failure().await;
    let functions = console_functions(&failed, &review, &owner);
    let listed: BTreeSet<String> = functions.iter().map(|(name, _, _)| format!("/api/{name}")).collect();
    let registered: BTreeSet<String> = leptos::server_fn::axum::server_fn_paths()
        .map(|(path, _)| path.to_string())
        .filter(|path| path.starts_with("/api/admin/"))
        .collect();
    assert_eq!(listed, registered, "every console function has its permission checked here");

    for role in Role::ALL {
        let (client, _) = staff(&app, role).await;
        let review = fresh_failure().await;
        let functions = console_functions(&failed, &review, &owner);
        for (name, args, needs) in &functions {
            let status = call(&client, &app, name, args).await.status();
            if role.may(*needs) {
                assert!(
                    ![StatusCode::NOT_FOUND, StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
                    "{role:?} may {needs:?}, but {name} answered {status}"
                );
            } else {
                assert_eq!(status, StatusCode::NOT_FOUND, "{role:?} may not {needs:?}: {name}");
            }
        }
        // Outside the console: any job's page is open to staff; acting on another's job and
        // opening its document are for operators and admins.
        let detail = call(&client, &app, "job_detail", &[("id", &waiting)]).await.status();
        assert_eq!(detail == StatusCode::OK, role.may(SeeConsole), "{role:?} job_detail: {detail}");
        let original = client.get(app.url(&format!("/api/v1/jobs/{failed}/original"))).send().await.unwrap().status();
        let opens = role.may(OpenDocuments);
        assert_eq!(
            original != StatusCode::NOT_FOUND && original != StatusCode::UNAUTHORIZED,
            opens,
            "{role:?} original: {original}"
        );
        let retry = call(&client, &app, "retry_now", &[("id", &waiting)]).await.status();
        assert_eq!(retry != StatusCode::NOT_FOUND, role.may(ActOnJobs), "{role:?} retry_now: {retry}");
    }
    // Cancelling another's job is acting on it: support cannot, an operator can (on the record).
    let (support, _) = (reqwest::Client::builder().cookie_store(true).build().unwrap(), ());
    call(&support, &app, "log_in", &[("email", "support@example.com"), ("password", "password123")]).await;
    assert_eq!(call(&support, &app, "cancel_job", &[("id", &waiting)]).await.status(), StatusCode::NOT_FOUND);
    let operator = reqwest::Client::builder().cookie_store(true).build().unwrap();
    call(&operator, &app, "log_in", &[("email", "operator@example.com"), ("password", "password123")]).await;
    // An operator puts a waiting job first in line; one not waiting is refused with why.
    assert_eq!(call(&operator, &app, "admin/run_next", &[("id", &waiting)]).await.status(), StatusCode::OK);
    fresh_failure().await;
    let refused = call(&operator, &app, "admin/run_next", &[("id", &failed)]).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let why = refused.text().await.unwrap();
    assert!(why.contains("not_waiting") && why.contains("failed"), "{why}");
    assert_eq!(call(&operator, &app, "cancel_job", &[("id", &waiting)]).await.status(), StatusCode::OK);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_role_change_holds_on_the_next_request_on_every_process_and_is_audited(pool: PgPool) {
    let first = TestApp::spawn(pool, WebSettings::default()).await;
    let second = TestApp::spawn(first.pool.clone(), WebSettings::default()).await;
    let (client, email) = staff(&first, Role::Operator).await;
    assert_eq!(call(&client, &second, "admin/set_processing", &[("enabled", "true")]).await.status(), StatusCode::OK);
    let user = users::find_by_email(&first.pool, &email).await.unwrap();
    engine::accounts::staff::set_role(&first.pool, user.id, Role::Support, "cli").await.unwrap();
    let refused = async {
        for _ in 0..50 {
            if call(&client, &second, "admin/set_processing", &[("enabled", "true")]).await.status()
                == StatusCode::NOT_FOUND
            {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        false
    };
    assert!(refused.await, "the other process still lets a demoted operator act after a second");
    // A change of role ends the account's sessions: the old one reaches nothing, a new log-in
    // holds the new role.
    assert_eq!(call(&client, &second, "admin/overview", &[]).await.status(), StatusCode::NOT_FOUND);
    let again = reqwest::Client::builder().cookie_store(true).build().unwrap();
    let logged_in = call(&again, &second, "log_in", &[("email", &email), ("password", "password123")]).await;
    assert_eq!(logged_in.status(), StatusCode::OK);
    assert_eq!(call(&again, &second, "admin/overview", &[]).await.status(), StatusCode::OK, "support reads");
    assert_eq!(
        call(&again, &second, "admin/set_processing", &[("enabled", "true")]).await.status(),
        StatusCode::NOT_FOUND
    );
    let audited: (String, String, String) = sqlx::query_as(
        "SELECT actor, old_value, new_value FROM audit_log WHERE action = 'role' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&first.pool)
    .await
    .unwrap();
    assert_eq!(audited, ("cli".to_string(), "operator".to_string(), "support".to_string()));
}

/// Every console function with arguments it takes and what it needs: `failed` a failed job's
/// id, `review` an open review's, `owner` a user's.
fn console_functions<'a>(
    failed: &'a str,
    review: &'a str,
    owner: &'a str,
) -> Vec<(&'static str, Vec<(&'static str, &'a str)>, Permission)> {
    use Permission::*;
    vec![
        ("admin/overview", vec![], SeeConsole),
        ("admin/capacity", vec![("days", "7")], SeeConsole),
        ("admin/dlq_groups", vec![], SeeConsole),
        ("admin/dlq_jobs", vec![("kind", "invalid_input"), ("reason", "no text")], SeeConsole),
        ("admin/reconciliation", vec![], SeeConsole),
        ("admin/audit_log", vec![], SeeConsole),
        ("admin/alerts", vec![], SeeConsole),
        ("admin/search_jobs", vec![("filter[state]", "failed")], SeeConsole),
        ("admin/find_user", vec![("email", "owner@example.com")], SeeConsole),
        ("admin/outcomes", vec![("period", "day")], SeeConsole),
        ("admin/processes", vec![], SeeConsole),
        ("admin/admins", vec![], SeeConsole),
        ("admin/reviews", vec![], SeeConsole),
        (
            "admin/mark_review",
            vec![("job", &failed), ("note", "please look"), ("assignee", "lead@example.com")],
            MarkForReview,
        ),
        ("admin/resolve_review", vec![("id", &review), ("note", "looked")], ActOnJobs),
        ("admin/acknowledge", vec![("what", "nothing"), ("id", "1"), ("note", "seen")], ActOnJobs),
        ("admin/bulk_preview", vec![("filter[state]", "failed")], ActOnJobs),
        ("admin/bulk_action", vec![("action", "cancel"), ("filter[state]", "queued"), ("confirmed", "0")], ActOnJobs),
        ("admin/dlq_replay", vec![("kind", "invalid_input"), ("reason", "nothing like it")], ActOnJobs),
        ("admin/dlq_discard", vec![("kind", "invalid_input"), ("reason", "nothing like it")], ActOnJobs),
        ("admin/dlq_replay_job", vec![("id", &failed)], ActOnJobs),
        ("admin/run_next", vec![("id", &failed)], ActOnJobs),
        ("admin/dlq_discard_job", vec![("id", &failed)], ActOnJobs),
        ("admin/reconcile", vec![], ActOnJobs),
        ("admin/set_processing", vec![("enabled", "true")], PauseProcessing),
        ("admin/pause_for", vec![("minutes", "0")], PauseProcessing),
        ("admin/set_gate", vec![("size", "10")], SetGate),
        ("admin/grant_credits", vec![("user_id", &owner), ("amount", "1")], GrantCredits),
        ("admin/set_in_flight_limit", vec![("user_id", &owner), ("limit", "10")], ManageUsers),
    ]
}

/// With several provider deployments, staff see which one answered each of a job's calls (and
/// those it moved on from, and why) and each deployment's state on the capacity page; the
/// document's owner sees none of it.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn staff_see_which_deployment_answered_each_call_and_each_deployments_state(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let owner = users::create_user(&app.pool, "owner@example.com", "password123", Role::User, 10).await.unwrap();
    let (_, token) = app.user_with_token("other@example.com", 10, 10).await;
    let job = app.upload(&token, doc(1), None).await.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    sqlx::query("UPDATE jobs SET owner_id = $1 WHERE id = $2::uuid")
        .bind(owner.id)
        .bind(&job)
        .execute(&app.pool)
        .await
        .unwrap();
    for sql in [
        "INSERT INTO provider_deployments (name, position, kind, model, failures_in_a_row, resting_since, resting_until,
                                           last_failure, limit_input_tokens_per_min, level_input)
         VALUES ('primary', 0, 'anthropic', 'claude-sonnet-4-5', 4, now() - interval '2 minutes',
                 now() + interval '40 seconds', 'the provider could not be reached', 30000, 12000),
                ('second', 1, 'openai', 'gpt-4o', 0, NULL, NULL, NULL, NULL, 'Infinity')",
        "INSERT INTO provider_calls (job_id, deployment, answered, failure)
         VALUES ($1::uuid, 'primary', false, 'the provider could not be reached'), ($1::uuid, 'second', true, NULL)",
    ] {
        sqlx::query(sql).bind(&job).execute(&app.pool).await.unwrap();
    }

    let (support, _) = staff(&app, Role::Support).await;
    let detail: serde_json::Value = call(&support, &app, "job_detail", &[("id", &job)]).await.json().await.unwrap();
    let calls: Vec<(String, bool)> = detail["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["deployment"].as_str().unwrap().to_string(), c["answered"].as_bool().unwrap()))
        .collect();
    assert_eq!(calls, [("primary".to_string(), false), ("second".to_string(), true)]);
    assert_eq!(detail["calls"][0]["failure"], "the provider could not be reached");

    let capacity: serde_json::Value =
        call(&support, &app, "admin/capacity", &[("days", "7")]).await.json().await.unwrap();
    let deployments = capacity["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 2);
    assert_eq!(
        (deployments[0]["name"].as_str(), deployments[0]["failures_in_a_row"].as_i64()),
        (Some("primary"), Some(4))
    );
    assert!(deployments[0]["resting_for_secs"].as_f64().unwrap() > 30.0);
    assert!(deployments[0]["failing_for_secs"].as_f64().unwrap() >= 120.0);
    assert!(deployments[0]["input_tokens_left"].as_f64().unwrap() >= 12_000.0);
    assert!(deployments[1]["resting_for_secs"].is_null() && deployments[1]["input_tokens_left"].is_null());

    let browser = reqwest::Client::builder().cookie_store(true).build().unwrap();
    call(&browser, &app, "log_in", &[("email", "owner@example.com"), ("password", "password123")]).await;
    let own: serde_json::Value = call(&browser, &app, "job_detail", &[("id", &job)]).await.json().await.unwrap();
    assert_eq!(own["calls"], serde_json::json!([]), "the owner sees the document, not the deployments");
}
