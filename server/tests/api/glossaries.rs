//! Issue 57: glossaries saved in an account through the REST API, and a translation's upload
//! carrying a glossary (pasted, saved, or both) and a formality into its job.

use app::server::session::WebSettings;
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::*;

async fn put(app: &TestApp, token: &str, name: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .put(app.url(&format!("/api/v1/glossaries/{name}")))
        .bearer_auth(token)
        .header("content-type", "text/csv")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn get(app: &TestApp, token: &str, path: &str) -> reqwest::Response {
    reqwest::Client::new().get(app.url(path)).bearer_auth(token).send().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_glossary_is_saved_listed_read_and_deleted_and_a_bad_one_is_refused_by_its_line(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("glossary@example.com", 10, 5).await;
    let (_, other) = app.user_with_token("other@example.com", 10, 5).await;
    let saved = put(&app, &token, "contracts", "Supplier,Lieferant\n\"terms, page\",AGB-Seite\n").await;
    assert_eq!(saved.status(), StatusCode::OK);
    let listed: serde_json::Value = get(&app, &token, "/api/v1/glossaries").await.json().await.unwrap();
    assert_eq!(listed[0]["name"], "contracts");
    assert_eq!(listed[0]["entries"], 2);
    let read: serde_json::Value = get(&app, &token, "/api/v1/glossaries/contracts").await.json().await.unwrap();
    assert_eq!(read["entries"][1], serde_json::json!({ "source": "terms, page", "target": "AGB-Seite" }));
    assert_eq!(get(&app, &other, "/api/v1/glossaries/contracts").await.status(), StatusCode::NOT_FOUND, "not theirs");
    // TSV replaces it.
    assert_eq!(put(&app, &token, "contracts", "Supplier\tAnbieter").await.status(), StatusCode::OK);
    let read: serde_json::Value = get(&app, &token, "/api/v1/glossaries/contracts").await.json().await.unwrap();
    assert_eq!(read["entries"].as_array().unwrap().len(), 1);

    for (name, body, says) in [
        ("bad", "Supplier,Lieferant\nBuyer\n", "line 2"),
        ("bad", "a,b\nA,c\n", "given twice"),
        ("bad", "", "no entries"),
        (&"n".repeat(61), "a,b", "1 to 60 characters"),
    ] {
        let refused = put(&app, &token, name, body).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body:?}");
        let message: serde_json::Value = refused.json().await.unwrap();
        assert!(message["message"].as_str().unwrap().contains(says), "{body:?}: {message}");
    }
    let too_big = put(&app, &token, "big", &"term,translation\n".repeat(5_000)).await;
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let deleted = reqwest::Client::new()
        .delete(app.url("/api/v1/glossaries/contracts"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert_eq!(get(&app, &token, "/api/v1/glossaries/contracts").await.status(), StatusCode::NOT_FOUND);
}

async fn upload(app: &TestApp, token: &str, fields: &[(&str, &str)]) -> reqwest::Response {
    let mut form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"The Supplier delivers to the Buyer.".to_vec()).file_name("c.txt"),
    );
    for (name, value) in fields {
        form = form.text(name.to_string(), value.to_string());
    }
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translations_upload_carries_its_glossary_and_formality_and_bad_ones_store_nothing(pool: PgPool) {
    let settings = WebSettings { presets: engine::Preset::ALL.to_vec(), ..WebSettings::default() };
    let app = TestApp::spawn(pool.clone(), settings).await;
    let (user, token) = app.user_with_token("translator@example.com", 20, 5).await;
    assert_eq!(put(&app, &token, "contracts", "Supplier,Lieferant\nBuyer,Käufer").await.status(), StatusCode::OK);
    let accepted = upload(
        &app,
        &token,
        &[
            ("preset", "translate"),
            ("language", "German"),
            ("glossary", "Buyer\tAbnehmer\nparty\tPartei"),
            ("save_glossary_as", "pasted"),
            ("glossary_name", "contracts"),
            ("formality", "formal"),
        ],
    )
    .await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED, "{:?}", accepted.text().await);
    let id = accepted.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM jobs WHERE id = $1::uuid").bind(&id).fetch_one(&pool).await.unwrap();
    // The pasted entries first (theirs win), then the saved one's others.
    assert_eq!(
        payload["guidance"],
        serde_json::json!({
            "glossary": [
                { "source": "Buyer", "target": "Abnehmer" },
                { "source": "party", "target": "Partei" },
                { "source": "Supplier", "target": "Lieferant" },
            ],
            "formality": "formal",
        })
    );
    let pasted: serde_json::Value = get(&app, &token, "/api/v1/glossaries/pasted").await.json().await.unwrap();
    assert_eq!(pasted["entries"].as_array().unwrap().len(), 2, "saved as asked: {pasted}");

    let before = app.user_state(user).await;
    let stored = app.stored_blobs();
    for (fields, says) in [
        (vec![("preset", "translate"), ("glossary_name", "nothing")], "no glossary named"),
        (vec![("preset", "translate"), ("glossary", "Supplier")], "glossary line 1"),
        (vec![("preset", "summarize"), ("glossary", "a,b")], "for translations only"),
        (vec![("preset", "translate"), ("formality", "rude")], "formality should be"),
        (vec![("preset", "translate"), ("save_glossary_as", "empty")], "needs a glossary"),
    ] {
        let refused = upload(&app, &token, &fields).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{fields:?}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(says), "{fields:?}: {body}");
    }
    assert_eq!(app.user_state(user).await, before, "refused uploads charge nothing");
    assert_eq!(app.stored_blobs(), stored, "refused uploads store nothing");

    // An upload refused for want of credits saves no glossary either.
    let (_, broke) = app.user_with_token("broke@example.com", 0, 5).await;
    let refused = upload(
        &app,
        &broke,
        &[("preset", "translate"), ("glossary", "Supplier,Lieferant"), ("save_glossary_as", "kept?")],
    )
    .await;
    assert_eq!(refused.status(), StatusCode::PAYMENT_REQUIRED);
    let listed: serde_json::Value = get(&app, &broke, "/api/v1/glossaries").await.json().await.unwrap();
    assert_eq!(listed, serde_json::json!([]), "nothing saved for a refused upload");
}

/// Issue 57, item 5: one upload, several languages: the document stored once, each language
/// its own job priced on its own; one refused does not undo the others; a repeat finds them.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_translation_into_several_languages_is_a_job_for_each_on_one_stored_document(pool: PgPool) {
    let settings = WebSettings { presets: engine::Preset::ALL.to_vec(), ..WebSettings::default() };
    let app = TestApp::spawn(pool.clone(), settings).await;
    let (user, token) = app.user_with_token("languages@example.com", 20, 10).await;
    let before = app.user_state(user).await;
    let fields = [("preset", "translate"), ("languages", "German, French,Italian")];
    let accepted = upload(&app, &token, &fields).await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let reply: serde_json::Value = accepted.json().await.unwrap();
    let also = reply["also"].as_array().unwrap();
    assert_eq!(also.iter().map(|a| a["language"].as_str().unwrap()).collect::<Vec<_>>(), ["French", "Italian"]);
    let jobs: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT payload->>'language', payload->'document'->>'key', cost FROM jobs WHERE owner_id = $1 ORDER BY accepted_at",
    )
    .bind(user)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(jobs.iter().map(|j| j.0.as_str()).collect::<Vec<_>>(), ["German", "French", "Italian"]);
    assert!(jobs.iter().all(|j| j.1 == jobs[0].1), "one stored document for all three");
    assert_eq!(app.stored_blobs(), 1);
    let each = i64::from(jobs[0].2);
    assert_eq!(reply["charged"].as_i64().unwrap(), 3 * each, "each language priced");
    assert_eq!(app.user_state(user).await.0, before.0 - 3 * each);
    // The same upload again is the same three jobs, nothing charged again.
    let again: serde_json::Value = upload(&app, &token, &fields).await.json().await.unwrap();
    assert_eq!(again["id"], reply["id"]);
    assert_eq!(again["also"][1]["id"], also[1]["id"]);
    assert_eq!(app.user_state(user).await.0, before.0 - 3 * each);

    // Credits for two more: the third language is refused, the two others stand.
    let (poor, poor_token) = app.user_with_token("poor@example.com", 2 * each, 10).await;
    let reply: serde_json::Value =
        upload(&app, &poor_token, &[("preset", "translate"), ("languages", "German, French, Italian")])
            .await
            .json()
            .await
            .unwrap();
    assert!(reply["also"][0]["id"].is_string(), "{reply}");
    assert!(reply["also"][1]["refused"].as_str().unwrap().contains("credits"), "{reply}");
    assert_eq!(app.user_state(poor).await.0, 0);

    let eleven = (0..11).map(|i| format!("Language{i}")).collect::<Vec<_>>().join(",");
    for (fields, says) in [
        (vec![("preset", "translate"), ("languages", eleven.as_str())], "at most 10 languages"),
        (vec![("preset", "translate"), ("languages", "German, german")], "named twice"),
        (vec![("preset", "summarize"), ("languages", "German, French")], "for translations only"),
        (vec![("preset", "translate"), ("language", "German"), ("languages", "French")], "not both"),
        (vec![("preset", "translate"), ("languages", " , ")], "one language or more"),
    ] {
        let refused = upload(&app, &token, &fields).await;
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{fields:?}");
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains(says), "{fields:?}: {body}");
    }
}
