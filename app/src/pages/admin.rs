//! The console's pages ([`super::console`] has the frame): the overview (alerts, the kill
//! switch, vital signs with a chart, outcomes and cost), dead letters with reviews, capacity,
//! jobs and users ([`super::admin_support`]), and the audit (reconciliation and the log).
//! Every call is checked on the server; others get "not found".

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::Permission;
use crate::model::{AuditInfo, DlqGroupInfo, QueueStatus, ReplayInfo};
use crate::pages::admin_capacity::CapacityCard;
use crate::pages::admin_reviews::{MarkReviewForm, ReviewBadge, ReviewsCard};
use crate::pages::admin_support::{Acknowledgement, AlertsCard, JobSearchCard, UserCard};
use crate::pages::clock::local_date_time;
use crate::pages::console::{may, OutcomesCard, Tick};
use crate::pages::jobs::AttemptTimeline;
use crate::server::admin::{
    audit_log, dlq_groups, dlq_jobs, latest_reconciliation, queue_overview, DlqDiscard, DlqDiscardJob, DlqReplay,
    DlqReplayJob, ReconcileNow, SetGate, SetProcessing,
};
use crate::server::console::{Acknowledge, PauseFor};

pub fn confirm(message: &str) -> bool {
    #[cfg(feature = "hydrate")]
    return window().confirm_with_message(message).unwrap_or(false);
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = message;
        false
    }
}

fn secs(v: Option<f64>) -> String {
    v.map(|s| if s < 120.0 { format!("{s:.0} s") } else { format!("{:.0} min", s / 60.0) })
        .unwrap_or_else(|| "–".into())
}

/// Pure: an audit entry in words.
pub fn describe_audit(a: &AuditInfo) -> String {
    let old = a.old_value.as_deref().unwrap_or("");
    let new = a.new_value.as_deref().unwrap_or("");
    let subject = a.subject.as_deref().unwrap_or("").replace('_', " ");
    let what = match a.action.as_str() {
        "processing" if new == "off" => "paused processing".to_string(),
        "processing" if new == "on" => "resumed processing".to_string(),
        "processing" if new.starts_with("off for ") => format!("paused processing for {}", &new[8..]),
        "gate_size" => format!("set the gate from {old} to {new} jobs at once"),
        "dlq_replay" => format!("replayed {subject} from the dead-letter queue ({new})"),
        "dlq_discard" => format!("discarded {subject} from the dead-letter queue ({new})"),
        // The entry holds the amount and the balance after it.
        "in_flight_limit" => format!("set the in-flight limit of {subject} from {old} to {new}"),
        "cancel" => format!("canceled job {subject} ({old})"),
        "download_original" => format!("downloaded the original document of {subject}"),
        "retry_now" => format!("made job {subject} retry now"),
        "run_next" => format!("put job {subject} first in line"),
        "review" => format!("marked {subject} for review by {new}"),
        "review_resolved" => format!("resolved the review of {subject}: {new}"),
        "acknowledge" if new.is_empty() => format!("acknowledged {subject}"),
        "acknowledge" => format!("acknowledged {subject}: {new}"),
        "bulk_cancel" => format!("canceled the jobs matching {subject}: {new}"),
        "bulk_replay" => format!("replayed the jobs matching {subject}: {new}"),
        "bulk_discard" => format!("discarded the jobs matching {subject}: {new}"),
        "credits" => match old.parse::<i64>() {
            Ok(n) if n < 0 => format!("took {} credits from {subject} (balance {new})", -n),
            _ => format!("granted {old} credits to {subject} (balance {new})"),
        },
        other => format!("changed {other} {subject}: {old} → {new}"),
    };
    format!("{} {what}", a.actor)
}

/// The chart's plot area inside its 600×130 box (left, right, top, bottom), leaving room for
/// the axis labels.
const PLOT: (f64, f64, f64, f64) = (40.0, 592.0, 8.0, 108.0);

/// Pure: the busiest minute of the chart (its y-axis top), at least 1.
pub fn chart_max(history: &[(i64, i64)]) -> i64 {
    history.iter().map(|(a, b)| (*a).max(*b)).max().unwrap_or(0).max(1)
}

/// Pure: where minute `i` of `n` sits on the x axis.
fn chart_x(i: usize, n: usize) -> f64 {
    let (left, right, _, _) = PLOT;
    left + i as f64 * (right - left) / (n.max(2) - 1) as f64
}

/// Pure: the two polylines (intake, completions) of the chart, scaled to the busiest minute.
pub fn chart_lines(history: &[(i64, i64)]) -> (String, String) {
    let (_, _, top, bottom) = PLOT;
    let max = chart_max(history) as f64;
    let line = |pick: fn(&(i64, i64)) -> i64| {
        history
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!("{:.1},{:.1}", chart_x(i, history.len()), bottom - pick(p) as f64 / max * (bottom - top))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    (line(|p| p.0), line(|p| p.1))
}

/// Pure: the hover text of minute `i` of `n` (oldest first, the last is now).
pub fn chart_point_text(i: usize, n: usize, (intake, done): (i64, i64)) -> String {
    let ago = match n - 1 - i {
        0 => "this minute".to_string(),
        1 => "1 minute ago".to_string(),
        m => format!("{m} minutes ago"),
    };
    format!("{ago}: {intake} accepted, {done} finished")
}

/// The overview: alerts, the kill switch (with a timed pause), vital signs, and outcomes and
/// cost. Refreshes on the console's clock.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let set_processing = ServerAction::<SetProcessing>::new();
    let pause_for = ServerAction::<PauseFor>::new();
    let ack = ServerAction::<Acknowledge>::new();
    // Owned by the page, so a refresh that redraws the card keeps the choice.
    let minutes = RwSignal::new(PAUSE_CHOICES[0].0);
    let overview = LocalResource::new(move || {
        Tick::track();
        set_processing.version().track();
        pause_for.version().track();
        queue_overview()
    });
    let alerts = LocalResource::new(move || {
        Tick::track();
        ack.version().track();
        crate::server::admin::alerts()
    });
    view! {
        <div class="cards">
            <AlertsCard alerts ack/>
            <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                {move || overview.get().and_then(|r| r.ok()).map(|o| view! {
                    <ProcessingCard status=o.clone() set_processing pause_for minutes/>
                    <VitalsCard status=o/>
                })}
            </Transition>
        </div>
        <OutcomesCard/>
    }
}

/// Dead letters: the reviews, and the failed jobs grouped by kind and reason.
#[component]
pub fn DeadLettersPage() -> impl IntoView {
    let actions = DlqActions::new();
    let marked = RwSignal::new(0u32);
    let groups = LocalResource::new(move || {
        Tick::track();
        actions.track();
        marked.track();
        dlq_groups()
    });
    let changed = Signal::derive(move || {
        actions.track();
        marked.get()
    });
    view! {
        <DlqCard groups actions marked/>
        <ReviewsCard changed/>
    }
}

/// Capacity: the gate with the slots alive, and the capacity planner.
#[component]
pub fn CapacityPage() -> impl IntoView {
    let set_gate = ServerAction::<SetGate>::new();
    let overview = LocalResource::new(move || {
        Tick::track();
        set_gate.version().track();
        queue_overview()
    });
    let gate_input = RwSignal::new(String::new());
    let admitted = Memo::new(|_| Some(true));
    view! {
        <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
            {move || overview.get().and_then(|r| r.ok()).map(|o| view! {
                <GateCard running=o.running gate_size=o.gate_size effective_gate=o.effective_gate
                    reduced=o.gate_reduced.clone() slots=(o.worker_slots, o.worker_processes, o.effective_concurrency)
                    set_gate gate_input/>
            })}
        </Transition>
        <CapacityCard admitted/>
    }
}

/// Jobs: find any job, act on one, or on everything a search matches.
#[component]
pub fn AdminJobsPage() -> impl IntoView {
    let replay = ServerAction::<DlqReplayJob>::new();
    view! { <JobSearchCard replay/> }
}

/// Users: a user's credits and limit.
#[component]
pub fn UsersPage() -> impl IntoView {
    view! { <UserCard/> }
}

/// Audit: reconciliation reports and the audit log, a page at a time.
#[component]
pub fn AuditPage() -> impl IntoView {
    let page = RwSignal::new(0u32);
    let audit = LocalResource::new(move || {
        Tick::track();
        audit_log(Some(page.get()))
    });
    view! {
        <ReconciliationCard/>
        <AuditCard audit page/>
    }
}

/// Pure: the time left of a timed pause ("9 min 5 s", "2 h 3 min").
pub fn time_left_text(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {} s", s / 60, s % 60),
        s => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The timed pauses offered, in minutes.
const PAUSE_CHOICES: [(u32, &str); 4] = [(10, "10 minutes"), (30, "30 minutes"), (60, "1 hour"), (240, "4 hours")];

/// The kill switch: its state, since when and by whom, a timed pause's end, and the buttons
/// (each with a confirmation).
#[component]
fn ProcessingCard(
    status: QueueStatus,
    set_processing: ServerAction<SetProcessing>,
    pause_for: ServerAction<PauseFor>,
    minutes: RwSignal<u32>,
) -> impl IntoView {
    let enabled = status.processing_enabled;
    view! {
        <section class="card" data-testid="kill-switch">
            <div class="card-head">
                <h2>"Processing"</h2>
                <span class=if enabled { "badge done" } else { "badge failed" } data-testid="processing-state">
                    {if enabled { "On" } else { "Paused" }}
                </span>
            </div>
            <p class="hint">{format!("Since {} by {}.", local_date_time(&status.processing_changed_at), status.processing_changed_by)}</p>
            {status.resume_at.clone().map(|(at, left)| view! {
                <p data-testid="resumes">{format!("Resumes by itself at {} ({} left).", local_date_time(&at), time_left_text(left))}</p>
            })}
            <Show when=|| may(Permission::PauseProcessing)>
            <div class="actions">
                <button
                    class=if enabled { "button danger" } else { "button primary" }
                    on:click=move |_| {
                        let question = if enabled {
                            "Pause processing? Running jobs finish; new uploads wait in the queue."
                        } else {
                            "Resume processing?"
                        };
                        if confirm(question) {
                            set_processing.dispatch(SetProcessing { enabled: !enabled });
                        }
                    }
                >
                    {if enabled { "Pause processing" } else { "Resume processing" }}
                </button>
                <label for="pause-minutes">"Pause for"</label>
                <select id="pause-minutes" on:change=move |ev| {
                    if let Ok(m) = event_target_value(&ev).parse() {
                        minutes.set(m);
                    }
                }>
                    {PAUSE_CHOICES.into_iter().map(|(m, label)| view! {
                        <option value=m.to_string() selected=move || minutes.get() == m>{label}</option>
                    }).collect_view()}
                </select>
                <button class="button" on:click=move |_| {
                    let m = minutes.get_untracked();
                    if confirm(&format!("Pause processing for {m} minutes? It resumes by itself.")) {
                        pause_for.dispatch(PauseFor { minutes: m });
                    }
                }>"Pause for a while"</button>
            </div>
            </Show>
            <p class="form-error">{move || pause_for.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
        </section>
    }
}

/// Pure: "1 process", "2 processes".
fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The concurrency gate: jobs running now, the limit, and a form to set it.
#[component]
fn GateCard(
    running: i64,
    gate_size: i32,
    /// The gate in force (lower while the adaptive gate grows back after 429s) and why.
    effective_gate: i32,
    reduced: Option<(String, String)>,
    /// Worker slots alive across processes, the processes, and the concurrency in effect.
    slots: (i64, i64, i64),
    set_gate: ServerAction<SetGate>,
    /// Owned by the page, so a refresh that redraws the card does not lose what was typed.
    gate_input: RwSignal<String>,
) -> impl IntoView {
    view! {
        <section class="card" data-testid="gate">
            <h2>"Concurrency gate"</h2>
            <p>{format!("{running} running now, at most {gate_size} at once across all workers.")}</p>
            <dl class="side-by-side" data-testid="concurrency">
                <div><dt>"Gate"</dt><dd data-testid="gate-size">{effective_gate}</dd></div>
                <div><dt>"Worker slots alive"</dt><dd data-testid="worker-slots">
                    {format!("{} in {}", slots.0, plural(slots.1, "process", "processes"))}
                </dd></div>
                <div><dt>"Running at once, at most"</dt><dd data-testid="effective-concurrency">{slots.2}</dd></div>
            </dl>
            {(slots.0 < i64::from(effective_gate)).then(|| view! {
                <p class="warn-text" data-testid="slots-short">
                    {format!("Only {} worker slots are alive: at most {} jobs run at once, whatever the gate says.                               Start more worker processes or give them more slots (--workers).", slots.0, slots.2)}
                </p>
            })}
            {reduced.map(|(reason, since)| view! {
                <p class="warn-text" data-testid="gate-reduced">
                    {format!("In force now: {effective_gate}, since {}: {reason}.", local_date_time(&since))}
                </p>
            })}
            <Show when=|| may(Permission::SetGate)>
            <form on:submit=move |ev| {
                ev.prevent_default();
                if let Ok(size) = gate_input.get_untracked().trim().parse::<i32>() {
                    set_gate.dispatch(SetGate { size });
                }
            }>
                <label for="gate">"Jobs at once (1 to 70)"</label>
                <input id="gate" type="number" min="1" max="70" placeholder=gate_size.to_string()
                    on:input=move |ev| gate_input.set(event_target_value(&ev))/>
                <button class="button" type="submit">"Set the gate"</button>
            </form>
            </Show>
            <p class="form-error">{move || set_gate.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
        </section>
    }
}

/// Pure: the document store's free space in words ("full" once a write found no room).
pub fn store_text(free_bytes: Option<i64>, full: bool) -> String {
    match (full, free_bytes) {
        (true, _) => "full: uploads refused".to_string(),
        (false, Some(free)) => crate::format::size_text(free.max(0) as u64),
        (false, None) => "not measured".to_string(),
    }
}

/// The vital signs and the last hour's chart of intake against completions.
#[component]
fn VitalsCard(status: QueueStatus) -> impl IntoView {
    let o = status;
    let (intake, done) = chart_lines(&o.history);
    view! {
        <section class="card">
            <h2>"Vital signs"</h2>
            <dl class="vitals">
                <div><dt>"Backlog (jobs)"</dt><dd data-testid="backlog">{o.backlog}</dd></div>
                <div><dt>"Oldest waiting"</dt><dd>{secs(o.oldest_waiting_secs)}</dd></div>
                <div><dt>"Accepted / finished (jobs per min)"</dt><dd>{format!("{:.1} / {:.1}", o.intake_per_min, o.completions_per_min)}</dd></div>
                <div><dt>"Time to done p50 / p95"</dt><dd>{format!("{} / {}", secs(o.time_to_done_p50_secs), secs(o.time_to_done_p95_secs))}</dd></div>
                <div><dt>"Dead letters (jobs)"</dt><dd>{o.dlq_depth}</dd></div>
                <div><dt>"Drains in"</dt><dd class:warn=o.drain == "not draining">{o.drain.clone()}</dd></div>
                <div><dt>"Deadlines at risk / missed (last day)"</dt><dd data-testid="deadlines" class:warn={o.deadlines_at_risk + o.deadlines_missed_last_day != 0}>{format!("{} / {}", o.deadlines_at_risk, o.deadlines_missed_last_day)}</dd></div>
                <div><dt>"Document store free"</dt><dd data-testid="store-free" class:warn=o.store_full>{store_text(o.store_free_bytes, o.store_full)}</dd></div>
            </dl>
            <svg class="chart" viewBox="0 0 600 130" role="img" aria-label="Jobs accepted and finished per minute over the last hour">
                <g class="axis">
                    <line x1=PLOT.0 y1=PLOT.2 x2=PLOT.0 y2=PLOT.3/>
                    <line x1=PLOT.0 y1=PLOT.3 x2=PLOT.1 y2=PLOT.3/>
                    <text x=PLOT.0 - 6.0 y=PLOT.2 + 8.0 text-anchor="end" data-testid="chart-max">{chart_max(&o.history)}</text>
                    <text x=PLOT.0 - 6.0 y=PLOT.3 text-anchor="end">"0"</text>
                    <text x=PLOT.0 y=PLOT.3 + 18.0>"60 min ago"</text>
                    <text x=PLOT.1 y=PLOT.3 + 18.0 text-anchor="end">"now"</text>
                    <text x=(PLOT.0 + PLOT.1) / 2.0 y=PLOT.3 + 18.0 text-anchor="middle">"jobs per minute"</text>
                </g>
                <polyline class="intake" points=intake fill="none"/>
                <polyline class="completions" points=done fill="none"/>
                {
                    let n = o.history.len();
                    let width = (PLOT.1 - PLOT.0) / (n.max(2) - 1) as f64;
                    o.history
                        .iter()
                        .enumerate()
                        .map(|(i, point)| view! {
                            <rect class="hover" x=chart_x(i, n) - width / 2.0 y=PLOT.2 width=width height=PLOT.3 - PLOT.2>
                                <title>{chart_point_text(i, n, *point)}</title>
                            </rect>
                        })
                        .collect_view()
                }
            </svg>
            <p class="legend"><span class="intake">"— accepted"</span>" "<span class="completions">"— finished"</span>" jobs per minute, last hour (hover for the values)"</p>
        </section>
    }
}

/// The dead-letter queue, grouped by kind and reason.
#[component]
fn DlqCard(
    groups: LocalResource<Result<Vec<DlqGroupInfo>, AppError>>,
    actions: DlqActions,
    marked: RwSignal<u32>,
) -> impl IntoView {
    view! {
        <section class="card">
            <h2>"Dead-letter queue"</h2>
            <ReplayNote info=actions.replay_group.value()/>
            <ReplayNote info=actions.replay_job.value()/>
            <Show when=move || groups.get().and_then(|r| r.ok()).is_some_and(|l| l.is_empty())>
                <p class="empty">"No failed jobs."</p>
            </Show>
            // Keyed and outside any closure: a refresh redraws only the groups that changed, so
            // an open group and a half-written review stay as they are.
            <ul class="dlq">
                <For
                    each=move || groups.get().and_then(|r| r.ok()).unwrap_or_default()
                    key=|g| (g.kind, g.reason.clone(), g.jobs, g.review.as_ref().map(|r| (r.id, r.marked_at.clone())))
                    children=move |g| view! { <DlqGroup group=g actions=actions marked/> }
                />
            </ul>
        </section>
    }
}

/// After a replay: jobs left failed because their owner uploaded the document again, each
/// with a link to the newer job.
#[component]
fn ReplayNote(#[prop(into)] info: Signal<Option<Result<ReplayInfo, AppError>>>) -> impl IntoView {
    move || {
        let info = info
            .get()
            .and_then(|r| r.ok())
            .filter(|i| !i.already_reuploaded.is_empty() || !i.document_released.is_empty())?;
        let released = (!info.document_released.is_empty()).then(|| {
            format!(
                " {} left failed because their document was released when its replay window ended: \
                 their owners have to upload them again.",
                info.document_released.len()
            )
        });
        Some(view! {
            <p class="hint" data-testid="replay-note">
                {format!("{} replayed.", info.replayed)}
                {(!info.already_reuploaded.is_empty()).then(|| " Already re-uploaded, so left failed: ")}
                {info.already_reuploaded.into_iter().map(|(job, newer)| view! {
                    <a href=format!("/jobs/{newer}")>{format!("job {} (see the newer job)", &job[..8.min(job.len())])}</a>" "
                }).collect_view()}
                {released}
            </p>
        })
    }
}

/// The newest audit entries, in words.
/// Pure: a reconciliation check in words.
pub fn check_label(check: &str) -> &'static str {
    match check {
        "balance_matches_ledger" => "Balances equal their ledgers",
        "in_flight_matches_open_jobs" => "In-flight counts equal open jobs",
        "one_debit_per_job" => "One debit per job",
        "refunds_match_state" => "Refunds exactly for failed and canceled jobs",
        "no_lease_far_in_future" => "No lease far in the future",
        "stored_bytes_match_documents" => "Stored bytes equal the documents and parts kept",
        "live_jobs_have_documents" => "Open jobs have their documents",
        "documents_have_jobs" => "Stored documents have jobs",
        _ => "Other check",
    }
}

/// The latest reconciliation report, and a button to run one now.
#[component]
fn ReconciliationCard() -> impl IntoView {
    let run = ServerAction::<ReconcileNow>::new();
    let ack = ServerAction::<Acknowledge>::new();
    // Not on the console's clock: a report comes an hour apart, and a half-written
    // acknowledgement should stay.
    let latest = LocalResource::new(move || {
        run.version().track();
        ack.version().track();
        latest_reconciliation()
    });
    view! {
        <section class="card" data-testid="reconciliation">
            <div class="card-head">
                <h2>"Reconciliation"</h2>
                {may(Permission::ActOnJobs).then(|| view! {
                    <button class="button" disabled=move || run.pending().get() on:click=move |_| { run.dispatch(ReconcileNow {}); }>
                        "Run a reconciliation now"
                    </button>
                })}
            </div>
            {move || match latest.get().and_then(|r| r.ok()).flatten() {
                None => view! { <p class="hint">"No reconciliation has run yet (one runs every hour)."</p> }.into_any(),
                Some(report) => {
                    let found: i64 = report.checks.iter().map(|c| c.2).sum();
                    view! {
                        <p data-testid="reconciliation-summary" class:error-text={found > 0}>
                            {format!(
                                "Report {} at {} by {}: {}.",
                                report.id,
                                local_date_time(&report.finished_at),
                                report.actor,
                                if found == 0 { "everything adds up".to_string() } else { format!("{found} discrepancies") },
                            )}
                        </p>
                        <table class="ledger">
                            <thead><tr><th>"Check"</th><th class="num">"Examined"</th><th class="num">"Found"</th></tr></thead>
                            <tbody>
                                {report.checks.into_iter().map(|(check, examined, found)| view! {
                                    <tr><td>{check_label(&check)}</td><td class="num">{examined}</td><td class="num">{found}</td></tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                        <ul class="audit">
                            {report.discrepancies.into_iter().map(|(check, subject, detail)| view! {
                                <li>{format!("{}: {subject}: {detail}", check_label(&check))}</li>
                            }).collect_view()}
                        </ul>
                        <Acknowledgement what="report" id=report.id acked=report.acknowledged ack/>
                    }
                        .into_any()
                }
            }}
        </section>
    }
}

#[component]
fn AuditCard(audit: LocalResource<Result<Vec<AuditInfo>, AppError>>, page: RwSignal<u32>) -> impl IntoView {
    let full = move || audit.get().and_then(|r| r.ok()).is_some_and(|a| a.len() >= 50);
    view! {
        <section class="card wide">
            <h2>"Audit log"</h2>
            <ul class="audit">
                {move || audit.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|a| view! {
                    <li>
                        <span class="when">{local_date_time(&a.at)}</span>
                        " "{describe_audit(&a)}
                    </li>
                }).collect_view()}
            </ul>
            <nav class="pager" aria-label="Pages of the audit log">
                <button class="button small" disabled=move || page.get() == 0 on:click=move |_| page.update(|p| *p = p.saturating_sub(1))>"Newer"</button>
                <span class="muted">{move || format!("Page {}", page.get() + 1)}</span>
                <button class="button small" disabled=move || !full() on:click=move |_| page.update(|p| *p += 1)>"Older"</button>
            </nav>
        </section>
    }
}

/// The DLQ's four actions; anything that shows the DLQ reloads after any of them.
#[derive(Clone, Copy)]
struct DlqActions {
    replay_group: ServerAction<DlqReplay>,
    discard_group: ServerAction<DlqDiscard>,
    replay_job: ServerAction<DlqReplayJob>,
    discard_job: ServerAction<DlqDiscardJob>,
}

impl DlqActions {
    fn new() -> Self {
        DlqActions {
            replay_group: ServerAction::new(),
            discard_group: ServerAction::new(),
            replay_job: ServerAction::new(),
            discard_job: ServerAction::new(),
        }
    }

    fn track(&self) {
        self.replay_group.version().track();
        self.discard_group.version().track();
        self.replay_job.version().track();
        self.discard_job.version().track();
    }
}

/// One group of failed jobs: replay or discard it whole, or open it to inspect its jobs and
/// their attempts, and replay or discard one.
#[component]
fn DlqGroup(group: DlqGroupInfo, actions: DlqActions, marked: RwSignal<u32>) -> impl IntoView {
    let open = RwSignal::new(false);
    let (kind, reason) = (group.kind.as_str().to_string(), group.reason.clone());
    let jobs = LocalResource::new({
        let (kind, reason) = (kind.clone(), reason.clone());
        move || {
            actions.track();
            let (show, kind, reason) = (open.get(), kind.clone(), reason.clone());
            async move {
                if show {
                    dlq_jobs(kind, reason).await
                } else {
                    Ok(Vec::new())
                }
            }
        }
    });
    let (replay_kind, replay_reason) = (kind.clone(), reason.clone());
    let review_group = (kind.clone(), reason.clone());
    let count = group.jobs;
    let bump = Callback::new(move |_| marked.update(|n| *n += 1));
    view! {
        <li data-testid="dlq-group">
            <div class="dlq-head">
                <span class="badge failed">{group.kind.as_str().replace('_', " ")}</span>
                <span class="reason">{group.reason.clone()}</span>
                <span class="muted">{if count == 1 { "1 job".to_string() } else { format!("{count} jobs") }}</span>
                <button class="button link" aria-expanded=move || open.get().to_string() on:click=move |_| open.update(|o| *o = !*o)>
                    {move || if open.get() { "Hide jobs" } else { "Show jobs" }}
                </button>
                {may(Permission::ActOnJobs).then(|| view! {
                    <button class="button" on:click=move |_| { actions.replay_group.dispatch(DlqReplay { kind: replay_kind.clone(), reason: replay_reason.clone() }); }>"Replay all"</button>
                    <button class="button link" on:click=move |_| {
                        if confirm("Discard every job in this group from the dead-letter queue?") {
                            actions.discard_group.dispatch(DlqDiscard { kind: kind.clone(), reason: reason.clone() });
                        }
                    }>"Discard all"</button>
                })}
                {may(Permission::MarkForReview).then(|| view! { <MarkReviewForm group=review_group marked=bump/> })}
            </div>
            <ReviewBadge review=group.review.clone()/>
            <Show when=move || open.get()>
                <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                    <ul class="dlq-jobs">
                        {move || jobs.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|d| {
                            let id = d.job.id.clone();
                            let (replay_id, discard_id, review_id) = (id.clone(), id.clone(), id.clone());
                            view! {
                                <li class="dlq-job" data-testid="dlq-job">
                                    <div class="dlq-head">
                                        <a class="file-name" href=format!("/jobs/{id}")>{d.job.file_name.clone().unwrap_or_else(|| "document".into())}</a>
                                        <span class="muted">{format!("{} · {}", d.owner_email, d.job.finished_at.as_deref().map(local_date_time).unwrap_or_default())}</span>
                                        {may(Permission::ActOnJobs).then(|| view! {
                                            <button class="button" on:click=move |_| { actions.replay_job.dispatch(DlqReplayJob { id: replay_id.clone() }); }>"Replay"</button>
                                            <button class="button link" on:click=move |_| {
                                                if confirm("Discard this job from the dead-letter queue?") {
                                                    actions.discard_job.dispatch(DlqDiscardJob { id: discard_id.clone() });
                                                }
                                            }>"Discard"</button>
                                        })}
                                        {may(Permission::MarkForReview).then(|| view! { <MarkReviewForm job=review_id marked=bump/> })}
                                    </div>
                                    <AttemptTimeline attempts=d.attempts/>
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                </Transition>
            </Show>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::{chart_lines, chart_max, chart_point_text, describe_audit, store_text};
    use crate::model::AuditInfo;

    #[test]
    fn the_stores_free_space_reads_in_words() {
        assert_eq!(store_text(Some(70_868_000_000), false), "66 GB");
        assert_eq!(store_text(Some(3 << 20), false), "3.0 MB");
        assert_eq!(store_text(Some(3 << 20), true), "full: uploads refused");
        assert_eq!(store_text(None, false), "not measured");
    }

    fn entry(action: &str, subject: Option<&str>, old: &str, new: &str) -> AuditInfo {
        AuditInfo {
            at: "2026-11-29T12:00:00.000Z".into(),
            actor: "ops@example.com".into(),
            action: action.into(),
            subject: subject.map(str::to_string),
            old_value: Some(old.into()),
            new_value: Some(new.into()),
        }
    }

    #[test]
    fn audit_entries_read_as_sentences() {
        assert_eq!(describe_audit(&entry("processing", None, "on", "off")), "ops@example.com paused processing");
        assert_eq!(describe_audit(&entry("processing", None, "off", "on")), "ops@example.com resumed processing");
        assert_eq!(
            describe_audit(&entry("gate_size", None, "24", "5")),
            "ops@example.com set the gate from 24 to 5 jobs at once"
        );
        assert_eq!(
            describe_audit(&entry("dlq_replay", Some("group retries_exhausted: timeouts"), "failed", "3 queued")),
            "ops@example.com replayed group retries exhausted: timeouts from the dead-letter queue (3 queued)"
        );
        assert_eq!(
            describe_audit(&entry("credits", Some("user 5"), "-20", "0")),
            "ops@example.com took 20 credits from user 5 (balance 0)"
        );
        assert_eq!(
            describe_audit(&entry("processing", None, "on", "off for 10 min")),
            "ops@example.com paused processing for 10 min"
        );
        assert_eq!(
            describe_audit(&entry("bulk_cancel", Some("state queued"), "", "40 of 41 matched")),
            "ops@example.com canceled the jobs matching state queued: 40 of 41 matched"
        );
        assert_eq!(
            describe_audit(&entry("something_new", Some("x"), "a", "b")),
            "ops@example.com changed something_new x: a → b"
        );
    }

    #[test]
    fn chart_lines_scale_to_the_busiest_minute() {
        let (intake, done) = chart_lines(&[(0, 0), (10, 5), (5, 10)]);
        assert_eq!(intake, "40.0,108.0 316.0,8.0 592.0,58.0");
        assert_eq!(done, "40.0,108.0 316.0,58.0 592.0,8.0");
        assert_eq!(chart_max(&[(0, 0), (10, 5), (5, 10)]), 10);
        let (flat, _) = chart_lines(&[]);
        assert_eq!(flat, "");
        assert_eq!(chart_max(&[]), 1, "an idle hour still has a scale");
    }

    #[test]
    fn chart_points_say_when_and_how_many() {
        assert_eq!(chart_point_text(59, 60, (3, 2)), "this minute: 3 accepted, 2 finished");
        assert_eq!(chart_point_text(58, 60, (0, 1)), "1 minute ago: 0 accepted, 1 finished");
        assert_eq!(chart_point_text(0, 60, (4, 4)), "59 minutes ago: 4 accepted, 4 finished");
    }
}
