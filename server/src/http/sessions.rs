//! The session store: Postgres, with each record kept in this process for a few seconds
//! ([`engine::accounts::auth_cache`]), so a poll reads no session row. A session deleted here
//! (log-out, a new id at log-in) is forgotten by every process through a notification sent
//! when the delete is done; a record saved here replaces the kept one.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::PgPool;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{Error, Result};
use tower_sessions::SessionStore;
use tower_sessions_sqlx_store::PostgresStore;

use app::server::session::{AuthCache, USER_KEY};
use engine::accounts::auth_cache::{announce, CachedSession, Revoked};

#[derive(Clone)]
pub struct CachedStore {
    inner: PostgresStore,
    cache: Arc<AuthCache>,
    pool: PgPool,
}

impl std::fmt::Debug for CachedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CachedStore")
    }
}

impl CachedStore {
    pub fn new(inner: PostgresStore, cache: Arc<AuthCache>, pool: PgPool) -> Self {
        CachedStore { inner, cache, pool }
    }

    fn keep(&self, record: &Record) {
        let user_id = record.data.get(USER_KEY).and_then(|v| v.as_i64());
        self.cache.put_session(record.id.to_string(), CachedSession { record: record.clone(), user_id });
    }
}

#[async_trait]
impl SessionStore for CachedStore {
    async fn create(&self, record: &mut Record) -> Result<()> {
        self.inner.create(record).await?;
        self.keep(record);
        Ok(())
    }

    async fn save(&self, record: &Record) -> Result<()> {
        self.inner.save(record).await?;
        self.keep(record);
        Ok(())
    }

    async fn load(&self, id: &Id) -> Result<Option<Record>> {
        if let Some(kept) = self.cache.session(&id.to_string()) {
            if kept.record.expiry_date > time::OffsetDateTime::now_utc() {
                return Ok(Some(kept.record));
            }
        }
        let record = self.inner.load(id).await?;
        if let Some(record) = &record {
            self.keep(record);
        }
        Ok(record)
    }

    async fn delete(&self, id: &Id) -> Result<()> {
        self.cache.forget_session(&id.to_string());
        self.inner.delete(id).await?;
        let mut conn = self.pool.acquire().await.map_err(|e| Error::Backend(e.to_string()))?;
        announce(&mut conn, &Revoked::Session(id.to_string())).await.map_err(|e| Error::Backend(e.to_string()))
    }
}
