//! The jobs list and a job's page, polled every 2 s while anything on screen can still change
//! (and not while the tab is hidden).

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::model::{FailureKind, JobState, JobStatus};
use crate::pages::clock::{local_time, now_ms, parse_ms};
use crate::pages::polling::{every, tab_visible, when_shown};
use crate::pages::{capitalise, credits_text};
use crate::server::jobs::{job_detail, list_jobs};

/// Ticks `now` every second and calls `refresh` every other tick while the tab is visible,
/// and at once when a hidden tab is shown again.
fn poll(now: RwSignal<f64>, refresh: impl Fn() + 'static) {
    let refresh = std::rc::Rc::new(refresh);
    let on_tick = refresh.clone();
    let mut tick = 0u32;
    every(1000, move || {
        now.set(now_ms());
        tick += 1;
        if tick % 2 == 0 && tab_visible() {
            on_tick();
        }
    });
    when_shown(move || {
        now.set(now_ms());
        refresh();
    });
}

/// Pure: a duration in words: "42 s", "3 min", "2 h 5 min".
pub fn duration_text(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

fn seconds_between(from_ms: f64, to_ms: f64) -> i64 {
    ((to_ms - from_ms) / 1000.0).round().max(0.0) as i64
}

/// Pure: a state's badge text.
pub fn state_label(state: JobState) -> &'static str {
    match state {
        JobState::Queued => "Queued",
        JobState::Running => "Running",
        JobState::Retrying => "Retrying",
        JobState::Done => "Done",
        JobState::Failed => "Failed",
    }
}

/// The state badge and the line under it.
#[component]
pub fn StateBadge(job: JobStatus, now: RwSignal<f64>) -> impl IntoView {
    let state = job.state;
    let detail = move || match job.state {
        JobState::Queued => queued_text(job.paused, job.jobs_ahead, job.starts_in_secs),
        JobState::Running => {
            let since = job.started_at.as_deref().map(parse_ms).unwrap_or(now.get());
            format!("Running for {}.", duration_text(seconds_between(since, now.get())))
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
        JobState::Failed => failed_text(job.failure_kind, job.failure_reason.as_deref(), job.attempts, job.cost),
        JobState::Done => match job.finished_at.as_deref() {
            Some(end) => {
                format!("Done in {}.", duration_text(seconds_between(parse_ms(&job.accepted_at), parse_ms(end))))
            }
            None => "Done.".to_string(),
        },
    };
    view! {
        <span class=format!("badge {}", state.as_str()) data-state=state.as_str()>{state_label(state)}</span>
        <span class="state-detail">{detail}</span>
    }
}

/// Pure: the line under a failed badge: why, in plain words, and the refund.
pub fn failed_text(kind: Option<FailureKind>, reason: Option<&str>, attempts: i32, cost: i32) -> String {
    let reason = reason.filter(|r| !r.is_empty()).unwrap_or("it could not be processed");
    let why = match kind {
        Some(FailureKind::RetriesExhausted | FailureKind::TimedOut) if attempts > 1 => {
            format!("Gave up after {attempts} attempts: {reason}")
        }
        _ => capitalise(reason),
    };
    let refund =
        if cost > 0 { format!("{} refunded", credits_text(cost.into())) } else { "Nothing was charged".into() };
    format!("{why}. {refund}.")
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

fn is_live(job: &JobStatus) -> bool {
    !job.state.is_terminal()
}

/// Tells the header to ask again when the number of ended jobs on screen changes (an ended
/// job may have refunded credits or left a notice).
fn watch_endings(ended: impl Fn() -> Option<usize> + 'static) {
    Effect::new(move |before: Option<Option<usize>>| {
        let now = ended();
        if let (Some(Some(b)), Some(n)) = (before, now) {
            if n != b {
                crate::AccountChanged::notify();
            }
        }
        now
    });
}

#[component]
pub fn JobsPage() -> impl IntoView {
    let jobs = LocalResource::new(list_jobs);
    let now = RwSignal::new(now_ms());
    poll(now, move || {
        let live = jobs.get_untracked().and_then(|r| r.ok()).is_some_and(|js| js.iter().any(is_live));
        if live {
            jobs.refetch();
        }
    });
    watch_endings(move || jobs.get().and_then(|r| r.ok()).map(|js| js.iter().filter(|j| !is_live(j)).count()));
    view! {
        <section class="card">
            <div class="card-head">
                <h1>"Your jobs"</h1>
                <a class="button primary" href="/upload">"Upload documents"</a>
            </div>
            <Transition fallback=|| view! { <p class="empty">"Loading your jobs…"</p> }>
                {move || {
                    jobs.get()
                        .map(|result| match result {
                            Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
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
                                                let name = job.file_name.clone().unwrap_or_else(|| "document".into());
                                                let id = job.id.clone();
                                                view! {
                                                    <li class="job" data-job-id=id>
                                                        <a class="file-name" href=href.clone()>{name}</a>
                                                        {(job.state == JobState::Done).then(|| view! { <a class="open-result" href=href>"Open the result"</a> })}
                                                        <StateBadge job=job now=now/>
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
        </section>
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
    watch_endings(move || detail.get().and_then(|r| r.ok()).map(|d| usize::from(!is_live(&d.job))));
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
                                let name = job.file_name.clone().unwrap_or_else(|| "document".into());
                                let markdown = d
                                    .result
                                    .as_ref()
                                    .and_then(|r| r["markdown"].as_str().map(str::to_string));
                                view! {
                                    <h1 class="file-name">{name}</h1>
                                    <p class="job-state"><StateBadge job=job.clone() now=now/></p>
                                    {markdown.map(|m| view! {
                                        <h2>"Result"</h2>
                                        <pre class="result-text">{m}</pre>
                                        <p class="downloads">
                                            <a class="button" href=format!("/api/v1/jobs/{}/result.md", job.id) download>"Download the result"</a>
                                            " "
                                            <a class="button" href=format!("/api/v1/jobs/{}/original", job.id) download>"Download the original"</a>
                                        </p>
                                    })}
                                    <h2>"Attempts"</h2>
                                    <AttemptTimeline attempts=d.attempts/>
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
    use super::{duration_text, failed_text, queued_text};
    use crate::model::FailureKind;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_text(0), "0 s");
        assert_eq!(duration_text(119), "119 s");
        assert_eq!(duration_text(125), "2 min");
        assert_eq!(duration_text(7260), "2 h 1 min");
        assert_eq!(duration_text(-5), "0 s");
    }

    #[test]
    fn failed_lines_say_why_and_the_refund() {
        assert_eq!(
            failed_text(Some(FailureKind::RetriesExhausted), Some("the provider is rate limiting us"), 3, 1),
            "Gave up after 3 attempts: the provider is rate limiting us. 1 credit refunded."
        );
        assert_eq!(
            failed_text(Some(FailureKind::InvalidInput), Some("the PDF is encrypted"), 1, 2),
            "The PDF is encrypted. 2 credits refunded."
        );
        assert_eq!(failed_text(None, None, 0, 0), "It could not be processed. Nothing was charged.");
    }

    #[test]
    fn queued_lines_say_the_place_and_the_estimate() {
        assert_eq!(queued_text(false, Some(0), Some(0)), "Next in line; starting now.");
        assert_eq!(queued_text(false, Some(1), Some(40)), "1 job ahead; starts in about 40 s.");
        assert_eq!(queued_text(false, Some(12), Some(150)), "12 jobs ahead; starts in about 3 min.");
        assert_eq!(queued_text(false, Some(3), None), "3 jobs ahead; no estimate yet (nothing has finished lately).");
        assert_eq!(queued_text(false, None, None), "Waiting for a free worker.");
        assert!(queued_text(true, Some(3), Some(5)).starts_with("Processing is paused"));
    }
}
