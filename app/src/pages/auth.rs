//! Sign-up and log-in pages.

use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use crate::errors::AppError;
use crate::model::UserInfo;
use crate::server::auth::{ForgotPassword, LogIn, ResetPassword, SignUp, VerifyEmail};

fn error_text(e: &AppError) -> String {
    match e {
        AppError::BadCredentials => "That e-mail address and password do not match an account.".into(),
        AppError::RateLimited { retry_after_secs } => {
            format!("Too many attempts. Try again in {} minutes.", retry_after_secs.div_ceil(60))
        }
        AppError::LinkExpired => "This link has expired or was already used. Ask for a new one below.".into(),
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
            <p class="switch"><a href="/forgot">"Forgot your password?"</a></p>
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
                    {move || terms.get().and_then(|r| r.ok()).map(|t| signup_grant_text(t.signup_grant, t.verify_email))}
                </p>
                <button class="button primary" type="submit" disabled=move || action.pending().get()>"Sign up"</button>
            </ActionForm>
            <p class="switch">"Have an account? " <a href="/login">"Log in"</a></p>
        </section>
    }
}

/// Pure: what the sign-up page promises.
pub fn signup_grant_text(grant: i64, verify_email: bool) -> String {
    match (grant, verify_email) {
        (0, _) => String::new(),
        (n, true) => format!(" You get {n} free credits once you confirm your address by the link we mail you."),
        (n, false) => format!(" You start with {n} free credits."),
    }
}

/// "Forgot your password?": a reset link by mail. The answer is the same whether or not an
/// account uses the address.
#[component]
pub fn ForgotPage() -> impl IntoView {
    let action = ServerAction::<ForgotPassword>::new();
    view! {
        <section class="auth card">
            <h1>"Reset your password"</h1>
            {move || match action.value().get() {
                Some(Ok(())) => view! {
                    <p class="ok-text" role="status" data-testid="reset-sent">
                        "If an account uses that address, a link to choose a new password is on its way. "
                        "It works once, for 30 minutes."
                    </p>
                }.into_any(),
                other => view! {
                    <ActionForm action=action>
                        <label for="email">"E-mail address"</label>
                        <input id="email" type="email" name="email" autocomplete="email" required/>
                        <p class="form-error" role="alert">{other.and_then(|r| r.err()).map(|e| error_text(&e))}</p>
                        <button class="button primary" type="submit" disabled=move || action.pending().get()>"Mail me a link"</button>
                    </ActionForm>
                }.into_any(),
            }}
            <p class="switch"><a href="/login">"Back to log in"</a></p>
        </section>
    }
}

/// The page a reset link opens: a new password, then logged in (every other session ended).
#[component]
pub fn ResetPage() -> impl IntoView {
    let action = ServerAction::<ResetPassword>::new();
    let query = leptos_router::hooks::use_query_map();
    let token = move || query.read().get("token").unwrap_or_default();
    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(_)) = action.value().get() {
            crate::AccountChanged::notify();
            navigate("/account?reset=1", Default::default());
        }
    });
    view! {
        <section class="auth card">
            <h1>"Choose a new password"</h1>
            <ActionForm action=action>
                <input type="hidden" name="token" prop:value=token/>
                <label for="password">"New password"</label>
                <input id="password" type="password" name="password" minlength="8" autocomplete="new-password" required/>
                <p class="hint">"At least 8 characters. Every other session of the account is signed out, and its API tokens are revoked."</p>
                <p class="form-error" role="alert">
                    {move || action.value().get().and_then(|r| r.err()).map(|e| error_text(&e))}
                </p>
                <button class="button primary" type="submit" disabled=move || action.pending().get()>"Set the password"</button>
            </ActionForm>
            <p class="switch"><a href="/forgot">"Ask for a new link"</a></p>
        </section>
    }
}

/// The page a verification link opens: one button proves the address (a page, not the link
/// itself, does it: mail scanners open every link).
#[component]
pub fn VerifyPage() -> impl IntoView {
    let action = ServerAction::<VerifyEmail>::new();
    let query = leptos_router::hooks::use_query_map();
    let token = move || query.read().get("token").unwrap_or_default();
    Effect::new(move |_| {
        if let Some(Ok(_)) = action.value().get() {
            crate::AccountChanged::notify();
        }
    });
    view! {
        <section class="auth card">
            <h1>"Confirm your e-mail address"</h1>
            {move || match action.value().get() {
                Some(Ok(user)) => view! {
                    <p class="ok-text" role="status" data-testid="verified">
                        {format!("{} is confirmed. Your balance is {} credits.", user.email, user.balance)}
                    </p>
                    <p><a class="button primary" href="/upload">"Upload documents"</a></p>
                }.into_any(),
                other => view! {
                    <ActionForm action=action>
                        <input type="hidden" name="token" prop:value=token/>
                        <p class="form-error" role="alert">{other.and_then(|r| r.err()).map(|e| error_text(&e))}</p>
                        <button class="button primary" type="submit" disabled=move || action.pending().get()>"Confirm my address"</button>
                    </ActionForm>
                }.into_any(),
            }}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::{after_login, signup_grant_text};

    #[test]
    fn the_signup_page_promises_the_grant_as_it_comes() {
        assert_eq!(signup_grant_text(20, false), " You start with 20 free credits.");
        assert!(signup_grant_text(20, true).contains("once you confirm your address"));
        assert_eq!(signup_grant_text(0, true), "");
    }

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
