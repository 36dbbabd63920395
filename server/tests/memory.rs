//! Memory under big uploads, measured as this process's peak resident size. In a binary of
//! its own, one test at a time: a neighbour test's allocations would blur the figure.

// The API tests' helpers; this binary uses a few of them.
#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::sync::Arc;

use app::server::session::WebSettings;
use engine::testing::peak_rss_mib;
use server::testing::{file_part, raw_upload};
use sqlx::PgPool;

use helpers::*;

const MIB: usize = 1 << 20;

async fn twenty_refused_50_mib_uploads_at_once_leave_memory_flat(pool: PgPool) {
    let app = TestApp::spawn(pool, WebSettings::default()).await;
    let (_, token) = app.user_with_token("broke@example.com", 0, 5).await;
    let before = peak_rss_mib();
    let uploads: Vec<_> = (0..20)
        .map(|_| {
            let (addr, token) = (app.addr, token.clone());
            tokio::task::spawn_blocking(move || {
                raw_upload(addr, &token, &file_part("big.pdf"), b"%PDF-1.7\n", b'0', 50 * MIB)
            })
        })
        .collect();
    for upload in uploads {
        let answer = upload.await.unwrap();
        assert_eq!(answer.status, 402);
        assert!(answer.sent < 50 * MIB);
    }
    let grew = peak_rss_mib().saturating_sub(before);
    eprintln!("peak RSS grew by {grew} MiB");
    assert!(grew < 64, "peak RSS grew by {grew} MiB for 20 refused uploads");
    assert_eq!(app.stored_blobs(), 0);
}

async fn twenty_accepted_50_mib_uploads_at_once_stream_in_bounded_memory(pool: PgPool) {
    // Twenty people, all on loopback here: more than one address's share of the upload slots.
    let settings = WebSettings { max_uploads_per_address: 32, ..WebSettings::default() };
    let app = Arc::new(TestApp::spawn(pool, settings).await);
    let mut tokens = Vec::new();
    for n in 0..20 {
        tokens.push(app.user_with_token(&format!("rich{n}@example.com"), 5, 5).await.1);
    }
    // Measured from here: the users' password hashing (argon2, 19 MiB each) is not the uploads'.
    let before = peak_rss_mib();
    let mut uploads = Vec::new();
    for (n, token) in tokens.into_iter().enumerate() {
        let addr = app.addr;
        uploads.push(tokio::task::spawn_blocking(move || {
            // A different first line per upload, so no two are duplicates.
            let head = format!("%PDF-1.7\n%{n}\n");
            raw_upload(addr, &token, &file_part("big.pdf"), head.as_bytes(), b'0', 50 * MIB)
        }));
    }
    for upload in uploads {
        let answer = upload.await.unwrap();
        assert_eq!((answer.status, answer.sent), (202, 50 * MIB));
    }
    let grew = peak_rss_mib().saturating_sub(before);
    eprintln!("peak RSS grew by {grew} MiB for 20 x 50 MiB accepted");
    assert!(grew < 100, "peak RSS grew by {grew} MiB");
    assert_eq!(app.stored_blobs(), 20);
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn big_uploads_refused_or_accepted_twenty_at_once_stay_in_bounded_memory(pool: PgPool) {
    twenty_refused_50_mib_uploads_at_once_leave_memory_flat(pool.clone()).await;
    sqlx::query("TRUNCATE users, jobs, api_tokens, ledger CASCADE").execute(&pool).await.unwrap();
    twenty_accepted_50_mib_uploads_at_once_stream_in_bounded_memory(pool).await;
}
