//! Who a bearer token or a session belongs to, kept in memory for a few seconds so that a
//! status poll does not ask Postgres who is asking every time.
//!
//! Staying correct across processes: every change that takes access away (a token revoked, a
//! session logged out, an account deleted) sends a notification on [`AUTH_CHANNEL`] in its
//! transaction, and every process's listener forgets what it names as soon as it arrives. The
//! lifetime (at most 5 s) is the backstop for a notification missed while a listener
//! reconnects, and a listener that (re)connects forgets everything first.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};

use super::users::User;
use crate::error::Result;

/// The notification channel of access taken away.
pub const AUTH_CHANNEL: &str = "sluice_auth";
/// The longest anything is kept.
pub const MAX_LIFETIME: Duration = Duration::from_secs(5);
/// The most entries of one kind (a bound on memory: past it, the map starts over).
const MAX_ENTRIES: usize = 100_000;

/// Pure: a map whose entries are good for `lifetime` after they were put, bounded in size.
#[derive(Debug)]
pub struct ExpiringMap<K, V> {
    entries: HashMap<K, (V, Instant)>,
    lifetime: Duration,
    most: usize,
}

impl<K: Eq + Hash, V: Clone> ExpiringMap<K, V> {
    pub fn new(lifetime: Duration, most: usize) -> Self {
        ExpiringMap { entries: HashMap::new(), lifetime, most: most.max(1) }
    }

    /// The value, if it was put less than `lifetime` before `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let (value, put) = self.entries.get(key)?;
        (now.saturating_duration_since(*put) < self.lifetime).then(|| value.clone())
    }

    pub fn put(&mut self, key: K, value: V, now: Instant) {
        if self.entries.len() >= self.most {
            // Expired entries first; if that is not enough, all of them (a cache may forget).
            self.entries.retain(|_, (_, put)| now.saturating_duration_since(*put) < self.lifetime);
            if self.entries.len() >= self.most {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (value, now));
    }

    pub fn remove(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Keep only the entries `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.entries.retain(|k, (v, _)| keep(k, v));
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a notification on [`AUTH_CHANNEL`] takes away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revoked {
    Token(i64),
    /// Every token and session of this user (an account deleted).
    User(i64),
    /// A session, by its id.
    Session(String),
}

impl Revoked {
    /// Pure: the notification's payload.
    pub fn payload(&self) -> String {
        match self {
            Revoked::Token(id) => format!("token:{id}"),
            Revoked::User(id) => format!("user:{id}"),
            Revoked::Session(id) => format!("session:{id}"),
        }
    }

    /// Pure: a payload read back (None for anything else).
    pub fn parse(payload: &str) -> Option<Revoked> {
        let (kind, rest) = payload.split_once(':')?;
        match kind {
            "token" => rest.parse().ok().map(Revoked::Token),
            "user" => rest.parse().ok().map(Revoked::User),
            "session" if !rest.is_empty() && rest.len() <= 128 => Some(Revoked::Session(rest.to_string())),
            _ => None,
        }
    }
}

/// Tell every process, when the caller's transaction commits, that `what` no longer grants
/// access.
pub async fn announce(conn: &mut PgConnection, what: &Revoked) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(AUTH_CHANNEL).bind(what.payload()).execute(conn).await?;
    Ok(())
}

/// A valid token's owner (as read when it was cached) and the token's id.
#[derive(Clone, Debug)]
pub struct TokenOwner {
    pub user: User,
    pub token_id: i64,
}

/// A session's record as the session store keeps it, by its owner.
#[derive(Clone, Debug)]
pub struct CachedSession<R> {
    pub record: R,
    pub user_id: Option<i64>,
}

/// The process's cache: tokens by their digest, session records by their id (`R` is the
/// session store's record type), users by id.
pub struct AuthCache<R> {
    inner: Mutex<Inner<R>>,
}

/// How many times the cache forgot something: a reader notes it before asking Postgres and
/// keeps the answer only if nothing was forgotten meanwhile (else an answer read just before
/// a revocation committed could be kept after its notification).
pub type Generation = u64;

struct Inner<R> {
    generation: Generation,
    tokens: ExpiringMap<String, TokenOwner>,
    sessions: ExpiringMap<String, CachedSession<R>>,
    users: ExpiringMap<i64, User>,
}

impl<R: Clone> AuthCache<R> {
    /// `lifetime` is capped at [`MAX_LIFETIME`]; zero keeps nothing (every request asks).
    pub fn new(lifetime: Duration) -> Arc<Self> {
        let lifetime = lifetime.min(MAX_LIFETIME);
        Arc::new(AuthCache {
            inner: Mutex::new(Inner {
                generation: 0,
                tokens: ExpiringMap::new(lifetime, MAX_ENTRIES),
                sessions: ExpiringMap::new(lifetime, MAX_ENTRIES),
                users: ExpiringMap::new(lifetime, MAX_ENTRIES),
            }),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner<R>) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn token(&self, digest: &str) -> Option<TokenOwner> {
        self.with(|c| c.tokens.get(&digest.to_string(), Instant::now()))
    }

    /// Where the cache stands now (see [`Generation`]).
    pub fn generation(&self) -> Generation {
        self.with(|c| c.generation)
    }

    /// Keep a token's owner read when the cache stood at `read_at`, unless something was
    /// forgotten since.
    pub fn put_token(&self, digest: String, owner: TokenOwner, read_at: Generation) {
        self.with(|c| {
            if c.generation == read_at {
                c.tokens.put(digest, owner, Instant::now())
            }
        })
    }

    pub fn session(&self, id: &str) -> Option<CachedSession<R>> {
        self.with(|c| c.sessions.get(&id.to_string(), Instant::now()))
    }

    pub fn put_session(&self, id: String, session: CachedSession<R>) {
        self.with(|c| c.sessions.put(id, session, Instant::now()))
    }

    pub fn forget_session(&self, id: &str) {
        self.with(|c| c.sessions.remove(&id.to_string()))
    }

    pub fn user(&self, id: i64) -> Option<User> {
        self.with(|c| c.users.get(&id, Instant::now()))
    }

    /// Keep a user read when the cache stood at `read_at`, unless something was forgotten since.
    pub fn put_user(&self, user: User, read_at: Generation) {
        self.with(|c| {
            if c.generation == read_at {
                c.users.put(user.id, user, Instant::now())
            }
        })
    }

    /// Forget what `what` names, at once.
    pub fn forget(&self, what: &Revoked) {
        self.with(|c| c.generation += 1);
        self.with(|c| match what {
            Revoked::Token(id) => c.tokens.retain(|_, owner| owner.token_id != *id),
            Revoked::User(id) => {
                c.tokens.retain(|_, owner| owner.user.id != *id);
                c.sessions.retain(|_, s| s.user_id != Some(*id));
                c.users.remove(id);
            }
            Revoked::Session(id) => c.sessions.remove(id),
        })
    }

    pub fn forget_everything(&self) {
        self.with(|c| {
            c.generation += 1;
            c.tokens.clear();
            c.sessions.clear();
            c.users.clear();
        })
    }
}

/// Listen on [`AUTH_CHANNEL`] until aborted, forgetting what each notification names. After
/// every (re)connection the cache starts empty: notifications sent while it was away are lost.
pub async fn listen<R: Clone + Send + 'static>(pool: PgPool, cache: Arc<AuthCache<R>>) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener.listen(AUTH_CHANNEL).await {
                Ok(()) => {
                    cache.forget_everything();
                    loop {
                        match listener.recv().await {
                            Ok(note) => match Revoked::parse(note.payload()) {
                                Some(what) => cache.forget(&what),
                                None => cache.forget_everything(),
                            },
                            Err(e) => {
                                tracing::warn!(error = %e, "the access listener lost its connection");
                                cache.forget_everything();
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot listen for revoked access"),
            },
            Err(e) => tracing::warn!(error = %e, "cannot connect the access listener"),
        }
        cache.forget_everything();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_good_for_its_lifetime_only() {
        let start = Instant::now();
        let mut map = ExpiringMap::new(Duration::from_secs(5), 10);
        map.put("a", 1, start);
        assert_eq!(map.get(&"a", start + Duration::from_millis(4_999)), Some(1));
        assert_eq!(map.get(&"a", start + Duration::from_secs(5)), None);
        let mut none = ExpiringMap::new(Duration::ZERO, 10);
        none.put("a", 1, start);
        assert_eq!(none.get(&"a", start), None, "a zero lifetime keeps nothing");
    }

    #[test]
    fn the_map_never_grows_past_its_bound() {
        let start = Instant::now();
        let mut map = ExpiringMap::new(Duration::from_secs(5), 3);
        for n in 0..10 {
            map.put(n, n, start);
            assert!(map.len() <= 3);
        }
        assert_eq!(map.get(&9, start), Some(9), "the newest is kept");
    }

    #[test]
    fn an_answer_read_before_a_revocation_is_not_kept_after_it() {
        let cache: Arc<AuthCache<()>> = AuthCache::new(Duration::from_secs(5));
        let user = User {
            id: 1,
            email: "a@example.com".into(),
            role: super::super::Role::User,
            balance: 0,
            in_flight: 0,
            max_in_flight: 5,
            created_at: chrono::Utc::now(),
            email_verified_at: None,
            session_epoch: 0,
        };
        let read_at = cache.generation();
        cache.forget(&Revoked::User(1)); // the notification arrives while the read is on its way
        cache.put_user(user.clone(), read_at);
        assert!(cache.user(1).is_none(), "a stale read is not kept");
        cache.put_user(user, cache.generation());
        assert!(cache.user(1).is_some());
    }

    #[test]
    fn payloads_read_back_and_nonsense_is_refused() {
        for what in [Revoked::Token(7), Revoked::User(12), Revoked::Session("abc-DEF".into())] {
            assert_eq!(Revoked::parse(&what.payload()), Some(what));
        }
        for junk in
            ["", "token:", "token:x", "user:-", "nothing:1", "session:", &format!("session:{}", "x".repeat(200))]
        {
            assert_eq!(Revoked::parse(junk), None, "{junk:?}");
        }
    }
}
