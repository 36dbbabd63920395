//! The console's server functions. Each checks the caller's role for what it does
//! (`Role::may`); to anyone whose role may not, they answer 404, as if it did not exist.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::{
    AlertsInfo, AuditInfo, CapacityInfo, DlqGroupInfo, DlqJobInfo, JobFilterForm, JobSearchPage, QueueStatus,
    ReconciliationInfo, ReplayInfo, UserInfo,
};
#[cfg(feature = "ssr")]
use {
    crate::server::session::{answer, context, require_permission},
    engine::accounts::users::Permission,
    engine::queue::dlq::{self, Selection},
    engine::queue::reviews,
};

/// The kill switch, the gate and the vital signs with the last hour's chart.
#[server(endpoint = "admin/overview")]
pub async fn queue_overview() -> Result<QueueStatus, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let settings = engine::queue::switches::read(&ctx.reserved).await?;
        let capacity = engine::queue::capacity::status(&ctx.reserved).await?;
        let vitals = engine::queue::vitals::read(&ctx.reserved).await?;
        let history = engine::queue::vitals::history(&ctx.reserved, 60).await?;
        let store = engine::documents::store_space::read(&ctx.reserved).await?;
        let live = engine::queue::processes::live(&ctx.reserved).await?;
        Ok(QueueStatus {
            worker_slots: live.slots,
            worker_processes: live.processes,
            effective_concurrency: engine::queue::processes::effective_concurrency(
                i64::from(capacity.effective_gate),
                live,
            ),
            processing_enabled: settings.processing_enabled,
            processing_changed_at: crate::model::time_text(settings.processing_changed_at),
            processing_changed_by: settings.processing_changed_by,
            gate_size: settings.gate_size,
            effective_gate: capacity.effective_gate,
            gate_reduced: capacity.reduced.map(|(reason, since)| (reason, crate::model::time_text(since))),
            running: vitals.running,
            backlog: vitals.backlog,
            scheduled_retries: vitals.scheduled_retries,
            oldest_waiting_secs: vitals.oldest_waiting_secs,
            intake_per_min: vitals.intake.m5 * 60.0,
            completions_per_min: vitals.completions.m5 * 60.0,
            time_to_done_p50_secs: vitals.time_to_done_p50_secs,
            time_to_done_p95_secs: vitals.time_to_done_p95_secs,
            dlq_depth: vitals.dlq_depth,
            store_free_bytes: store.free_bytes,
            store_full: store.full,
            deadlines_at_risk: vitals.deadlines_at_risk,
            deadlines_missed_last_day: vitals.deadlines_missed_last_day,
            drain: describe_drain(vitals.drain),
            history: history.into_iter().map(|m| (m.intake, m.completions)).collect(),
            resume_at: settings
                .resume_at
                .map(|at| (crate::model::time_text(at), settings.resume_in_secs.unwrap_or(0.0).round() as i64)),
        })
    })
    .await
}

/// The drain estimate in words.
#[cfg(feature = "ssr")]
fn describe_drain(drain: engine::queue::policy::drain::DrainEstimate) -> String {
    use engine::queue::policy::drain::DrainEstimate;
    match drain {
        DrainEstimate::Empty => "empty".into(),
        DrainEstimate::NotDraining => "not draining".into(),
        DrainEstimate::DrainsIn(d) if d.as_secs() < 120 => format!("{} s", d.as_secs()),
        DrainEstimate::DrainsIn(d) => format!("{} min", d.as_secs() / 60),
    }
}

/// The provider's limits, the budget now, and the last `days` of attempts for the planner.
#[server(endpoint = "admin/capacity")]
pub async fn capacity(days: u32) -> Result<CapacityInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let days = days.clamp(1, 90);
        let status = engine::queue::capacity::status(&ctx.pool).await?;
        Ok(CapacityInfo {
            limits: status.limits,
            requests_left: status.requests_left,
            input_tokens_left: status.input_tokens_left,
            output_tokens_left: status.output_tokens_left,
            gate_size: status.configured_gate,
            effective_gate: status.effective_gate,
            days,
            stats: engine::queue::capacity::attempt_stats(&ctx.pool, days).await?,
            time_limits: ctx.settings.time_limits,
            deployments: engine::documents::providers::router::states(&ctx.pool).await?,
        })
    })
    .await
}

/// Flip the kill switch (audited).
#[server(endpoint = "admin/set_processing")]
pub async fn set_processing(enabled: bool) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::PauseProcessing).await?;
        engine::queue::switches::set_processing(&ctx.reserved, enabled, &admin.email).await?;
        Ok(())
    })
    .await
}

/// Resize the gate, 1 to 70 (audited).
#[server(endpoint = "admin/set_gate")]
pub async fn set_gate(size: i32) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::SetGate).await?;
        engine::queue::switches::set_gate_size(&ctx.pool, size, &admin.email).await?;
        Ok(())
    })
    .await
}

/// The dead-letter queue, grouped by kind and reason.
#[server(endpoint = "admin/dlq_groups")]
pub async fn dlq_groups() -> Result<Vec<DlqGroupInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let groups = dlq::groups(&ctx.pool).await?;
        let mut open = reviews::open_for_groups(&ctx.pool).await?;
        Ok(groups
            .into_iter()
            .map(|g| {
                let mine = |r: &reviews::Review| {
                    r.failure_kind == Some(g.failure_kind)
                        && r.failure_reason.as_deref() == Some(g.failure_reason.as_str())
                };
                let review = open.iter().position(mine).map(|at| open.swap_remove(at).into());
                DlqGroupInfo { kind: g.failure_kind, reason: g.failure_reason, jobs: g.jobs, review }
            })
            .collect())
    })
    .await
}

/// The newest jobs of one group, each with its owner and its attempts' errors.
#[server(endpoint = "admin/dlq_jobs")]
pub async fn dlq_jobs(kind: String, reason: String) -> Result<Vec<DlqJobInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let mut out = Vec::new();
        for job in dlq::group_jobs(&ctx.pool, failure_kind(&kind)?, &reason, 20).await? {
            let owner = engine::accounts::users::get(&ctx.pool, job.owner_id).await;
            let attempts = engine::queue::attempts(&ctx.pool, job.id).await?;
            out.push(DlqJobInfo {
                job: (&job).into(),
                owner_email: owner.map(|u| u.email).unwrap_or_default(),
                attempts: attempts
                    .into_iter()
                    .map(|a| {
                        let detail = a.detail.clone();
                        crate::model::AttemptInfo { detail, ..a.into() }
                    })
                    .collect(),
            });
        }
        Ok(out)
    })
    .await
}

/// Replay a whole group (free for the owners: their refunds stand).
#[server(endpoint = "admin/dlq_replay")]
pub async fn dlq_replay(kind: String, reason: String) -> Result<ReplayInfo, AppError> {
    answer(async move { replay(Selection::Group { kind: failure_kind(&kind)?, reason }).await }).await
}

/// Take a whole group out of the DLQ (the jobs stay failed and refunded).
#[server(endpoint = "admin/dlq_discard")]
pub async fn dlq_discard(kind: String, reason: String) -> Result<u64, AppError> {
    answer(async move { discard(Selection::Group { kind: failure_kind(&kind)?, reason }).await }).await
}

/// Replay one job.
#[server(endpoint = "admin/dlq_replay_job")]
pub async fn dlq_replay_job(id: String) -> Result<ReplayInfo, AppError> {
    answer(async move { replay(job_selection(&id)?).await }).await
}

/// Put a waiting job at the front of the line (audited); 409 when it is not waiting.
#[server(endpoint = "admin/run_next")]
pub async fn run_next(id: String) -> Result<(), AppError> {
    answer(async move {
        let ctx = context()?;
        let staff = require_permission(&ctx, Permission::ActOnJobs).await?;
        let id = uuid::Uuid::parse_str(&id).map_err(|_| AppError::NotFound)?;
        match engine::queue::run_next::run_next(&ctx.pool, id, &staff.email).await? {
            engine::queue::run_next::RunNext::Next => Ok(()),
            engine::queue::run_next::RunNext::NotWaiting(state) => {
                Err(AppError::NotWaiting { state: state.as_str().to_string() })
            }
        }
    })
    .await
}

/// Take one job out of the DLQ.
#[server(endpoint = "admin/dlq_discard_job")]
pub async fn dlq_discard_job(id: String) -> Result<u64, AppError> {
    answer(async move { discard(job_selection(&id)?).await }).await
}

/// A failure kind named in a request (422 for a name that is none).
#[cfg(feature = "ssr")]
pub fn failure_kind(name: &str) -> Result<engine::FailureKind, AppError> {
    engine::FailureKind::parse(name).ok_or_else(|| AppError::invalid("unknown failure kind"))
}

#[cfg(feature = "ssr")]
fn job_selection(id: &str) -> Result<Selection, AppError> {
    Ok(Selection::Job(uuid::Uuid::parse_str(id).map_err(|_| AppError::NotFound)?))
}

#[cfg(feature = "ssr")]
async fn replay(selection: Selection) -> Result<ReplayInfo, AppError> {
    let ctx = context()?;
    let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
    let done = dlq::replay(&ctx.pool, &engine::hooks::SluiceHooks, &selection, &admin.email).await?;
    Ok(ReplayInfo {
        replayed: done.ids.len(),
        already_reuploaded: done.already_reuploaded.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
        document_released: done.document_released.iter().map(|id| id.to_string()).collect(),
    })
}

#[cfg(feature = "ssr")]
async fn discard(selection: Selection) -> Result<u64, AppError> {
    let ctx = context()?;
    let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
    Ok(dlq::discard(&ctx.pool, &engine::hooks::SluiceHooks, &selection, &admin.email).await?)
}

/// The newest reconciliation report, if any run was made.
#[server(endpoint = "admin/reconciliation")]
pub async fn latest_reconciliation() -> Result<Option<ReconciliationInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        Ok(engine::reconcile::latest(&ctx.pool).await?.map(Into::into))
    })
    .await
}

/// Run a reconciliation now (reports only; fixes nothing), named after the admin.
#[server(endpoint = "admin/reconcile")]
pub async fn reconcile_now() -> Result<ReconciliationInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::ActOnJobs).await?;
        Ok(engine::reconcile::run(&ctx.pool, Some(&ctx.blobs), &admin.email).await?.into())
    })
    .await
}

/// Audit entries per page of the console.
#[cfg(feature = "ssr")]
const AUDIT_PAGE: i64 = 50;

/// A page of the audit log, the newest first (page 0).
#[server(endpoint = "admin/audit_log")]
pub async fn audit_log(page: Option<u32>) -> Result<Vec<AuditInfo>, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let entries =
            engine::audit::page(&ctx.pool, i64::from(page.unwrap_or(0).min(10_000)) * AUDIT_PAGE, AUDIT_PAGE).await?;
        Ok(entries
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
    })
    .await
}

/// The alerts firing now and the latest firings.
#[server(endpoint = "admin/alerts")]
pub async fn alerts() -> Result<AlertsInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let firing = engine::alerts::firing(&ctx.pool).await?;
        let recent = engine::alerts::recent(&ctx.pool, 10).await?;
        Ok(AlertsInfo {
            firing: firing.into_iter().map(Into::into).collect(),
            recent: recent.into_iter().map(Into::into).collect(),
            webhook: ctx.settings.alert_webhook,
        })
    })
    .await
}

/// Jobs shown per page of an admin search.
#[cfg(feature = "ssr")]
const SEARCH_PAGE: i64 = 25;

/// Every user's jobs matching `filter`, newest first, a page at a time, each with its open
/// review.
#[server(endpoint = "admin/search_jobs")]
pub async fn search_jobs(filter: JobFilterForm, page: Option<u32>) -> Result<JobSearchPage, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        let search = job_search(&filter)?;
        let offset = i64::from(page.unwrap_or(0).min(10_000)) * SEARCH_PAGE;
        let (found, has_more) = engine::queue::search(&ctx.pool, &search, offset, SEARCH_PAGE).await?;
        let ids: Vec<uuid::Uuid> = found.iter().map(|f| f.job.id).collect();
        let reviews = reviews::open_for_jobs(&ctx.pool, &ids).await?.into_iter().map(Into::into).collect();
        Ok(JobSearchPage {
            jobs: found.into_iter().map(|f| ((&f.job).into(), f.owner_email)).collect(),
            has_more,
            reviews,
        })
    })
    .await
}

/// The engine's search from the console's form: the text is a job id, part of an e-mail (with
/// `@`) or part of a file name; the days are `YYYY-MM-DD`, both included.
#[cfg(feature = "ssr")]
pub fn job_search(filter: &JobFilterForm) -> Result<engine::queue::JobSearch, AppError> {
    let chosen = |v: &Option<String>| v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
    Ok(engine::queue::JobSearch {
        text: chosen(&filter.text),
        state: match chosen(&filter.state) {
            Some(s) => Some(
                engine::JobState::ALL
                    .into_iter()
                    .find(|j| j.as_str() == s)
                    .ok_or_else(|| AppError::invalid("unknown state"))?,
            ),
            None => None,
        },
        failure_kind: match chosen(&filter.kind) {
            Some(k) => Some(failure_kind(&k)?),
            None => None,
        },
        from: day_start(filter.from.as_deref(), 0)?,
        until: day_start(filter.until.as_deref(), 1)?,
        needs_review: filter.needs_review.unwrap_or(false),
    })
}

/// The start of a `YYYY-MM-DD` day (UTC) plus `days_after` days; empty is none.
#[cfg(feature = "ssr")]
fn day_start(day: Option<&str>, days_after: i64) -> Result<Option<chrono::DateTime<chrono::Utc>>, AppError> {
    let Some(day) = day.map(str::trim).filter(|d| !d.is_empty()) else { return Ok(None) };
    let date =
        chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").map_err(|_| AppError::invalid("dates are YYYY-MM-DD"))?;
    let start = date.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc();
    let day = start.checked_add_signed(chrono::Duration::days(days_after));
    day.map(Some).ok_or_else(|| AppError::invalid("that date is out of range"))
}

/// A user by e-mail, with their balance and limits.
#[server(endpoint = "admin/find_user")]
pub async fn find_user(email: String) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        require_permission(&ctx, Permission::SeeConsole).await?;
        Ok(engine::accounts::users::find_by_email(&ctx.pool, &email).await?.into())
    })
    .await
}

/// Set a user's in-flight limit (audited).
#[server(endpoint = "admin/set_in_flight_limit")]
pub async fn set_in_flight_limit(user_id: i64, limit: i32) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::ManageUsers).await?;
        Ok(engine::accounts::users::set_max_in_flight(&ctx.pool, user_id, limit, &admin.email).await?.into())
    })
    .await
}

/// Grant credits to a user, or take them back with a negative amount (audited, in the ledger).
#[server(endpoint = "admin/grant_credits")]
pub async fn grant_credits(user_id: i64, amount: i64) -> Result<UserInfo, AppError> {
    answer(async move {
        let ctx = context()?;
        let admin = require_permission(&ctx, Permission::GrantCredits).await?;
        if amount == 0 || amount.unsigned_abs() > 1_000_000 {
            return Err(AppError::invalid("grant between 1 and 1,000,000 credits (negative takes them back)"));
        }
        engine::accounts::ledger::admin_adjust(&ctx.pool, user_id, amount, &admin.email, "granted on the admin page")
            .await?;
        Ok(engine::accounts::users::get(&ctx.pool, user_id).await?.into())
    })
    .await
}
