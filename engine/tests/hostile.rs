//! Hostile documents: each is parsed in a sandboxed child, so whatever it does to the parser,
//! this process stays up, its memory stays small, and the job fails with a plain reason.

use std::sync::Arc;
use std::time::Duration;

use engine::accounts::admission::{Admission, AdmissionConfig};
use engine::accounts::{users, AccountHooks, Role};
use engine::documents::intake::{self, Intake, UploadOptions};
use engine::documents::processor::DocumentProcessor;
use engine::documents::providers::{self, ProviderConfig};
use engine::documents::sandbox::{extract_in_child, SandboxConfig, TOO_COMPLEX};
use engine::documents::{Blobs, DocType};
use engine::queue::policy::retry::ErrorClass;
use engine::queue::worker::WorkerPool;
use engine::testing::*;
use engine::{FailureKind, JobState};
use sluice_types::settlement::FREE_UNREADABLE_PER_DAY;
use sqlx::PgPool;

fn sandbox() -> SandboxConfig {
    let mut config = SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new());
    config.memory_bytes = 512 << 20;
    config
}

/// What each hostile file is, with the reasons a user may be given for it.
fn hostile_pdfs() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("self-drawing XObject", pdf_self_drawing_xobject()),
        ("300,000 nested arrays", pdf_deeply_nested(300_000)),
        ("decompression bomb (1 GiB from 7 MB)", pdf_decompression_bomb(1 << 30)),
        ("damaged xref", pdf_with_damaged_xref()),
    ]
}

const PLAIN_REASONS: [&str; 3] =
    [TOO_COMPLEX, "the PDF's text could not be read", "the PDF is damaged and cannot be read"];

#[tokio::test]
async fn hostile_pdfs_fail_in_the_child_with_plain_reasons_and_honest_big_ones_are_read() {
    for (name, bytes) in hostile_pdfs() {
        let error = extract_in_child(&sandbox(), DocType::Pdf, bytes.into()).await.expect_err(name);
        assert_eq!(error.class, ErrorClass::InvalidInput, "{name}: never retried");
        assert!(PLAIN_REASONS.contains(&error.message.as_str()), "{name}: {}", error.message);
    }
    let bomb = pdf_decompression_bomb(1 << 30);
    let error = extract_in_child(&sandbox(), DocType::Pdf, bomb.into()).await.unwrap_err();
    assert_eq!(error.message, TOO_COMPLEX, "the bomb is stopped by the child's memory limit");

    let honest = extract_in_child(&sandbox(), DocType::Pdf, pdf_with_pages(3000).into()).await.unwrap();
    assert_eq!(honest.pages, Some(3000));
    assert!(honest.text.contains("Page 2999 says hello."));
    let line = "a. ".repeat(2_000_000);
    let text = extract_in_child(&sandbox(), DocType::PlainText, line.clone().into()).await.unwrap();
    assert_eq!(text.text.len(), line.len());

    // This process never parsed a hostile byte: its peak stays far below the bomb's gigabyte.
    let peak = peak_rss_mib();
    assert!(peak < 300, "peak RSS {peak} MiB");
}

/// A reader started without its limits reads nothing: it never runs unconfined.
#[test]
fn a_reader_without_its_limits_refuses_to_read() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-extract"))
        .arg("text")
        .env_remove(engine::documents::sandbox::LIMITS_VAR)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused before reading");
    assert!(out.stdout.is_empty(), "no answer");
}

#[tokio::test]
async fn the_sandbox_enforces_wall_clock_cpu_and_output_limits() {
    // The document type is appended as an argument: `sh -c CMD sh` takes it as $1 and ignores it.
    let shell = |command: &str| vec!["-c".to_string(), command.to_string(), "sh".to_string()];
    let mut sleeper = SandboxConfig::new("/bin/sh".into(), shell("/bin/sleep 30"));
    sleeper.wall_clock = Duration::from_millis(500);
    let within = tokio::time::timeout(
        Duration::from_secs(20),
        extract_in_child(&sleeper, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")),
    );
    assert_eq!(within.await.expect("the wall clock stops it").unwrap_err().message, TOO_COMPLEX);

    let mut spinner = SandboxConfig::new("/bin/sh".into(), shell("while :; do :; done"));
    spinner.cpu_secs = 1;
    let within = tokio::time::timeout(
        Duration::from_secs(20),
        extract_in_child(&spinner, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")),
    );
    assert_eq!(within.await.expect("the CPU limit stops it").unwrap_err().message, TOO_COMPLEX);

    let mut talker = SandboxConfig::new("/usr/bin/yes".into(), Vec::new());
    talker.max_output_bytes = 1 << 20;
    talker.run_as = None; // `yes` would refuse the flag
    let within = tokio::time::timeout(
        Duration::from_secs(20),
        extract_in_child(&talker, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")),
    );
    assert_eq!(
        within.await.expect("the output limit stops it").unwrap_err().message,
        "the document's text is too large"
    );

    // A reader that fails on its own (an exit code, not a signal) is our fault: transient.
    let failing = SandboxConfig::new("/bin/sh".into(), shell("exit 3"));
    let error = extract_in_child(&failing, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")).await.unwrap_err();
    assert_eq!((error.class, error.message.as_str()), (ErrorClass::ServerError, "the document reader failed"));

    let missing = SandboxConfig::new("/nonexistent/reader".into(), Vec::new());
    let error = extract_in_child(&missing, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")).await.unwrap_err();
    assert_eq!(error.class, ErrorClass::ServerError, "our own fault is transient, not the user's");
}

/// Run the waiting jobs with the local provider and the sandboxed reader until `jobs` have
/// ended (done or failed); whether they did within 90 s.
async fn run_until_ended(pool: &PgPool, blobs: &Blobs, jobs: i64) -> bool {
    let processor = DocumentProcessor {
        blobs: blobs.clone(),
        provider: providers::build(&ProviderConfig::default()),
        sandbox: Arc::new(sandbox()),
        stages: engine::queue::stages::StageLog::new(pool.clone()),
        budget: engine::queue::capacity::Budget::disabled(),
        context_tokens: None,
        parts: engine::queue::parts::PartStore::disabled(),
        max_document_tokens: None,
        settle_held: None,
        token_ratio: engine::documents::ratio::TokenRatio::fixed(1.0),
        writing: Default::default(),
        economy: None,
    };
    let workers =
        WorkerPool::start(pool.clone(), fast_worker("hostile", 4), Arc::new(processor), Arc::new(AccountHooks));
    let all_ended = wait_for(Duration::from_secs(90), || async {
        count_in_state(pool, JobState::Done).await + count_in_state(pool, JobState::Failed).await == jobs
    })
    .await;
    workers.shutdown().await;
    all_ended
}

async fn submit(pool: &PgPool, blobs: &Blobs, user_id: i64, name: &str, bytes: &[u8]) -> uuid::Uuid {
    let chunks = bytes.chunks(64 * 1024).map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c)));
    let stored = intake::receive(blobs, intake::UploadCheck::new(Some(name), 64 << 20), futures::stream::iter(chunks))
        .await
        .unwrap();
    let intake = Intake {
        user_id,
        stored,
        options: UploadOptions::default(),
        client_key: None,
        admission: &AdmissionConfig::default(),
        callback: None,
        expected_run: std::time::Duration::ZERO,
    };
    match intake::submit(pool, blobs, intake).await.unwrap() {
        Admission::Accepted { job_id } => job_id,
        other => panic!("{name}: {other:?}"),
    }
}

/// Hostile files fail cleanly and cost their sender: the first few a day are refunded, the
/// rest charged (and told so), while another user's documents are done meanwhile.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn hostile_jobs_fail_refunded_up_to_the_daily_allowance_while_another_users_jobs_finish(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    let dir = std::env::temp_dir().join(format!("sluice-hostile-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let mallory = users::create_user(&pool, "mallory@example.com", "password123", Role::User, 10).await.unwrap();
    let alice = users::create_user(&pool, "alice@example.com", "password123", Role::User, 10).await.unwrap();
    let mut hostile = Vec::new();
    for (name, bytes) in hostile_pdfs() {
        hostile.push((name, submit(&pool, &blobs, mallory.id, &format!("{name}.pdf"), &bytes).await));
    }
    let mut honest = Vec::new();
    for (i, bytes) in [pdf_with_text(&["Quarterly report.", "Revenue grew."]), b"Plain notes. Nothing odd.".to_vec()]
        .iter()
        .enumerate()
    {
        honest.push(submit(&pool, &blobs, alice.id, &format!("honest-{i}"), bytes).await);
    }
    assert!(run_until_ended(&pool, &blobs, 6).await, "every job ended");

    let mut charged = 0;
    let mut refunded = 0;
    for (name, id) in &hostile {
        let job = engine::queue::get(&pool, *id).await.unwrap();
        if job.refunded == 0 {
            charged += i64::from(job.cost);
        } else {
            assert_eq!(job.refunded, i64::from(job.cost), "{name}: refunded in full or not at all");
            refunded += 1;
        }
        assert_eq!((job.state, job.failure_kind), (JobState::Failed, Some(FailureKind::InvalidInput)), "{name}");
        assert_eq!(job.attempts, 1, "{name}: not retried");
        assert!(
            PLAIN_REASONS.contains(&job.failure_reason.as_deref().unwrap_or("")),
            "{name}: {:?}",
            job.failure_reason
        );
    }
    for id in honest {
        assert_eq!(engine::queue::get(&pool, id).await.unwrap().state, JobState::Done);
    }
    assert_eq!(hostile.len(), 4);
    assert_eq!(refunded, FREE_UNREADABLE_PER_DAY, "the day's allowance, then charged");
    assert!(charged > 0);
    let mallory = users::get(&pool, mallory.id).await.unwrap();
    assert_eq!((mallory.balance, mallory.in_flight), (10 - charged, 0));
    let told: Vec<String> =
        engine::accounts::notices::list(&pool, mallory.id, 10).await.unwrap().into_iter().map(|n| n.message).collect();
    assert_eq!(told.len(), 4);
    assert_eq!(told.iter().filter(|m| m.contains("Charged")).count(), 1, "{told:?}");
    let alice = users::get(&pool, alice.id).await.unwrap();
    assert_eq!((alice.balance, alice.in_flight), (8, 0));
    let report = engine::reconcile::run(&pool, Some(&blobs), "test").await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn documents_no_job_points_at_are_removed_after_their_grace_on_the_record(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("sluice-sweep-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let user = users::create_user(&pool, "sweep@example.com", "password123", Role::User, 5).await.unwrap();
    let kept = submit(&pool, &blobs, user.id, "kept.txt", b"Notes that belong to a job.").await;
    // What a crash between storing and admitting leaves: a stored document and no job.
    let orphan = Blobs::new_key();
    blobs.put(&orphan, bytes::Bytes::from_static(b"left behind")).await.unwrap();
    // What a crash between building a translated file and its job's deletion leaves (issue
    // 55): a translated file of a job that is gone; a live job's stays.
    let gone_translation = Blobs::translated_key(uuid::Uuid::new_v4());
    blobs.put(&gone_translation, bytes::Bytes::from_static(b"translated")).await.unwrap();
    let kept_translation = Blobs::translated_key(kept);
    blobs.put(&kept_translation, bytes::Bytes::from_static(b"translated")).await.unwrap();

    let swept =
        engine::documents::sweep::remove_orphans(&pool, &blobs, Duration::from_secs(3600), "ops").await.unwrap();
    assert_eq!(swept, 0, "nothing is younger than an upload in progress could be");
    let swept = engine::documents::sweep::remove_orphans(&pool, &blobs, Duration::ZERO, "ops").await.unwrap();
    assert_eq!(swept, 2);
    let audited: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, new_value FROM audit_log WHERE action = 'remove_orphans' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audited, vec![("ops".to_string(), "0".to_string()), ("ops".to_string(), "2".to_string())]);
    assert!(matches!(blobs.get(&orphan).await, Err(engine::EngineError::NotFound)));
    assert!(matches!(blobs.get(&gone_translation).await, Err(engine::EngineError::NotFound)));
    assert!(blobs.get(&kept_translation).await.is_ok(), "a live job's translated file stays");
    blobs.delete(&kept_translation).await.unwrap();
    let job = engine::queue::get(&pool, kept).await.unwrap();
    let key = job.payload["document"]["key"].as_str().unwrap();
    assert!(blobs.get(key).await.is_ok(), "a job's document stays");

    // The upkeep's own turn: a stored document only a released job names (its deletion was
    // held off and never came back), and one no job names, go, on the record as the upkeep's.
    let released = submit(&pool, &blobs, user.id, "released.txt", b"Canceled and released.").await;
    let released_key =
        engine::queue::get(&pool, released).await.unwrap().payload["document"]["key"].as_str().unwrap().to_string();
    sqlx::query("UPDATE jobs SET state = 'canceled', finished_at = now(), document_released_at = now() WHERE id = $1")
        .bind(released)
        .execute(&pool)
        .await
        .unwrap();
    blobs.put(&orphan, bytes::Bytes::from_static(b"left behind again")).await.unwrap();
    assert_eq!(engine::documents::sweep::sweep_orphans(&pool, &blobs, Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(engine::documents::sweep::sweep_orphans(&pool, &blobs, Duration::ZERO).await.unwrap(), 2);
    assert!(matches!(blobs.get(&released_key).await, Err(engine::EngineError::NotFound)));
    assert!(blobs.get(key).await.is_ok(), "a job's document stays");
    let upkeep: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor = 'upkeep'").fetch_one(&pool).await.unwrap();
    assert_eq!(upkeep, 1, "on the record when it removed something, quiet when not");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upload whose request ends before its job exists (its client gone, a deadline) leaves no
/// file: the pending blob deletes it when dropped, unless a job came to need it meanwhile.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn an_upload_abandoned_before_its_admission_leaves_no_file(pool: PgPool) {
    use engine::documents::sweep::PendingBlob;
    let dir = std::env::temp_dir().join(format!("sluice-pending-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let user = users::create_user(&pool, "pending@example.com", "password123", Role::User, 5).await.unwrap();
    let abandoned = Blobs::new_key();
    blobs.put(&abandoned, bytes::Bytes::from_static(b"a request that never finished")).await.unwrap();
    drop(PendingBlob::new(&pool, &blobs, &abandoned));
    let gone = wait_for(Duration::from_secs(10), || async { blobs.get(&abandoned).await.is_err() }).await;
    assert!(gone, "an abandoned upload's file is deleted");

    // Admitted just as its request was dropped: the job keeps its document.
    let admitted = submit(&pool, &blobs, user.id, "admitted.txt", b"Admitted at the last moment.").await;
    let key =
        engine::queue::get(&pool, admitted).await.unwrap().payload["document"]["key"].as_str().unwrap().to_string();
    drop(PendingBlob::new(&pool, &blobs, &key));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(blobs.get(&key).await.is_ok(), "a job's document stays");

    let _ = std::fs::remove_dir_all(&dir);
}

/// The reader is a wall: locked down as in production, a child that tries to reach the
/// database's trust-auth socket, a file in the data folder or the network gets nowhere, while
/// this process (the server's user) reaches all three.
#[sqlx::test]
async fn a_reader_cannot_reach_the_database_socket_the_data_folder_or_the_network(pool: PgPool) {
    let socket_dir = pool.connect_options().get_socket().cloned().expect("the test cluster listens on a Unix socket");
    let socket = std::fs::read_dir(&socket_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(".s.PGSQL.") && !name.ends_with(".lock")
        })
        .expect("the cluster's socket");
    // The cluster keeps its socket in its data folder.
    let data_file = socket_dir.join("PG_VERSION");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = listener.local_addr().unwrap().to_string();
    let (socket_, data_file_, tcp_) = (socket.clone(), data_file.clone(), tcp.clone());
    tokio::task::spawn_blocking(move || {
        std::os::unix::net::UnixStream::connect(&socket_).expect("the server reaches the socket");
        std::fs::read(&data_file_).expect("the server reads the data folder");
        std::net::TcpStream::connect(&tcp_).expect("the server reaches the network");
    })
    .await
    .unwrap();

    let probe = SandboxConfig::new(
        env!("CARGO_BIN_EXE_sluice-extract").into(),
        vec!["probe".into(), socket.display().to_string(), data_file.display().to_string(), tcp],
    );
    let report = extract_in_child(&probe, DocType::PlainText, bytes::Bytes::new()).await.expect("the probe answers");
    let report: serde_json::Value = serde_json::from_str(&report.text).unwrap();
    for reach in ["socket", "file", "tcp"] {
        assert!(report[reach].as_str().unwrap().starts_with("denied"), "{reach}: {report}");
    }
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(report["uid"], 0, "root starts the reader; the reader is not root: {report}");
    }
    if report["landlock_abi"].as_i64().unwrap() > 0 {
        // Only landlock denies a file anyone may read.
        assert!(report["world_readable_file"].as_str().unwrap().starts_with("denied"), "{report}");
    }
    if report["seccomp"].as_bool().unwrap() {
        // Only seccomp denies a socket that reaches nothing: no Unix socket, whatever its folder.
        assert!(report["socket_pair"].as_str().unwrap().starts_with("denied"), "{report}");
        // io_uring and other ABIs' calls, refused by the filter itself (EACCES: a kernel without
        // them would say ENOSYS, one with io_uring switched off EPERM).
        let refused = std::io::Error::from_raw_os_error(libc::EACCES).to_string();
        for call in ["io_uring", "other_abi"] {
            assert_eq!(report[call].as_str().unwrap(), format!("denied: {refused}"), "{call}: {report}");
        }
    }
    drop(listener);
}

/// At most `max_readers` readers run at once, however many documents wait.
#[tokio::test]
async fn readers_beyond_the_limit_wait_for_a_turn() {
    let dir = std::env::temp_dir().join(format!("sluice-readers-{}", rand::random::<u64>()));
    std::fs::create_dir_all(dir.join("running")).unwrap();
    std::fs::create_dir_all(dir.join("seen")).unwrap();
    let dir_ = dir.display();
    // Each child comes in, stays a moment, counts who is in (itself included) and leaves (in
    // folder names: the reader may write no file). Counting on the way out sees a partner that
    // started at the same instant, which counting on the way in may miss.
    let command = format!(
        "mkdir {dir_}/running/$$; sleep 0.5; mkdir {dir_}/seen/$(ls {dir_}/running | wc -l)-$$; rmdir {dir_}/running/$$"
    );
    let mut reader = SandboxConfig::new("/bin/sh".into(), vec!["-c".into(), command, "sh".into()]);
    reader.limit_readers(2, u64::MAX);
    let runs = (0..8).map(|_| extract_in_child(&reader, DocType::Pdf, bytes::Bytes::from_static(b"%PDF-")));
    // The children answer nothing readable: each fails as unreadable, after it ran.
    for result in futures::future::join_all(runs).await {
        assert_eq!(result.unwrap_err().class, ErrorClass::InvalidInput);
    }
    let peaks: Vec<u32> = std::fs::read_dir(dir.join("seen"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().split('-').next().unwrap().parse().unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(peaks.len(), 8, "every child ran");
    assert!(peaks.iter().all(|&inside| inside <= 2), "at most two at once: {peaks:?}");
    assert!(peaks.contains(&2), "two did run side by side: {peaks:?}");
}

/// Word files, OpenDocument texts and web pages go through the same queue: honest ones are
/// read and summarized, a zip bomb and a billion laughs fail as invalid input, not retried.
#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn word_files_and_pages_are_done_and_crafted_ones_fail_in_plain_words(pool: PgPool) {
    let pool = wider_pool(&pool, 20).await;
    let dir = std::env::temp_dir().join(format!("sluice-office-{}", std::process::id()));
    let blobs = Blobs::local(&dir).unwrap();
    let user = users::create_user(&pool, "office@example.com", "password123", Role::User, 20).await.unwrap();
    let honest = [
        ("contract.docx", docx_with_paragraphs(&["The supplier delivers.", "The buyer pays within 30 days."])),
        ("manual.odt", odt_of("<text:h text:outline-level=\"1\">Manual</text:h><text:p>Press the button.</text:p>")),
        ("page.html", b"<!doctype html><html><body><h1>News</h1><p>It rained all day.</p></body></html>".to_vec()),
    ];
    let laughs = zip_of(&[(
        "word/document.xml",
        br#"<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">]><w:document><w:p><w:t>&a;</w:t></w:p></w:document>"#,
    )]);
    let crafted = [("bomb.docx", docx_zip_bomb(1 << 30)), ("laughs.docx", laughs)];
    let mut done = Vec::new();
    for (name, bytes) in &honest {
        done.push(submit(&pool, &blobs, user.id, name, bytes).await);
    }
    let mut failed = Vec::new();
    for (name, bytes) in &crafted {
        failed.push(submit(&pool, &blobs, user.id, name, bytes).await);
    }
    assert!(run_until_ended(&pool, &blobs, 5).await, "every job ended");
    for (id, words) in done.iter().zip(["supplier", "button", "rained"]) {
        let job = engine::queue::get(&pool, *id).await.unwrap();
        assert_eq!(job.state, JobState::Done, "{:?}", job.failure_reason);
        let summary = job.result.unwrap()["markdown"].as_str().unwrap().to_string();
        assert!(summary.contains(words), "{summary}");
    }
    for (id, why) in failed.iter().zip(["zip bomb", "DTD"]) {
        let job = engine::queue::get(&pool, *id).await.unwrap();
        assert_eq!((job.state, job.failure_kind, job.attempts), (JobState::Failed, Some(FailureKind::InvalidInput), 1));
        assert!(job.failure_reason.as_deref().unwrap_or("").contains(why), "{:?}", job.failure_reason);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
