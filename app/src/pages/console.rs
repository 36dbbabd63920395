//! The operator console: the admin area as pages with URLs under `/admin/…`, a navigation that
//! shows where you are, and one refresh control for the pages that refresh themselves. To
//! anyone but an admin every page is "Page not found", and the server answers 404 too.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::model::{OutcomeRow, Permission, ProcessesInfo, Role};
use crate::pages::clock::local_date_time;
use crate::pages::polling::{every, tab_visible};
use crate::server::console::{outcomes, processes};

/// The console's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Overview,
    Jobs,
    DeadLetters,
    Users,
    Capacity,
    Processes,
    Audit,
}

impl Section {
    pub const ALL: [Section; 7] = [
        Section::Overview,
        Section::Jobs,
        Section::DeadLetters,
        Section::Users,
        Section::Capacity,
        Section::Processes,
        Section::Audit,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Section::Overview => "/admin",
            Section::Jobs => "/admin/jobs",
            Section::DeadLetters => "/admin/dead-letters",
            Section::Users => "/admin/users",
            Section::Capacity => "/admin/capacity",
            Section::Processes => "/admin/processes",
            Section::Audit => "/admin/audit",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Section::Overview => "Overview",
            Section::Jobs => "Jobs",
            Section::DeadLetters => "Dead letters",
            Section::Users => "Users",
            Section::Capacity => "Capacity",
            Section::Processes => "Processes",
            Section::Audit => "Audit",
        }
    }
}

/// Bumped each time the pages that refresh themselves should ask again.
#[derive(Clone, Copy)]
pub struct Tick(pub RwSignal<u32>);

impl Tick {
    /// Track it in a resource (or do nothing outside the console).
    pub fn track() {
        if let Some(Tick(tick)) = use_context::<Tick>() {
            tick.track();
        }
    }
}

/// The refresh intervals offered, in seconds (0: paused).
pub const REFRESH_CHOICES: [u32; 4] = [5, 15, 60, 0];
const REFRESH_KEY: &str = "sluice.console.refresh";

/// Pure: a refresh interval in words.
pub fn refresh_label(secs: u32) -> String {
    match secs {
        0 => "Paused".into(),
        s => format!("Every {s} s"),
    }
}

/// Pure: the stored interval if it is one offered, else the default (5 s).
pub fn refresh_from_storage(stored: Option<&str>) -> u32 {
    stored.and_then(|s| s.parse().ok()).filter(|s| REFRESH_CHOICES.contains(s)).unwrap_or(REFRESH_CHOICES[0])
}

fn stored_refresh() -> u32 {
    #[cfg(feature = "hydrate")]
    {
        let stored = window().local_storage().ok().flatten().and_then(|s| s.get_item(REFRESH_KEY).ok().flatten());
        refresh_from_storage(stored.as_deref())
    }
    #[cfg(not(feature = "hydrate"))]
    refresh_from_storage(None)
}

fn store_refresh(secs: u32) {
    #[cfg(feature = "hydrate")]
    if let Some(storage) = window().local_storage().ok().flatten() {
        let _ = storage.set_item(REFRESH_KEY, &secs.to_string());
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (secs, REFRESH_KEY);
}

/// The role the console is shown to (provided by [`Console`]).
#[derive(Clone, Copy)]
pub struct StaffRole(pub Memo<Role>);

/// Whether the console's viewer may do `what` (reactive; false outside the console).
pub fn may(what: Permission) -> bool {
    use_context::<StaffRole>().is_some_and(|StaffRole(role)| role.get().may(what))
}

/// A console page: shown to staff only, under the console's navigation and refresh control.
#[component]
pub fn Console(section: Section, children: ChildrenFn) -> impl IntoView {
    let me = expect_context::<crate::CurrentUser>();
    // The server renders "Loading…" (it does not know the role yet), and so must the first
    // render in the browser, which hydrates that HTML: a console page's chunk arrives after the
    // header may have learnt the role. The role counts once the page is mounted.
    let mounted = RwSignal::new(false);
    Effect::new(move |_| mounted.set(true));
    // Kept while the header asks again after a navigation, so the page does not flicker.
    let admitted = Memo::new(move |before: Option<&Option<bool>>| {
        if !mounted.get() {
            return None;
        }
        match me.get() {
            Some(user) => Some(user.is_some_and(|u| u.role.is_staff())),
            None => before.copied().flatten(),
        }
    });
    // What the console shows follows the role: support reads, operators act on jobs, admins
    // also see the gate, credits and users' forms (the server refuses the rest anyway).
    let role = Memo::new(move |before: Option<&Role>| match me.get() {
        Some(Some(user)) => user.role,
        _ => before.copied().unwrap_or(Role::User),
    });
    provide_context(StaffRole(role));
    let tick = RwSignal::new(0u32);
    provide_context(Tick(tick));
    let interval = RwSignal::new(REFRESH_CHOICES[0]);
    Effect::new(move |_| interval.set(stored_refresh()));
    let elapsed = RwSignal::new(0u32);
    every(1000, move || {
        let secs = interval.get_untracked();
        if secs == 0 || !tab_visible() {
            return;
        }
        elapsed.update(|e| *e += 1);
        if elapsed.get_untracked() >= secs {
            elapsed.set(0);
            tick.update(|n| *n += 1);
        }
    });
    let children = StoredValue::new(children);
    move || {
        match admitted.get() {
        Some(true) => view! {
            <div class="console">
                <div class="console-head">
                    <nav class="console-nav" aria-label="Console">
                        {Section::ALL.into_iter().map(|s| view! {
                            <A href=s.path() exact=true>{s.title()}</A>
                        }).collect_view()}
                    </nav>
                    <div class="refresh" data-testid="refresh">
                        <label for="refresh-every">"Refresh"</label>
                        <select id="refresh-every" on:change=move |ev| {
                            let secs = refresh_from_storage(Some(&event_target_value(&ev)));
                            interval.set(secs);
                            store_refresh(secs);
                            elapsed.set(0);
                        }>
                            {REFRESH_CHOICES.into_iter().map(|secs| view! {
                                <option value=secs.to_string() selected=move || interval.get() == secs>{refresh_label(secs)}</option>
                            }).collect_view()}
                        </select>
                        <button class="button small" on:click=move |_| tick.update(|n| *n += 1)>"Refresh now"</button>
                    </div>
                </div>
                <h1>{section.title()}</h1>
                {children.with_value(|c| c())}
            </div>
        }
        .into_any(),
        Some(false) => view! { <p class="empty">"Page not found."</p> }.into_any(),
        None => view! { <p class="empty">"Loading…"</p> }.into_any(),
    }
    }
}

/// Pure: a share as a percentage ("–" when nothing ended).
pub fn share_text(share: Option<f64>) -> String {
    share.map(|s| format!("{:.1} %", s * 100.0)).unwrap_or_else(|| "–".into())
}

/// Pure: of `billed` output tokens, the share kept when `discarded` were not ("–" for none).
pub fn kept_text(billed: i64, discarded: i64) -> String {
    if billed <= 0 {
        return "–".into();
    }
    let kept = billed.saturating_sub(discarded.max(0)).max(0);
    format!("{:.1} %", kept as f64 * 100.0 / billed as f64)
}

/// Pure: a token count, short (1.2M, 35K, 900).
pub fn tokens_text(n: i64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 10_000 => format!("{}K", n / 1000),
        n => n.to_string(),
    }
}

/// Outcomes and cost per hour (last 24) or per day (last 30).
#[component]
pub fn OutcomesCard() -> impl IntoView {
    let period = RwSignal::new("hour".to_string());
    // Hours follow the console's clock; 30 days of totals are read when asked (a heavier read
    // that changes slowly).
    let rows = LocalResource::new(move || {
        let period = period.get();
        if period == "hour" {
            Tick::track();
        }
        outcomes(period)
    });
    let row = |o: OutcomeRow| {
        view! {
            <tr data-testid="outcome-row">
                <td>{o.start}</td>
                <td class="num">{o.done}</td>
                <td class="num">{o.failed}</td>
                <td class="num" class:warn=o.failure_share.is_some_and(|s| s > 0.1)>{share_text(o.failure_share)}</td>
                <td class="num">{o.credits_charged}</td>
                <td class="num">{o.credits_refunded}</td>
                <td class="num">{format!("{} / {}", tokens_text(o.input_tokens_succeeded), tokens_text(o.output_tokens_succeeded))}</td>
                <td class="num">{format!("{} / {}", tokens_text(o.input_tokens_failed), tokens_text(o.output_tokens_failed))}</td>
                <td class="num" data-testid="output-kept">{kept_text(o.output_tokens_succeeded.saturating_add(o.output_tokens_failed), o.output_tokens_discarded)}</td>
                <td class="num" data-testid="cost">{o.cost_usd.map_or_else(|| "—".to_string(), |c| format!("${c:.2}"))}</td>
            </tr>
        }
    };
    view! {
        <section class="card wide" data-testid="outcomes">
            <div class="card-head">
                <h2>"Outcomes and cost"</h2>
                <div class="segmented" role="group" aria-label="Per">
                    <button class="button small" aria-pressed=move || (period.get() == "hour").to_string()
                        on:click=move |_| period.set("hour".into())>"Per hour"</button>
                    <button class="button small" aria-pressed=move || (period.get() == "day").to_string()
                        on:click=move |_| period.set("day".into())>"Per day"</button>
                </div>
            </div>
            <div class="table-scroll">
                <table class="ledger">
                    <thead><tr>
                        <th>{move || if period.get() == "hour" { "Hour (UTC)" } else { "Day (UTC)" }}</th>
                        <th class="num">"Done"</th><th class="num">"Failed"</th><th class="num">"Failure share"</th>
                        <th class="num">"Credits charged"</th><th class="num">"Refunded"</th>
                        <th class="num">"Tokens in / out, succeeded"</th><th class="num">"Tokens in / out, failed attempts"</th>
                        <th class="num" title="Output tokens billed that results hold (the rest: answers asked again)">"Output kept"</th>
                        <th class="num">"Provider cost"</th>
                    </tr></thead>
                    <tbody>
                        {move || rows.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(row).collect_view()}
                    </tbody>
                </table>
            </div>
            <p class="hint">"Failed attempts' tokens are what retries, failures and timeouts cost at the provider. Providers bill output at several times input; the cost column needs the provider's prices (--provider-input-usd-per-mtok, --provider-output-usd-per-mtok)."</p>
        </section>
    }
}

/// Every server process, whether it still beats, its slots and jobs, and the concurrency in
/// effect (the gate, unless fewer worker slots are alive).
#[component]
pub fn ProcessesPage() -> impl IntoView {
    let info = LocalResource::new(move || {
        Tick::track();
        processes()
    });
    let table = |p: ProcessesInfo| {
        view! {
            <dl class="side-by-side" data-testid="effective">
                <div><dt>"Gate"</dt><dd>{format!("{} (set to {})", p.effective_gate, p.gate_size)}</dd></div>
                <div><dt>"Worker slots alive"</dt><dd data-testid="live-slots">{p.live_slots}</dd></div>
                <div><dt>"Running at once, at most"</dt><dd data-testid="effective-concurrency">{p.effective_concurrency}</dd></div>
            </dl>
            <div class="table-scroll">
                <table class="ledger">
                    <thead><tr>
                        <th>"Process"</th><th>"Role"</th><th>"Version"</th><th class="num">"Slots"</th>
                        <th class="num">"Running"</th><th>"Started"</th><th>"Last heartbeat"</th><th>"State"</th>
                    </tr></thead>
                    <tbody>
                        {p.processes.into_iter().map(|p| view! {
                            <tr data-testid="process" data-alive=p.alive.to_string()>
                                <td>{p.name}</td><td>{p.role}</td><td>{p.version}</td>
                                <td class="num">{p.slots}</td><td class="num">{p.running}</td>
                                <td>{local_date_time(&p.started_at)}</td><td>{local_date_time(&p.seen_at)}</td>
                                <td>{if p.alive {
                                    view! { <span class="badge done">"Alive"</span> }.into_any()
                                } else {
                                    view! { <span class="badge failed">"Stopped beating"</span> }.into_any()
                                }}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </div>
            <p class="hint">"A process that stops beating for three heartbeats (killed, hung, cut off) no longer counts; its jobs come back when their leases run out. Processes not seen for a day are forgotten."</p>
        }
    };
    view! {
        <section class="card wide" data-testid="processes">
            <h2>"Processes"</h2>
            {move || info.get().map(|r| match r {
                Ok(p) => table(p).into_any(),
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
            })}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_section_has_its_own_path_under_admin() {
        let paths: std::collections::HashSet<_> = Section::ALL.iter().map(|s| s.path()).collect();
        assert_eq!(paths.len(), Section::ALL.len());
        assert!(paths.iter().all(|p| p.starts_with("/admin")));
    }

    #[test]
    fn a_stored_refresh_is_used_only_if_it_is_offered() {
        assert_eq!(refresh_from_storage(Some("15")), 15);
        assert_eq!(refresh_from_storage(Some("0")), 0);
        assert_eq!(refresh_from_storage(Some("1")), 5, "not offered: the default");
        assert_eq!(refresh_from_storage(Some("junk")), 5);
        assert_eq!(refresh_from_storage(None), 5);
        assert_eq!(refresh_label(0), "Paused");
        assert_eq!(refresh_label(15), "Every 15 s");
    }

    #[test]
    fn shares_and_tokens_read_short() {
        assert_eq!(share_text(Some(0.25)), "25.0 %");
        assert_eq!(share_text(None), "–");
        assert_eq!(tokens_text(1_234_567), "1.2M");
        assert_eq!(tokens_text(35_400), "35K");
        assert_eq!(tokens_text(900), "900");
        assert_eq!(kept_text(10_000, 150), "98.5 %");
        assert_eq!(kept_text(0, 0), "–");
        assert_eq!(kept_text(100, 500), "0.0 %", "never below nothing");
    }
}
