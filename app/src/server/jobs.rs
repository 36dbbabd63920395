//! A user's jobs: the list and one job's details.

use leptos::prelude::*;
#[cfg(feature = "ssr")]
use leptos::server_fn::codec::{ByteStream, Streaming};

use crate::errors::AppError;
use crate::model::{JobDetails, JobStatus, JobsPage, UploadReply};
#[cfg(feature = "ssr")]
use crate::server::session::{
    answer, cancel_visible_job, context, job_status, job_statuses, job_to_act_on, require_user, visible_job,
};

/// Jobs on one page of the list.
pub const JOBS_PER_PAGE: u32 = 50;

/// One page of the caller's jobs, newest first, each with its place in line while waiting;
/// optionally only one state, and only file names containing `search` (any case).
#[server(endpoint = "list_jobs")]
pub async fn list_jobs(page: Option<u32>, state: Option<String>, search: Option<String>) -> Result<JobsPage, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let state = match state.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(
                crate::model::JobState::ALL
                    .into_iter()
                    .find(|k| k.as_str() == s)
                    .ok_or_else(|| AppError::invalid(format!("no such state: {s:?}")))?,
            ),
        };
        let search = search.map(|s| s.trim().chars().take(200).collect::<String>()).filter(|s| !s.is_empty());
        let filter = engine::queue::JobFilter { state, name_contains: search };
        let offset = i64::from(page.unwrap_or(0).min(100_000)) * i64::from(JOBS_PER_PAGE);
        let (jobs, has_more) =
            engine::queue::page_for_owner(&ctx.pool, user.id, &filter, offset, i64::from(JOBS_PER_PAGE)).await?;
        Ok(JobsPage { jobs: job_statuses(&ctx, user.id, &jobs).await?, has_more })
    })
    .await
}

/// One of the caller's jobs with its result and attempts; anyone else's is 404.
#[server(endpoint = "job_detail")]
pub async fn job_detail(id: String) -> Result<JobDetails, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let job = visible_job(&ctx.pool, &user, &id).await?;
        let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
        // Support sees another's job, not its text: the result is for its owner and the roles
        // that may open documents.
        let readable = job.owner_id == user.id || user.may(engine::accounts::users::Permission::OpenDocuments);
        let result = job.result.clone().filter(|_| readable);
        let markdown = result.as_ref().and_then(|r| r["markdown"].as_str()).map(str::to_string);
        let result_html = match markdown {
            Some(markdown) => Some(render_result(markdown).await?),
            None => None,
        };
        // Operators see which deployment each call went to; owners see the document's progress.
        let calls = if user.may(engine::accounts::users::Permission::SeeConsole) {
            engine::documents::providers::router::calls_of(&ctx.pool, job.id).await?
        } else {
            Vec::new()
        };
        Ok(JobDetails {
            job: job_status(&ctx, &job).await?,
            result_html,
            result,
            attempts: attempts.into_iter().map(Into::into).collect(),
            calls: calls
                .into_iter()
                .map(|c| crate::model::CallInfo {
                    at: crate::model::time_text(c.at),
                    deployment: c.deployment,
                    answered: c.answered,
                    failure: c.failure,
                })
                .collect(),
        })
    })
    .await
}

/// Cancel one of the caller's jobs (admins: anyone's, audited): a waiting job at once, refunded;
/// a running one at its next safe point. 409 when it has already ended.
#[server(endpoint = "cancel_job")]
pub async fn cancel_job(id: String) -> Result<JobStatus, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        cancel_visible_job(&ctx, &user, &id).await
    })
    .await
}

/// "Retry now": one of the caller's retrying jobs (admins: anyone's, audited) becomes due at
/// once, with no extra attempt; the gate and the kill switch still decide when it runs. 409
/// when it is not retrying.
#[server(endpoint = "retry_now")]
pub async fn retry_now(id: String) -> Result<JobStatus, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let job = job_to_act_on(&ctx.pool, &user, &id).await?;
        let owner = (job.owner_id == user.id).then_some(user.id);
        match engine::queue::retry_now(&ctx.pool, job.id, owner, &user.email).await? {
            engine::queue::RetriedNow::Due => {}
            engine::queue::RetriedNow::NotRetrying(state) => {
                return Err(AppError::NotRetrying { state: state.as_str().to_string() })
            }
        }
        job_status(&ctx, &engine::queue::get(&ctx.pool, job.id).await?).await
    })
    .await
}

/// Delete one of the caller's ended jobs' document and result (the job stays, marked deleted).
#[server(endpoint = "delete_job")]
pub async fn delete_job(id: String) -> Result<JobStatus, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        crate::server::session::delete_own_job(&ctx, &user, &id).await
    })
    .await
}

/// "Run again": one of the caller's jobs as a new job (and a new debit), with the same
/// document and the given preset (or the earlier one).
#[server(endpoint = "run_again")]
pub async fn run_again(id: String, preset: Option<String>) -> Result<UploadReply, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let again = crate::server::upload::run_again(&ctx, &user, &id, preset.as_deref(), None).await?;
        Ok(again.reply())
    })
    .await
}

/// A result's Markdown as safe HTML, rendered off the async threads and at most two at once
/// (a result can be 2 MiB of a provider's text, and anyone may ask for their job's page often).
#[cfg(feature = "ssr")]
async fn render_result(markdown: String) -> Result<String, AppError> {
    static RENDERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
    let _turn = RENDERING.acquire().await.map_err(|_| AppError::Internal)?;
    tokio::task::spawn_blocking(move || engine::documents::render::markdown_to_safe_html(&markdown))
        .await
        .map_err(|_| AppError::Internal)
}

/// The upload page's upload: a `multipart/form-data` body (`file`, `preset`, `language`),
/// streamed. 202 with the new job; 200 with the earlier job for a repeated `Idempotency-Key`;
/// 402, 429, 503 before any byte of the body is read; 413, 415, 422 while reading it. The same
/// intake path as `POST /api/v1/jobs`.
///
/// The page calls it with an XMLHttpRequest (for upload progress; see
/// `pages::upload::UPLOAD_URL`), so the browser build needs no client stub, and server_fn's
/// streaming client would not take a form anyway.
#[cfg(feature = "ssr")]
#[server(prefix = "/api", endpoint = "upload_document", input = Streaming, impl_from = false)]
pub async fn upload_document(body: UploadBody) -> Result<UploadReply, AppError> {
    answer(async move {
        let ctx = context()?;
        let user = require_user(&ctx).await?;
        let headers: http::HeaderMap = leptos_axum::extract().await.map_err(|_| AppError::Internal)?;
        let client = crate::server::session::client_address(&ctx.settings.trusted_proxies).await;
        let uploaded = crate::server::upload::upload(&ctx, &user, None, &client, &headers, body).await?;
        let status_url = uploaded.status_url();
        if let Some(options) = use_context::<leptos_axum::ResponseOptions>() {
            options.set_status(if uploaded.duplicate { http::StatusCode::OK } else { http::StatusCode::ACCEPTED });
            if let Ok(location) = http::HeaderValue::from_str(&status_url) {
                options.insert_header(http::header::LOCATION, location);
            }
        }
        Ok(uploaded.reply())
    })
    .await
}

/// The upload server function's request body, as the bytes arrive.
#[cfg(feature = "ssr")]
pub struct UploadBody(std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, AppError>> + Send>>);

#[cfg(feature = "ssr")]
impl std::fmt::Debug for UploadBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UploadBody")
    }
}

#[cfg(feature = "ssr")]
impl futures::Stream for UploadBody {
    type Item = Result<bytes::Bytes, AppError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.as_mut().poll_next(cx)
    }
}

/// How server_fn's `Streaming` input hands the body over.
#[cfg(feature = "ssr")]
impl From<ByteStream<AppError>> for UploadDocument {
    fn from(body: ByteStream<AppError>) -> Self {
        UploadDocument { body: UploadBody(Box::pin(body.into_inner())) }
    }
}

/// server_fn's `Streaming` client sends the arguments as a byte stream (the browser sends a
/// form with XMLHttpRequest instead); a failed chunk ends it.
#[cfg(feature = "ssr")]
impl futures::Stream for UploadDocument {
    type Item = bytes::Bytes;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.body).poll_next(cx).map(|chunk| chunk.and_then(Result::ok))
    }
}
