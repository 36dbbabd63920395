//! The session store: Postgres, with each record kept in this process for a few seconds
//! ([`engine::accounts::auth_cache`]), so a poll reads no session row. A session deleted here
//! (log-out, a new id at log-in) is forgotten by every process through a notification sent
//! when the delete is done; a record saved here replaces the kept one. A console request
//! finding every connection of the web requests' pool taken reads and saves its record on the
//! connections kept for health and the console, so an operator can still reach the console
//! and its kill switch; no other request uses those.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::PgPool;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{Error, Result};
use tower_sessions::SessionStore;
use tower_sessions_sqlx_store::PostgresStore;

use app::server::session::{is_console_request, AuthCache, USER_KEY};
use engine::accounts::auth_cache::{announce, CachedSession, Revoked};

#[derive(Clone)]
pub struct CachedStore {
    inner: PostgresStore,
    /// The same table through the reserved connections.
    reserved: PostgresStore,
    cache: Arc<AuthCache>,
    pool: PgPool,
}

impl std::fmt::Debug for CachedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CachedStore")
    }
}

impl CachedStore {
    /// `pool` is the web requests' (the store's own), `reserved` the connections kept for
    /// health and the console.
    pub fn new(pool: PgPool, reserved: PgPool, cache: Arc<AuthCache>) -> Self {
        CachedStore { inner: PostgresStore::new(pool.clone()), reserved: PostgresStore::new(reserved), cache, pool }
    }

    /// Whether this request reads and writes its record on the reserved connections: a
    /// console request, while the requests' are all taken ([`Self::on_timeout`] when they turn
    /// out taken only once asked).
    fn reserved_now(&self) -> bool {
        is_console_request() && engine::db::is_full(&self.pool)
    }

    /// Whether a failure of the requests' pool is a console request's cue to use the reserved
    /// connections.
    fn on_timeout(error: &Error) -> bool {
        matches!(error, Error::Backend(e) if engine::db::is_pool_timeout_text(e)) && is_console_request()
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
        if self.reserved_now() {
            self.reserved.save(record).await?;
        } else {
            match self.inner.save(record).await {
                Err(e) if Self::on_timeout(&e) => self.reserved.save(record).await?,
                other => other?,
            }
        }
        self.keep(record);
        Ok(())
    }

    async fn load(&self, id: &Id) -> Result<Option<Record>> {
        if let Some(kept) = self.cache.session(&id.to_string()) {
            if kept.record.expiry_date > time::OffsetDateTime::now_utc() {
                return Ok(Some(kept.record));
            }
        }
        let record = if self.reserved_now() {
            self.reserved.load(id).await?
        } else {
            match self.inner.load(id).await {
                Err(e) if Self::on_timeout(&e) => self.reserved.load(id).await?,
                other => other?,
            }
        };
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
