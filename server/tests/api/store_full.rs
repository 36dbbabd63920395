//! A full document store: the upload that finds it full is answered 507 in words with
//! `Retry-After` (nothing stored, nothing charged), later ones are refused before their body is
//! read, the vital signs and an alert say so, and uploads work again once there is room.

use std::path::PathBuf;
use std::time::Duration;

use app::server::session::WebSettings;
use sqlx::PgPool;

use crate::helpers::*;
use server::testing::{file_part, raw_upload};

const MIB: usize = 1 << 20;

/// A 24 MiB file system of its own (tmpfs), unmounted when dropped: a real disk that fills.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(name: &str) -> SmallDisk {
        // SAFETY: plain syscall.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "mounting a small file system needs root (as CI and the test command run)"
        );
        let dir = std::env::temp_dir().join(format!("sluice-small-disk-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount -t tmpfs");
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Upload a 7 MiB PDF-looking file over a plain socket (the answer is read even if it comes
/// mid-body, as a full store's does): the status.
async fn upload_pdf(app: &TestApp, token: &str, n: usize) -> u16 {
    let (addr, token) = (app.addr, token.to_string());
    tokio::task::spawn_blocking(move || {
        let headers = format!(
            "Content-Disposition: form-data; name=\"file\"; filename=\"scan-{n}.pdf\"\r\nContent-Type: application/pdf"
        );
        // Each its own bytes (the same bytes again would be the same document).
        let head = format!("%PDF-1.7\n% scan {n}\n");
        raw_upload(addr, &token, &headers, head.as_bytes(), b'0', 7 * MIB).status
    })
    .await
    .unwrap()
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_full_store_answers_507_in_words_refuses_unread_shows_and_alerts_then_recovers(pool: PgPool) {
    let disk = SmallDisk::mount("uploads");
    let app = TestApp::spawn_storing_in(pool, WebSettings::default(), disk.0.join("documents")).await;
    let (user, token) = app.user_with_token("filler@example.com", 1_000_000, 50).await;

    // 7 MiB at a time into 24 MiB: three fit, the fourth finds the disk full.
    let mut statuses = Vec::new();
    while statuses.last() != Some(&507) && statuses.len() < 6 {
        statuses.push(upload_pdf(&app, &token, statuses.len()).await);
    }
    assert_eq!(statuses, [202, 202, 202, 507]);
    assert_eq!(app.stored_blobs(), 3, "the refused upload left nothing");
    let (balance, in_flight, _, live) = app.user_state(user).await;
    assert_eq!((in_flight, live), (3, 3), "no job for it");

    // Known full: the next is told in words, before its body is read.
    let full = app.upload(&token, doc(1), None).await;
    assert_eq!(full.status(), 507);
    assert_eq!(full.headers()["retry-after"], "60");
    let said: serde_json::Value = full.json().await.unwrap();
    assert_eq!(said["error"], "store_full");
    assert!(said["message"].as_str().unwrap().contains("nothing was stored or charged"), "{said}");
    let addr = app.addr;
    let unread = tokio::task::spawn_blocking({
        let token = token.clone();
        move || {
            let headers = file_part("more.pdf");
            raw_upload(addr, &token, &headers, b"%PDF-1.7\n", b'0', 40 * MIB)
        }
    })
    .await
    .unwrap();
    assert_eq!(unread.status, 507);
    assert!(unread.sent < 8 * MIB, "answered before the body was read: {} bytes sent", unread.sent);
    assert_eq!(app.user_state(user).await.0, balance, "nothing charged");

    // The console's reading and the alert.
    engine::documents::store_space::record(&app.pool, &app.blobs).await.unwrap();
    let store = engine::documents::store_space::read(&app.pool).await.unwrap();
    assert!(store.full, "{store:?}");
    assert!(store.free_bytes.unwrap() < 7 * MIB as i64, "{store:?}");
    let thresholds = engine::alerts::Thresholds { store_min_free_bytes: 0, ..Default::default() };
    let config = engine::alerts::AlertConfig { thresholds, ..Default::default() };
    let fired = engine::alerts::evaluate_once(&app.pool, &config).await.unwrap().unwrap();
    assert!(fired.fired.iter().any(|r| r.rule == engine::alerts::Rule::StoreFull), "{fired:?}");

    // Room again (the owner canceled two; their documents are released): uploads work again.
    let jobs: Vec<String> =
        sqlx::query_scalar("SELECT id::text FROM jobs WHERE owner_id = $1 ORDER BY accepted_at LIMIT 2")
            .bind(user)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    for id in &jobs {
        let canceled =
            reqwest::Client::new().post(app.url(&format!("/api/v1/jobs/{id}/cancel"))).bearer_auth(&token).send().await;
        assert!(canceled.unwrap().status().is_success());
    }
    let released =
        engine::documents::sweep::release_documents(&app.pool, &app.blobs, Duration::from_secs(3600)).await.unwrap();
    assert_eq!(released, 2);
    assert_eq!(upload_pdf(&app, &token, 9).await, 202, "uploads work again once there is room");
    drop(app);
}
