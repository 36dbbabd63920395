//! A backup in progress holds off only what it has not copied yet: deletions, "run again",
//! the release sweep and lease rescue go on at full speed while gigabytes are being copied, a
//! deletion of a document not copied yet is left to the backup (which deletes it once copied),
//! and the backup stays consistent: every document a job in its dump names is in it.

use std::time::{Duration, Instant};

use engine::accounts::admission::AdmissionConfig;
use engine::accounts::{deletion, users, AccountHooks, Role};
use engine::documents::intake::{self, UploadOptions};
use engine::documents::Blobs;
use engine::queue::policy::retry::RetryPolicy;
use engine::testing::{wait_for, wider_pool, TempBlobs};
use engine::Preset;
use sqlx::PgPool;
use uuid::Uuid;

/// This test's database, as a URL `pg_dump` can use.
async fn database_url(pool: &PgPool) -> String {
    let db: String = sqlx::query_scalar("SELECT current_database()::text").fetch_one(pool).await.unwrap();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").expect("the test command sets DATABASE_URL")).unwrap();
    url.set_path(&db);
    url.to_string()
}

/// A stored document of `size` bytes (a sparse file: gigabytes to copy, none to write first)
/// and an ended job of `owner`'s naming it.
async fn document(pool: &PgPool, docs: &TempBlobs, owner: i64, size: u64, state: &str) -> (Uuid, String) {
    let key = Blobs::new_key();
    let path = docs.dir.join(&key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    let payload = serde_json::json!({
        "document": { "key": key, "type": "plain_text", "sha256": key, "size": size, "name": "big.txt" },
        "preset": "summarize",
    });
    let id = sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, cost, accepted_at, run_at, finished_at, idempotency_key)
         VALUES ($1, $2, $3, 1, now(), now(), now(), $4) RETURNING id",
    )
    .bind(owner)
    .bind(state)
    .bind(&payload)
    .bind(&key)
    .fetch_one(pool)
    .await
    .unwrap();
    (id, key)
}

async fn timed<T>(took: &mut Vec<Duration>, work: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let out = work.await;
    took.push(started.elapsed());
    out
}

#[sqlx::test(migrator = "engine::db::MIGRATOR")]
async fn a_backup_of_gigabytes_holds_up_nothing_but_what_it_has_not_copied(pool: PgPool) {
    let pool = wider_pool(&pool, 30).await;
    let docs = TempBlobs::new("backup-live");
    let owner = users::create_user(&pool, "big@example.com", "password123", Role::User, 1_000_000).await.unwrap();
    // 2 GiB in four documents, then a hundred small ones to delete; three big ones run again.
    let mut big = Vec::new();
    for _ in 0..4 {
        big.push(document(&pool, &docs, owner.id, 512 << 20, "done").await);
    }
    let mut small = Vec::new();
    for _ in 0..100 {
        small.push(document(&pool, &docs, owner.id, 4 << 10, "done").await);
    }
    let mut canceled = Vec::new();
    for _ in 0..5 {
        canceled.push(document(&pool, &docs, owner.id, 4 << 10, "canceled").await);
    }
    // A worker that died holding a job: its lease ran out.
    let stranded: Uuid = sqlx::query_scalar(
        "INSERT INTO jobs (owner_id, state, payload, lease_token, lease_owner, lease_expires_at, attempts, run_at,
                           claimed_at)
         VALUES ($1, 'running', '{}', gen_random_uuid(), 'dead-worker', now() - interval '1 minute', 1, now(),
                 now() - interval '2 minutes')
         RETURNING id",
    )
    .bind(owner.id)
    .fetch_one(&pool)
    .await
    .unwrap();

    // The copy goes to memory where the machine has it (/dev/shm): the test is about who waits,
    // not about this disk's speed.
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let target = base.join(format!("sluice-backup-live-copy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    let url = database_url(&pool).await;
    let bin = pgcluster::find_bin_dir().expect("Postgres's binaries");
    let backup = {
        let (pool, blobs, target) = (pool.clone(), docs.blobs.clone(), target.clone());
        tokio::spawn(async move { engine::backup::backup(&pool, &url, &blobs, &bin, &target).await })
    };
    let holding = wait_for(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM backup_holds").fetch_one(&pool).await.unwrap() > 0
    })
    .await;
    assert!(holding, "the backup lists what it will copy");
    // However fast this machine copies, the backup is kept mid-copy for as long as this test
    // needs: the row of a big document still to copy is locked here, and the backup waits at it
    // once that document is copied (as it would on a slow disk).
    let big_keys: Vec<String> = big.iter().map(|(_, key)| key.clone()).collect();
    let mut slow_disk = pool.begin().await.unwrap();
    let stalled: Option<String> =
        sqlx::query_scalar("SELECT key FROM backup_holds WHERE key = ANY($1) LIMIT 1 FOR UPDATE SKIP LOCKED")
            .bind(&big_keys)
            .fetch_optional(&mut *slow_disk)
            .await
            .unwrap();
    assert!(stalled.is_some(), "a big document is still to be copied");
    let waiting = wait_for(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%backup_holds%')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert!(waiting, "the backup is copying");

    // Meanwhile: a hundred deletions, three "run again", the release sweep and lease rescue.
    let mut took = Vec::new();
    for (id, _) in &small {
        let deleted = timed(&mut took, deletion::delete_job(&pool, &docs.blobs, owner.id, *id)).await.unwrap();
        assert_eq!(deleted, deletion::JobDeletion::Deleted);
    }
    let config = AdmissionConfig::default();
    for (id, _) in &big[..3] {
        let earlier: serde_json::Value =
            sqlx::query_scalar("SELECT payload FROM jobs WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
        let options = UploadOptions { preset: Preset::Summarize, ..UploadOptions::default() };
        let again = timed(&mut took, intake::run_again(&pool, &config, owner.id, &earlier, &options)).await.unwrap();
        assert!(matches!(again, engine::accounts::admission::Admission::Accepted { .. }), "{again:?}");
    }
    let released =
        timed(&mut took, engine::documents::sweep::release_documents(&pool, &docs.blobs, Duration::from_secs(3600)))
            .await
            .unwrap();
    assert_eq!(released, canceled.len());
    let rescued =
        timed(&mut took, engine::queue::rescue::rescue_expired(&pool, &AccountHooks, &RetryPolicy::default())).await;
    assert_eq!(rescued.unwrap().len(), 1, "the dead worker's job is rescued meanwhile");
    let (worker, outcome, ran): (String, String, bool) = sqlx::query_as(
        "SELECT worker, outcome, finished_at - started_at > interval '110 seconds' FROM job_attempts WHERE job_id = $1",
    )
    .bind(stranded)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((worker.as_str(), outcome.as_str(), ran), ("dead-worker", "lease_expired", true), "its attempt, ended");
    assert!(!backup.is_finished(), "all of it answered while the backup was still copying");
    let slowest = took.iter().max().unwrap();
    assert!(*slowest < Duration::from_secs(2), "each answered at once, the slowest in {slowest:?}");
    slow_disk.commit().await.unwrap();

    let manifest = backup.await.unwrap().unwrap();
    // Consistent: every document its jobs name is in it, the deleted and released ones too
    // (they were not copied yet when they were let go).
    assert_eq!(manifest.documents, big.len() + small.len() + canceled.len(), "{manifest:?}");
    assert_eq!(manifest.document_bytes, 4 * (512 << 20) + 105 * (4 << 10));
    for (_, key) in big.iter().chain(&small).chain(&canceled) {
        assert!(target.join("documents").join(key).exists(), "{key} is in the backup");
    }
    // And the deletions it held off happened once each was copied.
    for (_, key) in small.iter().chain(&canceled) {
        assert!(!docs.blobs.exists(key).await.unwrap(), "{key} is deleted after its copy");
    }
    for (_, key) in &big {
        assert!(docs.blobs.exists(key).await.unwrap(), "{key} is still needed");
    }
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM backup_holds").fetch_one(&pool).await.unwrap();
    assert_eq!(holds, 0);
    let _ = std::fs::remove_dir_all(&target);
}
