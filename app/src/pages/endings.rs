//! Jobs that end while the tab is in the background: the tab title counts them ("(2) Sluice")
//! until the tab is seen again and, once the user has opted in, a browser notification says
//! what ended (refunds included). Nothing is asked before the user opts in.

use leptos::prelude::*;

use crate::model::{JobState, JobStatus};
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

/// Pure: a notification's title and body for an ended job.
pub fn ending_message(job: &JobStatus) -> (String, String) {
    let name = job.file_name.clone().unwrap_or_else(|| "Your document".into());
    match job.state {
        JobState::Done => (format!("{name} is done"), "The result is ready in Sluice.".into()),
        JobState::Canceled => {
            (format!("{name} was canceled"), crate::pages::jobs::canceled_text(job.refunded, job.cost.into()))
        }
        _ => (
            format!("{name} failed"),
            crate::pages::jobs::failed_text(job.failure_kind, job.failure_reason.as_deref(), job.attempts, job.cost),
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
    fn the_title_counts_unseen_endings() {
        assert_eq!(tab_title(0), "Sluice");
        assert_eq!(tab_title(2), "(2) Sluice");
    }
}
