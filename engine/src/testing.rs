//! Helpers for tests and benchmarks (the engine's own and other crates'), behind the
//! `testing` feature: a job factory, bulk enqueue, waiting for a condition, worker settings
//! with short timings, and real PDFs made in memory.

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use crate::queue::policy::retry::RetryPolicy;
use crate::queue::worker::WorkerConfig;
use crate::{FailureKind, JobState};

/// A job as a test wants it, like River's `testfactory.Job`: every field has a plain default,
/// times are given as "seconds ago" (negative = in the future).
#[derive(Clone, Debug)]
pub struct JobOpts {
    pub owner_id: i64,
    pub state: JobState,
    pub payload: Value,
    pub cost: i32,
    pub attempts: i32,
    pub accepted_ago: f64,
    /// When it is (or was) due; defaults to `accepted_ago`.
    pub run_at_ago: Option<f64>,
    /// Defaults to unset; set it for done and failed jobs.
    pub finished_ago: Option<f64>,
    /// For failed jobs; defaults to `retries_exhausted` with a reason.
    pub failure: Option<(FailureKind, String)>,
}

impl Default for JobOpts {
    fn default() -> Self {
        JobOpts {
            owner_id: 1,
            state: JobState::Queued,
            payload: Value::Object(Default::default()),
            cost: 0,
            attempts: 0,
            accepted_ago: 0.0,
            run_at_ago: None,
            finished_ago: None,
            failure: None,
        }
    }
}

/// Insert one job exactly as `opts` describes it (running jobs get a lease token, failed ones
/// a failure kind, as the schema demands). Returns its id.
pub async fn job(pool: &PgPool, opts: &JobOpts) -> Uuid {
    let failure = match (&opts.failure, opts.state) {
        (Some(failure), _) => Some(failure.clone()),
        (None, JobState::Failed) => Some((FailureKind::RetriesExhausted, "provider overloaded".to_string())),
        (None, _) => None,
    };
    let lease = (opts.state == JobState::Running).then(|| Uuid::from_u128(rand::random()));
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, cost, attempts, accepted_at, run_at, finished_at,
                           failure_kind, failure_reason, lease_token, lease_expires_at)
         VALUES ($1, $2, $3, $4, $5, now() - make_interval(secs => $6), now() - make_interval(secs => $7),
                 now() - make_interval(secs => $8), $9, $10, $11, CASE WHEN $11::uuid IS NULL THEN NULL
                 ELSE now() + interval '1 hour' END)
         RETURNING id",
    )
    .bind(opts.owner_id)
    .bind(opts.state)
    .bind(&opts.payload)
    .bind(opts.cost)
    .bind(opts.attempts)
    .bind(opts.accepted_ago)
    .bind(opts.run_at_ago.unwrap_or(opts.accepted_ago))
    .bind(opts.finished_ago)
    .bind(failure.as_ref().map(|(kind, _)| *kind))
    .bind(failure.map(|(_, reason)| reason))
    .bind(lease)
    .fetch_one(pool)
    .await
    .expect("insert a job")
}

/// A second pool on the same database with room for `connections` (test pools are small).
pub async fn wider_pool(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .expect("a wider pool")
}

/// Enqueue `n` jobs for `owner` in one transaction; returns their ids in order.
pub async fn enqueue_many(pool: &PgPool, owner: i64, n: usize) -> Vec<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, payload, accepted_at, run_at)
         SELECT $1, jsonb_build_object('n', g), clock_timestamp(), clock_timestamp()
         FROM generate_series(1, $2) g RETURNING id",
    )
    .bind(owner)
    .bind(n as i32)
    .fetch_all(pool)
    .await
    .expect("enqueue")
}

/// How many jobs are in `state`.
pub async fn count_in_state(pool: &PgPool, state: JobState) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1").bind(state).fetch_one(pool).await.expect("count")
}

/// Poll `check` every 20 ms until it is true or `timeout` passes; returns whether it held.
pub async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Worker settings with timings short enough for tests.
pub fn fast_worker(name: &str, concurrency: usize) -> WorkerConfig {
    WorkerConfig {
        name: name.to_string(),
        concurrency,
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(400),
        poll_interval: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(5),
        policy: RetryPolicy {
            max_attempts: 3,
            delays: vec![Duration::from_millis(200), Duration::from_millis(400)],
            max_delay: Duration::from_secs(2),
            max_jitter: Duration::ZERO,
        },
    }
}

/// A real one-page PDF whose text layer holds `lines` (Helvetica), made with lopdf.
pub fn pdf_with_text(lines: &[&str]) -> Vec<u8> {
    let mut ops = vec!["BT".to_string(), "/F1 12 Tf".into(), "72 720 Td".into(), "14 TL".into()];
    for line in lines {
        let escaped = line.replace('\\', "\\\\").replace('(', "\\(").replace(')', "\\)");
        ops.push(format!("({escaped}) Tj T*"));
    }
    ops.push("ET".into());
    build_pdf(ops.join("\n").into_bytes(), false)
}

/// A PDF with a page that has no text (a filled rectangle, as a scan would be an image).
pub fn pdf_without_text() -> Vec<u8> {
    build_pdf(b"0.5 g 72 72 300 300 re f".to_vec(), false)
}

/// A PDF whose trailer names an encryption dictionary (as password-protected files do).
pub fn encrypted_pdf() -> Vec<u8> {
    build_pdf(b"BT /F1 12 Tf 72 720 Td (secret) Tj ET".to_vec(), true)
}

fn build_pdf(content: Vec<u8>, encrypted: bool) -> Vec<u8> {
    use lopdf::{dictionary, Document, Object, Stream};
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! { "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica" });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let content_id = doc.add_object(Stream::new(dictionary! {}, content));
    let page_id = doc.add_object(dictionary! {
        "Type" => "Page", "Parent" => pages_id, "Contents" => content_id, "Resources" => resources_id,
        "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
    });
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! { "Type" => "Pages", "Kids" => vec![page_id.into()], "Count" => 1 }),
    );
    let catalog_id = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog_id);
    if encrypted {
        let encrypt_id = doc.add_object(dictionary! {
            "Filter" => "Standard", "V" => 1, "R" => 2, "P" => -44,
            "O" => Object::string_literal(vec![0u8; 32]), "U" => Object::string_literal(vec![0u8; 32]),
        });
        doc.trailer.set("Encrypt", encrypt_id);
    }
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("write the PDF");
    out
}
