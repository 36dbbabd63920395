//! The account pages: credits with the ledger, notices, and API tokens.

use leptos::prelude::*;

use crate::model::CreditKind;
use crate::server::account::{credits, list_tokens, notices, CreateToken, DeleteAccount, MarkNoticesRead, RevokeToken};

use crate::pages::clock::local_date_time as day_and_time;

/// Pure: a ledger line's description: its note, else its kind, capitalised.
pub fn ledger_text(kind: CreditKind, note: Option<&str>) -> String {
    crate::format::capitalise(note.filter(|n| !n.is_empty()).unwrap_or(kind.as_str()))
}

#[component]
pub fn CreditsPage() -> impl IntoView {
    let summary = LocalResource::new(credits);
    let terms = LocalResource::new(crate::server::account::terms);
    view! {
        <section class="card">
            <h1>"Credits"</h1>
            <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                {move || summary.get().map(|r| match r {
                    Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                    Ok(c) => view! {
                        <p class="balance"><span data-testid="balance">{c.balance}</span>" credits"</p>
                        <p class="hint">
                            {move || terms.get().and_then(|r| r.ok()).map(|t| format!(
                                "Each document costs {}. Documents that cannot be processed are refunded.",
                                crate::format::credits_text(t.cost)
                            ))}
                        </p>
                        <MonthlyTotals months=c.months/>
                        <h2>"History"</h2>
                        <table class="ledger">
                            <thead><tr><th>"When"</th><th>"What"</th><th class="num">"Credits"</th></tr></thead>
                            <tbody>
                                {c.history.into_iter().map(|l| view! {
                                    <tr class=l.kind.as_str()>
                                        <td>{day_and_time(&l.at)}</td>
                                        <td>
                                            {ledger_text(l.kind, l.note.as_deref())}
                                            {l.job_id.map(|id| view! { " " <a href=format!("/jobs/{id}")>"(job)"</a> })}
                                        </td>
                                        <td class="num">{if l.amount > 0 { format!("+{}", l.amount) } else { l.amount.to_string() }}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                    }.into_any(),
                })}
            </Transition>
        </section>
        <TokensCard/>
        <DeleteAccountCard/>
    }
}

/// Deleting the account, after the password: what goes and what stays, said first.
#[component]
fn DeleteAccountCard() -> impl IntoView {
    let delete = ServerAction::<DeleteAccount>::new();
    let navigate = leptos_router::hooks::use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(())) = delete.value().get() {
            crate::AccountChanged::notify();
            navigate("/login", Default::default());
        }
    });
    view! {
        <section class="card danger-zone">
            <h2>"Delete your account"</h2>
            <p class="hint">
                "Your sessions and API tokens stop working at once. Waiting documents are canceled and refunded; "
                "one being processed stops at its next safe point. Every document, result and file name is erased, "
                "and so is your e-mail address. Your credits are not paid out; the bookkeeping of them stays, "
                "without your name. This cannot be undone."
            </p>
            <ActionForm action=delete>
                <label for="delete-password">"Your password"</label>
                <input id="delete-password" type="password" name="password" autocomplete="current-password" required/>
                <button class="button danger" type="submit" disabled=move || delete.pending().get()>"Delete my account"</button>
            </ActionForm>
            <p class="form-error" role="alert">{move || delete.value().get().and_then(|r| r.err()).map(|e| e.to_string())}</p>
        </section>
    }
}

/// What was spent each month: documents, credits charged and refunded, provider tokens.
#[component]
fn MonthlyTotals(months: Vec<crate::model::MonthTotals>) -> impl IntoView {
    use crate::format::thousands;
    (!months.is_empty()).then(|| {
        view! {
            <h2>"By month"</h2>
            <table class="months" data-testid="months">
                <thead>
                    <tr>
                        <th>"Month (UTC)"</th>
                        <th class="num">"Documents"</th>
                        <th class="num">"Charged"</th>
                        <th class="num">"Refunded"</th>
                        <th class="num">"Tokens in"</th>
                        <th class="num">"Tokens out"</th>
                    </tr>
                </thead>
                <tbody>
                    {months
                        .into_iter()
                        .map(|m| view! {
                            <tr>
                                <td>{m.month}</td>
                                <td class="num">{m.documents}</td>
                                <td class="num">{m.charged}</td>
                                <td class="num">{m.refunded}</td>
                                <td class="num">{thousands(m.input_tokens)}</td>
                                <td class="num">{thousands(m.output_tokens)}</td>
                            </tr>
                        })
                        .collect_view()}
                </tbody>
            </table>
        }
    })
}

#[component]
fn TokensCard() -> impl IntoView {
    let create = ServerAction::<CreateToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let tokens = LocalResource::new(move || {
        create.version().track();
        revoke.version().track();
        list_tokens()
    });
    view! {
        <section class="card">
            <h2>"API tokens"</h2>
            <p class="hint">"Programs upload with " <code>"Authorization: Bearer <token>"</code> " to " <code>"POST /api/v1/jobs"</code> "."</p>
            <ActionForm action=create>
                <label for="token-name">"Name"</label>
                <input id="token-name" type="text" name="name" placeholder="e.g. nightly import" required/>
                <button class="button" type="submit">"Create a token"</button>
            </ActionForm>
            {move || create.value().get().map(|r| match r {
                Ok(t) => view! {
                    <p class="secret">"Copy it now, it is shown only once: " <code data-testid="token-secret">{t.secret}</code></p>
                }.into_any(),
                Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
            })}
            <ul class="tokens">
                {move || tokens.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|t| {
                    let id = t.id;
                    view! {
                        <li>
                            <span>{t.name}</span>" "<code>{format!("{}…", t.prefix)}</code>
                            {if t.revoked {
                                view! { <span class="muted">" revoked"</span> }.into_any()
                            } else {
                                view! { <button class="button link" on:click=move |_| { revoke.dispatch(RevokeToken { id }); }>"Revoke"</button> }.into_any()
                            }}
                        </li>
                    }
                }).collect_view()}
            </ul>
        </section>
    }
}

#[component]
pub fn NoticesPage() -> impl IntoView {
    let mark = ServerAction::<MarkNoticesRead>::new();
    let list = LocalResource::new(move || {
        mark.version().track();
        notices()
    });
    view! {
        <section class="card">
            <div class="card-head">
                <h1>"Notices"</h1>
                <button class="button" on:click=move |_| { mark.dispatch(MarkNoticesRead { id: None }); }>"Mark all as read"</button>
            </div>
            <Transition fallback=|| view! { <p class="empty">"Loading…"</p> }>
                {move || list.get().map(|r| match r {
                    Err(e) => view! { <p class="form-error">{e.to_string()}</p> }.into_any(),
                    Ok(items) if items.is_empty() => view! { <p class="empty">"Nothing to report."</p> }.into_any(),
                    Ok(items) => view! {
                        <ul class="notices">
                            {items.into_iter().map(|n| view! {
                                <li class:unread=!n.read>
                                    <span class="when">{day_and_time(&n.created_at)}</span>
                                    <span>{n.message}</span>
                                    {n.job_id.map(|id| view! { " " <a href=format!("/jobs/{id}")>"View the job"</a> })}
                                </li>
                            }).collect_view()}
                        </ul>
                    }.into_any(),
                })}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::ledger_text;
    use crate::model::CreditKind;

    #[test]
    fn ledger_lines_read_as_words() {
        assert_eq!(ledger_text(CreditKind::Debit, Some("document accepted")), "Document accepted");
        assert_eq!(ledger_text(CreditKind::Grant, None), "Grant");
        assert_eq!(ledger_text(CreditKind::Refund, Some("")), "Refund");
    }
}
