//! What every API test needs: the app on a random port with a fresh database
//! (`#[sqlx::test]`), users with tokens, and requests made as a browser or a program would.

use std::net::SocketAddr;

use app::server::session::WebSettings;
use engine::accounts::{ledger, users, Role};
use engine::testing::wider_pool;
use engine::JobState;
use sqlx::PgPool;

/// The web app on a random loopback port, its pool and its blob folder (removed on drop).
pub struct TestApp {
    pub addr: SocketAddr,
    pub pool: PgPool,
    pub blob_dir: std::path::PathBuf,
    /// The app's own document store (what it knows of it: whether it is full).
    pub blobs: engine::documents::blobs::Blobs,
    /// Every `/api/v1` answer this app gave, checked against its OpenAPI document.
    pub contract: server::testing::contract::ContractCheck,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.blob_dir);
        let violations = self.contract.violations();
        if !violations.is_empty() && !std::thread::panicking() {
            panic!("answers outside the API's OpenAPI document:\n{}", violations.join("\n"));
        }
    }
}

impl TestApp {
    /// Start the app with `settings` on the test's database.
    pub async fn spawn(pool: PgPool, settings: WebSettings) -> TestApp {
        let db = pool.connect_options().get_database().unwrap_or("db").to_string();
        let blob_dir = std::env::temp_dir().join(format!("sluice-test-blobs-{db}"));
        // Database names repeat from run to run: an interrupted run's files must not count here.
        let _ = std::fs::remove_dir_all(&blob_dir);
        TestApp::spawn_storing_in(pool, settings, blob_dir).await
    }

    /// Start the app with `settings`, storing documents in `blob_dir`.
    pub async fn spawn_storing_in(pool: PgPool, settings: WebSettings, blob_dir: std::path::PathBuf) -> TestApp {
        let pool = wider_pool(&pool, 60).await;
        TestApp::spawn_with_pools(pool.clone(), pool.clone(), pool, settings, blob_dir).await
    }

    /// Start the app on its own pools for web requests and for health checks and the console
    /// (`pool` stays the test's own).
    pub async fn spawn_with_pools(
        pool: PgPool,
        requests: PgPool,
        reserved: PgPool,
        settings: WebSettings,
        blob_dir: std::path::PathBuf,
    ) -> TestApp {
        let blobs = engine::documents::blobs::Blobs::local(&blob_dir).unwrap();
        let contract = server::testing::contract::ContractCheck::default();
        let wrap = |router| contract.around(router);
        let addr = server::startup::spawn_web_with_pools(requests, reserved, settings, blobs.clone(), wrap)
            .await
            .expect("the app starts");
        TestApp { addr, pool, blob_dir, blobs, contract }
    }

    /// Files in blob storage (refusals must leave none behind).
    pub fn stored_blobs(&self) -> usize {
        files_under(&self.blob_dir)
    }

    /// An absolute URL for `path` on this app.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A user with `balance` credits and an API token; returns (user id, token).
    pub async fn user_with_token(&self, email: &str, balance: i64, limit: i32) -> (i64, String) {
        let user = users::create_user(&self.pool, email, "password123", Role::User, balance).await.unwrap();
        sqlx::query("UPDATE users SET max_in_flight = $2 WHERE id = $1")
            .bind(user.id)
            .bind(limit)
            .execute(&self.pool)
            .await
            .unwrap();
        let (_, secret) = engine::accounts::tokens::create(&self.pool, user.id, "tests").await.unwrap();
        (user.id, secret)
    }

    /// `GET path` through the REST API as `token`'s holder, its JSON answer.
    pub async fn get_json(&self, token: &str, path: &str) -> serde_json::Value {
        reqwest::Client::new().get(self.url(path)).bearer_auth(token).send().await.unwrap().json().await.unwrap()
    }

    /// Upload `bytes` as `doc.txt` through the REST API.
    pub async fn upload(&self, token: &str, bytes: Vec<u8>, idempotency_key: Option<&str>) -> reqwest::Response {
        let form = reqwest::multipart::Form::new()
            .part("file", reqwest::multipart::Part::bytes(bytes).file_name("doc.txt"))
            .text("preset", "summarize");
        let mut request = reqwest::Client::new().post(self.url("/api/v1/jobs")).bearer_auth(token).multipart(form);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.unwrap()
    }

    /// (balance, in flight, ledger sum, live jobs) of a user.
    pub async fn user_state(&self, user_id: i64) -> (i64, i32, i64, i64) {
        let user = users::get(&self.pool, user_id).await.unwrap();
        let ledger_sum = ledger::ledger_sum(&self.pool, user_id).await.unwrap();
        let live: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE owner_id = $1 AND state <> ALL($2)")
            .bind(user_id)
            .bind([JobState::Done, JobState::Failed, JobState::Canceled])
            .fetch_one(&self.pool)
            .await
            .unwrap();
        (user.balance, user.in_flight, ledger_sum, live)
    }
}

/// A small text document, unique per `n`.
pub fn doc(n: usize) -> Vec<u8> {
    format!("document number {n}\n").into_bytes()
}

/// Call a server function as the browser does (form-encoded, same origin).
pub async fn call(client: &reqwest::Client, app: &TestApp, name: &str, form: &[(&str, &str)]) -> reqwest::Response {
    client
        .post(app.url(&format!("/api/{name}")))
        .header("Origin", format!("http://{}", app.addr))
        .form(form)
        .send()
        .await
        .unwrap()
}

/// The `sluice_session` cookie a response sets, if any.
pub fn session_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("sluice_session="))
        .map(|c| c.split(';').next().unwrap().to_string())
}

/// Upload a named file with a preset through the REST API.
pub async fn upload_file(app: &TestApp, token: &str, name: &str, bytes: Vec<u8>, preset: &str) -> reqwest::Response {
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str("application/pdf").unwrap(),
        )
        .text("preset", preset.to_string());
    reqwest::Client::new().post(app.url("/api/v1/jobs")).bearer_auth(token).multipart(form).send().await.unwrap()
}

/// The document reader the server starts: this package's binary with its `extract` command,
/// reading scans in English with the machine's Tesseract.
pub fn sandbox() -> engine::documents::sandbox::SandboxConfig {
    let mut reader =
        engine::documents::sandbox::SandboxConfig::new(env!("CARGO_BIN_EXE_server").into(), vec!["extract".into()]);
    reader.ocr = Some(std::sync::Arc::new(engine::documents::ocr::OcrConfig::new(vec!["eng".into()])));
    reader
}

/// Run up to `jobs` waiting jobs with the local provider and the server's hooks (one worker step).
pub async fn work(app: &TestApp, jobs: usize) -> Vec<engine::queue::worker::AttemptReport> {
    work_with(app, jobs, &engine::documents::providers::ProviderConfig::default()).await
}

/// [`work`] with another provider (the fake one, for the presets a language model does).
pub async fn work_with(
    app: &TestApp,
    jobs: usize,
    provider: &engine::documents::providers::ProviderConfig,
) -> Vec<engine::queue::worker::AttemptReport> {
    let processor = engine::documents::processor::DocumentProcessor {
        blobs: engine::documents::blobs::Blobs::local(&app.blob_dir).unwrap(),
        provider: engine::documents::providers::build(provider),
        sandbox: std::sync::Arc::new(sandbox()),
        stages: engine::queue::stages::StageLog::new(app.pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::new(app.pool.clone()),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let config = engine::testing::fast_worker("hooks", jobs);
    let hooks = std::sync::Arc::new(engine::hooks::SluiceHooks);
    engine::queue::worker::work_once(&app.pool, &config, std::sync::Arc::new(processor), hooks, jobs as i64)
        .await
        .unwrap()
}

/// Files under `dir`, however deep (0 for a folder that is not there).
pub fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.filter_map(|e| e.ok()).map(|e| if e.path().is_dir() { files_under(&e.path()) } else { 1 }).sum()
        })
        .unwrap_or(0)
}
