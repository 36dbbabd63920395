//! The server-only pieces every server function (and the REST API) shares: what the server
//! provides as context, the session's user, the role checks, and which jobs a caller may see.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use engine::accounts::admission::AdmissionConfig;
use engine::accounts::login::LoginLimits;
use engine::accounts::signup::SignupLimits;
use engine::accounts::users::Permission;
use engine::accounts::{users, User};
use engine::documents::Blobs;
use engine::queue::JobView;
use engine::Preset;
use sqlx::PgPool;
use tower_sessions::Session;
use uuid::Uuid;

use crate::errors::{respond, AppError};
use crate::model::JobStatus;

/// What server functions need from the server, provided as context.
#[derive(Clone)]
pub struct ServerContext {
    /// The web requests' pool: a request that finds it full waits at most a second, then is
    /// answered 503 with `Retry-After`.
    pub pool: PgPool,
    /// A few connections of their own for the health check and the console's kill switch and
    /// overview (their queries; the session is read on the requests' pool), so a full pool of
    /// requests does not make a live server look dead (by default the requests' pool).
    pub reserved: PgPool,
    pub settings: Arc<WebSettings>,
    pub blobs: Blobs,
    /// One permit per upload in progress (see [`WebSettings::max_concurrent_uploads`]).
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// Uploads in progress per user and per client address (see
    /// [`WebSettings::max_uploads_per_user`]).
    uploads_by_holder: Arc<std::sync::Mutex<std::collections::HashMap<UploadHolder, usize>>>,
    /// Everyone's place in line, read at most once a second for all the polls.
    pub line: Arc<engine::queue::SharedLine>,
    /// Who tokens and sessions belong to, for a few seconds ([`engine::accounts::auth_cache`]).
    pub auth: Arc<AuthCache>,
    /// Translated files being rebuilt for download at once (each holds its document in memory
    /// and a reader child); past them, 503 with Retry-After, so downloads never crowd out the
    /// workers' readers or the memory.
    pub rebuilds: Arc<tokio::sync::Semaphore>,
    /// The measured pace upload estimates go by, read at most once a minute.
    pub paces: Arc<engine::documents::estimate::PaceCache>,
    /// Estimates read at once (their own: an estimate never holds an upload's slot).
    pub estimates: Arc<tokio::sync::Semaphore>,
    /// Estimates in progress per user (at most [`ESTIMATES_PER_USER`] at once).
    estimates_by_user: Arc<std::sync::Mutex<std::collections::HashMap<i64, usize>>>,
}

/// Estimates read at once, per process (as many as uploads, apart from them).
pub const ESTIMATES_AT_ONCE: usize = 32;
/// Estimates one user may have in progress at once: the upload page estimates every file
/// chosen together, as it uploads them (8 at once).
pub const ESTIMATES_PER_USER: usize = 8;
/// Estimates one user may ask for in a minute (across processes): the files of a few
/// drops in a row.
pub const ESTIMATES_PER_MINUTE: i64 = 60;

/// One estimate in progress of a user's; dropping it ends it.
pub struct UserEstimate {
    user_id: i64,
    counts: Arc<std::sync::Mutex<std::collections::HashMap<i64, usize>>>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for UserEstimate {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.user_id) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.user_id);
            }
        }
    }
}

/// Translated files rebuilt for download at once, per process.
pub const REBUILDS_AT_ONCE: usize = 2;
/// PDFs and images surveyed at upload at once, per process (an upload waits a few seconds for
/// a turn: past it a PDF is priced by its size, a photo asked for again). One: an estimate is
/// free, and a stranger's estimates may then take one core (at nice 10) at most, never the web's.
pub const SURVEYS_AT_ONCE: usize = 1;

/// The process's cache of tokens, sessions (the session store's records) and users.
pub type AuthCache = engine::accounts::auth_cache::AuthCache<tower_sessions::session::Record>;

/// Who holds upload slots: an account, and the address it uploads from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum UploadHolder {
    User(i64),
    Address(String),
}

/// One upload in progress, counted for its account and its address; dropping it ends it.
pub struct UserUpload {
    holders: [UploadHolder; 2],
    counts: Arc<std::sync::Mutex<std::collections::HashMap<UploadHolder, usize>>>,
}

impl Drop for UserUpload {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for holder in &self.holders {
            if let Some(n) = counts.get_mut(holder) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(holder);
                }
            }
        }
    }
}

impl ServerContext {
    /// The context for these settings, with its upload permits.
    pub fn new(pool: PgPool, settings: WebSettings, blobs: Blobs) -> ServerContext {
        let uploads = Arc::new(tokio::sync::Semaphore::new(settings.max_concurrent_uploads.max(1)));
        let settings_auth_lifetime = settings.auth_cache_lifetime;
        ServerContext {
            reserved: pool.clone(),
            pool,
            settings: Arc::new(settings),
            blobs,
            uploads,
            uploads_by_holder: Default::default(),
            line: Default::default(),
            auth: AuthCache::new(settings_auth_lifetime),
            rebuilds: Arc::new(tokio::sync::Semaphore::new(REBUILDS_AT_ONCE)),
            paces: Arc::default(),
            estimates: Arc::new(tokio::sync::Semaphore::new(ESTIMATES_AT_ONCE)),
            estimates_by_user: Arc::default(),
        }
    }

    /// The health check and the console's kill switch and overview use `reserved`.
    pub fn with_reserved(self, reserved: PgPool) -> ServerContext {
        ServerContext { reserved, ..self }
    }

    /// Start an estimate of `user_id`'s: none while the user has [`ESTIMATES_PER_USER`] in
    /// progress (429) or every estimate slot is taken (503). Never an upload's slot.
    pub fn begin_estimate(&self, user_id: i64) -> Result<UserEstimate, crate::errors::AppError> {
        let mut counts = self.estimates_by_user.lock().unwrap_or_else(|e| e.into_inner());
        if counts.get(&user_id).copied().unwrap_or(0) >= ESTIMATES_PER_USER {
            return Err(crate::errors::AppError::RateLimited { retry_after_secs: 1 });
        }
        let slot = self
            .estimates
            .clone()
            .try_acquire_owned()
            .map_err(|_| crate::errors::AppError::Overloaded { retry_after_secs: 1 })?;
        *counts.entry(user_id).or_default() += 1;
        Ok(UserEstimate { user_id, counts: self.estimates_by_user.clone(), _slot: slot })
    }

    /// Start an upload of `user_id`'s from `client`, unless the account or the address already
    /// has the most allowed at once: several free accounts on one address share one allowance.
    pub fn begin_upload(&self, user_id: i64, client: &str) -> Option<UserUpload> {
        let holders = [UploadHolder::User(user_id), UploadHolder::Address(client.to_string())];
        let mut counts = self.uploads_by_holder.lock().unwrap_or_else(|e| e.into_inner());
        let limit = |holder: &UploadHolder| match holder {
            UploadHolder::User(_) => self.settings.max_uploads_per_user,
            UploadHolder::Address(_) => self.settings.max_uploads_per_address,
        };
        if holders.iter().any(|h| counts.get(h).copied().unwrap_or(0) >= limit(h)) {
            return None;
        }
        for holder in &holders {
            *counts.entry(holder.clone()).or_default() += 1;
        }
        Some(UserUpload { holders, counts: self.uploads_by_holder.clone() })
    }
}

/// The web layer's configuration.
#[derive(Clone, Debug)]
pub struct WebSettings {
    pub admission: AdmissionConfig,
    /// Credits a new account starts with (once its address is verified, when that is asked).
    pub signup_grant: i64,
    /// New accounts prove their address by a mailed link before the sign-up grant.
    pub require_email_verification: bool,
    /// How often reset and verification mails may be asked for.
    pub link_limits: engine::accounts::recovery::LinkLimits,
    pub login_limits: LoginLimits,
    pub signup_limits: SignupLimits,
    /// Reverse proxies whose `X-Forwarded-For` is believed; anyone else's is ignored.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    pub max_upload_bytes: u64,
    /// Uploads read at once; past it an upload waits (unread) for its turn, then gets 503.
    pub max_concurrent_uploads: usize,
    /// Uploads one user may have in progress at once (the upload page sends several files
    /// together); past it, 429.
    pub max_uploads_per_user: usize,
    /// Uploads one client address may have in progress at once, whatever the accounts (free
    /// accounts cost nothing, so several on one address share this); past it, 429.
    pub max_uploads_per_address: usize,
    /// How long an upload waits for its turn (also the `Retry-After` of that 503).
    pub busy_uploads_wait: std::time::Duration,
    /// The longest an upload may send nothing (between parts or inside one) before it is dropped.
    pub upload_idle: std::time::Duration,
    /// The longest one upload may take in all (50 MiB at under 100 KB/s is not a client we
    /// serve); past it, 422 and what it stored is deleted.
    pub upload_deadline: std::time::Duration,
    /// The presets the configured provider can do (language-model presets need one).
    pub presets: Vec<Preset>,
    /// How long a request (other than an upload or a download) may take, slow clients
    /// included; past it, 408.
    pub request_timeout: std::time::Duration,
    /// Serve `/metrics` on the main address to this bearer token (none: not served there).
    pub metrics_token: Option<String>,
    /// Where completion callbacks may go.
    pub webhook_policy: engine::webhooks::TargetPolicy,
    /// Whether alerts are also sent to the operator's webhook (the admin page says so).
    pub alert_webhook: bool,
    /// How often a session in use has its expiry pushed back (see [`session_user`]).
    pub session_renew_after: std::time::Duration,
    /// The provider timeout and attempt deadline, for the capacity card's warnings (and an
    /// upload's estimate with nothing measured lately).
    pub time_limits: sluice_types::capacity::TimeLimits,
    /// What one provider call carries, for an upload's estimate of its parts.
    pub call_limits: engine::documents::calls::CallLimits,
    /// Whose tokenizer ratio, learned by the workers, the estimate plans parts by (none: the
    /// local provider, which counts as we do).
    pub tokenizer: Option<engine::documents::ratio::Tokenizer>,
    /// What the provider charges per million tokens, if the operator said (outcomes in money).
    pub provider_prices: Option<sluice_types::capacity::ProviderPrices>,
    /// A request's headers must arrive within this (also the longest a kept-alive connection
    /// sits idle), and at most `max_connections` are open at once.
    pub header_read_timeout: std::time::Duration,
    pub max_connections: usize,
    /// Of those, at most this many from one client address (IPv4, IPv6 /64).
    pub max_connections_per_address: usize,
    /// While an answer waits to be written, the client must take 16 KiB within this, or the
    /// connection is closed (a download's minimum rate).
    pub stalled_write_timeout: std::time::Duration,
    /// Cookies are marked `Secure` (served over HTTPS).
    pub secure_cookies: bool,
    /// The most jobs one bulk action of the console may take.
    pub bulk_action_cap: i64,
    /// How long this process keeps who a token or a session belongs to (at most 5 s; revoking
    /// reaches every process at once through a notification; zero: ask every time).
    pub auth_cache_lifetime: std::time::Duration,
    /// The sandboxed reader a translated Word or OpenDocument file is rebuilt with for its
    /// download (None: that download is not offered by this process).
    pub document_reader: Option<Arc<engine::documents::sandbox::SandboxConfig>>,
    /// The sandboxed reader PDFs and images are surveyed with at upload (their pages, the
    /// scanned ones, priced by page), with slots of its own, and how it reads scans (None: no
    /// survey, and no scans read).
    pub survey_reader: Option<Arc<engine::documents::sandbox::SandboxConfig>>,
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            admission: AdmissionConfig::default(),
            signup_grant: 20,
            require_email_verification: true,
            link_limits: Default::default(),
            login_limits: LoginLimits::default(),
            signup_limits: SignupLimits::default(),
            trusted_proxies: Vec::new(),
            max_upload_bytes: 50 * 1024 * 1024,
            max_concurrent_uploads: 32,
            max_uploads_per_user: 8,
            max_uploads_per_address: 16,
            busy_uploads_wait: std::time::Duration::from_secs(5),
            upload_idle: std::time::Duration::from_secs(30),
            upload_deadline: std::time::Duration::from_secs(600),
            presets: vec![Preset::Summarize, Preset::KeyFacts],
            request_timeout: std::time::Duration::from_secs(30),
            metrics_token: None,
            webhook_policy: engine::webhooks::TargetPolicy::default(),
            alert_webhook: false,
            session_renew_after: std::time::Duration::from_secs(24 * 3600),
            time_limits: Default::default(),
            call_limits: Default::default(),
            tokenizer: None,
            provider_prices: None,
            header_read_timeout: std::time::Duration::from_secs(10),
            max_connections: 4096,
            max_connections_per_address: 256,
            stalled_write_timeout: std::time::Duration::from_secs(30),
            secure_cookies: false,
            bulk_action_cap: engine::queue::bulk::DEFAULT_CAP,
            auth_cache_lifetime: engine::accounts::auth_cache::MAX_LIFETIME,
            document_reader: None,
            survey_reader: None,
        }
    }
}

/// Where a session keeps its user's id.
pub const USER_KEY: &str = "user_id";
/// The account's session epoch when the session began: a reset or a password change moves the
/// account's on, and every session begun before ends (see [`session_user`]).
const EPOCH_KEY: &str = "epoch";
/// When the session's expiry was last pushed back (seconds since the epoch).
const RENEWED_KEY: &str = "renewed_at_ms";

/// Run a server function's work and put its error's status (and `Retry-After`) on the response.
pub async fn answer<T>(work: impl Future<Output = Result<T, AppError>>) -> Result<T, AppError> {
    work.await.map_err(respond)
}

/// The server's context for this request.
pub fn context() -> Result<ServerContext, AppError> {
    leptos::prelude::use_context::<ServerContext>().ok_or(AppError::Internal)
}

/// This request's session.
pub async fn session() -> Result<Session, AppError> {
    leptos_axum::extract::<Session>().await.map_err(|_| AppError::Internal)
}

/// The session store is Postgres, so its failures are almost always the database being
/// unreachable (a restart): the caller should wait and retry.
fn session_error(e: tower_sessions::session::Error) -> AppError {
    tracing::warn!(error = %e, "session store");
    AppError::unavailable()
}

/// The logged-in user of a session, if any. A session in use is kept for 7 days of
/// inactivity, lazily: the store writes a session only when it changes, so its expiry is
/// pushed back (by marking when) at most once per `session_renew_after` (a day), not on every
/// request. A poll stays a read.
pub async fn session_user(ctx: &ServerContext, session: &Session) -> Result<Option<User>, AppError> {
    let Some(id) = session.get::<i64>(USER_KEY).await.map_err(session_error)? else {
        return Ok(None);
    };
    let epoch = session.get::<i32>(EPOCH_KEY).await.map_err(session_error)?.unwrap_or(0);
    let found = match ctx.auth.user(id) {
        // A kept account whose epoch differs may be the older one (this very session just
        // reset or changed the password): the database decides.
        Some(user) if user.session_epoch == epoch => Ok(user),
        _ => read_user(ctx, id).await,
    };
    match found {
        // Begun before the password was reset or changed: over, on every process (the change
        // made each forget the account it kept, so the epoch read here is the new one).
        Ok(user) if epoch != user.session_epoch => {
            end_session(session).await?;
            Ok(None)
        }
        Ok(user) => {
            // Milliseconds: whole seconds made a period renew up to a second early.
            let now = chrono::Utc::now().timestamp_millis();
            let renewed = session.get::<i64>(RENEWED_KEY).await.map_err(session_error)?.unwrap_or(0);
            if now.saturating_sub(renewed) >= ctx.settings.session_renew_after.as_millis() as i64 {
                session.insert(RENEWED_KEY, now).await.map_err(session_error)?;
            }
            Ok(Some(user))
        }
        Err(engine::EngineError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

tokio::task_local! {
    /// Set while a console request is served (see [`as_console_request`]).
    static CONSOLE_REQUEST: ();
}

/// Serve `work` as a console request: with every request connection taken, its caller's
/// session and account are read on the connections kept for health and the console, so an
/// operator still reaches the console and its kill switch. Other requests never use those.
pub async fn as_console_request<F: Future>(work: F) -> F::Output {
    CONSOLE_REQUEST.scope((), work).await
}

/// Whether this request is the console's ([`as_console_request`]).
pub fn is_console_request() -> bool {
    CONSOLE_REQUEST.try_with(|_| ()).is_ok()
}

/// The account from the database, kept for the next requests unless access changed meanwhile.
/// A console request finding every request connection taken reads it on the reserved ones:
/// who the caller is decides whether the console answers.
async fn read_user(ctx: &ServerContext, id: i64) -> engine::error::Result<User> {
    let read_at = ctx.auth.generation();
    let console = is_console_request();
    let user = if console && engine::db::is_full(&ctx.pool) {
        users::get(&ctx.reserved, id).await
    } else {
        match users::get(&ctx.pool, id).await {
            Err(engine::EngineError::Database(sqlx::Error::PoolTimedOut)) if console => {
                users::get(&ctx.reserved, id).await
            }
            other => other,
        }
    }?;
    ctx.auth.put_user(user.clone(), read_at);
    Ok(user)
}

/// The caller as the database has them now (their balance to the credit): the cached one is
/// who they are, a few seconds old.
pub async fn fresh(ctx: &ServerContext, user: &User) -> Result<User, AppError> {
    Ok(read_user(ctx, user.id).await?)
}

/// The caller, or 401.
pub async fn require_user(ctx: &ServerContext) -> Result<User, AppError> {
    session_user(ctx, &session().await?).await?.ok_or(AppError::Unauthenticated)
}

/// The caller if their role may do `what`. Anyone else gets "not found": the console does not
/// admit it exists, nor which of its functions a role lacks.
pub async fn require_permission(ctx: &ServerContext, what: Permission) -> Result<User, AppError> {
    let user = require_user(ctx).await.map_err(|_| AppError::NotFound)?;
    if user.may(what) {
        Ok(user)
    } else {
        Err(AppError::NotFound)
    }
}

/// A fresh session id at login (no fixation), then the user in it.
pub async fn start_session(session: &Session, user: &User) -> Result<(), AppError> {
    session.cycle_id().await.map_err(session_error)?;
    session.insert(RENEWED_KEY, chrono::Utc::now().timestamp_millis()).await.map_err(session_error)?;
    session.insert(EPOCH_KEY, user.session_epoch).await.map_err(session_error)?;
    session.insert(USER_KEY, user.id).await.map_err(session_error)
}

/// Ends the server-side session (the record is deleted, not just the cookie).
pub async fn end_session(session: &Session) -> Result<(), AppError> {
    session.flush().await.map_err(session_error)
}

/// The cookie a browser keeps its device token in (see `engine::accounts::login`).
pub const DEVICE_COOKIE: &str = "sluice_device";

/// The device token the browser sent, if any.
pub async fn device_token() -> Option<String> {
    let headers = leptos_axum::extract::<http::HeaderMap>().await.ok()?;
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(DEVICE_COOKIE)?.strip_prefix('=').map(str::to_string))
}

/// Have the browser keep `token` as its device token (a year; only the server reads it).
pub fn keep_device_token(token: &str, secure: bool) {
    let Some(options) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>() else { return };
    let cookie = format!(
        "{DEVICE_COOKIE}={token}; Path=/; Max-Age=31536000; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(value) = http::HeaderValue::from_str(&cookie) {
        options.append_header(http::header::SET_COOKIE, value);
    }
}

/// The client's address, for the throttles: the peer, or, when the peer is a trusted proxy,
/// the address that proxy says it forwarded for.
pub async fn client_address(trusted_proxies: &[IpAddr]) -> String {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    let Ok(ConnectInfo(peer)) = leptos_axum::extract::<ConnectInfo<SocketAddr>>().await else {
        return "unknown".into();
    };
    let headers = leptos_axum::extract::<http::HeaderMap>().await.unwrap_or_default();
    client_of(peer, &headers, trusted_proxies)
}

/// The client's throttle subject, from the peer and the request's headers.
pub fn client_of(peer: std::net::SocketAddr, headers: &http::HeaderMap, trusted_proxies: &[IpAddr]) -> String {
    throttle_subject(client_ip_of(peer, headers, trusted_proxies))
}

/// The client's address, from the peer and the request's `X-Forwarded-For` (see [`client_ip`]).
pub fn client_ip_of(peer: std::net::SocketAddr, headers: &http::HeaderMap, trusted_proxies: &[IpAddr]) -> IpAddr {
    let values: Vec<&str> = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).collect();
    let forwarded = (!values.is_empty()).then(|| values.join(","));
    client_ip(peer.ip(), forwarded.as_deref(), trusted_proxies)
}

/// Pure: the name the throttles count a client under: an IPv4 address, or an IPv6 /64 (one
/// subscriber gets a whole /64, so single IPv6 addresses cost an attacker nothing).
pub fn throttle_subject(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
    }
}

/// Pure: who the client is. `X-Forwarded-For` counts only when the peer is a trusted proxy;
/// then the rightmost address that is not itself a trusted proxy is the client (entries
/// further left were written by the client and prove nothing).
pub fn client_ip(peer: IpAddr, forwarded_for: Option<&str>, trusted_proxies: &[IpAddr]) -> IpAddr {
    let peer = peer.to_canonical();
    let trusted = |ip: &IpAddr| trusted_proxies.iter().any(|t| t.to_canonical() == *ip);
    if !trusted(&peer) {
        return peer;
    }
    let Some(header) = forwarded_for else { return peer };
    header
        .rsplit(',')
        .map(str::trim)
        .map_while(|hop| hop.parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))
        .find(|ip| !trusted(ip))
        .unwrap_or(peer)
}

/// A job the caller may see: their own (staff: any). Anything else is "not found".
pub async fn visible_job<'e>(db: impl sqlx::PgExecutor<'e>, caller: &User, id: &str) -> Result<JobView, AppError> {
    let id = Uuid::parse_str(id).map_err(|_| AppError::NotFound)?;
    let job = engine::queue::get(db, id).await?;
    if job.owner_id == caller.id || caller.may(Permission::SeeConsole) {
        Ok(job)
    } else {
        Err(AppError::NotFound)
    }
}

/// Delete one of the caller's own ended jobs: its document, result and file name go, the job
/// stays as a line of their credit history. Another user's job is 404 (admins included: a
/// user's data is theirs to delete); 409 while it has not ended.
pub async fn delete_own_job(ctx: &ServerContext, caller: &User, id: &str) -> Result<JobStatus, AppError> {
    let id = Uuid::parse_str(id).map_err(|_| AppError::NotFound)?;
    match engine::accounts::deletion::delete_job(&ctx.pool, &ctx.blobs, caller.id, id).await? {
        engine::accounts::deletion::JobDeletion::Deleted => {}
        engine::accounts::deletion::JobDeletion::NotEnded(state) => {
            return Err(AppError::NotEnded { state: state.as_str().to_string() })
        }
    }
    job_status(ctx, &engine::queue::get(&ctx.pool, id).await?).await
}

/// A job the caller may act on (cancel, retry now): their own, or, for a role that acts on
/// jobs, anyone's. Support sees others' jobs but may not act on them: "not found".
pub async fn job_to_act_on<'e>(db: impl sqlx::PgExecutor<'e>, caller: &User, id: &str) -> Result<JobView, AppError> {
    let job = visible_job(db, caller, id).await?;
    if job.owner_id == caller.id || caller.may(Permission::ActOnJobs) {
        Ok(job)
    } else {
        Err(AppError::NotFound)
    }
}

/// Cancel a job the caller may act on (their own; operators and admins any, which the audit
/// log records). 409 when it has already ended. Returns the job as it is now.
pub async fn cancel_visible_job(ctx: &ServerContext, caller: &User, id: &str) -> Result<JobStatus, AppError> {
    let pool = &ctx.pool;
    let job = job_to_act_on(pool, caller, id).await?;
    let someone_elses = job.owner_id != caller.id;
    let outcome =
        engine::queue::cancel(pool, &engine::hooks::SluiceHooks, job.id, &caller.email, someone_elses).await?;
    if let engine::queue::Canceled::AlreadyEnded(state) = outcome {
        if state != engine::JobState::Running {
            return Err(AppError::AlreadyEnded { state: state.as_str().to_string() });
        }
    }
    job_status(ctx, &engine::queue::get(pool, job.id).await?).await
}

/// Jobs as their owner sees them: paused while the kill switch is off, and, while waiting,
/// their place in line and estimated start.
pub async fn job_statuses(ctx: &ServerContext, owner_id: i64, jobs: &[JobView]) -> Result<Vec<JobStatus>, AppError> {
    let waiting: Vec<Uuid> = jobs.iter().filter(|j| j.state.is_waiting()).map(|j| j.id).collect();
    let line =
        if waiting.is_empty() { None } else { Some(ctx.line.waiting_line(&ctx.pool, owner_id, &waiting).await?) };
    let paused = line.as_ref().is_some_and(|line| !line.processing_enabled);
    let failed: Vec<Uuid> = jobs.iter().filter(|j| j.state == engine::JobState::Failed).map(|j| j.id).collect();
    let in_economy: Vec<Uuid> = jobs
        .iter()
        .filter(|j| j.state.is_waiting() && j.payload["economy"] == serde_json::Value::Bool(true))
        .map(|j| j.id)
        .collect();
    let in_batch = if in_economy.is_empty() {
        Default::default()
    } else {
        engine::documents::economy::in_batch_since(&ctx.pool, &in_economy).await?
    };
    let under_review =
        if failed.is_empty() { Vec::new() } else { engine::queue::reviews::under_review(&ctx.pool, &failed).await? };
    Ok(jobs
        .iter()
        .map(|j| {
            let mut status = JobStatus {
                paused,
                under_review: under_review.contains(&j.id),
                in_provider_batch_since: in_batch.get(&j.id).map(|at| crate::model::time_text(*at)),
                ..JobStatus::from(j)
            };
            if let Some(line) = &line {
                status.jobs_ahead = line.ahead.get(&j.id).map(|&n| n as i64);
                status.starts_in_secs = line.estimated_start(j.id).map(|d| d.as_secs_f64().ceil() as i64);
            }
            status
        })
        .collect())
}

/// One job as its owner sees it (see [`job_statuses`]).
pub async fn job_status(ctx: &ServerContext, job: &JobView) -> Result<JobStatus, AppError> {
    Ok(job_statuses(ctx, job.owner_id, std::slice::from_ref(job)).await?.remove(0))
}

#[cfg(test)]
mod tests {
    use super::{client_ip, throttle_subject};
    use std::net::IpAddr;

    #[test]
    fn forwarded_for_counts_only_from_trusted_proxies() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let proxy = ip("10.0.0.1");
        let trusted = [proxy];
        // A stranger's header is ignored.
        assert_eq!(client_ip(ip("203.0.113.9"), Some("1.2.3.4"), &trusted), ip("203.0.113.9"));
        // Behind the proxy: the rightmost untrusted hop, not what the client wrote further left.
        assert_eq!(client_ip(proxy, Some("6.6.6.6, 198.51.100.7"), &trusted), ip("198.51.100.7"));
        assert_eq!(client_ip(proxy, Some("198.51.100.7, 10.0.0.1"), &trusted), ip("198.51.100.7"));
        // Garbage or nothing: the proxy itself.
        assert_eq!(client_ip(proxy, Some("not-an-ip"), &trusted), proxy);
        assert_eq!(client_ip(proxy, None, &trusted), proxy);
        assert_eq!(client_ip(proxy, Some("1.2.3.4"), &[]), proxy, "no proxy is trusted by default");
        // A proxy seen as an IPv4-mapped IPv6 peer is still the trusted proxy.
        assert_eq!(client_ip(ip("::ffff:10.0.0.1"), Some("198.51.100.7"), &trusted), ip("198.51.100.7"));
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(throttle_subject(ip("2001:db8:1:2:aaaa::1")), throttle_subject(ip("2001:db8:1:2:bbbb::9")));
        assert_ne!(throttle_subject(ip("2001:db8:1:2::1")), throttle_subject(ip("2001:db8:1:3::1")));
        assert_eq!(throttle_subject(ip("::ffff:192.0.2.1")), "192.0.2.1");
    }
}
