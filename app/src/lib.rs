#![recursion_limit = "512"]
//! Sluice's web UI. Server functions stay thin: they fetch what they need from context,
//! call the engine and map its errors; the logic lives in `engine`.

pub mod api;
pub mod errors;
#[cfg(feature = "ssr")]
pub mod handlers;
pub mod model;
pub mod pages;

use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::path;

/// The HTML document around the app (server side only renders it).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <link rel="icon" type="image/svg+xml" href="/favicon.svg"/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    // Marks the document once the client has hydrated; end-to-end tests wait for it.
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
    view! {
        <Stylesheet id="leptos" href="/pkg/sluice.css"/>
        <Title text="Sluice"/>
        <Router>
            <Header/>
            <main class="page">
                <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                    <Route path=path!("") view=HomePage/>
                    <Route path=path!("/login") view=pages::auth::LoginPage/>
                    <Route path=path!("/signup") view=pages::auth::SignupPage/>
                    <Route path=path!("/upload") view=pages::upload::UploadPage/>
                    <Route path=path!("/jobs") view=pages::jobs::JobsPage/>
                    <Route path=path!("/jobs/:id") view=pages::jobs::JobPage/>
                    <Route path=path!("/credits") view=pages::account::CreditsPage/>
                    <Route path=path!("/notices") view=pages::account::NoticesPage/>
                    <Route path=path!("/admin") view=pages::admin::AdminPage/>
                </Routes>
            </main>
        </Router>
    }
}

/// The top bar: the product, the pages, and who is logged in.
#[component]
fn Header() -> impl IntoView {
    let log_out = ServerAction::<api::LogOut>::new();
    let location = leptos_router::hooks::use_location();
    // Asked again after each navigation and after logging out.
    let me = LocalResource::new(move || {
        location.pathname.track();
        log_out.version().track();
        api::me()
    });
    // Only asked for when logged in (a 401 would be a console error on public pages).
    let unread = LocalResource::new(move || {
        location.pathname.track();
        let logged_in = me.get().and_then(|r| r.ok()).flatten().is_some();
        async move {
            if logged_in {
                pages::account::unread_count().await
            } else {
                0
            }
        }
    });
    let navigate = leptos_router::hooks::use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(())) = log_out.value().get() {
            navigate("/login", Default::default());
        }
    });
    view! {
        <header class="topbar">
            <a class="brand" href="/">"Sluice"</a>
            <nav class="nav">
                {move || match me.get().and_then(|r| r.ok()).flatten() {
                    Some(user) => view! {
                        <a href="/upload">"Upload"</a>
                        <a href="/jobs">"Jobs"</a>
                        <a href="/credits">"Credits"</a>
                        {user.is_admin.then(|| view! { <a href="/admin">"Admin"</a> })}
                        <a href="/notices" aria-label="Notices">
                            "Notices"
                            {move || {
                                let n = unread.get().unwrap_or(0);
                                (n > 0).then(|| view! { <span class="count" data-testid="unread">{n}</span> })
                            }}
                        </a>
                        <span class="who" data-testid="who">{format!("{} · {} credits", user.email, user.balance)}</span>
                        <button class="button link" on:click=move |_| { log_out.dispatch(api::LogOut {}); }>"Log out"</button>
                    }
                        .into_any(),
                    None => view! {
                        <a href="/login">"Log in"</a>
                        <a class="button primary small" href="/signup">"Sign up"</a>
                    }
                        .into_any(),
                }}
            </nav>
        </header>
    }
}

/// Count a click in Postgres and return the stored total.
#[server(endpoint = "record_click")]
pub async fn record_click() -> Result<i64, ServerFnError> {
    let ctx = handlers::context().map_err(|e| ServerFnError::new(e.to_string()))?;
    engine::demo::record_click(&ctx.pool).await.map_err(|e| ServerFnError::new(e.to_string()))
}

#[component]
fn HomePage() -> impl IntoView {
    let click = ServerAction::<RecordClick>::new();
    let value = click.value();
    view! {
        <section class="hero">
            <h1>"Sluice"</h1>
            <p>
                "Upload documents, and Sluice queues them durably, runs them through the AI provider "
                "at a pace it can bear, retries what fails and tells you how each one is doing."
            </p>
            <div class="card">
                <h2>"Is everything connected?"</h2>
                <p>"This button asks the server, which asks Postgres."</p>
                <button id="ping" class="button primary" on:click=move |_| { click.dispatch(RecordClick {}); }>
                    "Count a click in Postgres"
                </button>
                <p id="ping-result" class="result" aria-live="polite">
                    {move || match value.get() {
                        None => "Not asked yet.".to_string(),
                        Some(Ok(n)) => format!("Postgres has counted {n} clicks."),
                        Some(Err(e)) => format!("The server could not answer: {e}"),
                    }}
                </p>
            </div>
        </section>
    }
}

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
}
