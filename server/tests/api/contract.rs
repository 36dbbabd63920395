//! The OpenAPI contract itself: served, complete, and routed. (Every other API test checks its
//! answers against it through [`TestApp`]'s contract check.)

use crate::helpers::TestApp;
use app::server::session::WebSettings;
use sqlx::PgPool;

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_openapi_document_is_served_and_every_operation_it_describes_is_routed(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let client = reqwest::Client::new();
    let doc: serde_json::Value = client
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let path = path.replace("{id}", "0b6c5f0e-1f1e-4a51-9f0e-0d3c1a2b3c4d").replace("{name}", "contracts");
            operations.push((method.to_uppercase(), path));
        }
    }
    operations.sort();
    let expected = [
        ("DELETE", "/api/v1/glossaries/contracts"),
        ("DELETE", "/api/v1/jobs/{id}"),
        ("DELETE", "/api/v1/webhook"),
        ("GET", "/api/v1/glossaries"),
        ("GET", "/api/v1/glossaries/contracts"),
        ("GET", "/api/v1/jobs/{id}"),
        ("GET", "/api/v1/jobs/{id}/original"),
        ("GET", "/api/v1/jobs/{id}/parts.md"),
        ("GET", "/api/v1/jobs/{id}/result"),
        ("GET", "/api/v1/jobs/{id}/result.md"),
        ("GET", "/api/v1/jobs/{id}/translated"),
        ("POST", "/api/v1/estimate"),
        ("POST", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs/{id}/cancel"),
        ("POST", "/api/v1/jobs/{id}/run-again"),
        ("PUT", "/api/v1/glossaries/contracts"),
        ("PUT", "/api/v1/webhook"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(m, p)| (m.to_string(), p.replace("{id}", "0b6c5f0e-1f1e-4a51-9f0e-0d3c1a2b3c4d")))
        .collect();
    assert_eq!(operations, expected);
    // Each described operation reaches its handler: without credentials it answers 401 (not the
    // pages' 404, not 405), and that answer is checked against the document too.
    for (method, path) in &operations {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = client.request(method.clone(), app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 401, "{method} {path}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "unauthenticated");
    }
    assert_eq!(app.contract.checked(), operations.len());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn the_docs_page_is_served_from_the_binary(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let client = reqwest::Client::new();
    let page = client.get(app.url("/api/v1/docs/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    // Its script, styles and the settings naming our document come from the binary itself.
    for asset in ["swagger-ui-bundle.js", "swagger-ui.css", "swagger-initializer.js"] {
        let response = client.get(app.url(&format!("/api/v1/docs/{asset}"))).send().await.unwrap();
        assert_eq!(response.status(), 200, "{asset}");
        let text = response.text().await.unwrap();
        assert!(text.len() > 100, "{asset}");
        if asset == "swagger-initializer.js" {
            assert!(text.contains("/api/v1/openapi.json"), "{text}");
        }
    }
}

/// A run-again body's fields may be null ("the earlier job's"), as the server takes them: the
/// schema says so, so a client (or a fuzzer) sending null is within the contract.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_run_again_bodys_fields_may_be_null_as_the_server_takes_them(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let doc: serde_json::Value = reqwest::get(app.url("/api/v1/openapi.json")).await.unwrap().json().await.unwrap();
    let body = &doc["components"]["schemas"]["RunAgainBody"]["properties"];
    for field in ["preset", "language"] {
        let types = body[field]["type"].as_array().unwrap_or_else(|| panic!("{field}: {}", body[field]));
        assert!(types.contains(&serde_json::json!("null")) && types.contains(&serde_json::json!("string")), "{field}");
    }
    assert!(body["preset"]["enum"].as_array().unwrap().contains(&serde_json::Value::Null));
}
