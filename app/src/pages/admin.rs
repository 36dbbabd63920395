//! The admin page: the kill switch, the gate, vital signs with a chart, the dead-letter queue
//! and the audit log. Every call is checked on the server; others get "not found".

use leptos::prelude::*;

use crate::api::{audit_log, dlq_groups, queue_overview, DlqDiscard, DlqReplay, SetGate, SetProcessing};
use crate::model::QueueStatus;

fn confirm(message: &str) -> bool {
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

/// Pure: the two polylines (intake, completions) of the chart, in a 600×120 box.
pub fn chart_lines(history: &[(i64, i64)]) -> (String, String) {
    let max = history.iter().map(|(a, b)| (*a).max(*b)).max().unwrap_or(0).max(1) as f64;
    let step = 600.0 / (history.len().max(2) - 1) as f64;
    let line = |pick: fn(&(i64, i64)) -> i64| {
        history
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", i as f64 * step, 115.0 - pick(p) as f64 / max * 110.0))
            .collect::<Vec<_>>()
            .join(" ")
    };
    (line(|p| p.0), line(|p| p.1))
}

#[component]
pub fn AdminPage() -> impl IntoView {
    let set_processing = ServerAction::<SetProcessing>::new();
    let set_gate = ServerAction::<SetGate>::new();
    let replay = ServerAction::<DlqReplay>::new();
    let discard = ServerAction::<DlqDiscard>::new();
    let refresh = RwSignal::new(0u32);
    let changed = move || {
        refresh.track();
        set_processing.version().track();
        set_gate.version().track();
        replay.version().track();
        discard.version().track();
    };
    let overview = LocalResource::new(move || {
        changed();
        queue_overview()
    });
    let groups = LocalResource::new(move || {
        changed();
        dlq_groups()
    });
    let audit = LocalResource::new(move || {
        changed();
        audit_log()
    });
    #[cfg(feature = "hydrate")]
    {
        let interval = gloo_timers::callback::Interval::new(5000, move || {
            if document().visibility_state() == web_sys::VisibilityState::Visible {
                refresh.update(|n| *n += 1);
            }
        });
        let interval = send_wrapper::SendWrapper::new(interval);
        on_cleanup(move || drop(interval));
    }
    let gate_input = RwSignal::new(String::new());

    let view_overview = move |o: QueueStatus| {
        let enabled = o.processing_enabled;
        let (intake, done) = chart_lines(&o.history);
        view! {
            <section class="card" data-testid="kill-switch">
                <div class="card-head">
                    <h2>"Processing"</h2>
                    <span class=if enabled { "badge done" } else { "badge failed" } data-testid="processing-state">
                        {if enabled { "On" } else { "Paused" }}
                    </span>
                </div>
                <p class="hint">{format!("Since {} by {}.", o.processing_changed_at.get(..16).unwrap_or("").replace('T', " "), o.processing_changed_by)}</p>
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
            </section>
            <section class="card">
                <h2>"Concurrency gate"</h2>
                <p>{format!("{} running now, at most {} at once across all workers.", o.running, o.gate_size)}</p>
                <form on:submit=move |ev| {
                    ev.prevent_default();
                    if let Ok(size) = gate_input.get_untracked().trim().parse::<i32>() {
                        set_gate.dispatch(SetGate { size });
                    }
                }>
                    <label for="gate">"Jobs at once (1 to 70)"</label>
                    <input id="gate" type="number" min="1" max="70" placeholder=o.gate_size.to_string()
                        on:input=move |ev| gate_input.set(event_target_value(&ev))/>
                    <button class="button" type="submit">"Set the gate"</button>
                </form>
                <p class="form-error">{move || set_gate.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
            </section>
            <section class="card">
                <h2>"Vital signs"</h2>
                <dl class="vitals">
                    <div><dt>"Backlog"</dt><dd data-testid="backlog">{o.backlog}</dd></div>
                    <div><dt>"Oldest waiting"</dt><dd>{secs(o.oldest_waiting_secs)}</dd></div>
                    <div><dt>"In / out per min"</dt><dd>{format!("{:.1} / {:.1}", o.intake_per_min, o.completions_per_min)}</dd></div>
                    <div><dt>"Time to done p50 / p95"</dt><dd>{format!("{} / {}", secs(o.time_to_done_p50_secs), secs(o.time_to_done_p95_secs))}</dd></div>
                    <div><dt>"Dead letters"</dt><dd>{o.dlq_depth}</dd></div>
                    <div><dt>"Drains in"</dt><dd class:warn=o.drain == "not draining">{o.drain.clone()}</dd></div>
                </dl>
                <svg class="chart" viewBox="0 0 600 120" role="img" aria-label="Intake and completions per minute over the last hour">
                    <polyline class="intake" points=intake fill="none"/>
                    <polyline class="completions" points=done fill="none"/>
                </svg>
                <p class="legend"><span class="intake">"— intake"</span>" "<span class="completions">"— completions"</span>" per minute, last hour"</p>
            </section>
        }
    };

    view! {
        <h1>"Operations"</h1>
        <Suspense fallback=|| view! { <p class="empty">"Loading…"</p> }>
            {move || overview.get().map(|r| match r {
                Ok(o) => view_overview(o).into_any(),
                Err(_) => view! { <p class="empty">"Page not found."</p> }.into_any(),
            })}
        </Suspense>
        <section class="card">
            <h2>"Dead-letter queue"</h2>
            {move || {
                let list = groups.get().and_then(|r| r.ok()).unwrap_or_default();
                if list.is_empty() {
                    return view! { <p class="empty">"No failed jobs."</p> }.into_any();
                }
                view! {
                    <ul class="dlq">
                        {list.into_iter().map(|g| {
                            let (k1, r1, k2, r2) = (g.kind.clone(), g.reason.clone(), g.kind.clone(), g.reason.clone());
                            view! {
                                <li data-testid="dlq-group">
                                    <span class="badge failed">{g.kind.replace('_', " ")}</span>
                                    <span class="reason">{g.reason.clone()}</span>
                                    <span class="muted">{format!("{} jobs", g.jobs)}</span>
                                    <button class="button" on:click=move |_| { replay.dispatch(DlqReplay { kind: k1.clone(), reason: r1.clone() }); }>"Replay"</button>
                                    <button class="button link" on:click=move |_| {
                                        if confirm("Discard these jobs from the dead-letter queue?") {
                                            discard.dispatch(DlqDiscard { kind: k2.clone(), reason: r2.clone() });
                                        }
                                    }>"Discard"</button>
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
        </section>
        <section class="card">
            <h2>"Audit log"</h2>
            <ul class="audit">
                {move || audit.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|a| view! {
                    <li>
                        <span class="when">{a.at.get(..16).unwrap_or("").replace('T', " ")}</span>
                        {format!(" {} changed {}{}: {} → {}", a.actor, a.action, a.subject.map(|s| format!(" ({s})")).unwrap_or_default(),
                            a.old_value.unwrap_or_default(), a.new_value.unwrap_or_default())}
                    </li>
                }).collect_view()}
            </ul>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::chart_lines;

    #[test]
    fn chart_lines_scale_to_the_busiest_minute() {
        let (intake, done) = chart_lines(&[(0, 0), (10, 5), (5, 10)]);
        assert_eq!(intake, "0.0,115.0 300.0,5.0 600.0,60.0");
        assert_eq!(done, "0.0,115.0 300.0,60.0 600.0,5.0");
        let (flat, _) = chart_lines(&[]);
        assert_eq!(flat, "");
    }
}
