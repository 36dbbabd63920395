//! Jobs that end while the tab is in the background: the tab title counts them ("(2) Sluice")
//! until the tab is seen again and, once the user has opted in, a browser notification says
//! what ended (refunds included). Nothing is asked before the user opts in.

use leptos::prelude::*;

use crate::format::{capitalise, credits_text};
use crate::model::{FailureKind, JobState, JobStatus};
use crate::pages::polling::tab_visible;

/// Jobs that ended while the tab was hidden, not yet seen.
#[derive(Clone, Copy)]
pub struct UnseenEndings(pub RwSignal<u32>);

/// Where the opt-in is kept in the browser.
#[cfg(feature = "hydrate")]
const OPT_IN_KEY: &str = "sluice.notify";

/// Pure: the tab title with `unseen` endings.
pub fn tab_title(unseen: u32) -> String {
    if unseen == 0 {
        "Sluice".into()
    } else {
        format!("({unseen}) Sluice")
    }
}

/// Pure: the line under a canceled badge.
pub fn canceled_text(refunded: i64, cost: i64) -> String {
    let kept = (cost - refunded).max(0);
    match (refunded, kept) {
        (0, 0) => "Canceled. Nothing was charged.".into(),
        (r, 0) => format!("Canceled. {} refunded.", credits_text(r)),
        (0, k) => format!("Canceled. {} kept: the provider had already started.", credits_text(k)),
        (r, k) => format!(
            "Canceled. {} refunded, {} kept: the provider had already started.",
            credits_text(r),
            credits_text(k)
        ),
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

/// Pure: a notification's title and body for an ended job.
pub fn ending_message(job: &JobStatus) -> (String, String) {
    let name = job.file_name.clone().unwrap_or_else(|| "Your document".into());
    match job.state {
        JobState::Done => (format!("{name} is done"), "The result is ready in Sluice.".into()),
        JobState::Canceled => (format!("{name} was canceled"), canceled_text(job.refunded, job.cost.into())),
        _ => (
            format!("{name} failed"),
            failed_text(job.failure_kind, job.failure_reason.as_deref(), job.attempts, job.cost),
        ),
    }
}

/// A page watching jobs saw `job` end: count it in the title and notify, if the tab is hidden.
pub fn job_ended(job: &JobStatus) {
    if tab_visible() {
        return;
    }
    if let Some(UnseenEndings(unseen)) = use_context::<UnseenEndings>() {
        unseen.update(|n| *n += 1);
    }
    #[cfg(feature = "hydrate")]
    if opted_in() {
        let (title, body) = ending_message(job);
        let options = web_sys::NotificationOptions::new();
        options.set_body(&body);
        options.set_tag(&job.id);
        let _ = web_sys::Notification::new_with_options(&title, &options);
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = ending_message(job);
}

#[cfg(feature = "hydrate")]
fn opted_in() -> bool {
    let stored = window().local_storage().ok().flatten().and_then(|s| s.get_item(OPT_IN_KEY).ok().flatten());
    stored.as_deref() == Some("on") && web_sys::Notification::permission() == web_sys::NotificationPermission::Granted
}

/// The opt-in: asks the browser's permission only when clicked.
#[component]
pub fn NotifyToggle() -> impl IntoView {
    let on = RwSignal::new(false);
    // After hydration only: the server cannot know the browser's choice.
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        on.set(opted_in());
    });
    let turn_on = move |_| {
        #[cfg(feature = "hydrate")]
        if let Ok(asked) = web_sys::Notification::request_permission() {
            leptos::task::spawn_local(async move {
                let _ = wasm_bindgen_futures::JsFuture::from(asked).await;
                if web_sys::Notification::permission() == web_sys::NotificationPermission::Granted {
                    if let Ok(Some(storage)) = window().local_storage() {
                        let _ = storage.set_item(OPT_IN_KEY, "on");
                    }
                    on.set(true);
                }
            });
        }
    };
    let turn_off = move |_| {
        #[cfg(feature = "hydrate")]
        if let Ok(Some(storage)) = window().local_storage() {
            let _ = storage.remove_item(OPT_IN_KEY);
        }
        on.set(false);
    };
    move || {
        if on.get() {
            view! {
                <p class="hint notify">
                    "You get a notification when a job ends while Sluice is in the background. "
                    <button class="button link" on:click=turn_off>"Turn off"</button>
                </p>
            }
            .into_any()
        } else {
            view! {
                <p class="hint notify">
                    <button class="button link" on:click=turn_on>"Notify me when a job ends"</button>
                </p>
            }
            .into_any()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canceled_lines_say_the_refund() {
        assert_eq!(canceled_text(1, 1), "Canceled. 1 credit refunded.");
        assert_eq!(canceled_text(0, 0), "Canceled. Nothing was charged.");
        assert_eq!(canceled_text(0, 3), "Canceled. 3 credits kept: the provider had already started.");
        assert_eq!(
            canceled_text(4, 8),
            "Canceled. 4 credits refunded, 4 credits kept: the provider had already started."
        );
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
    fn the_title_counts_unseen_endings() {
        assert_eq!(tab_title(0), "Sluice");
        assert_eq!(tab_title(2), "(2) Sluice");
    }
}
