//! Server-side plain functions behind the server functions (and shared with the REST API):
//! sessions, the caller, ownership checks. Server functions only call these and map errors.

use std::sync::Arc;

use engine::accounts::{self, LoginLimits, Role, User};
use engine::admission::AdmissionConfig;
use engine::queue::{JobState, JobView};
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

/// Jobs as their owner sees them: paused while the kill switch is off, and, while waiting,
/// their place in line and estimated start.
pub async fn job_statuses(pool: &PgPool, owner_id: i64, jobs: &[JobView]) -> Result<Vec<JobStatus>, AppError> {
    let waiting: Vec<Uuid> =
        jobs.iter().filter(|j| matches!(j.state, JobState::Queued | JobState::Retrying)).map(|j| j.id).collect();
    let line =
        if waiting.is_empty() { None } else { Some(engine::queue::waiting_line(pool, owner_id, &waiting).await?) };
    let paused = match &line {
        Some(line) => !line.processing_enabled,
        None => false,
    };
    Ok(jobs
        .iter()
        .map(|j| {
            let mut status = JobStatus { paused, ..JobStatus::from(j) };
            if let Some(line) = &line {
                status.jobs_ahead = line.ahead.get(&j.id).map(|&n| n as i64);
                status.starts_in_secs = line.estimated_start(j.id).map(|d| d.as_secs_f64().ceil() as i64);
            }
            status
        })
        .collect())
}

/// One job as its owner sees it (see [`job_statuses`]).
pub async fn job_status(pool: &PgPool, job: &JobView) -> Result<JobStatus, AppError> {
    Ok(job_statuses(pool, job.owner_id, std::slice::from_ref(job)).await?.remove(0))
}

pub async fn list_jobs() -> Result<Vec<JobStatus>, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let jobs = engine::queue::list_for_owner(&ctx.pool, user.id, 200).await?;
    job_statuses(&ctx.pool, user.id, &jobs).await
}

pub async fn job_detail(id: String) -> Result<JobDetails, AppError> {
    let ctx = context()?;
    let user = require_user(&ctx).await?;
    let job = visible_job(&ctx.pool, &user, &id).await?;
    let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
    Ok(JobDetails {
        job: job_status(&ctx.pool, &job).await?,
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

/// The caller if they are an admin. Anyone else gets "not found": the admin area does not
/// admit it exists.
pub async fn require_admin(ctx: &ServerContext) -> Result<User, AppError> {
    let user = require_user(ctx).await.map_err(|_| AppError::NotFound)?;
    if user.is_admin() {
        Ok(user)
    } else {
        Err(AppError::NotFound)
    }
}

fn describe_drain(drain: engine::drain::DrainEstimate) -> String {
    match drain {
        engine::drain::DrainEstimate::Empty => "empty".into(),
        engine::drain::DrainEstimate::NotDraining => "not draining".into(),
        engine::drain::DrainEstimate::DrainsIn(d) if d.as_secs() < 120 => format!("{} s", d.as_secs()),
        engine::drain::DrainEstimate::DrainsIn(d) => format!("{} min", d.as_secs() / 60),
    }
}

pub async fn queue_overview() -> Result<QueueStatus, AppError> {
    let ctx = context()?;
    require_admin(&ctx).await?;
    let settings = engine::settings::read(&ctx.pool).await?;
    let vitals = engine::vitals::read(&ctx.pool).await?;
    let history = engine::vitals::history(&ctx.pool, 60).await?;
    Ok(QueueStatus {
        processing_enabled: settings.processing_enabled,
        processing_changed_at: crate::model::time_text(settings.processing_changed_at),
        processing_changed_by: settings.processing_changed_by,
        gate_size: settings.gate_size,
        running: vitals.running,
        backlog: vitals.backlog,
        scheduled_retries: vitals.scheduled_retries,
        oldest_waiting_secs: vitals.oldest_waiting_secs,
        intake_per_min: vitals.intake.m5 * 60.0,
        completions_per_min: vitals.completions.m5 * 60.0,
        time_to_done_p50_secs: vitals.time_to_done_p50_secs,
        time_to_done_p95_secs: vitals.time_to_done_p95_secs,
        dlq_depth: vitals.dlq_depth,
        drain: describe_drain(vitals.drain),
        history: history.into_iter().map(|m| (m.intake, m.completions)).collect(),
    })
}

pub async fn set_processing(enabled: bool) -> Result<(), AppError> {
    let ctx = context()?;
    let admin = require_admin(&ctx).await?;
    engine::settings::set_processing(&ctx.pool, enabled, &admin.email).await?;
    Ok(())
}

pub async fn set_gate(size: i32) -> Result<(), AppError> {
    let ctx = context()?;
    let admin = require_admin(&ctx).await?;
    engine::settings::set_gate_size(&ctx.pool, size, &admin.email).await?;
    Ok(())
}

pub async fn dlq_groups() -> Result<Vec<DlqGroupInfo>, AppError> {
    let ctx = context()?;
    require_admin(&ctx).await?;
    Ok(engine::dlq::groups(&ctx.pool)
        .await?
        .into_iter()
        .map(|g| DlqGroupInfo { kind: g.failure_kind.as_str().into(), reason: g.failure_reason, jobs: g.jobs })
        .collect())
}

fn failure_kind(kind: &str) -> Result<engine::retry::FailureKind, AppError> {
    engine::retry::FailureKind::parse(kind).ok_or_else(|| AppError::invalid("unknown failure kind"))
}

fn group_selection(kind: &str, reason: String) -> Result<engine::dlq::Selection, AppError> {
    Ok(engine::dlq::Selection::Group { kind: failure_kind(kind)?, reason })
}

fn job_selection(id: &str) -> Result<engine::dlq::Selection, AppError> {
    Ok(engine::dlq::Selection::Job(Uuid::parse_str(id).map_err(|_| AppError::NotFound)?))
}

/// The newest jobs of one group, each with its owner and its attempts' errors.
pub async fn dlq_jobs(kind: String, reason: String) -> Result<Vec<DlqJobInfo>, AppError> {
    let ctx = context()?;
    require_admin(&ctx).await?;
    let kind = failure_kind(&kind)?;
    let mut out = Vec::new();
    for job in engine::dlq::group_jobs(&ctx.pool, kind, &reason, 20).await? {
        let owner_email = engine::accounts::get(&ctx.pool, job.owner_id).await.map(|u| u.email).unwrap_or_default();
        let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
        out.push(DlqJobInfo {
            job: JobStatus::from(&job),
            owner_email,
            attempts: attempts.into_iter().map(Into::into).collect(),
        });
    }
    Ok(out)
}

async fn replay(selection: engine::dlq::Selection) -> Result<usize, AppError> {
    let ctx = context()?;
    let admin = require_admin(&ctx).await?;
    Ok(engine::dlq::replay(&ctx.pool, &engine::ledger::AccountHooks, &selection, &admin.email).await?.len())
}

async fn discard(selection: engine::dlq::Selection) -> Result<u64, AppError> {
    let ctx = context()?;
    let admin = require_admin(&ctx).await?;
    Ok(engine::dlq::discard(&ctx.pool, &selection, &admin.email).await?)
}

pub async fn dlq_replay(kind: String, reason: String) -> Result<usize, AppError> {
    replay(group_selection(&kind, reason)?).await
}

pub async fn dlq_discard(kind: String, reason: String) -> Result<u64, AppError> {
    discard(group_selection(&kind, reason)?).await
}

pub async fn dlq_replay_job(id: String) -> Result<usize, AppError> {
    replay(job_selection(&id)?).await
}

pub async fn dlq_discard_job(id: String) -> Result<u64, AppError> {
    discard(job_selection(&id)?).await
}

pub async fn audit_log() -> Result<Vec<AuditInfo>, AppError> {
    let ctx = context()?;
    require_admin(&ctx).await?;
    Ok(engine::settings::audit_log(&ctx.pool, 50)
        .await?
        .into_iter()
        .map(|a| AuditInfo {
            at: crate::model::time_text(a.at),
            actor: a.actor,
            action: a.action,
            subject: a.subject,
            old_value: a.old_value,
            new_value: a.new_value,
        })
        .collect())
}
