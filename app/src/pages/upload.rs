//! Upload: drag and drop or pick several files, choose a preset, watch each file's progress,
//! and read a distinct message for each outcome.

use leptos::prelude::*;
use serde_json::Value;

use crate::format::size_text;
use crate::server::account::terms;
use sluice_types::capacity::{billed_tokens, estimate_input_tokens, max_bytes_for_context, PriceTable, SizeKind};
use sluice_types::Preset;

/// How an upload ended, for the message under its progress bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// `ok`, `duplicate` or `refused` (CSS class and test hook).
    pub kind: &'static str,
    pub message: String,
    pub job_id: Option<String>,
}

/// Pure: the message for an upload's HTTP status and JSON body.
pub fn outcome_for(status: u16, body: &Value) -> Outcome {
    let num = |k: &str| body[k].as_i64().unwrap_or(0);
    let job_id = body["id"].as_str().map(str::to_string);
    let refused = |message: String| Outcome { kind: "refused", message, job_id: None };
    match status {
        202 => Outcome {
            kind: "ok",
            message: format!("Accepted and queued. {} charged.", crate::format::credits_text(num("charged"))),
            job_id,
        },
        200 => Outcome {
            kind: "duplicate",
            message: "You uploaded this already; here is the existing job.".into(),
            job_id,
        },
        402 => refused(format!(
            "Out of credits: this document costs {} and your balance is {}. Nothing was charged.",
            num("cost"),
            num("balance")
        )),
        429 if body["error"] == "too_many_uploads" => refused(format!(
            "You are sending {} files at once already. Try again in {} s.",
            num("limit"),
            num("retry_after_secs")
        )),
        429 => refused(format!(
            "You have {} of {} documents in progress. Try again in {} s, when one has finished.",
            num("in_flight"),
            num("limit"),
            num("retry_after_secs")
        )),
        413 if body["error"] == "too_many_tokens" => refused(format!(
            "Too long: Sluice takes documents of up to {} tokens (about {} of text; those longer than one provider call are done in parts). Split it and upload the pieces. Nothing was charged.",
            crate::format::thousands(num("max_tokens")),
            size_text(max_bytes_for_context(SizeKind::Text, num("max_tokens").max(0) as u64))
        )),
        413 if body["error"] == "storage_full" => refused(format!(
            "Your storage is full: your documents take {} of your {}. Documents are removed once their jobs no longer need them; try again then. Nothing was stored or charged.",
            size_text(num("used_bytes").max(0) as u64),
            size_text(num("quota_bytes").max(0) as u64)
        )),
        413 => refused(format!("Too large: the limit is {} MB.", num("limit_bytes") / (1024 * 1024))),
        415 => refused(format!(
            "Not a supported document: {}.",
            body["message"].as_str().unwrap_or("upload a PDF, Word, OpenDocument, web page, text or Markdown file")
        )),
        503 if body["error"] == "unavailable" => {
            refused("Sluice is restarting, try again in a few seconds. Nothing was stored or charged.".into())
        }
        503 => refused(format!(
            "Sluice is not accepting new documents right now, and nothing was stored. Try again in {} s.",
            num("retry_after_secs")
        )),
        401 => refused("Your session has ended. Log in again.".into()),
        0 => refused("The upload did not reach the server. Check your connection and try again.".into()),
        _ => refused(
            body["message"].as_str().map(str::to_string).unwrap_or_else(|| format!("The upload failed ({status}).")),
        ),
    }
}

/// Pure: the line under the drop zone, with the price table in file sizes, e.g. "Up to 50 MB
/// each. 1 credit per document." or "... Priced by size: 1 credit up to 97 KB of text (976 KB
/// as PDF), 2 credits up to 390 KB (3.8 MB), 4 credits up to 781 KB (7.6 MB), and 4 more for each
/// 781 KB (7.6 MB) after that." (longer documents are done in parts, and priced by their size).
pub fn terms_hint(max_upload_bytes: u64, prices: &PriceTable) -> String {
    let cap = size_text(max_upload_bytes);
    let tiers = prices.tiers();
    if tiers.len() <= 1 && tiers.first().is_none_or(|t| t.up_to_tokens == u64::MAX) {
        return format!("Up to {cap} each. {} per document.", crate::format::credits_text(prices.cheapest()));
    }
    let steps: Vec<String> = tiers
        .iter()
        .enumerate()
        .map(|(i, tier)| {
            let credits = crate::format::credits_text(tier.credits);
            let text = size_text(max_bytes_for_context(SizeKind::Text, tier.up_to_tokens));
            let pdf = size_text(max_bytes_for_context(SizeKind::Pdf, tier.up_to_tokens));
            match i {
                _ if i + 1 == tiers.len() => {
                    format!(
                        "{credits} up to {text} ({pdf}), and {} more for each {text} ({pdf}) after that",
                        tier.credits
                    )
                }
                0 => format!("{credits} up to {text} of text ({pdf} as PDF)"),
                _ => format!("{credits} up to {text} ({pdf})"),
            }
        })
        .collect();
    format!("Up to {cap} each. Priced by size: {}.", steps.join(", "))
}

/// Pure: what a file will cost, from its name and size, before it is sent.
pub fn price_of_file(prices: &PriceTable, ceiling: Option<u64>, name: &str, bytes: u64, preset: Preset) -> i64 {
    let kind = SizeKind::from_file_name(name);
    let tokens = estimate_input_tokens(kind, bytes);
    // A PDF, a Word file or a page is charged its hold (settled to its text's price once read).
    let charged = sluice_types::settlement::hold_tokens(kind, tokens, ceiling);
    // A translation's answer is billed by the provider too.
    prices.price(billed_tokens(preset, charged))
}

/// Pure: a row's price: "2 credits", or for a PDF, a Word file or a page "2 credits held"
/// (settled once read).
pub fn price_label(name: &str, price: i64) -> String {
    match SizeKind::from_file_name(name) {
        kind if kind.priced_once_read() => format!("{} held", crate::format::credits_text(price)),
        _ => crate::format::credits_text(price),
    }
}

#[derive(Clone)]
struct UploadRow {
    name: String,
    /// What it will cost, known from its size and type before it is sent.
    price: Option<i64>,
    progress: RwSignal<f64>,
    outcome: RwSignal<Option<Outcome>>,
}

#[component]
pub fn UploadPage() -> impl IntoView {
    let terms = LocalResource::new(terms);
    let preset = RwSignal::new("summarize".to_string());
    // A translation needs its target language.
    let language = RwSignal::new("German".to_string());
    let rows = RwSignal::new(Vec::<UploadRow>::new());
    let dragging = RwSignal::new(false);
    #[cfg(feature = "hydrate")]
    let account = use_context::<crate::AccountChanged>();

    #[cfg(feature = "hydrate")]
    let start = move |files: web_sys::FileList| {
        for i in 0..files.length() {
            if let Some(file) = files.get(i) {
                let terms = terms.get_untracked().and_then(|r| r.ok());
                let chosen = Preset::parse(&preset.get_untracked()).unwrap_or(Preset::Summarize);
                let price = terms
                    .map(|t| price_of_file(&t.prices, t.max_document_tokens, &file.name(), file.size() as u64, chosen));
                let row =
                    UploadRow { name: file.name(), price, progress: RwSignal::new(0.0), outcome: RwSignal::new(None) };
                rows.update(|r| r.push(row.clone()));
                let preset = preset.get_untracked();
                let language = (preset == "translate").then(|| language.get_untracked());
                send(file, preset, language, row.progress, row.outcome, account);
            }
        }
    };

    view! {
        <section class="card">
            <h1>"Upload documents"</h1>
            <label for="preset">"What should Sluice do?"</label>
            <select id="preset" on:change=move |ev| preset.set(event_target_value(&ev))>
                {move || {
                    terms
                        .get()
                        .and_then(|r| r.ok())
                        .map(|t| t.presets)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|p| view! { <option value=p.id.as_str()>{p.label}</option> })
                        .collect_view()
                }}
            </select>
            <Show when=move || preset.get() == "translate">
                <label for="language">"Into which language?"</label>
                <input
                    id="language"
                    maxlength="40"
                    prop:value=move || language.get()
                    on:input=move |ev| language.set(event_target_value(&ev))
                />
            </Show>
            <div
                class="dropzone"
                class:dragging=move || dragging.get()
                on:dragover=move |ev| {
                    ev.prevent_default();
                    dragging.set(true);
                }
                on:dragleave=move |_| dragging.set(false)
                on:drop=move |ev| {
                    ev.prevent_default();
                    dragging.set(false);
                    #[cfg(feature = "hydrate")]
                    if let Some(files) = ev.data_transfer().and_then(|d| d.files()) {
                        start(files);
                    }
                    #[cfg(not(feature = "hydrate"))]
                    let _ = ev;
                }
            >
                <p>"Drop PDF, Word, OpenDocument, web page, text or Markdown files here, or"</p>
                <label class="button" for="files">"Choose files"</label>
                <input
                    id="files"
                    class="visually-hidden"
                    type="file"
                    multiple
                    accept=".pdf,.docx,.odt,.html,.htm,.txt,.md,application/pdf,application/vnd.openxmlformats-officedocument.wordprocessingml.document,application/vnd.oasis.opendocument.text,text/html,text/plain,text/markdown"
                    on:change=move |ev| {
                        #[cfg(feature = "hydrate")]
                        {
                            use wasm_bindgen::JsCast;
                            if let Some(input) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok()) {
                                if let Some(files) = input.files() {
                                    start(files);
                                }
                                input.set_value("");
                            }
                        }
                        #[cfg(not(feature = "hydrate"))]
                        let _ = ev;
                    }
                />
                <p class="hint">
                    {move || terms.get().and_then(|r| r.ok()).map(|t| terms_hint(t.max_upload_bytes, &t.prices))}
                </p>
                <p class="policy" data-testid="refund-policy">{refund_policy()}</p>
            </div>
            <ul class="uploads" aria-live="polite">
                {move || {
                    rows.get()
                        .into_iter()
                        .map(|row| {
                            let UploadRow { name, price, progress, outcome } = row;
                            let price = price.map(|p| price_label(&name, p));
                            view! {
                                <li class="upload" data-outcome=move || outcome.get().map(|o| o.kind).unwrap_or("uploading")>
                                    <span class="file-name">{name}</span>
                                    {price.map(|p| view! {
                                        <span class="price" data-testid="price">{p}</span>
                                    })}
                                    <progress max="1" value=move || progress.get()></progress>
                                    {move || {
                                        outcome
                                            .get()
                                            .map(|o| {
                                                view! {
                                                    <p class=format!("outcome {}", o.kind)>
                                                        {o.message}
                                                        {o.job_id.map(|id| view! { " " <a href=format!("/jobs/{id}")>"View the job"</a> })}
                                                    </p>
                                                }
                                            })
                                    }}
                                </li>
                            }
                        })
                        .collect_view()
                }}
            </ul>
        </section>
    }
}

/// Where the upload page sends files: the `upload_document` server function.
pub const UPLOAD_URL: &str = "/api/upload_document";

/// Upload one file with XMLHttpRequest, which reports upload progress (fetch does not).
#[cfg(feature = "hydrate")]
fn send(
    file: web_sys::File,
    preset: String,
    language: Option<String>,
    progress: RwSignal<f64>,
    outcome: RwSignal<Option<Outcome>>,
    account: Option<crate::AccountChanged>,
) {
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;

    let Ok(xhr) = web_sys::XmlHttpRequest::new() else { return };
    let Ok(form) = web_sys::FormData::new() else { return };
    let _ = form.append_with_blob_and_filename("file", &file, &file.name());
    let _ = form.append_with_str("preset", &preset);
    if let Some(language) = language {
        let _ = form.append_with_str("language", &language);
    }
    // The upload server function (the same intake as the REST API's `POST /api/v1/jobs`).
    let _ = xhr.open("POST", UPLOAD_URL);

    let on_progress = Closure::<dyn FnMut(web_sys::ProgressEvent)>::new(move |e: web_sys::ProgressEvent| {
        if e.length_computable() && e.total() > 0.0 {
            progress.set(e.loaded() / e.total());
        }
    });
    if let Ok(upload) = xhr.upload() {
        upload.set_onprogress(Some(on_progress.as_ref().unchecked_ref()));
    }
    on_progress.forget();

    let done = xhr.clone();
    let on_load = Closure::<dyn FnMut()>::new(move || {
        let status = done.status().unwrap_or(0);
        let body = done.response_text().ok().flatten().unwrap_or_default();
        let json: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        progress.set(1.0);
        if status == 202 {
            // A credit was taken: the header's balance asks again.
            if let Some(crate::AccountChanged(changed)) = account {
                changed.update(|n| *n += 1);
            }
        }
        outcome.set(Some(outcome_for(status, &json)));
    });
    xhr.set_onload(Some(on_load.as_ref().unchecked_ref()));
    on_load.forget();
    let on_error = Closure::<dyn FnMut()>::new(move || outcome.set(Some(outcome_for(0, &Value::Null))));
    xhr.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    let _ = xhr.send_with_opt_form_data(Some(&form));
}

/// Pure: when a document that does not get a result is refunded, said before the upload.
pub fn refund_policy() -> String {
    format!(
        "A PDF's, a Word file's or a web page's price is held at its largest and settled to its text's once read; the rest comes back. A document that fails is refunded. Unreadable files are refunded {} times a day; after that they are charged. Canceling before the provider starts costs nothing; after, its calls so far are charged.",
        sluice_types::settlement::FREE_UNREADABLE_PER_DAY
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_terms_hint_follows_the_configuration() {
        assert_eq!(terms_hint(50 * 1024 * 1024, &PriceTable::flat(1)), "Up to 50 MB each. 1 credit per document.");
        assert_eq!(terms_hint(512 * 1024, &PriceTable::flat(3)), "Up to 512 KB each. 3 credits per document.");
        let table: PriceTable = "25000:1,100000:2,200000:4".parse().unwrap();
        assert_eq!(
            terms_hint(50 * 1024 * 1024, &table),
            "Up to 50 MB each. Priced by size: 1 credit up to 97 KB of text (975 KB as PDF), 2 credits up to 390 KB (3.8 MB), 4 credits up to 781 KB (7.6 MB), and 4 more for each 781 KB (7.6 MB) after that."
        );
        assert_eq!(
            price_of_file(&table, None, "long.txt", 1_000_000, Preset::Summarize),
            8,
            "past the last step the price keeps growing"
        );
        assert_eq!(price_of_file(&table, None, "notes.txt", 1_000, Preset::Summarize), 1);
        assert_eq!(
            price_of_file(&table, None, "book.txt", 200_000, Preset::Translate),
            price_of_file(&table, None, "book.txt", 400_000, Preset::Summarize),
            "a translation is priced by what it reads and writes"
        );
        assert_eq!(price_of_file(&table, None, "book.txt", 200_000, Preset::Summarize), 2);
        assert_eq!(
            price_of_file(&table, None, "book.pdf", 20_000, Preset::Summarize),
            1,
            "a PDF's bytes are mostly not text"
        );
        assert_eq!(
            price_of_file(&table, None, "book.pdf", 200_000, Preset::Summarize),
            2,
            "a PDF is charged its hold: 8 times its bytes' tokens"
        );
        assert_eq!(
            price_of_file(&table, Some(25_000), "book.pdf", 200_000, Preset::Summarize),
            1,
            "never past the ceiling"
        );
        assert_eq!(price_label("book.pdf", 2), "2 credits held");
        assert_eq!(price_label("notes.txt", 1), "1 credit");
        assert_eq!(price_label("contract.docx", 2), "2 credits held");
        assert_eq!(price_label("saved.html", 1), "1 credit held");
    }

    #[test]
    fn each_refusal_has_its_own_message() {
        let body = serde_json::json!({"balance": 0, "cost": 1});
        assert!(outcome_for(402, &body).message.contains("balance is 0"));
        let body = serde_json::json!({"in_flight": 5, "limit": 5, "retry_after_secs": 15});
        assert!(outcome_for(429, &body).message.contains("5 of 5") && outcome_for(429, &body).message.contains("15 s"));
        let busy = serde_json::json!({"error": "too_many_uploads", "limit": 8, "retry_after_secs": 5});
        assert!(outcome_for(429, &busy).message.contains("8 files at once"));
        assert!(outcome_for(413, &serde_json::json!({"limit_bytes": 52428800})).message.contains("50 MB"));
        let body = serde_json::json!({"message": "HTML, SVG and XML files are not accepted"});
        assert!(outcome_for(415, &body).message.contains("HTML"));
        assert!(outcome_for(503, &serde_json::json!({"retry_after_secs": 60})).message.contains("nothing was stored"));
        let restarting = serde_json::json!({"error": "unavailable", "retry_after_secs": 5});
        assert!(outcome_for(503, &restarting).message.contains("restarting"));
        let ok = outcome_for(202, &serde_json::json!({"id": "abc", "charged": 2}));
        assert_eq!((ok.kind, ok.job_id.as_deref()), ("ok", Some("abc")));
        assert_eq!(ok.message, "Accepted and queued. 2 credits charged.");
        let long = outcome_for(413, &serde_json::json!({"error": "too_many_tokens", "max_tokens": 2000000}));
        assert!(long.message.contains("2,000,000 tokens (about 7.6 MB of text;"), "{}", long.message);
        assert!(long.message.contains("Nothing was charged"));
        assert_eq!(outcome_for(200, &serde_json::json!({"id": "abc"})).kind, "duplicate");
    }
}
