//! One-click unsubscribe from a notice mail (RFC 8058): the mail's `List-Unsubscribe` address.
//! `POST` turns the notice off (what mail providers send for their "unsubscribe" button, and
//! what the page's button sends); `GET` only shows that button, because link scanners open
//! every link in a mail. The key in the link is the account's mail key, which can do nothing
//! but this: no session, so no cross-site check applies, and the body is never read.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use engine::mail::MailKind;

use super::AppState;

/// Where unsubscribe links point.
pub const PATH: &str = "/unsubscribe";

#[derive(Deserialize)]
pub struct Link {
    u: i64,
    k: String,
    what: String,
}

/// Pure: what the notice is, in words (None for anything but a notice).
fn notice_words(kind: MailKind) -> Option<&'static str> {
    match kind {
        MailKind::Done => Some("a document is done"),
        MailKind::Failed => Some("a document failed"),
        MailKind::CreditsLow => Some("your credits run low"),
        MailKind::Verify | MailKind::Reset => None,
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn page(status: StatusCode, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width, initial-scale=1\"><title>Sluice mail</title></head>\
         <body><main style=\"max-width:32rem;margin:3rem auto;font-family:system-ui,sans-serif\">{body}\
         <p><a href=\"/account\">Your account</a></p></main></body></html>"
    );
    (status, Html(html)).into_response()
}

fn not_found() -> Response {
    page(StatusCode::NOT_FOUND, "<h1>This link does not work</h1><p>Choose which mails you get in your account.</p>")
}

/// `GET /unsubscribe`: a button that unsubscribes (nothing changes until it is pressed).
async fn confirm(Query(link): Query<Link>) -> Response {
    let Some(words) = MailKind::parse(&link.what).and_then(notice_words) else { return not_found() };
    let action = format!("{PATH}?u={}&k={}&what={}", link.u, escape(&link.k), escape(&link.what));
    page(
        StatusCode::OK,
        &format!(
            "<h1>Stop these mails?</h1><p>You get a mail when {words}.</p>\
             <form method=\"post\" action=\"{action}\"><button type=\"submit\">Unsubscribe</button></form>"
        ),
    )
}

/// `POST /unsubscribe`: turn the notice off (idempotent).
async fn unsubscribe(State(state): State<AppState>, Query(link): Query<Link>) -> Response {
    let Some(kind) = MailKind::parse(&link.what) else { return not_found() };
    let Some(words) = notice_words(kind) else { return not_found() };
    match engine::accounts::recovery::unsubscribe(&state.ctx.pool, link.u, &link.k, kind).await {
        Ok(()) => page(
            StatusCode::OK,
            &format!(
                "<h1>Unsubscribed</h1><p>No more mails when {words}. You can turn them on again in your account.</p>"
            ),
        ),
        Err(engine::EngineError::NotFound) => not_found(),
        Err(e) => super::error::ApiError(e.into()).into_response(),
    }
}

/// The unsubscribe routes, outside the session and the cross-site check.
pub fn routes(state: AppState) -> Router {
    Router::new().route(PATH, get(confirm).post(unsubscribe)).with_state(state)
}
