//! Scans read by OCR (Tesseract and poppler, the machine's own), in the sandboxed reader, page
//! by page: whole jobs through the engine against the scripted fake provider.

use std::sync::Arc;
use std::time::Duration;

use engine::accounts::admission::{self, Admission, AdmissionConfig, Submission};
use engine::accounts::AccountHooks;
use engine::accounts::{users, Role};
use engine::documents::blobs::Blobs;
use engine::documents::ocr::{self, OcrConfig, OcrSource};
use engine::documents::payload::{DocumentJob, DocumentRef};
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, Preset, ProviderConfig, ProviderKind};
use engine::documents::sandbox::SandboxConfig;
use engine::documents::DocType;
use engine::queue::worker::WorkerPool;
use engine::queue::{self, JobState};
use engine::testing::{
    fast_worker, pdf_of_pages, pdf_with_a_page_that_never_finishes, png_of_lines, wait_for, TestPage,
};
use fakeprovider::{FakeProvider, HostedModel};
use sluice_types::scan::ScanReport;
use sqlx::PgPool;

fn ocr_config() -> OcrConfig {
    OcrConfig::new(vec!["eng".into()])
}

/// The sandboxed reader as this package builds it, reading scans with `ocr`.
fn reader(ocr: OcrConfig) -> SandboxConfig {
    let mut sandbox = SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new());
    sandbox.ocr = Some(Arc::new(ocr));
    sandbox
}

fn lines_of(page: usize) -> Vec<String> {
    vec![format!("Page {page} of the lease."), format!("Clause {page} says the tenant pays on time.")]
}

#[tokio::test]
async fn a_scanned_page_is_read_in_the_sandbox_with_its_confidence() {
    let pdf = pdf_of_pages(&[TestPage::Scanned(lines_of(7))]);
    let config = ocr_config();
    let sandbox = reader(config.clone());
    let read = ocr::read_in_child(&sandbox, &config, OcrSource::PdfPage(1), "eng", pdf.into()).await.unwrap();
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0].skipped, None, "{read:?}");
    assert!(read[0].text.contains("Clause 7 says the tenant pays on time."), "{:?}", read[0].text);
    assert!(read[0].confidence.is_some_and(|c| c > 80.0), "{:?}", read[0].confidence);
}

struct Setup {
    pool: PgPool,
    blobs: Blobs,
    fake: FakeProvider,
    user: i64,
    _dir: engine::testing::TempBlobs,
}

async fn setup(pool: PgPool, name: &str) -> Setup {
    let dir = engine::testing::TempBlobs::new(name);
    let blobs = dir.blobs.clone();
    let fake = FakeProvider::start().await;
    fake.behave_like(HostedModel { first_token_ms: 0, ..HostedModel::default() });
    let user =
        users::create_user(&pool, &format!("{name}@example.com"), "password123", Role::User, 1000).await.unwrap().id;
    Setup { pool, blobs, fake, user, _dir: dir }
}

fn workers(s: &Setup, sandbox: SandboxConfig) -> WorkerPool {
    workers_settling(s, sandbox, None)
}

/// Workers that settle a held price by `prices` (none: not settled).
fn workers_settling(s: &Setup, sandbox: SandboxConfig, prices: Option<engine::sizing::PriceTable>) -> WorkerPool {
    let provider = providers::build(&ProviderConfig {
        kind: ProviderKind::Anthropic,
        base_url: s.fake.base_url(),
        api_key: Some("test-key".into()),
        model: "test-model".into(),
        max_tokens: 16_000,
        timeout: Duration::from_secs(30),
        timeout_per_100k_tokens: Duration::ZERO,
        stream: true,
        stall_timeout: engine::documents::providers::DEFAULT_STALL_TIMEOUT,
    });
    let processor = DocumentProcessor {
        blobs: s.blobs.clone(),
        provider,
        sandbox: Arc::new(sandbox),
        stages: engine::queue::stages::StageLog::new(s.pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::new(s.pool.clone()),
        max_document_tokens: None,
        settle_held: prices.map(|prices| engine::documents::processor::HoldSettlement {
            pool: s.pool.clone(),
            prices,
            economy: None,
        }),
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    WorkerPool::start(s.pool.clone(), fast_worker("scans", 2), Arc::new(processor), Arc::new(AccountHooks))
}

/// Store `bytes` as a document of `doc_type` and admit its translation into German.
async fn submit(s: &Setup, doc_type: DocType, bytes: Vec<u8>) -> uuid::Uuid {
    submit_reading(s, doc_type, bytes, None).await
}

/// [`submit`], its scanned pages read in `language` (none: the operator's first).
async fn submit_reading(s: &Setup, doc_type: DocType, bytes: Vec<u8>, language: Option<&str>) -> uuid::Uuid {
    let key = Blobs::new_key();
    s.blobs.put(&key, bytes.clone().into()).await.unwrap();
    let job = DocumentJob {
        document: DocumentRef {
            key: key.clone(),
            doc_type,
            sha256: key.clone(),
            size: bytes.len() as u64,
            name: Some(format!("scan.{}", doc_type.extension())),
            tokens: None,
            scanned_pages: None,
        },
        preset: Preset::Translate,
        language: Some("German".into()),
        guidance: Default::default(),
        economy: false,
        economy_discount: None,
        document_language: language.map(str::to_string),
    };
    let submission = Submission {
        shared_document: None,
        user_id: s.user,
        payload: serde_json::to_value(job).unwrap(),
        cost: 1,
        est_input_tokens: 1_000,
        content_key: key.clone(),
        client_key: None,
        price_by_size: None,
        lane: Default::default(),
        fingerprint: key,
    };
    match admission::submit(&s.pool, &AdmissionConfig::default(), &submission).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("{other:?}"),
    }
}

async fn wait_terminal(pool: &PgPool, id: uuid::Uuid, within: Duration) -> queue::JobView {
    assert!(wait_for(within, || async { queue::get(pool, id).await.unwrap().state.is_terminal() }).await);
    queue::get(pool, id).await.unwrap()
}

fn report_of(job: &queue::JobView) -> ScanReport {
    serde_json::from_value(job.scan_report.clone().expect("a scan report")).unwrap()
}

/// Where each of `needles` is in `text`, in order: fails if one is missing or out of order.
fn in_order(text: &str, needles: &[String]) {
    let mut from = 0;
    for needle in needles {
        let at = text[from..]
            .find(needle.as_str())
            .unwrap_or_else(|| panic!("{needle:?} missing or out of order in {text}"));
        from += at + needle.len();
    }
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_forty_page_scan_is_read_page_by_page_translated_and_comes_back_in_order(pool: PgPool) {
    let s = setup(pool, "scan-40").await;
    let pages: Vec<TestPage> = (1..=40).map(|n| TestPage::Scanned(lines_of(n))).collect();
    let pdf = pdf_of_pages(&pages);
    let id = submit(&s, DocType::Pdf, pdf).await;
    let workers = workers(&s, reader(ocr_config()));
    // While it is read, the job says which page: seen at least once past the first.
    let seen = wait_for(Duration::from_secs(120), || async {
        queue::get(&s.pool, id).await.unwrap().reading_page.is_some_and(|page| page > 1)
    })
    .await;
    let job = wait_terminal(&s.pool, id, Duration::from_secs(300)).await;
    workers.shutdown().await;
    assert!(seen, "the page being read was shown");
    assert_eq!(job.state, JobState::Done, "{:?}", job.last_error);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    assert!(markdown.contains("[translated]"), "{markdown}");
    let expected: Vec<String> = (1..=40).map(|n| format!("Clause {n} says")).collect();
    in_order(&markdown, &expected);
    let report = report_of(&job);
    assert_eq!(report.pages, 40);
    assert_eq!(report.read.iter().map(|p| p.page).collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
    assert!(report.read.iter().all(|p| p.confidence > 80.0 && !p.low), "{report:?}");
    assert!(report.skipped.is_empty());
    assert_eq!(job.reading_page, None, "the page is cleared once read");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_mixed_pdf_reads_its_text_pages_and_its_scanned_ones_in_order(pool: PgPool) {
    let s = setup(pool, "scan-mixed").await;
    let pdf = pdf_of_pages(&[
        TestPage::Text(lines_of(1)),
        TestPage::Scanned(lines_of(2)),
        TestPage::Text(lines_of(3)),
        TestPage::Scanned(lines_of(4)),
    ]);
    let id = submit(&s, DocType::Pdf, pdf).await;
    let workers = workers(&s, reader(ocr_config()));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(120)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Done, "{:?}", job.last_error);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    in_order(&markdown, &(1..=4).map(|n| format!("Clause {n} says")).collect::<Vec<_>>());
    let report = report_of(&job);
    assert_eq!(report.read.iter().map(|p| p.page).collect::<Vec<_>>(), vec![2, 4], "only the scanned pages by OCR");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_png_photo_of_a_page_is_read(pool: PgPool) {
    let s = setup(pool, "scan-png").await;
    let png = png_of_lines(&["Invoice 2291 from Harbour Supplies.", "Total due within thirty days."]);
    let id = submit(&s, DocType::Png, png).await;
    let workers = workers(&s, reader(ocr_config()));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(60)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Done, "{:?}", job.last_error);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    assert!(markdown.contains("Invoice 2291 from Harbour Supplies."), "{markdown}");
    assert_eq!(report_of(&job).read.len(), 1);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_page_that_never_finishes_is_skipped_with_a_note_and_the_others_are_read(pool: PgPool) {
    let s = setup(pool, "scan-slow").await;
    let pdf = pdf_with_a_page_that_never_finishes(&["First page reads fine."], &["Third page reads fine too."]);
    let id = submit(&s, DocType::Pdf, pdf).await;
    let config = OcrConfig { page_wall_clock: Duration::from_secs(3), ..ocr_config() };
    let started = std::time::Instant::now();
    let workers = workers(&s, reader(config));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(90)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Done, "{:?}", job.last_error);
    assert!(started.elapsed() < Duration::from_secs(60), "bounded by the page's clock: {:?}", started.elapsed());
    let report = report_of(&job);
    assert_eq!(report.read.iter().map(|p| p.page).collect::<Vec<_>>(), vec![1, 3], "{report:?}");
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].page, 2);
    assert!(report.skipped[0].reason.contains("longer than"), "{:?}", report.skipped[0]);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    in_order(&markdown, &["First page reads fine.".to_string(), "Third page reads fine too.".to_string()]);
    // Nothing of the killed page's tools is left running.
    let left = std::process::Command::new("pgrep").args(["-x", "pdftoppm"]).output().unwrap();
    assert!(left.stdout.is_empty(), "a renderer outlived its page: {}", String::from_utf8_lossy(&left.stdout));
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_scans_language_is_detected_from_its_first_page_where_the_operator_allows_it(pool: PgPool) {
    let s = setup(pool, "scan-detect").await;
    let german = |n: usize| {
        vec![
            format!("Seite {n}: Die Mieterin zahlt die Miete am ersten Werktag."),
            "Kündigungen müssen schriftlich erfolgen; Schäden sind unverzüglich zu melden.".to_string(),
        ]
    };
    let pdf = pdf_of_pages(&[TestPage::Scanned(german(1)), TestPage::Scanned(german(2))]);
    let id = submit_reading(&s, DocType::Pdf, pdf, Some("auto")).await;
    let config = OcrConfig { detect_language: true, ..OcrConfig::new(vec!["eng".into(), "deu".into()]) };
    let workers = workers(&s, reader(config));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(90)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Done, "{:?}", job.last_error);
    let report = report_of(&job);
    assert_eq!(report.language, "deu", "German read best as German: {report:?}");
    assert_eq!(report.read.len(), 2);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    assert!(markdown.contains("Kündigungen müssen schriftlich"), "its umlauts read as such: {markdown}");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_scan_whose_pages_cost_more_than_its_hold_is_refused_before_a_page_is_read(pool: PgPool) {
    let s = setup(pool, "scan-hold").await;
    // Admitted at 1 credit (no survey priced it); its 3 pages at 5 credits each are 15.
    let pdf = pdf_of_pages(&(1..=3).map(|n| TestPage::Scanned(lines_of(n))).collect::<Vec<_>>());
    let id = submit(&s, DocType::Pdf, pdf).await;
    let prices = engine::sizing::PriceTable::flat(1).with_scan_page_price(5_000);
    let workers = workers_settling(&s, reader(ocr_config()), Some(prices));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(60)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Failed);
    assert!(
        job.failure_reason.as_deref().unwrap_or("").contains("more than the price held"),
        "{:?}",
        job.failure_reason
    );
    assert_eq!(job.scan_report, None, "no page was read");
    assert_eq!(s.fake.calls(), 0, "nobody was called");
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_document_of_pages_that_all_fail_is_stopped_after_a_few_not_read_to_its_end(pool: PgPool) {
    let s = setup(pool, "scan-bombs").await;
    // 40,000 pixels square: a few seconds of rendering each, past a second of CPU.
    let id = submit(&s, DocType::Pdf, engine::testing::pdf_of_bombs(8, 40_000)).await;
    // Each page is killed at its CPU time (its fault, not a busy server's).
    let config = OcrConfig { page_cpu_secs: 1, ..ocr_config() };
    let workers = workers(&s, reader(config));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(180)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Failed);
    let reason = job.failure_reason.clone().unwrap_or_default();
    assert!(reason.contains("too many of its pages could not be read"), "{reason}");
    assert_eq!(job.failure_kind, Some(engine::FailureKind::InvalidInput), "the document's fault");
    assert_eq!(job.reading_page, Some(4), "stopped at the fourth page of eight");
    assert_eq!(s.fake.calls(), 0);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_retry_uses_the_scans_text_its_first_attempt_read_and_reads_no_page_again(pool: PgPool) {
    let s = setup(pool, "scan-retry").await;
    let pdf = pdf_of_pages(&(1..=3).map(|n| TestPage::Scanned(lines_of(n))).collect::<Vec<_>>());
    let id = submit(&s, DocType::Pdf, pdf).await;
    // The first attempt reads the pages, then the provider refuses it for a while.
    s.fake.push([fakeprovider::Reply::RateLimitedSeconds { seconds: 1 }]);
    let first = workers(&s, reader(ocr_config()));
    assert!(wait_for(Duration::from_secs(60), || async { queue::get(&s.pool, id).await.unwrap().attempts == 1 }).await);
    assert!(
        wait_for(Duration::from_secs(60), || async {
            queue::get(&s.pool, id).await.unwrap().state == JobState::Retrying
        })
        .await
    );
    first.shutdown().await;
    // The next attempt's OCR could read nothing: it must not need to.
    let broken = OcrConfig { tesseract: "/usr/bin/false".into(), ..ocr_config() };
    let second = workers(&s, reader(broken));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(60)).await;
    second.shutdown().await;
    assert_eq!((job.state, job.attempts), (JobState::Done, 2), "{:?}", job.last_error);
    let markdown = job.result.clone().unwrap()["markdown"].as_str().unwrap().to_string();
    in_order(&markdown, &(1..=3).map(|n| format!("Clause {n} says")).collect::<Vec<_>>());
    // Once done, the kept text is forgotten by the upkeep.
    assert_eq!(engine::documents::kept_answers::forget_ended(&s.pool).await.unwrap(), 2, "its answer and its text");
    assert!(engine::documents::kept_answers::kept_scan_text(&s.pool, id).await.unwrap().is_none());
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_image_that_cannot_be_read_is_read_once_not_once_a_frame(pool: PgPool) {
    let s = setup(pool, "scan-tiff").await;
    let id = submit(&s, DocType::Tiff, engine::testing::tiff_of(&[(100, 100); 3], false)).await;
    let workers = workers(&s, reader(ocr_config()));
    let job = wait_terminal(&s.pool, id, Duration::from_secs(60)).await;
    workers.shutdown().await;
    assert_eq!(job.state, JobState::Failed);
    assert!(job.failure_reason.as_deref().unwrap_or("").contains("no text could be read"), "{:?}", job.failure_reason);
    // One run for the whole image: its other frames skipped with it, not read again each.
    let report = report_of(&job);
    assert_eq!(report.skipped.iter().map(|p| p.page).collect::<Vec<_>>(), vec![2, 3], "{report:?}");
    let once = "the image was read once, without this page: the reader gave no answer for it";
    assert!(report.skipped.iter().all(|p| p.reason == once), "{report:?}");
    assert_eq!(s.fake.calls(), 0);
}
