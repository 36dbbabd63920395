//! The account page: the address and whether it is confirmed, the password, and which notices
//! also come by e-mail.

use leptos::prelude::*;

use crate::model::MailChoicesInfo;
use crate::server::account::{mail_choices, SetMailChoices};
use crate::server::auth::{me, ChangePassword, ResendVerification};

#[component]
pub fn AccountPage() -> impl IntoView {
    let user = LocalResource::new(me);
    let query = leptos_router::hooks::use_query_map();
    let after_reset = move || query.read().get("reset").is_some();
    view! {
        <section class="card" data-testid="account">
            <h1>"Your account"</h1>
            <Show when=after_reset>
                <p class="ok-text" role="status" data-testid="password-reset">
                    "Your new password is set. Every other session was signed out and the account's API tokens were revoked."
                </p>
            </Show>
            <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                {move || user.get().and_then(|r| r.ok()).flatten().map(|u| view! {
                    <p>"Signed in as " <strong data-testid="account-email">{u.email.clone()}</strong></p>
                    {(!u.email_verified).then(|| view! { <Unconfirmed email=u.email.clone()/> })}
                })}
            </Transition>
        </section>
        <PasswordCard/>
        <MailChoicesCard/>
    }
}

/// The address is not confirmed yet: what that means, and the mail again.
#[component]
fn Unconfirmed(email: String) -> impl IntoView {
    let resend = ServerAction::<ResendVerification>::new();
    view! {
        <div class="notice-box" role="status" data-testid="unconfirmed">
            <p>{format!("Confirm {email} by the link we mailed you: your free credits come with it.")}</p>
            <button class="button small" disabled=move || resend.pending().get() on:click=move |_| { resend.dispatch(ResendVerification {}); }>
                "Mail the link again"
            </button>
            {move || resend.value().get().map(|r| match r {
                Ok(()) => view! { <p class="ok-text">"Sent. Look in your inbox (and its spam folder)."</p> }.into_any(),
                Err(e) => view! { <p class="form-error" role="alert">{e.to_string()}</p> }.into_any(),
            })}
        </div>
    }
}

/// Change the password; other sessions end, API tokens too unless kept.
#[component]
fn PasswordCard() -> impl IntoView {
    let change = ServerAction::<ChangePassword>::new();
    let (current, password, keep) = (RwSignal::new(String::new()), RwSignal::new(String::new()), RwSignal::new(false));
    view! {
        <section class="card" data-testid="change-password">
            <h2>"Password"</h2>
            <form on:submit=move |ev| {
                ev.prevent_default();
                change.dispatch(ChangePassword {
                    current: current.get_untracked(),
                    password: password.get_untracked(),
                    keep_api_tokens: keep.get_untracked(),
                });
            }>
                <label for="current-password">"Current password"</label>
                <input id="current-password" type="password" autocomplete="current-password" required
                    on:input=move |ev| current.set(event_target_value(&ev))/>
                <label for="new-password">"New password"</label>
                <input id="new-password" type="password" minlength="8" autocomplete="new-password" required
                    on:input=move |ev| password.set(event_target_value(&ev))/>
                <label class="check">
                    <input type="checkbox" prop:checked=keep on:change=move |ev| keep.set(event_target_checked(&ev))/>
                    " Keep my API tokens working"
                </label>
                <p class="hint">"Every other session and device is signed out. Without the box ticked, API tokens are revoked too."</p>
                <button class="button primary" type="submit" disabled=move || change.pending().get()>"Change the password"</button>
            </form>
            {move || change.value().get().map(|r| match r {
                Ok(()) => view! { <p class="ok-text" role="status" data-testid="password-changed">"Changed. Other sessions are signed out."</p> }.into_any(),
                Err(e) => view! { <p class="form-error" role="alert">{crate::format::capitalise(&e.to_string())}"."</p> }.into_any(),
            })}
        </section>
    }
}

/// Which notices also come by e-mail; each change is saved at once.
#[component]
fn MailChoicesCard() -> impl IntoView {
    let save = ServerAction::<SetMailChoices>::new();
    let loaded = LocalResource::new(mail_choices);
    let choices = RwSignal::new(None::<MailChoicesInfo>);
    Effect::new(move |_| {
        if let Some(Ok(c)) = loaded.get() {
            choices.set(Some(c));
        }
    });
    Effect::new(move |_| {
        if let Some(Ok(c)) = save.value().get() {
            choices.set(Some(c));
        }
    });
    let toggle = move |change: fn(&mut MailChoicesInfo, bool), on: bool| {
        if let Some(mut c) = choices.get_untracked() {
            change(&mut c, on);
            save.dispatch(SetMailChoices { done: c.done, failed: c.failed, credits_low: c.credits_low });
        }
    };
    let rows: [(&str, &str, fn(&MailChoicesInfo) -> bool, fn(&mut MailChoicesInfo, bool)); 3] = [
        ("mail-done", "A document is done (when it took longer than a minute)", |c| c.done, |c, on| c.done = on),
        ("mail-failed", "A document failed, and what was refunded", |c| c.failed, |c, on| c.failed = on),
        ("mail-credits-low", "My credits run low", |c| c.credits_low, |c, on| c.credits_low = on),
    ];
    view! {
        <section class="card" data-testid="mail-choices">
            <h2>"E-mail me when"</h2>
            <p class="hint">"Mails link to the job and never carry a document's text. Each has a one-click unsubscribe."</p>
            {rows.into_iter().map(|(id, label, read, write)| view! {
                <label class="check" for=id>
                    <input id=id type="checkbox"
                        prop:checked=move || choices.get().is_some_and(|c| read(&c))
                        disabled=move || choices.get().is_none()
                        on:change=move |ev| toggle(write, event_target_checked(&ev))/>
                    " " {label}
                </label>
            }).collect_view()}
            {move || save.value().get().and_then(|r| r.err()).map(|e| view! { <p class="form-error" role="alert">{e.to_string()}</p> })}
        </section>
    }
}
