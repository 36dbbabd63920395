//! Sign-up and log-in pages.

use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use crate::errors::AppError;
use crate::model::UserInfo;
use crate::server::auth::{LogIn, SignUp};

fn error_text(e: &AppError) -> String {
    match e {
        AppError::BadCredentials => "That e-mail address and password do not match an account.".into(),
        AppError::RateLimited { retry_after_secs } => {
            format!("Too many failed attempts. Try again in {} minutes.", retry_after_secs.div_ceil(60))
        }
        other => crate::format::capitalise(&other.to_string()) + ".",
    }
}

/// Pure: where to go after logging in. Only a path on this site (never `//host` or a URL),
/// so a crafted link cannot send anyone elsewhere.
pub fn after_login(next: Option<&str>) -> String {
    // Only visible ASCII: browsers drop tabs and newlines from URLs, so "/\t/evil.example"
    // would become "//evil.example", another site.
    let local = |path: &str| {
        path.starts_with('/')
            && !path.starts_with("//")
            && path.chars().all(|c| c.is_ascii_graphic() && c != '\\')
            && path != "/login"
    };
    match next {
        Some(path) if local(path) => path.to_string(),
        _ => "/jobs".to_string(),
    }
}

/// E-mail and password inputs, the error line, and on success a redirect to the page that
/// sent the user here (`?next=`), else the jobs page.
#[component]
fn Fields(#[prop(into)] value: Signal<Option<Result<UserInfo, AppError>>>, new_password: bool) -> impl IntoView {
    let navigate = use_navigate();
    let query = leptos_router::hooks::use_query_map();
    Effect::new(move |_| {
        if let Some(Ok(_)) = value.get() {
            crate::AccountChanged::notify();
            let next = query.read_untracked().get("next");
            navigate(&after_login(next.as_deref()), Default::default());
        }
    });
    view! {
        <label for="email">"E-mail address"</label>
        <input id="email" type="email" name="email" autocomplete="email" required/>
        <label for="password">"Password"</label>
        <input
            id="password"
            type="password"
            name="password"
            minlength="8"
            autocomplete=if new_password { "new-password" } else { "current-password" }
            required
        />
        <p class="form-error" role="alert">
            {move || match value.get() {
                Some(Err(e)) => error_text(&e),
                _ => String::new(),
            }}
        </p>
    }
}

#[component]
pub fn LoginPage() -> impl IntoView {
    let action = ServerAction::<LogIn>::new();
    view! {
        <section class="auth card">
            <h1>"Log in"</h1>
            <ActionForm action=action>
                <Fields value=action.value() new_password=false/>
                <button class="button primary" type="submit" disabled=move || action.pending().get()>"Log in"</button>
            </ActionForm>
            <p class="switch">"New here? " <a href="/signup">"Create an account"</a></p>
        </section>
    }
}

#[component]
pub fn SignupPage() -> impl IntoView {
    let action = ServerAction::<SignUp>::new();
    let terms = LocalResource::new(crate::server::account::terms);
    view! {
        <section class="auth card">
            <h1>"Create your account"</h1>
            <ActionForm action=action>
                <Fields value=action.value() new_password=true/>
                <p class="hint">
                    "At least 8 characters."
                    {move || terms.get().and_then(|r| r.ok()).map(|t| format!(" You start with {} free credits.", t.signup_grant))}
                </p>
                <button class="button primary" type="submit" disabled=move || action.pending().get()>"Sign up"</button>
            </ActionForm>
            <p class="switch">"Have an account? " <a href="/login">"Log in"</a></p>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::after_login;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(after_login(Some("/jobs/42")), "/jobs/42");
        assert_eq!(after_login(Some("/upload")), "/upload");
        assert_eq!(after_login(None), "/jobs");
        assert_eq!(after_login(Some("https://evil.example/")), "/jobs");
        assert_eq!(after_login(Some("//evil.example/")), "/jobs");
        assert_eq!(after_login(Some("/\\evil.example")), "/jobs");
        assert_eq!(after_login(Some("/login")), "/jobs");
        for sneaky in ["/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/ /evil.example", "/\u{7f}/x"] {
            assert_eq!(after_login(Some(sneaky)), "/jobs", "{sneaky:?}");
        }
        assert_eq!(after_login(Some("/jobs?state=failed&page=2")), "/jobs?state=failed&page=2");
    }
}
