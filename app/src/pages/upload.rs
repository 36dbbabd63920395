//! Upload: drag and drop or pick several files, choose a preset, watch each file's progress,
//! and read a distinct message for each outcome.

use leptos::prelude::*;
use serde_json::Value;

use crate::format::size_text;
use crate::model::Estimate;
use crate::server::account::terms;
use sluice_types::capacity::{max_bytes_for_context, PriceTable, SizeKind};
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

/// Pure: what scans cost, after the price table: " Scans (PDF pages without text, PNG, JPEG,
/// TIFF) are read by OCR at 0.3 credits a page."
pub fn scans_hint(prices: &PriceTable) -> String {
    format!(
        " Scans (PDF pages without text, PNG, JPEG, TIFF) are read by OCR at {} credits a page.",
        sluice_types::scan::page_price_text(prices.scan_page_millicredits())
    )
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

/// Pure: an estimate in words: its price, its size and parts, and when it should be done.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimateText {
    pub price: String,
    pub size: String,
    pub time: String,
}

/// Pure: what the user reads before confirming an upload.
pub fn estimate_text(e: &Estimate) -> EstimateText {
    use crate::format::{credits_text, duration_text, thousands};
    let pages = |n: u32| if n == 1 { "1 scanned page".to_string() } else { format!("{n} scanned pages") };
    let price = match (e.scanned_pages, e.scan_credits) {
        // A scan is priced by its pages: "40 scanned pages: 12 credits".
        (Some(n), Some(scan)) if scan >= e.credits => format!("{}: {}", pages(n), credits_text(e.credits)),
        (Some(n), Some(scan)) => format!(
            "{}: {} for {} and {} for its text pages",
            credits_text(e.credits),
            credits_text(scan),
            pages(n),
            credits_text(e.credits - scan)
        ),
        _ => String::new(),
    };
    let price = match (e.held, e.least_credits < e.credits) {
        _ if !price.is_empty() => price,
        (true, true) => format!(
            "{} held, settled to its text's price once read ({} to {})",
            credits_text(e.credits),
            e.least_credits,
            e.credits
        ),
        (true, false) => format!("{} held, settled to its text's price once read", credits_text(e.credits)),
        (false, _) => credits_text(e.credits),
    };
    let tokens = match e.counted_tokens {
        Some(counted) => format!("{} tokens", thousands(counted as i64)),
        None => format!("about {} tokens by its size", thousands(e.input_tokens as i64)),
    };
    let tokens = match (e.pages, e.scanned_pages) {
        (Some(all), Some(scanned)) if all == scanned => format!("{}, read by OCR (about {tokens})", pages(scanned)),
        (Some(all), Some(scanned)) => {
            format!("{all} pages, {scanned} of them scanned and read by OCR (about {tokens})")
        }
        _ => tokens,
    };
    let size = if e.parts > 1 { format!("{tokens}, in {} parts", e.parts) } else { tokens };
    let measured = e.run_time_basis == "measured";
    let ahead = match e.jobs_ahead {
        0 => String::new(),
        1 => " (1 document ahead of it)".to_string(),
        n => format!(" ({n} documents ahead of it)"),
    };
    let runs = duration_text(e.runs_for_secs as i64);
    let time = match e.done_in_secs {
        _ if e.processing_paused => "Processing is paused by an operator: it starts when they resume.".to_string(),
        Some(secs) if measured => format!("Done in about {}{ahead}.", duration_text(secs as i64)),
        Some(secs) => format!(
            "Done within {}{ahead}: nothing has finished lately to time it by, so this is the longest it may take.",
            duration_text(secs as i64)
        ),
        None if measured => {
            format!("It starts once the {} documents ahead of it are done, then takes about {runs}.", e.jobs_ahead)
        }
        None => format!("It starts once the {} documents ahead of it are done, then takes up to {runs}.", e.jobs_ahead),
    };
    let time = match e.meets_deadline {
        Some(true) => format!("{time} It should be done before it is needed."),
        Some(false) => format!("{time} It may not be done by the time you need it."),
        None => time,
    };
    EstimateText { price, size, time }
}

/// Pure: the confirm bar's words for the estimates waiting on it: "2 documents: 9 credits."
pub fn confirm_summary(estimates: &[Estimate]) -> String {
    let credits: i64 = estimates.iter().map(|e| e.credits).sum();
    let held = estimates.iter().any(|e| e.held);
    let documents =
        if estimates.len() == 1 { "1 document".to_string() } else { format!("{} documents", estimates.len()) };
    format!(
        "{documents}: {}{}. Nothing is charged until you upload.",
        crate::format::credits_text(credits),
        if held { " at most (held prices settle once read)" } else { "" }
    )
}

/// Pure: the economy lane's choice in words: "By tomorrow, at half the credits".
pub fn economy_choice_text(terms: &sluice_types::capacity::EconomyTerms) -> String {
    let when = match terms.window_hours {
        h if h <= 1.0 => format!("Within {} min", (h * 60.0).round()),
        h if h < 20.0 => format!("Within {} hours", h.round()),
        h if h <= 26.0 => "By tomorrow".to_string(),
        h => format!("Within {} days", (h / 24.0).round()),
    };
    let off = match terms.discount {
        d if (d - 0.5).abs() < 1e-9 => "half the credits".to_string(),
        d => format!("{:.0} % off", d * 100.0),
    };
    format!("{when}, at {off} (through the provider's batch)")
}

/// A chosen file: priced and timed by the server first, sent once the user confirms.
#[derive(Clone)]
struct UploadRow {
    name: String,
    /// What it is to be done as, chosen with it (its estimate is for this).
    preset: String,
    language: Option<String>,
    /// When it is needed (RFC 3339), and whether it goes in the urgent lane.
    #[cfg(feature = "hydrate")]
    due_by: Option<String>,
    #[cfg(feature = "hydrate")]
    urgent: bool,
    /// In the economy lane.
    #[cfg(feature = "hydrate")]
    economy: bool,
    /// A translation's guidance, as the form fields say it (empty: not sent).
    #[cfg(feature = "hydrate")]
    guidance: Vec<(&'static str, String)>,
    /// The language its scanned pages are read in by OCR (none: the server's first).
    #[cfg(feature = "hydrate")]
    document_language: Option<String>,
    /// Reading progress of the estimate, then of the upload.
    progress: RwSignal<f64>,
    estimate: RwSignal<Option<Estimate>>,
    /// Confirmed: being sent, or sent.
    sent: RwSignal<bool>,
    outcome: RwSignal<Option<Outcome>>,
    #[cfg(feature = "hydrate")]
    file: send_wrapper::SendWrapper<web_sys::File>,
}

impl UploadRow {
    /// Priced and waiting for the user's word.
    fn awaits_confirmation(&self) -> bool {
        self.estimate.get().is_some() && !self.sent.get() && self.outcome.get().is_none()
    }

    fn is_estimating(&self) -> bool {
        self.estimate.get().is_none() && self.outcome.get().is_none()
    }

    /// The row's `data-outcome`: `estimating`, `estimated`, `uploading`, or how it ended.
    fn stage(&self) -> &'static str {
        match (self.outcome.get(), self.sent.get(), self.estimate.get().is_some()) {
            (Some(outcome), _, _) => outcome.kind,
            (None, true, _) => "uploading",
            (None, false, true) => "estimated",
            (None, false, false) => "estimating",
        }
    }
}

#[component]
pub fn UploadPage() -> impl IntoView {
    let terms = LocalResource::new(terms);
    let preset = RwSignal::new("summarize".to_string());
    // A translation needs its target language.
    let language = RwSignal::new("German".to_string());
    // "Needed by", as the browser's local date and time (empty: no deadline), and "urgent".
    let needed_by = RwSignal::new(String::new());
    let urgent = RwSignal::new(false);
    // "By tomorrow, at half the credits": the economy lane, where it is offered.
    let economy = RwSignal::new(false);
    // The language scans are read in (empty: the server's first).
    let document_language = RwSignal::new(String::new());
    // A translation's formality and glossary: pasted pairs, a saved one, and a name to save the
    // pasted one under.
    let formality = RwSignal::new("as_source".to_string());
    let glossary = RwSignal::new(String::new());
    let glossary_name = RwSignal::new(String::new());
    let save_glossary_as = RwSignal::new(String::new());
    let saved_glossaries = LocalResource::new(crate::server::account::glossary_names);
    let rows = RwSignal::new(Vec::<UploadRow>::new());
    let dragging = RwSignal::new(false);
    #[cfg(feature = "hydrate")]
    let account = use_context::<crate::AccountChanged>();

    // Each chosen file is read by the server once for its estimate (its tokens counted, its
    // type known by its content); nothing is stored or charged until the user confirms.
    #[cfg(feature = "hydrate")]
    let start = move |files: web_sys::FileList| {
        for i in 0..files.length() {
            if let Some(file) = files.get(i) {
                let chosen = preset.get_untracked();
                let chosen_is_translation = chosen == "translate";
                let row = UploadRow {
                    name: file.name(),
                    // A blank language names none: the server translates into English.
                    language: (chosen == "translate")
                        .then(|| language.get_untracked().trim().to_string())
                        .filter(|l| !l.is_empty()),
                    preset: chosen,
                    due_by: local_time_as_rfc3339(&needed_by.get_untracked()),
                    urgent: urgent.get_untracked(),
                    economy: economy.get_untracked(),
                    document_language: Some(document_language.get_untracked()).filter(|l| !l.is_empty()),
                    guidance: if chosen_is_translation {
                        [
                            ("formality", formality.get_untracked()),
                            ("glossary", glossary.get_untracked()),
                            ("glossary_name", glossary_name.get_untracked()),
                            ("save_glossary_as", save_glossary_as.get_untracked()),
                        ]
                        .into_iter()
                        .filter(|(_, v)| !v.trim().is_empty() && v != "as_source")
                        .collect()
                    } else {
                        Vec::new()
                    },
                    progress: RwSignal::new(0.0),
                    estimate: RwSignal::new(None),
                    sent: RwSignal::new(false),
                    outcome: RwSignal::new(None),
                    file: send_wrapper::SendWrapper::new(file),
                };
                rows.update(|r| r.push(row.clone()));
                let (estimate, outcome) = (row.estimate, row.outcome);
                send(ESTIMATE_URL, &row, move |status, body| match status {
                    200 => match serde_json::from_value::<Estimate>(body) {
                        Ok(e) => estimate.set(Some(e)),
                        Err(_) => outcome.set(Some(outcome_for(500, &Value::Null))),
                    },
                    _ => outcome.set(Some(outcome_for(status, &body))),
                });
            }
        }
    };
    let waiting = move || rows.get().into_iter().filter(UploadRow::awaits_confirmation).collect::<Vec<_>>();
    let estimating = move || rows.get().iter().any(UploadRow::is_estimating);
    let confirm = move |_| {
        for row in waiting() {
            row.sent.set(true);
            row.progress.set(0.0);
            #[cfg(feature = "hydrate")]
            {
                let (progress, outcome) = (row.progress, row.outcome);
                send(UPLOAD_URL, &row, move |status, body| {
                    progress.set(1.0);
                    if status == 202 {
                        // A credit was taken: the header's balance asks again.
                        if let Some(crate::AccountChanged(changed)) = account {
                            changed.update(|n| *n += 1);
                        }
                    }
                    outcome.set(Some(outcome_for(status, &body)));
                });
            }
        }
    };
    // "Not now": the files not sent are let go, their estimates too (nothing was stored).
    let let_go =
        move |_| rows.update(|r| r.retain(|row| row.sent.get_untracked() || row.outcome.get_untracked().is_some()));

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
                <label for="language">"Into which language? (several: comma-separated, up to 10; each is its own job)"</label>
                <input
                    id="language"
                    data-testid="language"
                    maxlength="420"
                    prop:value=move || language.get()
                    on:input=move |ev| language.set(event_target_value(&ev))
                />
                <label for="formality">"Addressing the reader"</label>
                <select id="formality" data-testid="formality" on:change=move |ev| formality.set(event_target_value(&ev))>
                    <option value="as_source">"As the document does"</option>
                    <option value="formal">"Formally (Sie, vous)"</option>
                    <option value="informal">"Informally (du, tu)"</option>
                </select>
                <label for="glossary">"Glossary (optional): a term and its translation a line, \"term, translation\" (DeepL's CSV or TSV)"</label>
                <textarea
                    id="glossary"
                    data-testid="glossary"
                    rows="3"
                    placeholder="Supplier, Lieferant"
                    prop:value=move || glossary.get()
                    on:input=move |ev| glossary.set(event_target_value(&ev))
                ></textarea>
                <div class="when">
                    <label for="save-glossary">"Save it as"</label>
                    <input
                        id="save-glossary"
                        data-testid="save-glossary-as"
                        maxlength="60"
                        placeholder="a name, to use it again"
                        prop:value=move || save_glossary_as.get()
                        on:input=move |ev| save_glossary_as.set(event_target_value(&ev))
                    />
                    {move || {
                        let names = saved_glossaries.get().and_then(|r| r.ok()).unwrap_or_default();
                        (!names.is_empty()).then(|| view! {
                            <label for="glossary-name">"Use a saved glossary"</label>
                            <select id="glossary-name" data-testid="glossary-name" on:change=move |ev| glossary_name.set(event_target_value(&ev))>
                                <option value="">"None"</option>
                                {names.into_iter().map(|n| view! { <option value=n.clone()>{n.clone()}</option> }).collect_view()}
                            </select>
                        })
                    }}
                </div>
            </Show>
            <div class="when">
                <label for="due-by">"Needed by (optional)"</label>
                <input
                    id="due-by"
                    data-testid="due-by"
                    type="datetime-local"
                    prop:value=move || needed_by.get()
                    on:input=move |ev| {
                        let when = event_target_value(&ev);
                        // A deadline is the standard lane's.
                        if !when.is_empty() {
                            economy.set(false);
                        }
                        needed_by.set(when);
                    }
                />
                <label class="check">
                    <input
                        type="checkbox"
                        data-testid="urgent"
                        prop:checked=move || urgent.get()
                        on:change=move |ev| {
                            let chosen = event_target_checked(&ev);
                            if chosen {
                                economy.set(false);
                            }
                            urgent.set(chosen);
                        }
                    />
                    " Urgent: keep it out of the line behind long documents"
                </label>
                {move || {
                    // Scans are read by OCR in one of the server's languages.
                    terms.get().and_then(|t| t.ok()).filter(|t| t.ocr_languages.len() > 1 || t.detect_language).map(|t| {
                        view! {
                            <label for="document-language">"Language of scanned pages"</label>
                            <select id="document-language" data-testid="document-language" on:change=move |ev| document_language.set(event_target_value(&ev))>
                                {t.ocr_languages.iter().map(|l| view! { <option value=l.clone()>{l.clone()}</option> }).collect_view()}
                                {t.detect_language.then(|| view! { <option value="auto">"Detect it"</option> })}
                            </select>
                        }
                    })
                }}
                {move || {
                    terms.get().and_then(|t| t.ok()).and_then(|t| t.economy).map(|offered| {
                        view! {
                            <label class="check">
                                <input
                                    type="checkbox"
                                    data-testid="economy"
                                    prop:checked=move || economy.get()
                                    on:change=move |ev| {
                                        let chosen = event_target_checked(&ev);
                                        economy.set(chosen);
                                        // The economy lane keeps no deadline and is not urgent.
                                        if chosen {
                                            urgent.set(false);
                                            needed_by.set(String::new());
                                        }
                                    }
                                />
                                {format!(" {}", economy_choice_text(&offered))}
                            </label>
                        }
                    })
                }}
            </div>
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
                <p>"Drop PDF, Word, OpenDocument, web page, text or Markdown files, or scans (PNG, JPEG, TIFF), here, or"</p>
                <label class="button" for="files">"Choose files"</label>
                <input
                    id="files"
                    class="visually-hidden"
                    type="file"
                    multiple
                    accept=".pdf,.docx,.odt,.html,.htm,.txt,.md,.png,.jpg,.jpeg,.tif,.tiff,image/png,image/jpeg,image/tiff,application/pdf,application/vnd.openxmlformats-officedocument.wordprocessingml.document,application/vnd.oasis.opendocument.text,text/html,text/plain,text/markdown"
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
                    {move || terms.get().and_then(|r| r.ok()).map(|t| {
                        let scans = (!t.ocr_languages.is_empty()).then(|| scans_hint(&t.prices)).unwrap_or_default();
                        format!("{}{scans}", terms_hint(t.max_upload_bytes, &t.prices))
                    })}
                </p>
                <p class="policy" data-testid="refund-policy">{refund_policy()}</p>
            </div>
            <ul class="uploads" aria-live="polite">
                {move || {
                    rows.get()
                        .into_iter()
                        .map(|row| {
                            let name = row.name.clone();
                            let task = preset_words(&row.preset, row.language.as_deref());
                            let (estimate, outcome, progress) = (row.estimate, row.outcome, row.progress);
                            view! {
                                <li class="upload" data-outcome=move || row.stage()>
                                    <span class="file-name">{name}</span>
                                    <progress max="1" value=move || progress.get()></progress>
                                    {move || estimate.get().map(|e| {
                                        let words = estimate_text(&e);
                                        view! {
                                            <p class="estimate" data-testid="estimate">
                                                <span class="price" data-testid="price">{words.price}</span>
                                                " · " {task.clone()} " · " {words.size}
                                                <br/>
                                                <span data-testid="eta">{words.time}</span>
                                            </p>
                                        }
                                    })}
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
            <Show when=move || !waiting().is_empty()>
                <div class="confirm" data-testid="confirm-bar">
                    <p>
                        {move || {
                            let estimates: Vec<Estimate> = waiting().iter().filter_map(|r| r.estimate.get()).collect();
                            confirm_summary(&estimates)
                        }}
                    </p>
                    <button
                        class="button primary"
                        data-testid="confirm-upload"
                        disabled=move || estimating()
                        on:click=confirm
                    >
                        {move || match waiting().len() {
                            1 => "Upload it".to_string(),
                            n => format!("Upload all {n}"),
                        }}
                    </button>
                    <button class="button" data-testid="let-go" on:click=let_go>"Not now"</button>
                </div>
            </Show>
        </section>
    }
}

/// Pure: what a row is to be done as: "Summarize", "Translate into German" (into English when
/// it names no language, as the server does).
fn preset_words(preset: &str, language: Option<&str>) -> String {
    let label = Preset::parse(preset).map(|p| p.label().to_string()).unwrap_or_else(|| preset.to_string());
    match (Preset::parse(preset), language) {
        (Some(Preset::Translate), language) => format!("{label} into {}", language.unwrap_or("English")),
        _ => label,
    }
}

/// The browser's local date and time of a `datetime-local` field as RFC 3339 in UTC (the
/// server wants the zone); none when empty or not a time.
#[cfg(feature = "hydrate")]
fn local_time_as_rfc3339(local: &str) -> Option<String> {
    if local.trim().is_empty() {
        return None;
    }
    let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_str(local));
    if date.get_time().is_nan() {
        return None;
    }
    date.to_iso_string().as_string()
}

/// Where the upload page sends files: the `upload_document` server function.
pub const UPLOAD_URL: &str = "/api/upload_document";
/// Where it asks a file's estimate before the user confirms (the REST API's dry run).
pub const ESTIMATE_URL: &str = "/api/v1/estimate";

/// Send a row's file and options to `url` with XMLHttpRequest, which reports upload progress
/// (fetch does not); `done` gets the status (0 when the request did not get through) and the
/// JSON answer.
#[cfg(feature = "hydrate")]
fn send(url: &str, row: &UploadRow, done: impl FnOnce(u16, Value) + 'static) {
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;

    let (Ok(xhr), Ok(form)) = (web_sys::XmlHttpRequest::new(), web_sys::FormData::new()) else {
        return done(0, Value::Null);
    };
    let file: &web_sys::File = &row.file;
    let _ = form.append_with_blob_and_filename("file", file, &file.name());
    let _ = form.append_with_str("preset", &row.preset);
    if let Some(language) = &row.language {
        // "German, French": one job for each.
        let field = if language.contains(',') { "languages" } else { "language" };
        let _ = form.append_with_str(field, language);
    }
    if let Some(due_by) = &row.due_by {
        let _ = form.append_with_str("due_by", due_by);
    }
    if row.urgent {
        let _ = form.append_with_str("urgent", "true");
    }
    if row.economy {
        let _ = form.append_with_str("lane", "economy");
    }
    for (name, value) in &row.guidance {
        let _ = form.append_with_str(name, value);
    }
    if let Some(language) = &row.document_language {
        let _ = form.append_with_str("document_language", language);
    }
    let _ = xhr.open("POST", url);

    let progress = row.progress;
    let on_progress = Closure::<dyn FnMut(web_sys::ProgressEvent)>::new(move |e: web_sys::ProgressEvent| {
        if e.length_computable() && e.total() > 0.0 {
            progress.set(e.loaded() / e.total());
        }
    });
    if let Ok(upload) = xhr.upload() {
        upload.set_onprogress(Some(on_progress.as_ref().unchecked_ref()));
    }
    on_progress.forget();

    // Load and error each may end it; whichever comes first does.
    let done = std::rc::Rc::new(std::cell::RefCell::new(Some(done)));
    let (loaded, answered) = (xhr.clone(), done.clone());
    let on_load = Closure::<dyn FnMut()>::new(move || {
        let status = loaded.status().unwrap_or(0);
        let body = loaded.response_text().ok().flatten().unwrap_or_default();
        if let Some(done) = answered.borrow_mut().take() {
            done(status, serde_json::from_str(&body).unwrap_or(Value::Null));
        }
    });
    xhr.set_onload(Some(on_load.as_ref().unchecked_ref()));
    on_load.forget();
    let on_error = Closure::<dyn FnMut()>::new(move || {
        if let Some(done) = done.borrow_mut().take() {
            done(0, Value::Null);
        }
    });
    // A failure, an abort and a timeout all end the row as "did not reach the server".
    xhr.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    xhr.set_onabort(Some(on_error.as_ref().unchecked_ref()));
    xhr.set_ontimeout(Some(on_error.as_ref().unchecked_ref()));
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
    fn the_economy_choice_says_when_and_at_what_price() {
        let terms = |discount, window_hours| sluice_types::capacity::EconomyTerms { discount, window_hours };
        assert_eq!(
            economy_choice_text(&terms(0.5, 24.0)),
            "By tomorrow, at half the credits (through the provider's batch)"
        );
        assert_eq!(economy_choice_text(&terms(0.3, 6.0)), "Within 6 hours, at 30 % off (through the provider's batch)");
        assert_eq!(
            economy_choice_text(&terms(0.5, 0.05)),
            "Within 3 min, at half the credits (through the provider's batch)"
        );
        assert_eq!(
            economy_choice_text(&terms(0.5, 72.0)),
            "Within 3 days, at half the credits (through the provider's batch)"
        );
    }

    #[test]
    fn the_terms_hint_follows_the_configuration() {
        assert_eq!(terms_hint(50 * 1024 * 1024, &PriceTable::flat(1)), "Up to 50 MB each. 1 credit per document.");
        assert_eq!(terms_hint(512 * 1024, &PriceTable::flat(3)), "Up to 512 KB each. 3 credits per document.");
        assert_eq!(
            scans_hint(&PriceTable::flat(1).with_scan_page_price(250)),
            " Scans (PDF pages without text, PNG, JPEG, TIFF) are read by OCR at 0.25 credits a page."
        );
        let table: PriceTable = "25000:1,100000:2,200000:4".parse().unwrap();
        assert_eq!(
            terms_hint(50 * 1024 * 1024, &table),
            "Up to 50 MB each. Priced by size: 1 credit up to 97 KB of text (975 KB as PDF), 2 credits up to 390 KB (3.8 MB), 4 credits up to 781 KB (7.6 MB), and 4 more for each 781 KB (7.6 MB) after that."
        );
    }

    fn estimate() -> Estimate {
        Estimate {
            doc_type: "txt".into(),
            bytes: 50_000,
            counted_tokens: Some(12_345),
            input_tokens: 12_385,
            credits: 7,
            held: false,
            least_credits: 7,
            parts: 1,
            jobs_ahead: 0,
            starts_in_secs: Some(0),
            runs_for_secs: 95,
            run_time_basis: "measured".into(),
            done_in_secs: Some(95),
            processing_paused: false,
            meets_deadline: None,
            pages: None,
            scanned_pages: None,
            scan_credits: None,
        }
    }

    #[test]
    fn a_scan_reads_as_its_pages_and_their_price() {
        let scan = Estimate {
            doc_type: "pdf".into(),
            counted_tokens: Some(0),
            input_tokens: 28_040,
            credits: 12,
            held: true,
            least_credits: 1,
            pages: Some(40),
            scanned_pages: Some(40),
            scan_credits: Some(12),
            ..estimate()
        };
        let text = estimate_text(&scan);
        assert_eq!(text.price, "40 scanned pages: 12 credits");
        assert!(text.size.starts_with("40 scanned pages, read by OCR"), "{}", text.size);
        let mixed = Estimate { credits: 14, pages: Some(42), ..scan };
        let text = estimate_text(&mixed);
        assert_eq!(text.price, "14 credits: 12 credits for 40 scanned pages and 2 credits for its text pages");
        assert!(text.size.starts_with("42 pages, 40 of them scanned"), "{}", text.size);
    }

    #[test]
    fn an_estimate_reads_as_a_price_a_size_and_a_time() {
        let text = estimate_text(&estimate());
        assert_eq!(text.price, "7 credits");
        assert_eq!(text.size, "12,345 tokens");
        assert_eq!(text.time, "Done in about 95 s.");
        let word = Estimate {
            doc_type: "docx".into(),
            counted_tokens: None,
            held: true,
            least_credits: 1,
            parts: 3,
            jobs_ahead: 4,
            done_in_secs: Some(400),
            run_time_basis: "deadline".into(),
            ..estimate()
        };
        let text = estimate_text(&word);
        assert_eq!(text.price, "7 credits held, settled to its text's price once read (1 to 7)");
        assert_eq!(text.size, "about 12,385 tokens by its size, in 3 parts");
        assert!(
            text.time.starts_with("Done within 6 min (4 documents ahead of it): nothing has finished lately"),
            "{}",
            text.time
        );
        let unknown_start = Estimate { starts_in_secs: None, done_in_secs: None, jobs_ahead: 3, ..estimate() };
        assert_eq!(
            estimate_text(&unknown_start).time,
            "It starts once the 3 documents ahead of it are done, then takes about 95 s."
        );
        let paused = Estimate { processing_paused: true, ..estimate() };
        assert!(estimate_text(&paused).time.starts_with("Processing is paused"));
        let late = Estimate { meets_deadline: Some(false), ..estimate() };
        assert!(estimate_text(&late).time.ends_with("It may not be done by the time you need it."));
        let in_time = Estimate { meets_deadline: Some(true), ..estimate() };
        assert!(estimate_text(&in_time).time.ends_with("It should be done before it is needed."));
        assert_eq!(confirm_summary(&[estimate()]), "1 document: 7 credits. Nothing is charged until you upload.");
        assert_eq!(
            confirm_summary(&[estimate(), word]),
            "2 documents: 14 credits at most (held prices settle once read). Nothing is charged until you upload."
        );
        assert_eq!(preset_words("translate", Some("German")), "Translate into German");
        assert_eq!(preset_words("translate", None), "Translate into English");
        assert_eq!(preset_words("summarize", None), "Summarize");
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
