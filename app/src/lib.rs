//! Sluice's web UI. Server functions stay thin: they fetch what they need from context,
//! call the engine and map its errors; the logic lives in `engine`.

pub mod api;
pub mod errors;
#[cfg(feature = "ssr")]
pub mod handlers;
pub mod model;

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
            <header class="topbar">
                <a class="brand" href="/">"Sluice"</a>
                <span class="tagline">"Documents through slow AI providers, without the wait"</span>
            </header>
            <main class="page">
                <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                    <Route path=path!("") view=HomePage/>
                </Routes>
            </main>
        </Router>
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
