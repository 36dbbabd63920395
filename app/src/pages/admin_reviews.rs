//! "Needs review" in the console: the badge beside a job or a group (who, since when, the
//! note), the form that hands one to an admin, and the list of reviews with "resolved, no
//! action".

use leptos::prelude::*;

use crate::model::Permission;
use crate::model::ReviewInfo;
use crate::pages::clock::local_date_time;
use crate::pages::console::{may, Tick};
use crate::server::console::{admins, recent_reviews, MarkReview, ResolveReview};

/// Pure: an open review in words.
pub fn review_text(r: &ReviewInfo) -> String {
    format!(
        "Needs review by {} (since {}, marked by {}): {}",
        r.assignee.as_deref().unwrap_or("nobody (the account is gone)"),
        local_date_time(&r.marked_at),
        r.marked_by,
        r.note
    )
}

/// Pure: how a review ended, in words.
pub fn resolution_text(how: &str) -> &'static str {
    match how {
        "replayed" => "replayed",
        "discarded" => "discarded",
        "no_action" => "resolved, no action",
        _ => "resolved",
    }
}

/// The open review of a job or group, if any.
#[component]
pub fn ReviewBadge(review: Option<ReviewInfo>) -> impl IntoView {
    review.map(|r| {
        view! { <p class="review" data-testid="review">{review_text(&r)}</p> }
    })
}

/// "Needs review…": hand a failed job (`job`) or a dead-letter group (`group`) to an admin
/// with a note. `marked` runs after it is saved.
#[component]
pub fn MarkReviewForm(
    #[prop(optional)] job: Option<String>,
    #[prop(optional)] group: Option<(String, String)>,
    marked: Callback<()>,
) -> impl IntoView {
    let open = RwSignal::new(false);
    let note = RwSignal::new(String::new());
    let assignee = RwSignal::new(String::new());
    let mark = ServerAction::<MarkReview>::new();
    let people = LocalResource::new(move || {
        let show = open.get();
        async move {
            if show {
                admins().await
            } else {
                Ok(Vec::new())
            }
        }
    });
    Effect::new(move |_| {
        if let Some(Ok(_)) = mark.value().get() {
            open.set(false);
            note.set(String::new());
            marked.run(());
        }
    });
    // Unique per form on the page, for the labels.
    let id = job.clone().unwrap_or_else(|| group.clone().map(|(k, r)| format!("{k}-{r}")).unwrap_or_default());
    let id: String = id.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(60).collect();
    let (note_id, who_id) = (format!("review-note-{id}"), format!("review-who-{id}"));
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (kind, reason) = group.clone().map(|(k, r)| (Some(k), Some(r))).unwrap_or((None, None));
        mark.dispatch(MarkReview {
            job: job.clone(),
            kind,
            reason,
            note: note.get_untracked(),
            assignee: assignee.get_untracked(),
        });
    };
    view! {
        <button class="button link" aria-expanded=move || open.get().to_string() on:click=move |_| open.update(|o| *o = !*o)>
            "Needs review…"
        </button>
        <Show when=move || open.get()>
            <form class="review-form" on:submit=submit.clone()>
                <label for=who_id.clone()>"Assign to"</label>
                <select id=who_id.clone() required on:change=move |ev| assignee.set(event_target_value(&ev))>
                    <option value="">"Choose an admin"</option>
                    {move || people.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|email| view! {
                        <option value=email.clone()>{email.clone()}</option>
                    }).collect_view()}
                </select>
                <label for=note_id.clone()>"Note"</label>
                <input id=note_id.clone() type="text" maxlength="2000" required prop:value=note
                    on:input=move |ev| note.set(event_target_value(&ev))/>
                <button class="button primary" type="submit">"Mark for review"</button>
                <p class="form-error">{move || mark.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
            </form>
        </Show>
    }
}

/// The newest reviews, open ones first; an open one can be resolved without action.
#[component]
pub fn ReviewsCard(#[prop(into)] changed: Signal<u32>) -> impl IntoView {
    let resolve = ServerAction::<ResolveReview>::new();
    let list = LocalResource::new(move || {
        Tick::track();
        changed.track();
        resolve.version().track();
        recent_reviews()
    });
    view! {
        <section class="card" data-testid="reviews">
            <h2>"Reviews"</h2>
            <Show when=move || list.get().and_then(|r| r.ok()).is_some_and(|l| l.is_empty())>
                <p class="empty">"Nothing is waiting for review."</p>
            </Show>
            // Keyed, so a refresh keeps a half-written reason.
            <ul class="reviews">
                <For
                    each=move || list.get().and_then(|r| r.ok()).unwrap_or_default()
                    key=|r| (r.id, r.marked_at.clone(), r.resolved.is_some())
                    children=move |r| view! { <ReviewItem review=r resolve/> }
                />
            </ul>
            <p class="form-error">{move || resolve.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
        </section>
    }
}

#[component]
fn ReviewItem(review: ReviewInfo, resolve: ServerAction<ResolveReview>) -> impl IntoView {
    let what = match (&review.job_id, &review.group) {
        (Some(job), _) => {
            view! { <a href=format!("/jobs/{job}")>{format!("Job {}", &job[..8.min(job.len())])}</a> }.into_any()
        }
        (None, Some((kind, reason))) => {
            view! { <span>{format!("Group {}: {reason}", kind.as_str().replace('_', " "))}</span> }.into_any()
        }
        (None, None) => ().into_any(),
    };
    let why = RwSignal::new(String::new());
    let id = review.id;
    let field = format!("resolve-note-{id}");
    let state = match &review.resolved {
        None => view! {
            <p class="review">{review_text(&review)}</p>
            {may(Permission::ActOnJobs).then(|| view! {
                <form class="filters" on:submit=move |ev| {
                    ev.prevent_default();
                    resolve.dispatch(ResolveReview { id, note: why.get_untracked() });
                }>
                    <label for=field.clone()>"Why no action"</label>
                    <input id=field.clone() type="text" maxlength="2000" required on:input=move |ev| why.set(event_target_value(&ev))/>
                    <button class="button" type="submit">"Resolved, no action"</button>
                </form>
            })}
        }
        .into_any(),
        Some((by, at, how, note)) => view! {
            <p class="muted">
                {format!(
                    "{} by {} on {}{} (was: {})",
                    resolution_text(how),
                    by,
                    local_date_time(at),
                    note.as_deref().map(|n| format!(": {n}")).unwrap_or_default(),
                    review.note
                )}
            </p>
        }
        .into_any(),
    };
    view! {
        <li data-testid="review-item" data-open=review.resolved.is_none().to_string()>
            {what}
            {state}
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_reads_as_who_since_when_and_why() {
        let r = ReviewInfo {
            id: 1,
            job_id: None,
            group: None,
            note: "parser regression?".into(),
            assignee: Some("lead@example.com".into()),
            marked_by: "ops@example.com".into(),
            marked_at: "2026-12-01T10:00:00.000Z".into(),
            resolved: None,
        };
        let text = review_text(&r);
        assert!(text.starts_with("Needs review by lead@example.com (since "), "{text}");
        assert!(text.ends_with("marked by ops@example.com): parser regression?"), "{text}");
        assert_eq!(resolution_text("no_action"), "resolved, no action");
    }
}
