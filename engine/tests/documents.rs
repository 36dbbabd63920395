//! Documents and providers: PDF text extraction, the HTTP providers against the scripted fake
//! provider (a real HTTP server), and whole jobs through the engine.

use std::sync::Arc;
use std::time::Duration;

use engine::accounts::admission::{self, Admission, AdmissionConfig, Submission};
use engine::accounts::AccountHooks;
use engine::accounts::{users, Role};
use engine::documents::blobs::Blobs;
use engine::documents::extract::extract_text;
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, Preset, Provider, ProviderConfig, ProviderKind, Task};
use engine::documents::sandbox::SandboxConfig;
use engine::documents::DocType;
use engine::queue::policy::retry::{ErrorClass, MAX_RETRY_AFTER};
use engine::queue::worker::WorkerPool;
use engine::queue::{self, JobState};
use engine::testing::{encrypted_pdf, fast_worker, pdf_with_text, pdf_without_text, wait_for};
use engine::FailureKind;
use fakeprovider::{FakeProvider, Reply};
use sluice_types::AttemptOutcome;
use sqlx::PgPool;

#[test]
fn text_comes_out_of_a_real_pdf() {
    let pdf = pdf_with_text(&["Quarterly report", "Revenue grew by 12 percent."]);
    let extracted = extract_text(DocType::Pdf, &pdf).unwrap();
    assert!(extracted.text.contains("Quarterly report"), "{:?}", extracted.text);
    assert!(extracted.text.contains("Revenue grew"));
    assert_eq!(extracted.pages, Some(1));
}

#[test]
fn encrypted_scanned_and_damaged_pdfs_are_invalid_input() {
    for (pdf, words) in [
        (encrypted_pdf(), "encrypted"),
        (pdf_without_text(), "no text layer"),
        (b"%PDF-1.4\nnot really a pdf".to_vec(), "damaged"),
    ] {
        let error = extract_text(DocType::Pdf, &pdf).unwrap_err();
        assert_eq!(error.class, ErrorClass::InvalidInput);
        assert!(error.message.contains(words), "{}", error.message);
    }
}

fn task() -> Task {
    Task {
        preset: Preset::Summarize,
        language: None,
        text: "Some text to summarize.".into(),
        pages: None,
        part: None,
        prompt_tokens: None,
        answer_tokens: None,
        on_written: None,
        guidance: Default::default(),
        finds_terms: false,
    }
}

fn provider(kind: ProviderKind, fake: &FakeProvider, timeout: Duration) -> Arc<dyn Provider> {
    let base_url = match kind {
        ProviderKind::Openai => format!("{}/v1", fake.base_url()),
        _ => fake.base_url(),
    };
    providers::build(&ProviderConfig {
        kind,
        base_url,
        api_key: Some("test-key".into()),
        model: "test-model".into(),
        max_tokens: 256,
        timeout,
        timeout_per_100k_tokens: Duration::ZERO,
        stream: true,
        stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
    })
}

#[tokio::test]
async fn a_calls_timeout_grows_with_its_tokens() {
    let fake = FakeProvider::start().await;
    let config = ProviderConfig {
        kind: ProviderKind::Anthropic,
        base_url: fake.base_url(),
        api_key: Some("test-key".into()),
        timeout: Duration::from_millis(800),
        timeout_per_100k_tokens: Duration::from_secs(4),
        stream: true,
        stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
        ..Default::default()
    };
    assert_eq!(config.call_timeout(50_000, 0), Duration::from_millis(2_800));
    // A long answer (a translation's) gets the time to be written at a slow model's pace.
    assert_eq!(config.call_timeout(0, 4_000), Duration::from_millis(100_800));
    let provider = providers::build(&config);
    // The provider takes 1.5 s: too long for a short text (0.8 s), in time for a 50K-token part.
    fake.push([Reply::Hang { millis: 1_500 }, Reply::Hang { millis: 1_500 }]);
    let short = task();
    assert_eq!(provider.run(&short).await.unwrap_err().class, ErrorClass::Timeout);
    let long = Task { text: "word ".repeat(40_000), ..task() };
    assert!(provider.run(&long).await.is_ok(), "a long call is given longer");
}

#[tokio::test]
async fn http_providers_classify_every_scripted_answer() {
    for kind in [ProviderKind::Anthropic, ProviderKind::Openai] {
        let fake = FakeProvider::start().await;
        let p = provider(kind, &fake, Duration::from_millis(500));
        fake.push([Reply::Success { text: "# Done".into(), input_tokens: 321, output_tokens: 45 }]);
        let ok = p.run(&task()).await.unwrap();
        assert_eq!((ok.text.as_str(), ok.input_tokens, ok.output_tokens), ("# Done", Some(321), Some(45)), "{kind:?}");
        let sent = fake.last_request().unwrap();
        assert_eq!(sent["model"], "test-model");
        assert!(sent["messages"][0]["content"].to_string().contains("Some text to summarize."));
        if kind == ProviderKind::Anthropic {
            assert_eq!(ok.data["rate_limits"]["anthropic-ratelimit-requests-remaining"], "49");
        }

        let cases: Vec<(Reply, ErrorClass, Option<u16>)> = vec![
            (Reply::RateLimitedSeconds { seconds: 7 }, ErrorClass::RateLimited, Some(429)),
            (Reply::RateLimitedDate { seconds_ahead: 30 }, ErrorClass::RateLimited, Some(429)),
            (Reply::Overloaded, ErrorClass::Overloaded, Some(529)),
            (Reply::ServerError, ErrorClass::ServerError, Some(500)),
            (Reply::Hang { millis: 2000 }, ErrorClass::Timeout, None),
            (Reply::BadRequest, ErrorClass::Rejected, Some(400)),
            (Reply::SpendLimit, ErrorClass::QuotaExhausted, Some(429)),
        ];
        for (reply, class, status) in cases {
            fake.push([reply.clone()]);
            let error = p.run(&task()).await.unwrap_err();
            assert_eq!((error.class, error.provider_status), (class, status), "{kind:?} {reply:?}: {}", error.message);
            match reply {
                Reply::RateLimitedSeconds { .. } => assert_eq!(error.retry_after, Some(Duration::from_secs(7))),
                Reply::RateLimitedDate { .. } => {
                    let wait = error.retry_after.expect("an HTTP-date Retry-After");
                    assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
                }
                _ => {}
            }
        }
        // Nothing is retried inside the client: one call per run.
        assert_eq!(fake.calls(), 8, "{kind:?}");
    }
    // Hostile answers: a Retry-After past u64, a far date, a body that never ends, a 401 that
    // quotes the key. Each is bounded, and users read our words only.
    let fake = FakeProvider::start().await;
    let p = provider(ProviderKind::Openai, &fake, Duration::from_secs(10));
    let far_date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(50 * 365 * 86_400));
    for raw in ["18446744073709551615", "99999999999999999999999999", far_date.as_str()] {
        fake.push([Reply::RateLimitedRaw { retry_after: raw.into() }]);
        let error = p.run(&task()).await.unwrap_err();
        assert_eq!(error.retry_after, Some(MAX_RETRY_AFTER), "{raw}");
    }
    fake.push([Reply::EndlessBody]);
    let error = p.run(&task()).await.unwrap_err();
    assert_eq!((error.class, error.message.as_str()), (ErrorClass::ServerError, "the provider's answer was too large"));
    fake.push([Reply::Unauthorized]);
    let error = p.run(&task()).await.unwrap_err();
    assert_eq!((error.class, error.message.as_str()), (ErrorClass::Rejected, "the provider refused the request (401)"));
    let detail = error.detail.expect("the provider's words, for admins");
    assert!(detail.starts_with("Incorrect API key provided: sk-p…."), "{detail}");
    assert!(!detail.contains("Xy89Qw7"), "{detail}");

    // A provider nobody listens on is a connection error.
    let closed = providers::build(&ProviderConfig {
        kind: ProviderKind::Anthropic,
        base_url: "http://127.0.0.1:9".into(),
        ..Default::default()
    });
    assert_eq!(closed.run(&task()).await.unwrap_err().class, ErrorClass::Connection);
}

struct Setup {
    pool: PgPool,
    blobs: Blobs,
    fake: FakeProvider,
    user: i64,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn setup(pool: PgPool, name: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("sluice-blobs-{name}-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let fake = FakeProvider::start().await;
    let user = users::create_user(&pool, &format!("{name}@example.com"), "password123", Role::User, 5).await.unwrap();
    Setup { pool, blobs, fake, user: user.id, _dir: TempDir(dir) }
}

async fn submit_pdf(s: &Setup) -> uuid::Uuid {
    let pdf = pdf_with_text(&["Invoice 42", "Total due: $300.00 by 2026-01-31."]);
    let key = Blobs::new_key();
    s.blobs.put(&key, pdf.clone().into()).await.unwrap();
    let payload = serde_json::json!({
        "document": { "key": key, "type": "pdf", "sha256": "abc", "size": pdf.len(), "name": "invoice.pdf" },
        "preset": "summarize",
    });
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: s.user,
        payload,
        content_key: key.clone(),
        client_key: None,
        fingerprint: key,
    };
    match admission::submit(&s.pool, &AdmissionConfig::default(), &submission).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("{other:?}"),
    }
}

/// The sandboxed document reader, as this package builds it.
fn sandbox() -> SandboxConfig {
    SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new())
}

fn workers(s: &Setup) -> WorkerPool {
    let processor = DocumentProcessor {
        blobs: s.blobs.clone(),
        provider: provider(ProviderKind::Anthropic, &s.fake, Duration::from_secs(5)),
        sandbox: Arc::new(sandbox()),
        stages: engine::queue::stages::StageLog::new(s.pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::disabled(),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    WorkerPool::start(s.pool.clone(), fast_worker("docs", 2), Arc::new(processor), Arc::new(AccountHooks))
}

async fn wait_terminal(pool: &PgPool, id: uuid::Uuid) -> queue::JobView {
    assert!(
        wait_for(Duration::from_secs(20), || async { queue::get(pool, id).await.unwrap().state.is_terminal() }).await
    );
    queue::get(pool, id).await.unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn two_rate_limits_then_success_is_done_on_attempt_three(pool: PgPool) {
    let s = setup(pool, "retry-ok").await;
    s.fake.push([
        Reply::RateLimitedSeconds { seconds: 0 },
        Reply::RateLimitedSeconds { seconds: 0 },
        Reply::Success { text: "# Invoice 42\nDue soon.".into(), input_tokens: 900, output_tokens: 60 },
    ]);
    let id = submit_pdf(&s).await;
    let pool_handle = workers(&s);
    let job = wait_terminal(&s.pool, id).await;
    pool_handle.shutdown().await;
    assert_eq!((job.state, job.attempts), (JobState::Done, 3));
    assert_eq!((job.input_tokens, job.output_tokens), (Some(900), Some(60)));
    let result = job.result.unwrap();
    assert_eq!(result["markdown"], "# Invoice 42\nDue soon.");
    assert_eq!(result["provider"], "anthropic");
    let attempts = queue::attempts(&s.pool, id).await.unwrap();
    let outcomes: Vec<_> = attempts.iter().map(|a| (a.outcome.clone().unwrap(), a.provider_status)).collect();
    assert_eq!(
        outcomes,
        vec![
            (AttemptOutcome::RetryScheduled, Some(429)),
            (AttemptOutcome::RetryScheduled, Some(429)),
            (AttemptOutcome::Succeeded, None)
        ]
    );
    assert_eq!(attempts[2].input_tokens, Some(900));
    assert_eq!(s.fake.calls(), 3);
    let user = users::get(&s.pool, s.user).await.unwrap();
    assert_eq!((user.balance, user.in_flight), (4, 0), "charged once, no refund");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn three_rate_limits_exhaust_the_retries_and_refund_once(pool: PgPool) {
    let s = setup(pool, "retry-fail").await;
    s.fake.push([
        Reply::RateLimitedSeconds { seconds: 0 },
        Reply::Overloaded,
        Reply::RateLimitedSeconds { seconds: 0 },
    ]);
    let id = submit_pdf(&s).await;
    let pool_handle = workers(&s);
    let job = wait_terminal(&s.pool, id).await;
    pool_handle.shutdown().await;
    assert_eq!((job.state, job.failure_kind), (JobState::Failed, Some(FailureKind::RetriesExhausted)));
    assert_eq!(s.fake.calls(), 3, "at most three provider calls");
    assert_eq!(queue::attempts(&s.pool, id).await.unwrap().len(), 3);
    let user = users::get(&s.pool, s.user).await.unwrap();
    assert_eq!((user.balance, user.in_flight), (5, 0), "refunded");
    let refunds: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE job_id = $1 AND kind = 'refund'")
        .bind(id)
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(refunds, 1);
    assert_eq!(engine::accounts::notices::list(&s.pool, s.user, 10).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_encrypted_pdf_fails_at_once_as_invalid_input_without_calling_the_provider(pool: PgPool) {
    let s = setup(pool, "encrypted").await;
    let key = Blobs::new_key();
    s.blobs.put(&key, encrypted_pdf().into()).await.unwrap();
    let payload = serde_json::json!({
        "document": { "key": key, "type": "pdf", "sha256": "e", "size": 1, "name": null }, "preset": "summarize",
    });
    let submission = Submission {
        price_by_size: None,
        lane: Default::default(),
        shared_document: None,
        cost: 1,
        est_input_tokens: 0,
        user_id: s.user,
        payload,
        content_key: "e".into(),
        client_key: None,
        fingerprint: "e".into(),
    };
    let Admission::Accepted { job_id } =
        admission::submit(&s.pool, &AdmissionConfig::default(), &submission).await.unwrap()
    else {
        panic!()
    };
    let pool_handle = workers(&s);
    let job = wait_terminal(&s.pool, job_id).await;
    pool_handle.shutdown().await;
    assert_eq!((job.failure_kind, job.attempts), (Some(FailureKind::InvalidInput), 1));
    assert!(job.failure_reason.unwrap().contains("encrypted"));
    assert_eq!(s.fake.calls(), 0);
}

/// A claimed first attempt at the stored PDF under `key`, to hand a processor directly.
fn claimed_pdf(key: &str, preset: &str) -> queue::ClaimedJob {
    queue::ClaimedJob {
        id: uuid::Uuid::nil(),
        owner_id: 1,
        kind: "document".into(),
        payload: serde_json::json!({
            "document": { "key": key, "type": "pdf", "sha256": "x", "size": 1, "name": "doc.pdf" }, "preset": preset,
        }),
        attempt: 1,
        max_attempts: 3,
        lease_token: uuid::Uuid::nil(),
        est_input_tokens: 41,
        place: None,
        worker: "test".into(),
        deadline: None,
    }
}

#[tokio::test]
async fn the_local_provider_summarises_a_pdf_without_network() {
    let dir = std::env::temp_dir().join(format!("sluice-local-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let key = Blobs::new_key();
    let pdf =
        pdf_with_text(&["Lease agreement", "The tenant pays 1,200 EUR monthly.", "Contact: landlord@example.org"]);
    blobs.put(&key, pdf.into()).await.unwrap();
    let processor = DocumentProcessor {
        blobs,
        provider: providers::build(&ProviderConfig::default()),
        sandbox: Arc::new(sandbox()),
        stages: engine::queue::stages::StageLog::disabled(),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::disabled(),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let job = claimed_pdf(&key, "key_facts");
    let out = engine::queue::worker::Processor::process(&processor, job).await.unwrap();
    let markdown = out.result["markdown"].as_str().unwrap();
    assert!(markdown.contains("1,200 EUR") && markdown.contains("landlord@example.org"), "{markdown}");
    assert_eq!(out.result["provider"], "local");
    assert!(out.input_tokens.unwrap() > 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_running_job_shows_its_stage_and_only_its_lease_holder_can_move_it(pool: PgPool) {
    let s = setup(pool, "stages").await;
    s.fake.push([Reply::Hang { millis: 2_000 }]);
    let job_id = submit_pdf(&s).await;
    let pool_handle = workers(&s);
    let waiting = wait_for(Duration::from_secs(10), || async {
        queue::get(&s.pool, job_id).await.unwrap().current_stage().map(|(stage, _)| stage)
            == Some(queue::JobStage::WaitingForProvider)
    })
    .await;
    assert!(waiting, "while the provider thinks, the job says it is waiting for it");
    let job = queue::get(&s.pool, job_id).await.unwrap();
    assert_eq!(job.stage_pages, Some(1), "the pages read are known by then");
    let (_, since) = job.current_stage().unwrap();
    assert!(since >= job.started_at.unwrap());

    // A worker without the lease cannot move the stage.
    let moved = queue::stages::set_stage(&s.pool, job_id, uuid::Uuid::from_u128(7), queue::JobStage::Writing, None)
        .await
        .unwrap();
    assert!(!moved.written);

    let job = wait_terminal(&s.pool, job_id).await;
    pool_handle.shutdown().await;
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.current_stage(), None, "a finished job has no stage");
    assert_eq!(job.stage, Some(queue::JobStage::Writing), "the last stage it went through was writing the result");
}

#[tokio::test]
async fn a_pdf_whose_text_is_longer_than_the_context_fails_as_invalid_input_before_the_provider() {
    let dir = std::env::temp_dir().join(format!("sluice-context-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let key = Blobs::new_key();
    let lines: Vec<String> = (0..40).map(|i| format!("Line {i} of a long contract with many clauses.")).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    blobs.put(&key, pdf_with_text(&lines).into()).await.unwrap();
    let fake = FakeProvider::start().await;
    let processor = DocumentProcessor {
        blobs,
        provider: provider(ProviderKind::Anthropic, &fake, Duration::from_secs(5)),
        sandbox: Arc::new(sandbox()),
        stages: engine::queue::stages::StageLog::disabled(),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: Some(200),
        parts: engine::queue::parts::PartStore::disabled(),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let job = claimed_pdf(&key, "summarize");
    let error = engine::queue::worker::Processor::process(&processor, job).await.unwrap_err();
    assert_eq!(error.class, ErrorClass::InvalidInput, "permanent: refunded, never retried");
    // 90 % of the context: the provider's tokenizer is not ours.
    assert!(error.message.contains("more than the provider reads or writes at once (180)"), "{}", error.message);
    assert_eq!(fake.calls(), 0, "the provider is not paid for a request it would refuse");
    let _ = std::fs::remove_dir_all(dir);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn canceled_documents_are_released_at_once_and_failed_ones_after_the_inspection_window(pool: PgPool) {
    use engine::testing::{job, JobOpts, TempBlobs};
    let store = TempBlobs::new("release");
    let mut keys = Vec::new();
    let mut jobs = Vec::new();
    // Canceled a second ago; failed a day ago; failed eight days ago; done.
    for (state, finished_ago) in [
        (JobState::Canceled, 1.0),
        (JobState::Failed, 86_400.0),
        (JobState::Failed, 8.0 * 86_400.0),
        (JobState::Done, 1.0),
    ] {
        let key = Blobs::new_key();
        store.blobs.put(&key, b"some text".to_vec().into()).await.unwrap();
        let payload = serde_json::json!({ "document": { "key": key, "type": "plain_text", "sha256": "x", "size": 9, "name": null } });
        let opts = JobOpts {
            state,
            payload,
            finished_ago: Some(finished_ago),
            accepted_ago: finished_ago + 10.0,
            ..Default::default()
        };
        jobs.push(job(&pool, &opts).await);
        keys.push(key);
    }
    let week = Duration::from_secs(7 * 86_400);
    let released = engine::documents::sweep::release_documents(&pool, &store.blobs, week).await.unwrap();
    assert_eq!(released, 2);
    let mut kept = Vec::new();
    for key in &keys {
        kept.push(store.blobs.exists(key).await.unwrap());
    }
    assert_eq!(kept, [false, true, false, true], "the canceled and the old failed documents are gone");
    let marked: Vec<bool> = sqlx::query_scalar(
        "SELECT document_released_at IS NOT NULL FROM jobs WHERE id = ANY($1) ORDER BY array_position($1, id)",
    )
    .bind(&jobs)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(marked, [true, false, true, false]);
    assert_eq!(engine::documents::sweep::release_documents(&pool, &store.blobs, week).await.unwrap(), 0, "once");
}
