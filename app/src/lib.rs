#![recursion_limit = "512"]
//! Sluice's web UI. Server functions stay thin: they fetch what they need from context,
//! call the engine and map its errors; the logic lives in `engine`.

pub mod errors;
pub mod format;
pub mod model;
pub mod pages;
pub mod server;

use leptos::prelude::*;
use leptos_meta::{provide_meta_context, HashedStylesheet, MetaTags, Title};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::path;
use leptos_router::{lazy_route, Lazy, LazyRoute};
use pages::admin::{AdminJobsPage, AuditPage, CapacityPage, DeadLettersPage, OverviewPage, UsersPage};
use pages::console::{Console, ProcessesPage, Section};

/// A console page as a lazy route: its code is a WASM chunk of its own (`cargo leptos build
/// --split`), downloaded when an admin opens it, so users' pages never carry the console.
macro_rules! console_route {
    ($route:ident, $section:expr, $page:ident) => {
        #[derive(Debug)]
        struct $route;

        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                $route
            }

            fn view(this: Self) -> AnyView {
                let _ = this;
                view! { <Console section=$section><$page/></Console> }.into_any()
            }
        }
    };
}

console_route!(OverviewRoute, Section::Overview, OverviewPage);
console_route!(JobsRoute, Section::Jobs, AdminJobsPage);
console_route!(DeadLettersRoute, Section::DeadLetters, DeadLettersPage);
console_route!(UsersRoute, Section::Users, UsersPage);
console_route!(CapacityRoute, Section::Capacity, CapacityPage);
console_route!(ProcessesRoute, Section::Processes, ProcessesPage);
console_route!(AuditRoute, Section::Audit, AuditPage);

/// The HTML document around the app (server side only renders it).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <AutoReload options=options.clone()/>
                <HashedStylesheet options=options.clone() id="leptos"/>
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

/// Bumped when something on a page may have changed the balance or the notices (a job
/// finished or failed), so the header asks again without waiting for a navigation.
#[derive(Clone, Copy)]
pub struct AccountChanged(pub RwSignal<u32>);

impl AccountChanged {
    pub fn notify() {
        if let Some(AccountChanged(signal)) = use_context::<AccountChanged>() {
            signal.update(|n| *n += 1);
        }
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    provide_context(AccountChanged(RwSignal::new(0)));
    let unseen = RwSignal::new(0u32);
    provide_context(pages::endings::UnseenEndings(unseen));
    pages::polling::when_shown(move || unseen.set(0));
    // Marks the document once the client has hydrated; end-to-end tests wait for it.
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
    view! {
        <Title text=move || pages::endings::tab_title(unseen.get())/>
        <Router>
            <Session>
                <Header/>
                <main class="page">
                    <Routes fallback=|| view! { <p class="empty">"Page not found."</p> }>
                        <Route path=path!("") view=HomePage/>
                        <Route path=path!("/login") view=pages::auth::LoginPage/>
                        <Route path=path!("/signup") view=pages::auth::SignupPage/>
                        <Route path=path!("/forgot") view=pages::auth::ForgotPage/>
                        <Route path=path!("/reset") view=pages::auth::ResetPage/>
                        <Route path=path!("/verify") view=pages::auth::VerifyPage/>
                        <Route path=path!("/account") view=|| view! { <SignedIn><pages::settings::AccountPage/></SignedIn> }/>
                        <Route path=path!("/upload") view=|| view! { <SignedIn><pages::upload::UploadPage/></SignedIn> }/>
                        <Route path=path!("/jobs") view=|| view! { <SignedIn><pages::jobs::JobsPage/></SignedIn> }/>
                        <Route path=path!("/jobs/:id") view=|| view! { <SignedIn><pages::jobs::JobPage/></SignedIn> }/>
                        <Route path=path!("/credits") view=|| view! { <SignedIn><pages::account::CreditsPage/></SignedIn> }/>
                        <Route path=path!("/notices") view=|| view! { <SignedIn><pages::account::NoticesPage/></SignedIn> }/>
                        // Not behind SignedIn: to anyone but staff these are pages that do not exist.
                        // Loaded only when opened (lazy routes: WASM chunks of their own).
                        <Route path=path!("/admin") view={Lazy::<OverviewRoute>::new()}/>
                        <Route path=path!("/admin/jobs") view={Lazy::<JobsRoute>::new()}/>
                        <Route path=path!("/admin/dead-letters") view={Lazy::<DeadLettersRoute>::new()}/>
                        <Route path=path!("/admin/users") view={Lazy::<UsersRoute>::new()}/>
                        <Route path=path!("/admin/capacity") view={Lazy::<CapacityRoute>::new()}/>
                        <Route path=path!("/admin/processes") view={Lazy::<ProcessesRoute>::new()}/>
                        <Route path=path!("/admin/audit") view={Lazy::<AuditRoute>::new()}/>
                    </Routes>
                </main>
            </Session>
        </Router>
    }
}

/// Who is logged in, asked again after each navigation and when a job ends (the balance and
/// the notices may have changed). `None` while the first answer is on its way.
#[derive(Clone, Copy)]
pub struct CurrentUser(pub LocalResource<Result<Option<model::UserInfo>, errors::AppError>>);

impl CurrentUser {
    pub fn get(&self) -> Option<Option<model::UserInfo>> {
        self.0.get().map(|r| r.ok().flatten())
    }
}

#[component]
fn Session(children: Children) -> impl IntoView {
    let location = leptos_router::hooks::use_location();
    let AccountChanged(changed) = expect_context::<AccountChanged>();
    let me = LocalResource::new(move || {
        location.pathname.track();
        changed.track();
        server::auth::me()
    });
    provide_context(CurrentUser(me));
    children()
}

/// Shows its pages to a logged-in user; sends anyone else to the log-in page, and back here
/// after logging in. It asks the server afresh when the page opens (the header's answer may
/// be from before a log-in), and re-renders only if the logged-in state changes. While the
/// server cannot tell (Postgres restarting), it says so and asks again every 5 s instead of
/// sending a logged-in user to log in.
#[component]
fn SignedIn(children: ChildrenFn) -> impl IntoView {
    #[derive(Clone, PartialEq)]
    enum Seen {
        Asking,
        In,
        Out,
        Unanswered(String),
    }
    let me = LocalResource::new(server::auth::me);
    let seen = Memo::new(move |_| match me.get() {
        None => Seen::Asking,
        Some(Ok(Some(_))) => Seen::In,
        Some(Ok(None)) | Some(Err(errors::AppError::Unauthenticated)) => Seen::Out,
        Some(Err(e)) => Seen::Unanswered(e.to_string()),
    });
    let navigate = leptos_router::hooks::use_navigate();
    let location = leptos_router::hooks::use_location();
    Effect::new(move |_| match seen.get() {
        Seen::Out => {
            let next = location.pathname.get_untracked();
            navigate(
                &format!("/login?next={next}"),
                leptos_router::NavigateOptions { replace: true, ..Default::default() },
            );
        }
        Seen::Unanswered(_) => {
            set_timeout(move || me.refetch(), std::time::Duration::from_secs(5));
        }
        _ => {}
    });
    move || match seen.get() {
        Seen::In => children().into_any(),
        Seen::Out => view! { <p class="empty">"Log in to see this page…"</p> }.into_any(),
        Seen::Unanswered(message) => view! { <p class="form-error" role="alert">{message}</p> }.into_any(),
        Seen::Asking => view! { <p class="empty">"Loading…"</p> }.into_any(),
    }
}

/// The top bar: the product, the pages, and who is logged in.
#[component]
fn Header() -> impl IntoView {
    let log_out = ServerAction::<server::auth::LogOut>::new();
    let user = expect_context::<CurrentUser>();
    // Asked each time the user is (re)read, and only when logged in: a 401 would be a console
    // error on public pages.
    let unread = LocalResource::new(move || {
        let logged_in = user.get().flatten().is_some();
        async move {
            if logged_in {
                server::account::unread_notices().await.unwrap_or(0)
            } else {
                0
            }
        }
    });
    let navigate = leptos_router::hooks::use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(())) = log_out.value().get() {
            AccountChanged::notify();
            navigate("/login", Default::default());
        }
    });
    view! {
        <header class="topbar">
            <a class="brand" href="/">"Sluice"</a>
            <nav class="nav" aria-label="Main">
                {move || match user.get().flatten() {
                    Some(user) => view! {
                        <a href="/upload">"Upload"</a>
                        <a href="/jobs">"Jobs"</a>
                        <a href="/credits">"Credits"</a>
                        {user.role.is_staff().then(|| view! { <a href="/admin">"Admin"</a> })}
                        <a href="/notices" aria-label="Notices">
                            "Notices"
                            {move || {
                                let n = unread.get().unwrap_or(0);
                                (n > 0).then(|| view! { <span class="count" data-testid="unread">{n}</span> })
                            }}
                        </a>
                        <a href="/account">"Account"</a>
                        <span class="who" data-testid="who">{format!("{} · {} credits", user.email, user.balance)}</span>
                        <button class="button link" on:click=move |_| { log_out.dispatch(server::auth::LogOut {}); }>"Log out"</button>
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

#[component]
fn HomePage() -> impl IntoView {
    let user = expect_context::<CurrentUser>();
    view! {
        <section class="hero">
            <h1>"Documents in, results out, at a pace the AI can bear."</h1>
            <p>
                "Upload PDFs, Word and OpenDocument files, web pages, text or Markdown, to summarize, "
                "explain, pick out key facts or translate. Sluice queues each one durably, runs it through "
                "the AI provider without tripping its rate limits, retries what fails, and shows you where "
                "every document is, live. If a document cannot be done, its credits come back."
            </p>
            <p class="cta">
                {move || match user.get().flatten() {
                    Some(_) => view! {
                        <a class="button primary" href="/upload">"Upload documents"</a>
                        <a class="button" href="/jobs">"See your jobs"</a>
                    }.into_any(),
                    None => view! {
                        <a class="button primary" href="/signup">"Create a free account"</a>
                        <a class="button" href="/login">"Log in"</a>
                    }.into_any(),
                }}
            </p>
        </section>
        <section class="features">
            <div class="card">
                <h2>"Nothing gets lost"</h2>
                <p>"Every document is stored in Postgres before we say yes, and survives restarts and crashes."</p>
            </div>
            <div class="card">
                <h2>"Watch it live"</h2>
                <p>"Queued, running, retrying with a countdown, done: each state as it happens, with the reason."</p>
            </div>
            <div class="card">
                <h2>"The price before you confirm"</h2>
                <p>
                    "A document's price follows its length in tokens. The upload page shows what each costs "
                    "and when it should be done before anything is stored; a PDF or Word file is held at its "
                    "size's price and settled to its text's once read."
                </p>
            </div>
            <div class="card">
                <h2>"Pay for results"</h2>
                <p>"When the provider keeps failing, the credits come back and you get a notice."</p>
            </div>
            <div class="card">
                <h2>"Translations in their own format"</h2>
                <p>
                    "A translated Word, OpenDocument or web page comes back as a file of its kind, every "
                    "paragraph in place, its bold, italics and links kept; up to 10 languages at once."
                </p>
            </div>
        </section>
    }
}

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // Lazy routes (the console) hydrate once their chunk has arrived.
    leptos::mount::hydrate_lazy(App);
}
