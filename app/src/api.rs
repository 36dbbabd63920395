//! Server functions: thin wrappers that call [`crate::handlers`] on the server and put the
//! error's HTTP status on the response. Each has a fixed endpoint under `/api/`.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::*;

#[cfg(feature = "ssr")]
use crate::{errors::respond, handlers as h};

#[server(endpoint = "sign_up")]
pub async fn sign_up(email: String, password: String) -> Result<UserInfo, AppError> {
    h::sign_up(email, password).await.map_err(respond)
}

#[server(endpoint = "log_in")]
pub async fn log_in(email: String, password: String) -> Result<UserInfo, AppError> {
    h::log_in(email, password).await.map_err(respond)
}

#[server(endpoint = "log_out")]
pub async fn log_out() -> Result<(), AppError> {
    h::log_out().await.map_err(respond)
}

#[server(endpoint = "me")]
pub async fn me() -> Result<Option<UserInfo>, AppError> {
    h::me().await.map_err(respond)
}

#[server(endpoint = "list_jobs")]
pub async fn list_jobs() -> Result<Vec<JobStatus>, AppError> {
    h::list_jobs().await.map_err(respond)
}

#[server(endpoint = "job_detail")]
pub async fn job_detail(id: String) -> Result<JobDetails, AppError> {
    h::job_detail(id).await.map_err(respond)
}

#[server(endpoint = "notices")]
pub async fn notices() -> Result<Vec<NoticeInfo>, AppError> {
    h::notices().await.map_err(respond)
}

#[server(endpoint = "mark_notices_read")]
pub async fn mark_notices_read(id: Option<i64>) -> Result<u64, AppError> {
    h::mark_notices_read(id).await.map_err(respond)
}

#[server(endpoint = "credits")]
pub async fn credits() -> Result<CreditSummary, AppError> {
    h::credits().await.map_err(respond)
}

#[server(endpoint = "create_token")]
pub async fn create_token(name: String) -> Result<NewToken, AppError> {
    h::create_token(name).await.map_err(respond)
}

#[server(endpoint = "list_tokens")]
pub async fn list_tokens() -> Result<Vec<TokenInfo>, AppError> {
    h::list_tokens().await.map_err(respond)
}

#[server(endpoint = "revoke_token")]
pub async fn revoke_token(id: i64) -> Result<(), AppError> {
    h::revoke_token(id).await.map_err(respond)
}

/// What this server offers and charges: its presets (language-model presets need a
/// provider), the cost per document, the upload cap and the sign-up grant. Public.
#[server(endpoint = "terms")]
pub async fn terms() -> Result<SiteTerms, AppError> {
    let ctx = h::context().map_err(respond)?;
    let settings = &ctx.settings;
    Ok(SiteTerms {
        presets: settings
            .presets
            .iter()
            .map(|p| PresetInfo { id: p.as_str().to_string(), label: p.label().to_string() })
            .collect(),
        cost: settings.admission.cost,
        max_upload_bytes: settings.max_upload_bytes,
        signup_grant: settings.signup_grant,
    })
}

#[server(endpoint = "admin/overview")]
pub async fn queue_overview() -> Result<QueueStatus, AppError> {
    h::queue_overview().await.map_err(respond)
}

#[server(endpoint = "admin/set_processing")]
pub async fn set_processing(enabled: bool) -> Result<(), AppError> {
    h::set_processing(enabled).await.map_err(respond)
}

#[server(endpoint = "admin/set_gate")]
pub async fn set_gate(size: i32) -> Result<(), AppError> {
    h::set_gate(size).await.map_err(respond)
}

#[server(endpoint = "admin/dlq_groups")]
pub async fn dlq_groups() -> Result<Vec<DlqGroupInfo>, AppError> {
    h::dlq_groups().await.map_err(respond)
}

#[server(endpoint = "admin/dlq_replay")]
pub async fn dlq_replay(kind: String, reason: String) -> Result<usize, AppError> {
    h::dlq_replay(kind, reason).await.map_err(respond)
}

#[server(endpoint = "admin/dlq_discard")]
pub async fn dlq_discard(kind: String, reason: String) -> Result<u64, AppError> {
    h::dlq_discard(kind, reason).await.map_err(respond)
}

#[server(endpoint = "admin/dlq_jobs")]
pub async fn dlq_jobs(kind: String, reason: String) -> Result<Vec<DlqJobInfo>, AppError> {
    h::dlq_jobs(kind, reason).await.map_err(respond)
}

#[server(endpoint = "admin/dlq_replay_job")]
pub async fn dlq_replay_job(id: String) -> Result<usize, AppError> {
    h::dlq_replay_job(id).await.map_err(respond)
}

#[server(endpoint = "admin/dlq_discard_job")]
pub async fn dlq_discard_job(id: String) -> Result<u64, AppError> {
    h::dlq_discard_job(id).await.map_err(respond)
}

#[server(endpoint = "admin/audit_log")]
pub async fn audit_log() -> Result<Vec<AuditInfo>, AppError> {
    h::audit_log().await.map_err(respond)
}
