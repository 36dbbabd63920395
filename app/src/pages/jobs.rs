//! The jobs list and a job's page, polled every 2 s while anything on screen can still change
//! (and not while the tab is hidden).

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::format::{credits_text, duration_text, thousands};
use crate::model::{JobStage, JobState, JobStatus};
use crate::pages::clock::{local_time, now_ms, parse_ms};
use crate::pages::endings::{self, canceled_text, failed_text, NotifyToggle};
use crate::pages::polling::{every, tab_visible, when_shown};
use crate::server::jobs::{job_detail, list_jobs, CancelJob, DeleteJob, RetryNow};
use sluice_types::settlement::{calls_started, kept_on_cancel, FREE_UNREADABLE_PER_DAY};

/// Ticks `now` every second and calls `refresh` every 2 s while the tab is visible, every
/// 10 s while it is hidden, and at once when a hidden tab is shown again.
fn poll(now: RwSignal<f64>, refresh: impl Fn() + 'static) {
    let refresh = std::rc::Rc::new(refresh);
    let on_tick = refresh.clone();
    let (mut seen_ticks, mut hidden_ticks) = (0u32, 0u32);
    every(1000, move || {
        now.set(now_ms());
        // Every 2 s while seen; every 10 s in the background, so an ending can still be told
        // (tab title, notification) without hammering the server from forgotten tabs.
        let due = if tab_visible() {
            hidden_ticks = 0;
            seen_ticks += 1;
            seen_ticks % 2 == 0
        } else {
            hidden_ticks += 1;
            hidden_ticks % 10 == 0
        };
        if due {
            on_tick();
        }
    });
    when_shown(move || {
        now.set(now_ms());
        refresh();
    });
}

fn seconds_between(from_ms: f64, to_ms: f64) -> i64 {
    ((to_ms - from_ms) / 1000.0).round().max(0.0) as i64
}

/// What the owner of a failed job an operator marked "needs review" reads under its badge.
pub const UNDER_REVIEW: &str = "An operator is looking into this.";

/// Pure: a state's badge text.
pub fn state_label(state: JobState) -> &'static str {
    match state {
        JobState::Queued => "Queued",
        JobState::Running => "Running",
        JobState::Retrying => "Retrying",
        JobState::Done => "Done",
        JobState::Failed => "Failed",
        JobState::Canceled => "Canceled",
    }
}

/// The state badge and the line under it.
#[component]
pub fn StateBadge(job: JobStatus, now: RwSignal<f64>) -> impl IntoView {
    let state = job.state;
    let detail = move || match job.state {
        JobState::Queued if job.in_provider_batch_since.is_some() => {
            in_batch_text(job.in_provider_batch_since.as_deref().map(local_time).as_deref().unwrap_or(""))
        }
        JobState::Queued => queued_text(job.paused, job.jobs_ahead, job.starts_in_secs),
        JobState::Running if job.cancel_requested => match job.cancel_kept {
            0 => "Cancel requested: it stops at its next safe point, and nothing is charged.".to_string(),
            kept => format!(
                "Cancel requested: it stops at its next safe point. {} kept: the provider had already started.",
                credits_text(kept)
            ),
        },
        JobState::Canceled => canceled_text(job.refunded, job.cost.into()),
        JobState::Running => {
            let since = job.started_at.as_deref().map(parse_ms).unwrap_or(now.get());
            let in_stage = job.stage_since.as_deref().map(|s| seconds_between(parse_ms(s), now.get()));
            let stage_started = job.stage_since.as_deref().map(local_time);
            let running = running_text(
                job.stage,
                job.pages.map(|pages| (pages, job.reading_page)),
                stage_started.as_deref(),
                in_stage,
                seconds_between(since, now.get()),
            );
            format!("{running}{}", writing_text(job.written_tokens, job.expected_tokens))
        }
        JobState::Retrying => {
            let wait = seconds_between(now.get(), parse_ms(&job.run_at));
            format!(
                "Attempt {} of {} failed: {}. {}",
                job.attempts,
                job.max_attempts,
                job.last_error.clone().unwrap_or_else(|| "a temporary problem".into()),
                if wait > 0 { format!("Next attempt in {wait} s.") } else { "Next attempt starting now.".into() }
            )
        }
        JobState::Failed => {
            let why = failed_text(job.failure_kind, job.failure_reason.as_deref(), job.attempts, job.cost);
            if job.under_review {
                format!("{why} {UNDER_REVIEW}")
            } else {
                why
            }
        }
        JobState::Done => match job.finished_at.as_deref() {
            Some(end) => {
                format!("Done in {}.", duration_text(seconds_between(parse_ms(&job.accepted_at), parse_ms(end))))
            }
            None => "Done.".to_string(),
        },
    };
    let stage = job.stage.map(|s| s.as_str());
    // A long document: which part it is at, with a bar (failed and canceled jobs say why instead).
    let parts = job.parts.filter(|_| !matches!(state, JobState::Failed | JobState::Canceled)).map(|p| {
        let mut words = p.words(job.preset, state);
        if let Some(left) = p.left_secs.filter(|_| !state.is_terminal()) {
            words.push_str(&format!(", about {} left", duration_text(left)));
        }
        view! {
            <span class="parts" data-parts-done=p.done data-parts-total=p.total>
                <progress max=p.total value=p.done aria-label=words.clone()></progress>
                " "
                {words}
            </span>
        }
    });
    let deadline = job.due_by.as_deref().map(|due| {
        let standing = job.deadline.unwrap_or(crate::model::DeadlineStanding::OnTrack);
        let when = crate::pages::clock::local_date_time(due);
        view! {
            <span class="deadline" data-testid="deadline" data-standing=standing.words()>
                {format!("Needed by {when}: {}", standing.words())}
            </span>
        }
    });
    view! {
        <span class=format!("badge {}", state.as_str()) data-state=state.as_str()>{state_label(state)}</span>
        <span class="state-detail" data-stage=stage>{detail}</span>
        {parts}
        {deadline}
    }
}

/// Pure: what canceling now costs, asked before the user confirms. The server fixes the same
/// sum (`sluice_types::settlement`) when the cancel arrives.
pub fn cancel_question(name: &str, cost: i64, stage: Option<JobStage>, parts: Option<(i32, i32)>) -> String {
    let in_flight = matches!(stage, Some(JobStage::WaitingForProvider | JobStage::Writing));
    let (done, total) = parts.unwrap_or((0, 1));
    let kept = kept_on_cancel(cost, calls_started(done.max(0) as u32, in_flight), total.max(1) as u32);
    // Canceled while read, it counts as an unreadable document (the reader's work is spent).
    let unless = if stage == Some(JobStage::Reading) {
        format!(", unless you already had {FREE_UNREADABLE_PER_DAY} unreadable documents refunded today")
    } else {
        String::new()
    };
    match kept {
        0 if cost == 1 => format!("Cancel {name}? Your 1 credit comes back{unless}."),
        0 if cost > 1 => format!("Cancel {name}? Your {cost} credits come back{unless}."),
        0 => format!("Cancel {name}?"),
        k if k >= cost => format!(
            "The provider is already working on {name}: canceling now still costs {}. Cancel anyway?",
            credits_text(cost)
        ),
        k => format!(
            "The provider has already done part of {name}: canceling now keeps {} and gives back {}. Cancel anyway?",
            credits_text(k),
            credits_text(cost - k)
        ),
    }
}

/// Cancels a job that has not ended (and has no request yet), after the user confirmed what
/// it costs; `done` tells the page to ask again and the header to show the refund.
#[component]
pub fn CancelButton(job: JobStatus, done: Callback<()>) -> impl IntoView {
    let can_cancel = !job.state.is_terminal() && !job.cancel_requested;
    let cancel = ServerAction::<CancelJob>::new();
    let asking = RwSignal::new(false);
    let id = job.id.clone();
    Effect::new(move |_| {
        if let Some(result) = cancel.value().get() {
            if result.is_ok() {
                crate::AccountChanged::notify();
            }
            done.run(());
        }
    });
    can_cancel.then(|| {
        let name = job.file_name.clone().unwrap_or_else(|| "this document".into());
        let question =
            cancel_question(&name, job.cost.into(), job.stage, job.parts.as_ref().map(|p| (p.done, p.total)));
        let confirm_label = format!("Yes, cancel {name}");
        view! {
            <span class="cancel">
                <Show
                    when=move || asking.get()
                    fallback=move || {
                        view! {
                            <button class="button small" aria-label=format!("Cancel {name}") on:click=move |_| asking.set(true)>
                                "Cancel"
                            </button>
                        }
                    }
                >
                    <span class="cancel-question" role="alert">{question.clone()}</span>
                    " "
                    <button
                        class="button small danger"
                        aria-label=confirm_label.clone()
                        on:click={
                            let id = id.clone();
                            move |_| {
                                asking.set(false);
                                cancel.dispatch(CancelJob { id: id.clone() });
                            }
                        }
                    >
                        "Yes, cancel"
                    </button>
                    " "
                    <button class="button small secondary" on:click=move |_| asking.set(false)>
                        "Keep it"
                    </button>
                </Show>
                <span class="form-error">{move || cancel.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</span>
            </span>
        }
    })
}

/// "Retry now" for a job waiting out its backoff: it becomes due at once (no extra attempt;
/// the gate still decides when it runs). `done` tells the page to ask again.
#[component]
pub fn RetryNowButton(job: JobStatus, done: Callback<()>) -> impl IntoView {
    let retry = ServerAction::<RetryNow>::new();
    // Only after it worked: on an error the button stays, with why.
    Effect::new(move |_| {
        if let Some(Ok(_)) = retry.value().get() {
            done.run(());
        }
    });
    let id = job.id.clone();
    (job.state == JobState::Retrying).then(|| {
        let name = job.file_name.clone().unwrap_or_else(|| "this document".into());
        view! {
            <span class="retry-now">
                <button class="button small" aria-label=format!("Retry {name} now")
                    on:click=move |_| { retry.dispatch(RetryNow { id: id.clone() }); }>
                    "Retry now"
                </button>
                <span class="form-error">{move || retry.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</span>
            </span>
        }
    })
}

/// The name a job goes by: its file's, or what became of it.
fn shown_name(job: &JobStatus) -> String {
    match (&job.file_name, job.deleted) {
        (_, true) => "Deleted document".into(),
        (Some(name), false) => name.clone(),
        (None, false) => "document".into(),
    }
}

/// Deletes an ended job's document and result, after the user confirmed what goes.
#[component]
fn DeleteButton(job: JobStatus, done: Callback<()>) -> impl IntoView {
    let delete = ServerAction::<DeleteJob>::new();
    let asking = RwSignal::new(false);
    let id = job.id.clone();
    let name = shown_name(&job);
    Effect::new(move |_| {
        if delete.value().get().is_some() {
            done.run(());
        }
    });
    view! {
        <p class="delete">
            <Show
                when=move || asking.get()
                fallback=move || view! {
                    <button class="button secondary" on:click=move |_| asking.set(true)>"Delete this document"</button>
                }
            >
                <span class="cancel-question" role="alert">
                    {format!("Delete {name}? Its document, result and name are erased for good; the credits stay in your history.")}
                </span>
                " "
                <button class="button small danger" on:click={
                    let id = id.clone();
                    move |_| {
                        asking.set(false);
                        delete.dispatch(DeleteJob { id: id.clone() });
                    }
                }>"Yes, delete"</button>
                " "
                <button class="button small secondary" on:click=move |_| asking.set(false)>"Keep it"</button>
            </Show>
            <span class="form-error">{move || delete.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</span>
        </p>
    }
}

/// Pure: how a scan was read, for its owner: the pages OCR read and their confidence, those
/// worth checking (under the floor), and those skipped.
pub fn scan_text(scan: &sluice_types::scan::ScanReport) -> String {
    let list = |pages: Vec<u32>| pages.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let mut words = match scan.read.len() {
        0 => "No page was read by OCR.".to_string(),
        n => {
            let mean = scan.read.iter().map(|p| p.confidence).sum::<f32>() / n as f32;
            let pages = if n == 1 { "1 page".to_string() } else { format!("{n} pages") };
            let language = if scan.language.is_empty() { String::new() } else { format!(" ({})", scan.language) };
            format!(
                "{pages} of {} read by OCR{language}: pages {}, {:.0}% confident on average.",
                scan.pages,
                list(scan.read.iter().map(|p| p.page).collect()),
                mean
            )
        }
    };
    let low = scan.low_pages();
    if !low.is_empty() {
        words.push_str(&format!(
            " Check pages {} against the original: read with less than {:.0}% confidence.",
            list(low),
            scan.confidence_floor
        ));
    }
    for skipped in &scan.skipped {
        words.push_str(&format!(" Page {} was left out: {}.", skipped.page, skipped.reason));
    }
    words
}

/// Pure: the line under a running badge: what the job is doing and for how long.
pub fn running_text(
    stage: Option<JobStage>,
    pages: Option<(i32, Option<i32>)>,
    stage_started: Option<&str>,
    stage_secs: Option<i64>,
    running_secs: i64,
) -> String {
    // A scan read by OCR, page by page: "Reading page 12 of 40 (scanned, by OCR)…".
    if let (Some(JobStage::Reading), Some((of, Some(page)))) = (stage, pages) {
        return format!("Reading page {page} of {of} (scanned, by OCR)…");
    }
    let pages_read = match pages.map(|(pages, _)| pages) {
        Some(1) => "Read 1 page. ".to_string(),
        Some(n) if n > 1 => format!("Read {n} pages. "),
        _ => String::new(),
    };
    match (stage, stage_started, stage_secs) {
        (Some(JobStage::WaitingForProvider), Some(at), Some(secs)) => {
            format!("{pages_read}Waiting for the provider since {at} ({}).", duration_text(secs))
        }
        (Some(stage @ (JobStage::Reading | JobStage::Writing)), _, _) => format!("{}…", stage.label()),
        (Some(JobStage::WaitingForProvider), _, _) => format!("{pages_read}Waiting for the provider."),
        (None, _, _) => format!("Running for {}.", duration_text(running_secs)),
    }
}

/// Pure: how far the answers being written (streamed) are: " About 2,100 of 8,000 tokens
/// written." (nothing before the first token).
pub fn writing_text(written: Option<i64>, expected: Option<i64>) -> String {
    match (written.filter(|w| *w > 0), expected.filter(|e| *e > 0)) {
        (Some(w), Some(e)) => {
            format!(" About {} of {} tokens written.", sluice_types::thousands(w), sluice_types::thousands(e.max(w)))
        }
        (Some(w), None) => format!(" About {} tokens written.", sluice_types::thousands(w)),
        _ => String::new(),
    }
}

/// Pure: what a job cost: what it comes to in credits (a hold settled to the document's
/// price, or a failure's refund, said as held and returned), and the provider's tokens.
pub fn cost_text(
    cost: i32,
    refunded: i64,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    output_kept: Option<i64>,
) -> String {
    let cost = i64::from(cost);
    let money = match (cost, refunded) {
        (0, _) => "No charge".to_string(),
        (c, r) if r >= c => format!("Cost nothing ({} held, all returned)", thousands(c)),
        (c, r) if r > 0 => format!("Cost {} ({} held, {} returned)", credits_text(c - r), thousands(c), thousands(r)),
        (c, _) => format!("Cost {}", credits_text(c)),
    };
    let tokens = |n: i64| format!("{} {}", thousands(n), if n == 1 { "token" } else { "tokens" });
    match (input_tokens, output_tokens) {
        // Output paid for and not kept (paragraphs asked again) is said: billed against kept.
        (Some(i), Some(o)) => match output_kept.filter(|k| *k < o) {
            Some(k) => format!("{money} · {} in, {} out ({} kept)", tokens(i), thousands(o), thousands(k)),
            None => format!("{money} · {} in, {} out", tokens(i), thousands(o)),
        },
        (Some(i), None) => format!("{money} · {} in", tokens(i)),
        _ => money,
    }
}

/// Pure: what a translation says of its paragraphs that came back without their inline
/// formatting.
pub fn formatting_lost_text(paragraphs: i32) -> String {
    let which = if paragraphs == 1 { "1 paragraph".to_string() } else { format!("{paragraphs} paragraphs") };
    format!(
        "{which} came back without {} bold, italics or links: {} in the look of {} first words.",
        if paragraphs == 1 { "its" } else { "their" },
        if paragraphs == 1 { "it is" } else { "they are" },
        if paragraphs == 1 { "its" } else { "their" },
    )
}

/// Pure: an economy document waiting for the provider's batch.
pub fn in_batch_text(submitted: &str) -> String {
    format!("In the provider's batch, submitted {submitted}; it is done as soon as the batch answers.")
}

/// Pure: the line under a queued badge.
pub fn queued_text(paused: bool, ahead: Option<i64>, starts_in_secs: Option<i64>) -> String {
    if paused {
        return "Processing is paused by an operator; it starts when processing resumes.".into();
    }
    let place = match ahead {
        Some(0) => "Next in line".to_string(),
        Some(1) => "1 job ahead".to_string(),
        Some(n) => format!("{n} jobs ahead"),
        None => "Waiting for a free worker".to_string(),
    };
    match starts_in_secs {
        Some(s) if s <= 1 => format!("{place}; starting now."),
        Some(s) if s < 120 => format!("{place}; starts in about {s} s."),
        Some(s) => format!("{place}; starts in about {} min.", (s + 59) / 60),
        None if ahead.is_some() => format!("{place}; no estimate yet (nothing has finished lately)."),
        None => format!("{place}."),
    }
}

/// A job's attempts: when each started, how long it took, its outcome and error.
#[component]
pub fn AttemptTimeline(attempts: Vec<crate::model::AttemptInfo>) -> impl IntoView {
    view! {
        <ol class="timeline">
            {attempts
                .into_iter()
                .map(|a| {
                    let took = a.finished_at.as_deref().map(|end| {
                        let ms = parse_ms(end) - parse_ms(&a.started_at);
                        format!(", took {:.1} s", ms.max(0.0) / 1000.0)
                    });
                    view! {
                        <li>
                            <strong>{format!("Attempt {}", a.attempt)}</strong>
                            <span class="muted">{format!(" at {}{}", local_time(&a.started_at), took.unwrap_or_default())}</span>
                            " · "
                            <span>{a.outcome.map_or("running", |o| o.words())}</span>
                            {a.provider_status.map(|s| format!(" (HTTP {s})"))}
                            {a.error.map(|e| view! { <span class="error-text">{format!(": {e}")}</span> })}
                            {a.detail.map(|d| view! { <span class="muted detail">{format!(" (provider: {d})")}</span> })}
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
}

/// Pure: one provider call in words, for operators.
pub fn call_text(call: &crate::model::CallInfo) -> String {
    match (&call.failure, call.answered) {
        (_, true) => format!("{} answered", call.deployment),
        (Some(why), false) => format!("{} failed ({why}); the call moved on", call.deployment),
        (None, false) => format!("{} did not answer; the call moved on", call.deployment),
    }
}

/// Which provider deployment each of a job's calls went to (operators only).
#[component]
fn ProviderCalls(calls: Vec<crate::model::CallInfo>) -> impl IntoView {
    view! {
        <h2>"Provider calls"</h2>
        <ol class="timeline" data-testid="provider-calls">
            {calls
                .into_iter()
                .map(|c| {
                    let text = call_text(&c);
                    view! {
                        <li data-deployment=c.deployment.clone() class:error-text=!c.answered>
                            <span class="muted">{format!("{} · ", local_time(&c.at))}</span>
                            {text}
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
}

/// Copies `text` to the clipboard and says so.
#[component]
fn CopyButton(text: String) -> impl IntoView {
    let copied = RwSignal::new(false);
    let copy = move |_| {
        #[cfg(feature = "hydrate")]
        {
            let clipboard = window().navigator().clipboard();
            let promise = clipboard.write_text(&text);
            leptos::task::spawn_local(async move {
                if wasm_bindgen_futures::JsFuture::from(promise).await.is_ok() {
                    copied.set(true);
                }
            });
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
    };
    view! {
        <button class="button small" on:click=copy>
            {move || if copied.get() { "Copied" } else { "Copy the result" }}
        </button>
    }
}

fn is_live(job: &JobStatus) -> bool {
    !job.state.is_terminal()
}

/// Watches the ended jobs on screen: when one ends, the header asks again (it may have
/// refunded credits or left a notice) and, in a background tab, the ending is told
/// ([`endings::job_ended`]).
fn watch_endings(ended: impl Fn() -> Option<Vec<JobStatus>> + 'static) {
    Effect::new(move |before: Option<Option<Vec<String>>>| {
        let before = before.flatten();
        let Some(now) = ended() else { return before };
        if let Some(seen) = &before {
            let fresh: Vec<&JobStatus> = now.iter().filter(|j| !seen.contains(&j.id)).collect();
            if !fresh.is_empty() {
                crate::AccountChanged::notify();
                fresh.into_iter().for_each(endings::job_ended);
            }
        }
        Some(now.into_iter().map(|j| j.id).collect())
    });
}

#[component]
pub fn JobsPage() -> impl IntoView {
    let page = RwSignal::new(0u32);
    let state = RwSignal::new(String::new());
    let search = RwSignal::new(String::new());
    let filtered = move || !state.get().is_empty() || !search.get().trim().is_empty();
    let jobs = LocalResource::new(move || {
        let (page, state, search) = (page.get(), state.get(), search.get());
        async move {
            let state = (!state.is_empty()).then_some(state);
            let search = (!search.trim().is_empty()).then_some(search);
            list_jobs(Some(page), state, search).await
        }
    });
    let now = RwSignal::new(now_ms());
    poll(now, move || {
        let live = jobs.get_untracked().and_then(|r| r.ok()).is_some_and(|p| p.jobs.iter().any(is_live));
        if live {
            jobs.refetch();
        }
    });
    watch_endings(move || {
        jobs.get().and_then(|r| r.ok()).map(|p| p.jobs.into_iter().filter(|j| !is_live(j)).collect())
    });
    let has_more = move || jobs.get().and_then(|r| r.ok()).is_some_and(|p| p.has_more);
    view! {
        <section class="card">
            <div class="card-head">
                <h1>"Your jobs"</h1>
                <a class="button primary" href="/upload">"Upload documents"</a>
            </div>
            <NotifyToggle/>
            <div class="filters">
                <label for="job-state">"State"</label>
                <select id="job-state" on:change=move |ev| { state.set(event_target_value(&ev)); page.set(0); }>
                    <option value="">"All"</option>
                    {JobState::ALL.into_iter().map(|s| view! { <option value=s.as_str()>{state_label(s)}</option> }).collect_view()}
                </select>
                <label for="job-search">"File name"</label>
                <input id="job-search" type="search" placeholder="Search by file name"
                    on:input=move |ev| { search.set(event_target_value(&ev)); page.set(0); }/>
            </div>
            <Transition fallback=|| view! { <p class="empty">"Loading your jobs…"</p> }>
                {move || {
                    jobs.get()
                        .map(|result| match result.map(|p| p.jobs) {
                            Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                            Ok(list) if list.is_empty() && filtered() => {
                                view! { <p class="empty">"No jobs match."</p> }.into_any()
                            }
                            Ok(list) if list.is_empty() => {
                                view! { <p class="empty">"No jobs yet. Upload a document to start."</p> }.into_any()
                            }
                            Ok(list) => {
                                view! {
                                    <ul class="jobs">
                                        {list
                                            .into_iter()
                                            .map(|job| {
                                                let href = format!("/jobs/{}", job.id);
                                                let name = shown_name(&job);
                                                let id = job.id.clone();
                                                view! {
                                                    <li class="job" data-job-id=id>
                                                        <a class="file-name" href=href.clone()>{name}</a>
                                                        {(job.state == JobState::Done).then(|| view! { <a class="open-result" href=href>"Open the result"</a> })}
                                                        <span class="cost muted" data-testid="cost">
                                                            {cost_text(job.cost, job.refunded, job.input_tokens, job.output_tokens, job.output_tokens_kept)}
                                                        </span>
                                                        <StateBadge job=job.clone() now=now/>
                                                        <CancelButton job=job done=Callback::new(move |_| jobs.refetch())/>
                                                    </li>
                                                }
                                            })
                                            .collect_view()}
                                    </ul>
                                }
                                    .into_any()
                            }
                        })
                }}
            </Transition>
            <nav class="pager" aria-label="Pages of jobs">
                <button class="button small" disabled=move || page.get() == 0 on:click=move |_| page.update(|p| *p = p.saturating_sub(1))>
                    "Newer"
                </button>
                <span class="muted" data-testid="page">{move || format!("Page {}", page.get() + 1)}</span>
                <button class="button small" disabled=move || !has_more() on:click=move |_| page.update(|p| *p += 1)>
                    "Older"
                </button>
            </nav>
        </section>
    }
}

/// "Run again": the same document as a new job (charged again), with a preset to choose;
/// the page moves to the new job.
#[component]
fn RunAgain(job: JobStatus) -> impl IntoView {
    let terms = LocalResource::new(crate::server::account::terms);
    let preset = RwSignal::new(job.preset.map(|p| p.as_str().to_string()).unwrap_or_default());
    let again = ServerAction::<crate::server::jobs::RunAgain>::new();
    let navigate = leptos_router::hooks::use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(reply)) = again.value().get() {
            crate::AccountChanged::notify();
            navigate(&format!("/jobs/{}", reply.id), Default::default());
        }
    });
    let id = job.id.clone();
    view! {
        <form class="filters run-again" on:submit=move |ev| {
            ev.prevent_default();
            again.dispatch(crate::server::jobs::RunAgain { id: id.clone(), preset: Some(preset.get_untracked()) });
        }>
            <label for="again-preset">"Process this document again as"</label>
            <select id="again-preset" on:change=move |ev| preset.set(event_target_value(&ev))>
                {move || terms.get().and_then(|r| r.ok()).map(|t| t.presets).unwrap_or_default().into_iter().map(|p| {
                    let selected = p.id.as_str() == preset.get_untracked();
                    view! { <option value=p.id.as_str() selected=selected>{p.label}</option> }
                }).collect_view()}
            </select>
            <button class="button" type="submit" disabled=move || again.pending().get()>"Run again"</button>
            <span class="hint">"A new job, charged again."</span>
            <span class="form-error">{move || again.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</span>
        </form>
    }
}

#[component]
pub fn JobPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let detail = LocalResource::new(move || job_detail(id()));
    let now = RwSignal::new(now_ms());
    poll(now, move || {
        let live = detail.get_untracked().and_then(|r| r.ok()).is_some_and(|d| is_live(&d.job));
        if live {
            detail.refetch();
        }
    });
    watch_endings(move || {
        detail.get().and_then(|r| r.ok()).map(|d| [d.job].into_iter().filter(|j| !is_live(j)).collect())
    });
    view! {
        <section class="card">
            <p><a href="/jobs">"← All jobs"</a></p>
            <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                {move || {
                    detail
                        .get()
                        .map(|result| match result {
                            Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                            Ok(d) => {
                                let job = d.job.clone();
                                let name = shown_name(&job);
                                let deleted = job.deleted;
                                let markdown = d
                                    .result
                                    .as_ref()
                                    .and_then(|r| r["markdown"].as_str().map(str::to_string));
                                let html = d.result_html.clone().unwrap_or_default();
                                let cost = cost_text(job.cost, job.refunded, job.input_tokens, job.output_tokens, job.output_tokens_kept);
                                // A long document's answered parts, to read before it ends (or after it failed).
                                let parts_so_far = job
                                    .parts
                                    .filter(|p| p.done > 0 && !deleted && matches!(job.state, JobState::Running | JobState::Retrying | JobState::Queued | JobState::Failed) && sluice_types::settlement::answered_parts_served(i64::from(job.cost), job.refunded))
                                    .map(|p| {
                                        let words = if p.done == 1 { "the 1 part done".to_string() } else { format!("the {} parts done", p.done) };
                                        view! {
                                            <p class="downloads">
                                                <a class="button" data-testid="parts-so-far" href=format!("/api/v1/jobs/{}/parts.md", job.id) download>
                                                    {format!("Download {words} so far")}
                                                </a>
                                            </p>
                                        }
                                    });
                                view! {
                                    <h1 class="file-name">{name}</h1>
                                    <p class="job-state">
                                        <StateBadge job=job.clone() now=now/>
                                        " "
                                        <CancelButton job=job.clone() done=Callback::new(move |_| detail.refetch())/>
                                        <RetryNowButton job=job.clone() done=Callback::new(move |_| detail.refetch())/>
                                    </p>
                                    <p class="cost" data-testid="cost">{cost}</p>
                                    {(job.paragraphs_without_formatting > 0).then(|| view! {
                                        <p class="hint" data-testid="formatting-lost">{formatting_lost_text(job.paragraphs_without_formatting)}</p>
                                    })}
                                    {(!job.terms_found.is_empty()).then(|| view! {
                                        <p class="hint" data-testid="terms-found">
                                            {format!("Key terms kept the same in every part: {}.", job.terms_found.join("; "))}
                                        </p>
                                    })}
                                    {job.scan.as_ref().map(|scan| view! {
                                        <p class="hint" data-testid="scan-report">{scan_text(scan)}</p>
                                    })}
                                    {(!job.terms_missed.is_empty()).then(|| view! {
                                        <p class="hint" data-testid="terms-missed">
                                            {format!("Glossary terms the translation did not use, even asked again: {}.", job.terms_missed.join("; "))}
                                        </p>
                                    })}
                                    {parts_so_far}
                                    {markdown.map(|m| view! {
                                        <div class="card-head">
                                            <h2>"Result"</h2>
                                            <CopyButton text=m/>
                                        </div>
                                        <article class="result-rendered" inner_html=html></article>
                                        <p class="downloads">
                                            <a class="button" href=format!("/api/v1/jobs/{}/result.md", job.id) download>"Download the result"</a>
                                            " "
                                            {job.translated_file.clone().map(|kind| view! {
                                                <a class="button" data-testid="translated-file" href=format!("/api/v1/jobs/{}/translated", job.id) download>
                                                    {format!("Download the translated .{kind}")}
                                                </a>
                                                " "
                                            })}
                                            <a class="button" href=format!("/api/v1/jobs/{}/original", job.id) download>"Download the original"</a>
                                        </p>
                                    })}
                                    {deleted.then(|| view! {
                                        <p class="hint" data-testid="deleted">
                                            "Deleted by you: its document, result and file name are gone. The credits stay in your history."
                                        </p>
                                    })}
                                    {(job.state.is_terminal() && !deleted).then(|| view! {
                                        <RunAgain job=job.clone()/>
                                        <DeleteButton job=job.clone() done=Callback::new(move |_| detail.refetch())/>
                                    })}
                                    <h2>"Attempts"</h2>
                                    <AttemptTimeline attempts=d.attempts/>
                                    {(!d.calls.is_empty()).then(|| view! { <ProviderCalls calls=d.calls.clone()/> })}
                                }
                                    .into_any()
                            }
                        })
                }}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::{
        call_text, cost_text, formatting_lost_text, in_batch_text, queued_text, running_text, scan_text, writing_text,
    };
    use crate::model::JobStage;

    #[test]
    fn the_cancel_question_says_what_canceling_costs_before_it_is_confirmed() {
        use super::cancel_question;
        assert_eq!(cancel_question("a.txt", 1, None, None), "Cancel a.txt? Your 1 credit comes back.");
        assert_eq!(
            cancel_question("a.txt", 2, Some(JobStage::Reading), None),
            "Cancel a.txt? Your 2 credits come back, unless you already had 3 unreadable documents refunded today."
        );
        assert_eq!(cancel_question("a.txt", 2, None, None), "Cancel a.txt? Your 2 credits come back.");
        assert_eq!(
            cancel_question("a.txt", 2, Some(JobStage::WaitingForProvider), None),
            "The provider is already working on a.txt: canceling now still costs 2 credits. Cancel anyway?"
        );
        assert_eq!(
            cancel_question("big.pdf", 12, Some(JobStage::WaitingForProvider), Some((2, 6))),
            "The provider has already done part of big.pdf: canceling now keeps 6 credits and gives back 6 credits. Cancel anyway?"
        );
        assert_eq!(cancel_question("free.txt", 0, Some(JobStage::Writing), None), "Cancel free.txt?");
    }

    #[test]
    fn a_call_says_which_deployment_answered_or_why_it_moved_on() {
        let call = |answered, failure: Option<&str>| crate::model::CallInfo {
            at: String::new(),
            deployment: "primary".into(),
            answered,
            failure: failure.map(String::from),
        };
        assert_eq!(call_text(&call(true, None)), "primary answered");
        assert_eq!(
            call_text(&call(false, Some("the provider could not be reached"))),
            "primary failed (the provider could not be reached); the call moved on"
        );
    }

    #[test]
    fn costs_say_what_a_job_came_to_and_what_it_used() {
        assert_eq!(cost_text(1, 0, Some(12_345), Some(678), Some(678)), "Cost 1 credit · 12,345 tokens in, 678 out");
        assert_eq!(
            cost_text(1, 0, Some(12_345), Some(9_000), Some(8_800)),
            "Cost 1 credit · 12,345 tokens in, 9,000 out (8,800 kept)"
        );
        // A document held at its size's price and settled by its text: what it cost first.
        assert_eq!(
            cost_text(8, 7, Some(900), Some(40), None),
            "Cost 1 credit (8 held, 7 returned) · 900 tokens in, 40 out"
        );
        assert_eq!(cost_text(2, 2, None, None, None), "Cost nothing (2 held, all returned)");
        assert_eq!(cost_text(1_200, 200, None, None, None), "Cost 1,000 credits (1,200 held, 200 returned)");
        assert_eq!(cost_text(0, 0, None, None, None), "No charge");
        assert_eq!(
            formatting_lost_text(2),
            "2 paragraphs came back without their bold, italics or links: they are in the look of their first words."
        );
        assert_eq!(
            formatting_lost_text(1),
            "1 paragraph came back without its bold, italics or links: it is in the look of its first words."
        );
    }

    #[test]
    fn a_scan_report_names_its_pages_their_confidence_and_the_ones_to_check() {
        use sluice_types::scan::{OcrPage, ScanReport, SkippedPage};
        let report = ScanReport {
            pages: 4,
            language: "eng".into(),
            read: vec![
                OcrPage { page: 1, confidence: 95.0, low: false },
                OcrPage { page: 2, confidence: 41.0, low: true },
                OcrPage { page: 4, confidence: 90.0, low: false },
            ],
            skipped: vec![SkippedPage { page: 3, reason: "reading the page took longer than its time allows".into() }],
            confidence_floor: 60.0,
        };
        assert_eq!(
            scan_text(&report),
            "3 pages of 4 read by OCR (eng): pages 1, 2, 4, 75% confident on average. Check pages 2 against the \
             original: read with less than 60% confidence. Page 3 was left out: reading the page took longer than its time allows."
        );
        assert_eq!(scan_text(&ScanReport { read: vec![], skipped: vec![], ..report }), "No page was read by OCR.");
    }

    #[test]
    fn running_lines_say_the_stage() {
        assert_eq!(running_text(None, None, None, None, 75), "Running for 75 s.");
        assert_eq!(running_text(Some(JobStage::Reading), None, Some("14:02:10"), Some(1), 1), "Reading the document…");
        assert_eq!(
            running_text(Some(JobStage::Reading), Some((40, Some(12))), None, None, 9),
            "Reading page 12 of 40 (scanned, by OCR)…"
        );
        assert_eq!(
            running_text(Some(JobStage::WaitingForProvider), Some((12, None)), Some("14:02:10"), Some(130), 131),
            "Read 12 pages. Waiting for the provider since 14:02:10 (2 min)."
        );
        assert_eq!(
            running_text(Some(JobStage::WaitingForProvider), Some((1, None)), Some("14:02:10"), Some(3), 4),
            "Read 1 page. Waiting for the provider since 14:02:10 (3 s)."
        );
        assert_eq!(running_text(Some(JobStage::Writing), None, None, None, 9), "Writing the result…");
    }

    #[test]
    fn a_streaming_answer_says_how_far_it_is_written() {
        assert_eq!(writing_text(Some(2_100), Some(8_000)), " About 2,100 of 8,000 tokens written.");
        assert_eq!(writing_text(Some(9_000), Some(8_000)), " About 9,000 of 9,000 tokens written.", "never past all");
        assert_eq!(writing_text(Some(40), None), " About 40 tokens written.");
        assert_eq!(writing_text(Some(0), Some(8_000)), "", "nothing before the first token");
        assert_eq!(writing_text(None, None), "");
    }

    #[test]
    fn queued_lines_say_the_place_and_the_estimate() {
        assert_eq!(queued_text(false, Some(0), Some(0)), "Next in line; starting now.");
        assert_eq!(
            in_batch_text("14:02"),
            "In the provider's batch, submitted 14:02; it is done as soon as the batch answers."
        );
        assert_eq!(queued_text(false, Some(1), Some(40)), "1 job ahead; starts in about 40 s.");
        assert_eq!(queued_text(false, Some(12), Some(150)), "12 jobs ahead; starts in about 3 min.");
        assert_eq!(queued_text(false, Some(3), None), "3 jobs ahead; no estimate yet (nothing has finished lately).");
        assert_eq!(queued_text(false, None, None), "Waiting for a free worker.");
        assert!(queued_text(true, Some(3), Some(5)).starts_with("Processing is paused"));
    }
}
