//! The admin page's capacity card: the provider's limits and what the token budget holds now,
//! and the capacity planner. The server sends the measured attempts; the plan is computed here
//! (the same pure planner as `server capacity`), so other limits typed in show their result at
//! once, without a round trip.

use leptos::prelude::*;

use crate::errors::AppError;
use crate::model::CapacityInfo;
use crate::server::admin::capacity;
use sluice_types::capacity::DeploymentState;
use sluice_types::capacity::{plan, AttemptStats, ProviderLimits, Sizing};
use sluice_types::Preset;

/// Pure: a per-minute limit as typed: empty is unlimited; digits with `,`, `_` or spaces
/// between them; `k` or `M` at the end multiply.
pub fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    let clean: String = text.chars().filter(|c| !matches!(c, ',' | '_' | ' ')).collect();
    if clean.is_empty() {
        return Ok(None);
    }
    let (digits, factor) = match clean.chars().last() {
        Some('k' | 'K') => (&clean[..clean.len() - 1], 1_000),
        Some('m' | 'M') => (&clean[..clean.len() - 1], 1_000_000),
        _ => (clean.as_str(), 1),
    };
    match digits.parse::<u64>().ok().and_then(|n| n.checked_mul(factor)) {
        Some(0) | None => Err(format!("{text:?} is not a limit: write a number like 2000000 or 2M, or leave it empty")),
        Some(n) => Ok(Some(n)),
    }
}

/// Pure: a limit as the field shows it (empty = unlimited).
pub fn limit_text(limit: Option<u64>) -> String {
    limit.map(|n| n.to_string()).unwrap_or_default()
}

/// Pure: a preset's name for people ("all" and names we do not know stay as they are).
pub fn preset_text(name: &str) -> String {
    match name {
        "all" => "All presets".to_string(),
        other => Preset::parse(other).map_or_else(|| other.to_string(), |p| p.label().to_string()),
    }
}

/// Pure: the safe concurrency at one sizing, in words: "81.7 (input tokens per minute)".
pub fn sizing_text(sizing: &Sizing) -> String {
    match sizing.binding {
        Some((constraint, slots)) => format!("{slots:.1} ({})", constraint.words()),
        None => "unlimited".to_string(),
    }
}

fn three(p: &sluice_types::capacity::Percentiles, digits: usize) -> String {
    format!("{:.d$} / {:.d$} / {:.d$}", p.p50, p.p90, p.p99, d = digits)
}

/// Pure: what the budget holds now, in words.
pub fn budget_text(info: &CapacityInfo) -> String {
    let part = |name: &str, limit: Option<u64>, left: Option<f64>| {
        limit.map(|limit| format!("{name}: {} of {limit}/min left", left.unwrap_or(0.0).max(0.0).floor()))
    };
    let parts: Vec<String> = [
        part("requests", info.limits.requests_per_min, info.requests_left),
        part("input tokens", info.limits.input_tokens_per_min, info.input_tokens_left),
        part("output tokens", info.limits.output_tokens_per_min, info.output_tokens_left),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "No provider limits are configured: claims are held only by the gate.".to_string()
    } else {
        format!("Token budget shared by every worker: {}.", parts.join("; "))
    }
}

#[component]
fn LimitField(id: &'static str, label: &'static str, value: RwSignal<String>) -> impl IntoView {
    view! {
        <label for=id>{label}</label>
        <input id=id data-testid=id inputmode="numeric" placeholder="unlimited"
            prop:value=move || value.get() on:input=move |ev| value.set(event_target_value(&ev))/>
    }
}

fn stats_row(stats: &AttemptStats, limits: &ProviderLimits, gate: i32) -> impl IntoView {
    let answer = plan(stats, limits);
    let recommended = answer.recommended_gate.map_or("—".to_string(), |g| g.to_string());
    let advice = match answer.recommended_gate {
        Some(g) if g > gate => "raise",
        Some(g) if g < gate => "lower",
        Some(_) => "keep",
        None => "",
    };
    view! {
        <tr data-testid="planner-row" data-preset=stats.preset.clone()>
            <th scope="row">{preset_text(&stats.preset)}</th>
            <td>{stats.attempts}</td>
            <td>{three(&stats.duration_secs, 1)}</td>
            <td>{three(&stats.input_tokens, 0)}</td>
            <td>{three(&stats.output_tokens, 0)}</td>
            <td data-testid="at-p50">{sizing_text(&answer.at_p50)}</td>
            <td data-testid="at-p90">{sizing_text(&answer.at_p90)}</td>
            <td data-testid="recommended-gate" class=advice>{recommended}</td>
        </tr>
    }
}

/// Seed 003: the deadline must exceed the slowest work. Warns, per preset, where the measured
/// p99 attempt takes over half the provider timeout or the attempt deadline at its p99 size.
fn timeout_warnings(info: &CapacityInfo) -> impl IntoView {
    let warnings: Vec<_> = info
        .stats
        .iter()
        .flat_map(|s| {
            info.time_limits.warnings(s).into_iter().map(move |w| format!("{}: {w}.", preset_text(&s.preset)))
        })
        .map(|w| view! { <li>{w}</li> })
        .collect();
    let limits = info.time_limits;
    let hint = format!(
        "Timeouts: a provider call {:.0} s and an attempt {:.0} s, plus {:.0} s per 100K input tokens.",
        limits.provider_secs, limits.attempt_secs, limits.per_100k_tokens_secs
    );
    view! {
        <p class="hint" data-testid="time-limits">{hint}</p>
        {(!warnings.is_empty()).then(|| view! { <ul class="warn-text" data-testid="timeout-warnings">{warnings}</ul> })}
    }
}

/// The limits, the budget now, and the planner with "what if" limits.
#[component]
pub fn CapacityCard(admitted: Memo<Option<bool>>) -> impl IntoView {
    let days = RwSignal::new(7u32);
    let info = LocalResource::new(move || {
        let days = days.get();
        let admin = admitted.get() == Some(true);
        async move {
            if admin {
                capacity(days).await.map(Some)
            } else {
                Ok::<_, AppError>(None)
            }
        }
    });
    let (rpm, itpm, otpm) = (RwSignal::new(String::new()), RwSignal::new(String::new()), RwSignal::new(String::new()));
    // The fields start at the configured limits, once.
    let filled = StoredValue::new(false);
    Effect::new(move |_| {
        if let Some(Ok(Some(i))) = info.get() {
            if !filled.get_value() {
                filled.set_value(true);
                rpm.set(limit_text(i.limits.requests_per_min));
                itpm.set(limit_text(i.limits.input_tokens_per_min));
                otpm.set(limit_text(i.limits.output_tokens_per_min));
            }
        }
    });
    let limits = move || -> Result<ProviderLimits, String> {
        Ok(ProviderLimits {
            requests_per_min: parse_limit(&rpm.get())?,
            input_tokens_per_min: parse_limit(&itpm.get())?,
            output_tokens_per_min: parse_limit(&otpm.get())?,
        })
    };
    let planner = move || {
        let info = info.get().and_then(|r| r.ok()).flatten()?;
        let limits = match limits() {
            Ok(limits) => limits,
            Err(e) => return Some(view! { <p class="form-error" data-testid="planner-error">{e}</p> }.into_any()),
        };
        if info.stats.is_empty() {
            let empty = format!("No attempt finished in the last {} days: nothing to size from yet.", info.days);
            return Some(view! { <p class="empty">{empty}</p> }.into_any());
        }
        let gate = info.gate_size;
        let rows: Vec<_> = info.stats.iter().map(|s| stats_row(s, &limits, gate)).collect();
        Some(
            view! {
                <div class="table-scroll">
                    <table class="planner">
                        <thead><tr>
                            <th scope="col">"Preset"</th>
                            <th scope="col">"Attempts"</th>
                            <th scope="col">"Duration p50 / p90 / p99 (s)"</th>
                            <th scope="col">"Input tokens p50 / p90 / p99"</th>
                            <th scope="col">"Output tokens p50 / p90 / p99"</th>
                            <th scope="col">"Safe slots, median jobs"</th>
                            <th scope="col">"Safe slots, p90 jobs"</th>
                            <th scope="col">"Recommended gate"</th>
                        </tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                </div>
                {timeout_warnings(&info)}
                <p class="hint">{format!(
                    "Safe slots: how many jobs may run at once before a limit runs out, each job the median \
                     (or 90th percentile) size held for the median duration; in brackets the limit that binds. \
                     The recommendation is a quarter of the p90 figure, as seed 000 chose; the gate now is {gate}."
                )}</p>
            }
            .into_any(),
        )
    };
    view! {
        <section class="card" data-testid="capacity">
            <h2>"Provider capacity"</h2>
            <p data-testid="budget">
                {move || info.get().and_then(|r| r.ok()).flatten().map(|i| budget_text(&i))}
            </p>
            {move || {
                let deployments = info.get().and_then(|r| r.ok()).flatten().map(|i| i.deployments).unwrap_or_default();
                (!deployments.is_empty()).then(|| view! { <DeploymentTable deployments/> })
            }}
            <h3>"Capacity planner"</h3>
            <form class="planner-limits" on:submit=|ev| ev.prevent_default()>
                <LimitField id="limit-rpm" label="Requests per minute" value=rpm/>
                <LimitField id="limit-itpm" label="Input tokens per minute" value=itpm/>
                <LimitField id="limit-otpm" label="Output tokens per minute" value=otpm/>
                <label for="planner-days">"From the last"</label>
                <select id="planner-days" on:change=move |ev| {
                    if let Ok(d) = event_target_value(&ev).parse() { days.set(d) }
                }>
                    <option value="1">"day"</option>
                    <option value="7" selected>"7 days"</option>
                    <option value="30">"30 days"</option>
                </select>
            </form>
            {planner}
        </section>
    }
}

/// Pure: a deployment's state in words: taking calls, failing, or resting and until when.
pub fn deployment_state_text(d: &DeploymentState) -> String {
    let minutes = |secs: f64| {
        if secs < 90.0 {
            format!("{:.0} s", secs.max(0.0))
        } else {
            format!("{:.0} min", secs / 60.0)
        }
    };
    match (d.resting_for_secs, d.failing_for_secs, d.last_success_secs_ago) {
        (Some(rest), since, _) => format!(
            "Resting {} more after {} failures in a row{}: its calls go to the next",
            minutes(rest),
            d.failures_in_a_row,
            since.map_or(String::new(), |s| format!(", failing for {}", minutes(s)))
        ),
        (None, Some(since), _) => {
            format!("Trying again after failing for {} ({} failures in a row)", minutes(since), d.failures_in_a_row)
        }
        (None, None, Some(ago)) if d.failures_in_a_row > 0 => {
            format!("Taking calls; {} failed in a row, last answered {} ago", d.failures_in_a_row, minutes(ago))
        }
        (None, None, Some(ago)) => format!("Taking calls; last answered {} ago", minutes(ago)),
        (None, None, None) => "Taking calls; not called yet".to_string(),
    }
}

/// Pure: a deployment's own limits, as the providers file gives them.
pub fn deployment_limits_text(d: &DeploymentState) -> String {
    let limits: Vec<String> = [
        (d.limit_requests_per_min, "requests"),
        (d.limit_input_tokens_per_min, "input tokens"),
        (d.limit_output_tokens_per_min, "output tokens"),
    ]
    .into_iter()
    .filter_map(|(limit, what)| limit.map(|l| format!("{} {what}", sluice_types::thousands(l))))
    .collect();
    if limits.is_empty() {
        "No limits".into()
    } else {
        format!("{} a minute", limits.join(", "))
    }
}

/// The providers file's deployments, in the order calls try them.
#[component]
fn DeploymentTable(deployments: Vec<DeploymentState>) -> impl IntoView {
    let rows = deployments
        .into_iter()
        .map(|d| {
            let state = deployment_state_text(&d);
            let limits = deployment_limits_text(&d);
            let left = d.input_tokens_left.map_or("—".to_string(), |l| sluice_types::thousands(l.max(0.0) as i64));
            let resting = d.resting_for_secs.is_some();
            view! {
                <tr data-testid="deployment" data-name=d.name.clone() class:warn=resting>
                    <td>{d.name.clone()}</td>
                    <td>{format!("{} {}", d.kind, d.model)}</td>
                    <td data-testid="deployment-state">{state}</td>
                    <td>{limits}</td>
                    <td class="num">{left}</td>
                    <td>{d.last_failure.clone().unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <h3>"Deployments"</h3>
        <div class="table-scroll">
            <table data-testid="deployments">
                <thead><tr>
                    <th scope="col">"Deployment"</th>
                    <th scope="col">"Model"</th>
                    <th scope="col">"State"</th>
                    <th scope="col">"Its limits"</th>
                    <th scope="col">"Input tokens left"</th>
                    <th scope="col">"Last failure"</th>
                </tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </div>
        <p class="hint">
            "Each call goes to the first deployment that is not resting and has room in its limits. Failures in a \
             row put a deployment to rest, longer each time; its first answer ends the rest."
        </p>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_says_whether_it_takes_calls_or_rests_and_for_how_long() {
        let d = |resting: Option<f64>, failing: Option<f64>, ago: Option<f64>, failures| DeploymentState {
            resting_for_secs: resting,
            failing_for_secs: failing,
            last_success_secs_ago: ago,
            failures_in_a_row: failures,
            ..DeploymentState::default()
        };
        assert_eq!(deployment_state_text(&d(None, None, None, 0)), "Taking calls; not called yet");
        assert_eq!(deployment_state_text(&d(None, None, Some(4.0), 0)), "Taking calls; last answered 4 s ago");
        assert_eq!(
            deployment_state_text(&d(None, None, Some(4.0), 2)),
            "Taking calls; 2 failed in a row, last answered 4 s ago"
        );
        assert_eq!(
            deployment_state_text(&d(Some(20.0), Some(400.0), Some(500.0), 4)),
            "Resting 20 s more after 4 failures in a row, failing for 7 min: its calls go to the next"
        );
        assert_eq!(
            deployment_state_text(&d(None, Some(30.0), None, 3)),
            "Trying again after failing for 30 s (3 failures in a row)"
        );
        let limited = DeploymentState {
            limit_input_tokens_per_min: Some(30_000),
            limit_requests_per_min: Some(50),
            ..Default::default()
        };
        assert_eq!(deployment_limits_text(&limited), "50 requests, 30,000 input tokens a minute");
        assert_eq!(deployment_limits_text(&DeploymentState::default()), "No limits");
    }

    #[test]
    fn limits_are_typed_the_way_people_write_them() {
        assert_eq!(parse_limit(""), Ok(None));
        assert_eq!(parse_limit("  "), Ok(None));
        assert_eq!(parse_limit("2,000,000"), Ok(Some(2_000_000)));
        assert_eq!(parse_limit("2M"), Ok(Some(2_000_000)));
        assert_eq!(parse_limit("400k"), Ok(Some(400_000)));
        for bad in ["0", "-5", "lots", "1.5M", "99999999999999999999"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(limit_text(Some(4000)), "4000");
        assert_eq!(preset_text("key_facts"), "Extract key facts");
        assert_eq!(preset_text("all"), "All presets");
    }
}
