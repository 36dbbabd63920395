//! Server-side plain functions behind the server functions (and shared with the REST API):
//! sessions, the caller, ownership checks. Server functions only call these and map errors.

use std::sync::Arc;

use engine::accounts::{self, LoginLimits, Role, User};
use engine::admission::AdmissionConfig;
use sqlx::PgPool;
use tower_sessions::Session;
use uuid::Uuid;

use crate::errors::AppError;
use crate::model::*;

/// What server functions need from the server, provided as context.
#[derive(Clone)]
pub struct ServerContext {
    pub pool: PgPool,
    pub settings: Arc<WebSettings>,
    pub blobs: engine::blobs::Blobs,
}

#[derive(Clone, Debug)]
pub struct WebSettings {
    pub admission: AdmissionConfig,
    pub signup_grant: i64,
    pub login_limits: LoginLimits,
    pub max_upload_bytes: u64,
    /// The presets the configured provider can do (language-model presets need one).
    pub presets: Vec<engine::providers::Preset>,
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            admission: AdmissionConfig::default(),
            signup_grant: 20,
            login_limits: LoginLimits::default(),
            max_upload_bytes: 50 * 1024 * 1024,
            presets: vec![engine::providers::Preset::Summarize, engine::providers::Preset::KeyFacts],
        }
    }
}

const USER_KEY: &str = "user_id";

pub fn context() -> Result<ServerContext, AppError> {
    leptos::prelude::use_context::<ServerContext>().ok_or(AppError::Internal)
}

async fn session() -> Result<Session, AppError> {
    leptos_axum::extract::<Session>().await.map_err(|_| AppError::Internal)
}

fn session_error(e: tower_sessions::session::Error) -> AppError {
    tracing::error!(error = %e, "session store");
    AppError::Internal
}

/// The logged-in user of a session, if any.
pub async fn session_user(pool: &PgPool, session: &Session) -> Result<Option<User>, AppError> {
    let Some(id) = session.get::<i64>(USER_KEY).await.map_err(session_error)? else {
        return Ok(None);
    };
    match accounts::get(pool, id).await {
        Ok(user) => Ok(Some(user)),
        Err(engine::EngineError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The caller, or 401.
pub async fn require_user(ctx: &ServerContext) -> Result<User, AppError> {
    session_user(&ctx.pool, &session().await?).await?.ok_or(AppError::Unauthenticated)
}

/// A fresh session id at login (no fixation), then the user in it.
async fn start_session(session: &Session, user: &User) -> Result<(), AppError> {
    session.cycle_id().await.map_err(session_error)?;
    session.insert(USER_KEY, user.id).await.map_err(session_error)
}

async fn client_address() -> String {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    leptos_axum::extract::<ConnectInfo<SocketAddr>>()
        .await
        .map(|ConnectInfo(addr)| addr.ip().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub async fn sign_up(email: String, password: String) -> Result<UserInfo, AppError> {
    let ctx = context()?;
    let user = accounts::create_user(&ctx.pool, &email, &password, Role::User, ctx.settings.signup_grant).await?;
    start_session(&session().await?, &user).await?;
    Ok(user.into())
}

pub async fn log_in(email: String, password: String) -> Result<UserInfo, AppError> {
    let ctx = context()?;
    let client = client_address().await;
    let user = accounts::log_in(&ctx.pool, &email, &password, &client, ctx.settings.login_limits).await?;
    start_session(&session().await?, &user).await?;
    Ok(user.into())
}

/// Ends the server-side session (the record is deleted, not just the cookie).
pub async fn log_out() -> Result<(), AppError> {
    session().await?.flush().await.map_err(session_error)
}

pub async fn me() -> Result<Option<UserInfo>, AppError> {
    let ctx = context()?;
    Ok(session_user(&ctx.pool, &session().await?).await?.map(UserInfo::from))
}

/// A job the caller may see: their own (admins: any). Anything else is "not found".
pub async fn visible_job(pool: &PgPool, caller: &User, id: &str) -> Result<engine::queue::JobView, AppError> {
    let id = Uuid::parse_str(id).map_err(|_| AppError::NotFound)?;
    let job = engine::queue::get(pool, id).await?;
    if job.owner_id == caller.id || caller.is_admin() {
        Ok(job)
    } else {
        Err(AppError::NotFound)
    }
}

pub async fn list_jobs() -> Result<Vec<JobStatus>, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let jobs = engine::queue::list_for_owner(&ctx.pool, user.id, 200).await?;
    Ok(jobs.iter().map(JobStatus::from).collect())
}

pub async fn job_detail(id: String) -> Result<JobDetails, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let job = visible_job(&ctx.pool, &user, &id).await?;
    let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
    Ok(JobDetails {
        job: JobStatus::from(&job),
        result: job.result.clone(),
        attempts: attempts.into_iter().map(Into::into).collect(),
    })
}

pub async fn notices() -> Result<Vec<NoticeInfo>, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    Ok(engine::notices::list(&ctx.pool, user.id, 100).await?.into_iter().map(Into::into).collect())
}

pub async fn mark_notices_read(id: Option<i64>) -> Result<u64, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    Ok(engine::notices::mark_read(&ctx.pool, user.id, id).await?)
}

pub async fn credits() -> Result<CreditSummary, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let history = engine::ledger::history(&ctx.pool, user.id, 200).await?;
    Ok(CreditSummary { balance: user.balance, history: history.into_iter().map(Into::into).collect() })
}

pub async fn create_token(name: String) -> Result<NewToken, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let (token, secret) = engine::tokens::create(&ctx.pool, user.id, &name).await?;
    Ok(NewToken { token: token.into(), secret })
}

pub async fn list_tokens() -> Result<Vec<TokenInfo>, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    Ok(engine::tokens::list(&ctx.pool, user.id).await?.into_iter().map(Into::into).collect())
}

pub async fn revoke_token(id: i64) -> Result<(), AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    Ok(engine::tokens::revoke(&ctx.pool, user.id, id).await?)
}
