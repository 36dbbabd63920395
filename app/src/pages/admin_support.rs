//! The admin page's support tools: the alerts card, finding any job (by id, e-mail, file
//! name, state, failure kind and date) to open, cancel, replay or inspect, and a user's
//! credits and in-flight limit. Every call is checked on the server.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::{
    AckInfo, AlertInfo, AlertsInfo, FailureKind, JobFilterForm, JobState, JobStatus, Permission, ReviewInfo, UserInfo,
};
use crate::pages::admin_reviews::{MarkReviewForm, ReviewBadge};
use crate::pages::clock::local_date_time;
use crate::pages::clock::now_ms;
use crate::pages::console::may;
use crate::pages::jobs::{state_label, CancelButton, RetryNowButton, StateBadge};
use crate::server::admin::{find_user, search_jobs, DlqReplayJob, GrantCredits, RunNext, SetInFlightLimit};
use crate::server::console::{bulk_preview, Acknowledge, BulkAction};

/// Pure: a rule's name for people.
pub fn rule_label(rule: &str) -> &'static str {
    match rule {
        "oldest_wait" => "A job has waited too long",
        "not_draining" => "The queue is not draining",
        "dlq_depth" => "The dead-letter queue is deep",
        "dlq_growth" => "Jobs are failing fast",
        "provider_failures" => "The provider is failing",
        "reconciliation_drift" => "The books do not add up",
        "store_full" => "The document store is full",
        "provider_held" => "The provider's quota is spent",
        "deadline_at_risk" => "Deadlines are at risk",
        "primary_resting" => "The primary provider deployment is down",
        _ => "Alert",
    }
}

/// Pure: a rule's value (or threshold) in its unit.
pub fn alert_value_text(rule: &str, value: f64) -> String {
    match rule {
        "oldest_wait" => format!("{:.0} min", value / 60.0),
        "not_draining" => format!("{value:.0} min"),
        "provider_failures" => format!("{:.0} %", value * 100.0),
        "store_full" => crate::format::size_text(value.max(0.0) as u64),
        "provider_held" => (if value > 0.0 { "held" } else { "taking calls" }).to_string(),
        "deadline_at_risk" => format!("{value:.0} documents"),
        "primary_resting" => format!("{:.0} min", value / 60.0),
        _ => format!("{value:.0}"),
    }
}

fn alert_line(a: &AlertInfo) -> String {
    format!(
        "{} (now {}, threshold {})",
        a.detail,
        alert_value_text(&a.rule, a.value),
        alert_value_text(&a.rule, a.threshold)
    )
}

/// What fires now (since when, value, threshold), and the latest resolved firings.
#[component]
pub fn AlertsCard(
    alerts: LocalResource<Result<AlertsInfo, AppError>>,
    ack: ServerAction<Acknowledge>,
) -> impl IntoView {
    view! {
        <section class="card" data-testid="alerts">
            <h2>"Alerts"</h2>
            <Show when=move || alerts.get().and_then(|r| r.ok()).is_some_and(|a| a.firing.is_empty())>
                <p class="ok-text" data-testid="no-alerts">"Nothing is firing."</p>
            </Show>
            // Keyed, so a refresh keeps a half-written acknowledgement.
            <ul class="alerts">
                <For
                    each=move || alerts.get().and_then(|r| r.ok()).map(|a| a.firing).unwrap_or_default()
                    key=|f| (f.id, f.acknowledged.is_some(), f.value.to_bits())
                    children=move |f| view! {
                        <li class="alert-firing" data-testid="alert-firing" data-rule=f.rule.clone()>
                            <strong>{rule_label(&f.rule)}</strong>
                            <span class="when">{format!(" since {}: ", local_date_time(&f.fired_at))}</span>
                            {alert_line(&f)}
                            <Acknowledgement what="alert" id=f.id acked=f.acknowledged.clone() ack/>
                        </li>
                    }
                />
            </ul>
            {move || alerts.get().and_then(|r| r.ok()).map(|a| {
                let resolved: Vec<AlertInfo> = a.recent.into_iter().filter(|f| f.resolved_at.is_some()).take(5).collect();
                view! {
                    <p class="hint">
                        {if a.webhook {
                            "Each firing and each resolve is also sent to the alert webhook."
                        } else {
                            "No alert webhook is set (--alert-webhook-url): alerts show here and in /metrics."
                        }}
                    </p>
                    {(!resolved.is_empty()).then(|| view! {
                        <details>
                            <summary>"Recently resolved"</summary>
                            <ul class="audit">
                                {resolved.into_iter().map(|f| view! {
                                    <li>
                                        <span class="when">{local_date_time(&f.fired_at)}</span>
                                        {format!(" {} until {}: {}", rule_label(&f.rule),
                                            f.resolved_at.as_deref().map(local_date_time).unwrap_or_default(), f.detail)}
                                        {f.acknowledged.map(|a| format!(" (acknowledged by {})", a.by))}
                                    </li>
                                }).collect_view()}
                            </ul>
                        </details>
                    })}
                }
            })}
        </section>
    }
}

/// Who acknowledged an alert or a report, or a form to acknowledge it with a note.
#[component]
pub fn Acknowledgement(
    what: &'static str,
    id: i64,
    acked: Option<AckInfo>,
    ack: ServerAction<Acknowledge>,
) -> impl IntoView {
    let note = RwSignal::new(String::new());
    let field = format!("ack-{what}-{id}");
    match acked {
        Some(a) => view! {
            <p class="ack" data-testid="acknowledged">
                {format!(
                    "Acknowledged by {} at {}{}",
                    a.by,
                    local_date_time(&a.at),
                    a.note.map(|n| format!(": {n}")).unwrap_or_default()
                )}
            </p>
        }
        .into_any(),
        None if !may(Permission::ActOnJobs) => view! { <p class="muted">"Not acknowledged yet."</p> }.into_any(),
        None => view! {
            <form class="ack-form" on:submit=move |ev| {
                ev.prevent_default();
                ack.dispatch(Acknowledge { what: what.to_string(), id, note: note.get_untracked() });
            }>
                <label for=field.clone() class="visually-hidden">"Acknowledgement note"</label>
                <input id=field.clone() type="text" maxlength="2000" placeholder="Note (optional)"
                    on:input=move |ev| note.set(event_target_value(&ev))/>
                <button class="button small" type="submit">"Acknowledge"</button>
            </form>
        }
        .into_any(),
    }
}

/// Find any job: the search box reads a job id, an e-mail (with `@`) or a file name.
#[component]
pub fn JobSearchCard(replay: ServerAction<DlqReplayJob>) -> impl IntoView {
    let text = RwSignal::new(String::new());
    let state = RwSignal::new(String::new());
    let kind = RwSignal::new(String::new());
    let from = RwSignal::new(String::new());
    let until = RwSignal::new(String::new());
    let needs_review = RwSignal::new(false);
    let page = RwSignal::new(0u32);
    // The search the results (and a bulk action) are for: what was submitted, not what is typed.
    let searched = RwSignal::new(None::<JobFilterForm>);
    let reload = RwSignal::new(0u32);
    let results = LocalResource::new(move || {
        reload.track();
        replay.version().track();
        let (filter, page) = (searched.get(), page.get());
        async move {
            match filter {
                None => Ok(None),
                Some(filter) => search_jobs(filter, Some(page)).await.map(Some),
            }
        }
    });
    let now = RwSignal::new(now_ms());
    let has_more = move || results.get().and_then(|r| r.ok()).flatten().is_some_and(|p| p.has_more);
    let refresh = Callback::new(move |_| reload.update(|n| *n += 1));
    view! {
        <section class="card wide" data-testid="job-search">
            <h2>"Find jobs"</h2>
            <form class="filters" on:submit=move |ev| {
                ev.prevent_default();
                let some = |s: String| (!s.trim().is_empty()).then_some(s);
                searched.set(Some(JobFilterForm {
                    text: some(text.get_untracked()),
                    state: some(state.get_untracked()),
                    kind: some(kind.get_untracked()),
                    from: some(from.get_untracked()),
                    until: some(until.get_untracked()),
                    needs_review: needs_review.get_untracked().then_some(true),
                }));
                page.set(0);
                reload.update(|n| *n += 1);
            }>
                <label for="search-text">"Job id, e-mail or file name"</label>
                <input id="search-text" type="search" prop:value=text on:input=move |ev| text.set(event_target_value(&ev))/>
                <label for="search-state">"State"</label>
                <select id="search-state" on:change=move |ev| state.set(event_target_value(&ev))>
                    <option value="">"Any"</option>
                    {JobState::ALL.into_iter().map(|s| view! { <option value=s.as_str()>{state_label(s)}</option> }).collect_view()}
                </select>
                <label for="search-kind">"Failure"</label>
                <select id="search-kind" on:change=move |ev| kind.set(event_target_value(&ev))>
                    <option value="">"Any"</option>
                    {FailureKind::ALL.into_iter().map(|k| view! { <option value=k.as_str()>{k.as_str().replace('_', " ")}</option> }).collect_view()}
                </select>
                <label for="search-from">"From"</label>
                <input id="search-from" type="date" on:input=move |ev| from.set(event_target_value(&ev))/>
                <label for="search-until">"Until"</label>
                <input id="search-until" type="date" on:input=move |ev| until.set(event_target_value(&ev))/>
                <label class="check"><input type="checkbox" on:change=move |ev| needs_review.set(event_target_checked(&ev))/>" Needs review"</label>
                <button class="button primary" type="submit">"Search"</button>
            </form>
            {move || searched.get().map(|filter| view! { <BulkBar filter done=refresh/> })}
            {move || results.get().map(|r| match r {
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                Ok(None) => ().into_any(),
                Ok(Some(p)) if p.jobs.is_empty() => view! { <p class="empty">"No jobs match."</p> }.into_any(),
                Ok(Some(p)) => {
                    let reviews = p.reviews;
                    view! {
                        <ul class="jobs">
                            {p.jobs.into_iter().map(|(job, owner)| {
                                let review = reviews.iter().find(|r| r.job_id.as_deref() == Some(job.id.as_str())).cloned();
                                view! { <FoundJob job owner review replay now refresh/> }
                            }).collect_view()}
                        </ul>
                    }.into_any()
                }
            })}
            <nav class="pager" aria-label="Pages of found jobs">
                <button class="button small" disabled=move || page.get() == 0 on:click=move |_| page.update(|p| *p = p.saturating_sub(1))>"Newer"</button>
                <span class="muted">{move || format!("Page {}", page.get() + 1)}</span>
                <button class="button small" disabled=move || !has_more() on:click=move |_| page.update(|p| *p += 1)>"Older"</button>
            </nav>
        </section>
    }
}

/// One found job: its owner, attempts and state, its review, and what can be done to it.
#[component]
fn FoundJob(
    job: JobStatus,
    owner: String,
    review: Option<ReviewInfo>,
    replay: ServerAction<DlqReplayJob>,
    now: RwSignal<f64>,
    refresh: Callback<()>,
) -> impl IntoView {
    let id = job.id.clone();
    let failed = job.state == JobState::Failed;
    let replay_id = id.clone();
    let review_id = id.clone();
    view! {
        <li class="job" data-testid="found-job" data-job-id=id.clone()>
            <a class="file-name" href=format!("/jobs/{id}")>{job.file_name.clone().unwrap_or_else(|| "document".into())}</a>
            <span class="muted">{format!("{owner} · {} attempts · {}", job.attempts, local_date_time(&job.accepted_at))}</span>
            <StateBadge job=job.clone() now=now/>
            {(failed && may(Permission::ActOnJobs)).then(|| view! {
                <a class="button small" href=format!("/api/v1/jobs/{id}/original") rel="external">"Download the original"</a>
                <button class="button small" on:click=move |_| { replay.dispatch(DlqReplayJob { id: replay_id.clone() }); }>"Replay"</button>
            })}
            {(failed && may(Permission::MarkForReview)).then(|| view! { <MarkReviewForm job=review_id marked=refresh/> })}
            {may(Permission::ActOnJobs).then(|| view! {
                <RetryNowButton job=job.clone() done=refresh/>
                <RunNextButton job=job.clone() done=refresh/>
                <CancelButton job=job done=refresh/>
            })}
            <ReviewBadge review/>
        </li>
    }
}

/// Puts a waiting job first in line (a deadline at risk, say); shown for waiting jobs only.
#[component]
fn RunNextButton(job: JobStatus, done: Callback<()>) -> impl IntoView {
    let run_next = ServerAction::<RunNext>::new();
    Effect::new(move |_| {
        if let Some(Ok(())) = run_next.value().get() {
            done.run(());
        }
    });
    let id = job.id.clone();
    matches!(job.state, JobState::Queued | JobState::Retrying).then(|| {
        let name = job.file_name.clone().unwrap_or_else(|| "this document".into());
        view! {
            <span class="run-next">
                <button class="button small" aria-label=format!("Run {name} next")
                    on:click=move |_| { run_next.dispatch(RunNext { id: id.clone() }); }>
                    "Run next"
                </button>
                <span class="form-error">{move || run_next.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</span>
            </span>
        }
    })
}

/// Pure: what a bulk action will do, as the confirmation asks it.
pub fn bulk_question(action: &str, matched: i64) -> String {
    let jobs = if matched == 1 { "1 job".to_string() } else { format!("{matched} jobs") };
    match action {
        "cancel" => {
            format!("Cancel {jobs}? Waiting ones are refunded at once; running ones stop at their next safe point.")
        }
        "replay" => format!("Replay the failed ones of {jobs}? They run again, free for their owners."),
        _ => format!("Discard the failed ones of {jobs} from the dead-letter queue? They stay failed and refunded."),
    }
}

/// Act on everything the search matches: count first, confirm with the count, then run.
#[component]
fn BulkBar(filter: JobFilterForm, done: Callback<()>) -> impl IntoView {
    let chosen = RwSignal::new(None::<&'static str>);
    let count = LocalResource::new({
        let filter = filter.clone();
        move || {
            let (action, filter) = (chosen.get(), filter.clone());
            async move {
                match action {
                    Some(_) => bulk_preview(filter).await.map(Some),
                    None => Ok(None),
                }
            }
        }
    });
    let run = ServerAction::<BulkAction>::new();
    Effect::new(move |_| {
        if run.value().get().is_some() {
            done.run(());
        }
    });
    let filter = StoredValue::new(filter);
    may(Permission::ActOnJobs).then(|| view! {
        <div class="bulk" data-testid="bulk">
            <span class="muted">"Everything this search matches:"</span>
            {["cancel", "replay", "discard"].into_iter().map(|action| view! {
                <button class="button small" on:click=move |_| { run.clear(); chosen.set(Some(action)); }>
                    {format!("{}…", crate::format::capitalise(action))}
                </button>
            }).collect_view()}
            {move || chosen.get().and_then(|action| count.get().map(|r| match r {
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                Ok(None) => ().into_any(),
                Ok(Some(c)) if c.matched > c.cap => view! {
                    <p class="form-error" data-testid="bulk-over-cap">
                        {format!("More than {} jobs match: the most one bulk action takes. Narrow the search.", c.cap)}
                    </p>
                }.into_any(),
                Ok(Some(c)) if c.matched == 0 => view! { <p class="empty">"No jobs match."</p> }.into_any(),
                Ok(Some(c)) => view! {
                    <p class="bulk-confirm" role="alert" data-testid="bulk-confirm">
                        {bulk_question(action, c.matched)}" "
                        <button class="button small danger" on:click=move |_| {
                            chosen.set(None);
                            run.dispatch(BulkAction { action: action.to_string(), filter: filter.get_value(), confirmed: c.matched });
                        }>{format!("Yes, {action} {}", c.matched)}</button>
                        " "
                        <button class="button small secondary" on:click=move |_| chosen.set(None)>"No"</button>
                    </p>
                }.into_any(),
            }))}
            {move || run.value().get().map(|r| match r {
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                Ok(info) => view! {
                    <p class="ok-text" data-testid="bulk-done">
                        {match info.acted {
                            Some(acted) if info.failed > 0 => format!("Done: {acted} of {} matched jobs changed; {} could not be changed (see the log).", info.matched, info.failed),
                            Some(acted) => format!("Done: {acted} of {} matched jobs changed (the rest were not in a state it applies to).", info.matched),
                            None => format!("Started on {} jobs; it goes on in the background (the audit log has the counts when it ends).", info.matched),
                        }}
                    </p>
                }.into_any(),
            })}
            <Show when=move || run.pending().get()><p class="muted">"Working…"</p></Show>
        </div>
    })
}

/// A user's balance and limits, with the two audited changes an admin makes for them.
#[component]
pub fn UserCard() -> impl IntoView {
    let email = RwSignal::new(String::new());
    let found = RwSignal::new(None::<Result<UserInfo, AppError>>);
    let limit = RwSignal::new(String::new());
    let credits = RwSignal::new(String::new());
    let set_limit = ServerAction::<SetInFlightLimit>::new();
    let grant = ServerAction::<GrantCredits>::new();
    // Each change answers with the user as they are now.
    Effect::new(move |_| {
        if let Some(user) = set_limit.value().get() {
            found.set(Some(user));
        }
    });
    Effect::new(move |_| {
        if let Some(user) = grant.value().get() {
            found.set(Some(user));
        }
    });
    let look_up = move || {
        let email = email.get_untracked();
        leptos::task::spawn_local(async move { found.set(Some(find_user(email).await)) });
    };
    view! {
        <section class="card" data-testid="user-admin">
            <h2>"A user's credits and limit"</h2>
            <form class="filters" on:submit=move |ev| { ev.prevent_default(); look_up(); }>
                <label for="user-email">"E-mail"</label>
                <input id="user-email" type="email" prop:value=email on:input=move |ev| email.set(event_target_value(&ev))/>
                <button class="button" type="submit">"Look up"</button>
            </form>
            {move || found.get().map(|r| match r {
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                Ok(user) => {
                    let id = user.id;
                    view! {
                        <p data-testid="user-summary">
                            {format!("{}: {} credits, {} of {} jobs in flight.", user.email, user.balance, user.in_flight, user.max_in_flight)}
                        </p>
                        {may(Permission::ManageUsers).then(|| view! {
                        <form class="filters" on:submit=move |ev| {
                            ev.prevent_default();
                            if let Ok(n) = limit.get_untracked().trim().parse::<i32>() {
                                set_limit.dispatch(SetInFlightLimit { user_id: id, limit: n });
                            }
                        }>
                            <label for="user-limit">"In-flight limit"</label>
                            <input id="user-limit" type="number" min="1" max="1000" on:input=move |ev| limit.set(event_target_value(&ev))/>
                            <button class="button" type="submit">"Set the limit"</button>
                        </form>
                        })}
                        {may(Permission::GrantCredits).then(|| view! {
                        <form class="filters" on:submit=move |ev| {
                            ev.prevent_default();
                            if let Ok(n) = credits.get_untracked().trim().parse::<i64>() {
                                grant.dispatch(GrantCredits { user_id: id, amount: n });
                            }
                        }>
                            <label for="user-credits">"Credits (negative takes back)"</label>
                            <input id="user-credits" type="number" on:input=move |ev| credits.set(event_target_value(&ev))/>
                            <button class="button" type="submit">"Grant"</button>
                        </form>
                        })}
                    }.into_any()
                }
            })}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_values_read_in_their_units() {
        assert_eq!(alert_value_text("oldest_wait", 960.0), "16 min");
        assert_eq!(alert_value_text("provider_failures", 0.55), "55 %");
        assert_eq!(alert_value_text("dlq_depth", 101.0), "101");
        assert_eq!(rule_label("not_draining"), "The queue is not draining");
        assert_eq!(rule_label("no such rule"), "Alert");
    }

    #[test]
    fn a_bulk_confirmation_names_the_count_and_what_happens() {
        assert!(bulk_question("cancel", 2500).starts_with("Cancel 2500 jobs?"));
        assert!(bulk_question("replay", 1).starts_with("Replay the failed ones of 1 job?"));
        assert!(bulk_question("discard", 3).contains("stay failed and refunded"));
    }
}
