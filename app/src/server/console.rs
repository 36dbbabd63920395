//! The operator console's server functions beyond the admin page's first set ([`super::admin`]):
//! reviews, acknowledgements, bulk actions, processes, the timed pause, and outcomes and cost.
//! Each checks the role on the server; to anyone but an admin they answer 404.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::{BulkCount, BulkInfo, JobFilterForm, OutcomeRow, ProcessesInfo, ReviewInfo};
#[cfg(feature = "ssr")]
use {
    crate::server::admin::{failure_kind, job_search},
    crate::server::session::{answer, context, require_permission},
    engine::accounts::users::Permission,
    engine::queue::reviews::{self, Subject},
};

/// Pause processing for `minutes` (1 minute to 7 days); it resumes by itself (audited).
#[server(endpoint = "admin/pause_for")]
pub async fn pause_for(minutes: u32) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::PauseProcessing).await?;
        engine::queue::switches::pause_for(&ctx.pool, minutes, &admin.email).await?;
        Ok(())
    })
    .await
}

/// Outcomes and cost of the last 24 hours (`hour`) or 30 days (`day`), the newest first.
#[server(endpoint = "admin/outcomes")]
pub async fn outcomes(period: String) -> Result<Vec<OutcomeRow>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        use engine::queue::outcomes::{failure_share, read, Period};
        let (period, count, format) = match period.as_str() {
            "hour" => (Period::Hour, 24, "%Y-%m-%d %H:00"),
            "day" => (Period::Day, 30, "%Y-%m-%d"),
            _ => return Err(AppError::invalid("the period is hour or day")),
        };
        Ok(read(&ctx.pool, period, count)
            .await?
            .into_iter()
            .map(|o| OutcomeRow {
                start: o.start.format(format).to_string(),
                failure_share: failure_share(o.done, o.failed),
                done: o.done,
                failed: o.failed,
                credits_charged: o.credits_charged,
                credits_refunded: o.credits_refunded,
                input_tokens_succeeded: o.input_tokens_succeeded,
                output_tokens_succeeded: o.output_tokens_succeeded,
                input_tokens_failed: o.input_tokens_failed,
                output_tokens_failed: o.output_tokens_failed,
                output_tokens_discarded: o.output_tokens_discarded,
                cost_usd: ctx.settings.provider_prices.map(|p| {
                    p.cost_usd(
                        o.input_tokens_succeeded.saturating_add(o.input_tokens_failed),
                        o.cached_input_tokens,
                        o.output_tokens_succeeded.saturating_add(o.output_tokens_failed),
                    )
                }),
            })
            .collect())
    })
    .await
}

/// Every server process seen in the last day, and the concurrency in effect.
#[server(endpoint = "admin/processes")]
pub async fn processes() -> Result<ProcessesInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        use engine::queue::processes::{effective_concurrency, list, live};
        let capacity = engine::queue::capacity::status(&ctx.pool).await?;
        let live = live(&ctx.pool).await?;
        Ok(ProcessesInfo {
            processes: list(&ctx.pool)
                .await?
                .into_iter()
                .map(|p| crate::model::ProcessInfo {
                    name: p.name,
                    role: p.role,
                    version: p.version,
                    slots: p.slots,
                    running: p.running,
                    started_at: crate::model::time_text(p.started_at),
                    seen_at: crate::model::time_text(p.seen_at),
                    alive: p.alive,
                })
                .collect(),
            gate_size: capacity.configured_gate,
            effective_gate: capacity.effective_gate,
            live_slots: live.slots,
            effective_concurrency: effective_concurrency(i64::from(capacity.effective_gate), live),
        })
    })
    .await
}

/// The e-mails of the accounts a review can be handed to (operators and admins).
#[server(endpoint = "admin/admins")]
pub async fn admins() -> Result<Vec<String>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        Ok(sqlx::query_scalar(
            "SELECT email FROM users WHERE role IN ('admin', 'operator') AND deleted_at IS NULL ORDER BY email LIMIT 200",
        )
        .fetch_all(&ctx.pool)
        .await
        .map_err(engine::error::EngineError::from)?)
    })
    .await
}

/// The newest reviews (50), open ones first.
#[server(endpoint = "admin/reviews")]
pub async fn recent_reviews() -> Result<Vec<ReviewInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        Ok(reviews::recent(&ctx.pool, 50).await?.into_iter().map(Into::into).collect())
    })
    .await
}

/// Mark a failed job (`job` set) or a dead-letter group (`kind` and `reason`) "needs review",
/// handed to `assignee` (an admin's e-mail) with `note`.
#[server(endpoint = "admin/mark_review")]
pub async fn mark_review(
    job: Option<String>,
    kind: Option<String>,
    reason: Option<String>,
    note: String,
    assignee: String,
) -> Result<ReviewInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::MarkForReview).await?;
        let subject = match (job, kind) {
            (Some(job), _) => Subject::Job(uuid::Uuid::parse_str(&job).map_err(|_| AppError::NotFound)?),
            (None, Some(kind)) => Subject::Group { kind: failure_kind(&kind)?, reason: reason.unwrap_or_default() },
            (None, None) => return Err(AppError::invalid("name a job or a group")),
        };
        let assignee_id = engine::accounts::users::admin_id(&ctx.pool, &assignee).await?;
        Ok(reviews::mark(&ctx.pool, &subject, &note, assignee_id, &admin.email).await?.into())
    })
    .await
}

/// "Resolved, no action" for an open review, with why.
#[server(endpoint = "admin/resolve_review")]
pub async fn resolve_review(id: i64, note: String) -> Result<ReviewInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
        Ok(reviews::resolve_without_action(&ctx.pool, id, &note, &admin.email).await?.into())
    })
    .await
}

/// Acknowledge an alert firing (`alert`) or a reconciliation report (`report`) with a note.
#[server(endpoint = "admin/acknowledge")]
pub async fn acknowledge(what: String, id: i64, note: String) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
        use engine::acks::Acked;
        let what = match what.as_str() {
            "alert" => Acked::Alert(id),
            "report" => Acked::Report(id),
            _ => return Err(AppError::invalid("acknowledge an alert or a report")),
        };
        engine::acks::acknowledge(&ctx.pool, what, &note, &admin.email).await?;
        Ok(())
    })
    .await
}

/// How many jobs `filter` matches (up to one past the cap), before a bulk action.
#[server(endpoint = "admin/bulk_preview")]
pub async fn bulk_preview(filter: JobFilterForm) -> Result<BulkCount, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::ActOnJobs).await?;
        let cap = ctx.settings.bulk_action_cap;
        let matched = engine::queue::bulk::preview(&ctx.pool, &job_search(&filter)?, cap).await?;
        Ok(BulkCount { matched, cap })
    })
    .await
}

/// Cancel, replay or discard everything `filter` matches: at most the cap, and no more than
/// `confirmed` (the count the admin was shown). It runs in its own task: if it outlasts the
/// request, it goes on and the answer says so (the audit log has its counts when it ends).
#[server(endpoint = "admin/bulk_action")]
pub async fn bulk_action(action: String, filter: JobFilterForm, confirmed: i64) -> Result<BulkInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
        use engine::queue::bulk::{self, BulkAction};
        let action = BulkAction::parse(&action).ok_or_else(|| AppError::invalid("cancel, replay or discard"))?;
        let search = job_search(&filter)?;
        let limits = (ctx.settings.bulk_action_cap, confirmed.max(0));
        let matched = bulk::preview(&ctx.pool, &search, limits.0).await?;
        bulk::within_bounds(matched, limits.0, limits.1)?;
        let pool = ctx.pool.clone();
        let running = tokio::spawn(async move {
            let done = bulk::run(&pool, &engine::hooks::SluiceHooks, &search, action, limits, &admin.email).await;
            if let Err(e) = &done {
                tracing::warn!(error = %e, action = action.as_str(), "a bulk action stopped");
            }
            done
        });
        let patience = ctx.settings.request_timeout.saturating_sub(std::time::Duration::from_secs(2));
        match tokio::time::timeout(patience, running).await {
            Ok(Ok(done)) => {
                let done = done?;
                Ok(BulkInfo { matched: done.matched, acted: Some(done.acted), failed: done.failed })
            }
            Ok(Err(panicked)) => {
                tracing::error!(error = %panicked, "a bulk action stopped");
                Err(AppError::Internal)
            }
            Err(_) => Ok(BulkInfo { matched, acted: None, failed: 0 }),
        }
    })
    .await
}
