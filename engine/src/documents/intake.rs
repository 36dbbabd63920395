//! Upload intake: an upload is checked while it streams (size cap, type by content, UTF-8 for
//! text, sha256), then stored under a server-generated key and admitted. The REST API and the
//! web UI both come through here; the HTTP layer only reads the request.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::blobs::{BlobWriter, Blobs};
use super::encoding::Transcoder;
use super::payload::{size_kind, DocumentJob, DocumentRef, DocumentSize};
use super::sniff::{sniff, DocType, MarkupScan, Utf8Stream, SNIFF_BYTES};
use super::tokens::{self, TokenTally};
use crate::accounts::admission::{self, Admission, AdmissionConfig, Submission};
use crate::error::{EngineError, Result};
use crate::webhooks::completion::Callback;
use crate::Preset;
use sluice_types::capacity;
use sluice_types::settlement;

/// Checks an upload chunk by chunk, so a refusal comes as soon as the bytes decide it.
pub struct UploadCheck {
    limit: u64,
    /// The document ceiling in tokens: a text whose estimate passes it is refused.
    max_document_tokens: Option<u64>,
    name: Option<String>,
    size: u64,
    hasher: Sha256,
    /// The first bytes, for [`sniff`].
    head: Vec<u8>,
    /// Bytes that arrived before the type was decided, to check as UTF-8 once it is.
    undecided: Vec<u8>,
    doc_type: Option<DocType>,
    utf8: Utf8Stream,
    markup: MarkupScan,
    /// A text's tokens, counted as it streams in.
    tally: TokenTally,
}

/// An upload that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedUpload {
    /// The user's file name as display text (see [`display_name`]).
    pub name: Option<String>,
    pub size: u64,
    pub sha256: String,
    pub doc_type: DocType,
    /// A text's tokens, counted (none for a PDF: its text is known once read; a scan's text
    /// layer's, once surveyed).
    pub tokens: Option<u64>,
    /// A PDF's or an image's pages, and those without a text layer, once surveyed
    /// ([`survey`]); a scan is priced by them.
    pub pages: Option<u32>,
    pub scanned_pages: Option<u32>,
}

impl UploadCheck {
    /// A check for one file of at most `limit` bytes.
    pub fn new(file_name: Option<&str>, limit: u64) -> UploadCheck {
        UploadCheck {
            limit,
            max_document_tokens: None,
            name: file_name.map(display_name),
            size: 0,
            hasher: Sha256::new(),
            head: Vec::new(),
            undecided: Vec::new(),
            doc_type: None,
            utf8: Utf8Stream::default(),
            markup: MarkupScan::default(),
            tally: TokenTally::default(),
        }
    }

    /// Also refuse a text longer than the document ceiling (`max_document_tokens`), as soon
    /// as its bytes pass it, before they are stored. A PDF's text is only known once read, so
    /// the worker checks it then.
    pub fn with_ceiling(mut self, max_document_tokens: Option<u64>) -> UploadCheck {
        self.max_document_tokens = max_document_tokens;
        self
    }

    /// `TooManyTokens` once a text's tokens, as counted so far, are past the document ceiling
    /// (a page's markup counts too, so its text is checked once read instead).
    fn check_context(&self) -> Result<()> {
        let (Some(ceiling), Some(doc_type)) = (self.max_document_tokens, self.doc_type) else {
            return Ok(());
        };
        if doc_type.is_text() && self.tally.so_far() + capacity::PROMPT_OVERHEAD_TOKENS > ceiling {
            return Err(EngineError::TooManyTokens { max_tokens: ceiling });
        }
        Ok(())
    }

    /// Check the next chunk: `TooLarge` past the cap, `UnsupportedType` once the type is known
    /// to be wrong or text turns out not to be UTF-8.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.size += chunk.len() as u64;
        if self.size > self.limit {
            return Err(EngineError::TooLarge { limit_bytes: self.limit });
        }
        self.check_context()?;
        self.hasher.update(chunk);
        match self.doc_type {
            None => {
                let wanted = SNIFF_BYTES - self.head.len();
                self.head.extend_from_slice(&chunk[..chunk.len().min(wanted)]);
                self.undecided.extend_from_slice(chunk);
                if self.head.len() >= SNIFF_BYTES {
                    self.decide()?;
                }
            }
            Some(doc_type) if doc_type.is_text() => self.check_text(chunk)?,
            // A page is read in the sandbox, but its tokens are counted as they come.
            Some(DocType::Html) => self.tally.push(chunk),
            Some(_) => {}
        }
        Ok(())
    }

    /// Decide the type from the head, and check what came before as UTF-8 if it is text.
    fn decide(&mut self) -> Result<()> {
        let doc_type = sniff(&self.head).map_err(EngineError::UnsupportedType)?;
        let undecided = std::mem::take(&mut self.undecided);
        self.doc_type = Some(doc_type);
        if doc_type.is_text() {
            self.check_text(&undecided)?;
        } else if doc_type == DocType::Html {
            self.tally.push(&undecided);
        }
        self.check_context()
    }

    /// Whether this upload's tokens are counted as it streams in: a text's, and a page's
    /// (markup and all: more than its text, so a safe price to hold until it is read).
    fn counts_tokens(&self) -> bool {
        self.doc_type.is_some_and(|t| t.is_text() || t == DocType::Html)
    }

    /// Text must be UTF-8 to its last byte and carry no markup anywhere.
    fn check_text(&mut self, chunk: &[u8]) -> Result<()> {
        self.utf8.push(chunk).map_err(EngineError::UnsupportedType)?;
        self.markup.push(chunk).map_err(EngineError::UnsupportedType)?;
        // Counted as it comes (a chunk's worth of CPU, as hashing it is), so the price and the
        // ceiling follow the tokens a provider will count, not four bytes a token.
        self.tally.push(chunk);
        self.check_context()
    }

    /// The upload ended: an empty file is `Invalid`; a text must not end mid-character.
    pub fn finish(mut self) -> Result<CheckedUpload> {
        if self.size == 0 {
            return Err(EngineError::Invalid("the file is empty".into()));
        }
        if self.doc_type.is_none() {
            self.decide()?;
        }
        let doc_type = self.doc_type.expect("decided above");
        let tokens = if !self.counts_tokens() {
            None
        } else {
            if doc_type.is_text() {
                self.utf8.finish().map_err(EngineError::UnsupportedType)?;
            }
            let tokens = std::mem::take(&mut self.tally).finish();
            let ceiling = self.max_document_tokens.filter(|_| doc_type.is_text());
            if let Some(ceiling) = ceiling.filter(|c| tokens + capacity::PROMPT_OVERHEAD_TOKENS > *c) {
                return Err(EngineError::TooManyTokens { max_tokens: ceiling });
            }
            Some(tokens)
        };
        Ok(CheckedUpload {
            name: self.name,
            size: self.size,
            sha256: hex::encode(self.hasher.finalize()),
            doc_type,
            tokens,
            pages: None,
            scanned_pages: None,
        })
    }
}

impl CheckedUpload {
    /// What it is, as admission prices it.
    pub fn size(&self) -> DocumentSize {
        DocumentSize {
            doc_type: self.doc_type,
            bytes: self.size,
            tokens: self.tokens,
            scanned_pages: self.scanned_pages.unwrap_or(0),
        }
    }

    /// Its provider request's input tokens: a text's counted, a PDF's estimated from its size.
    pub fn estimated_tokens(&self) -> u64 {
        self.size().input_tokens()
    }
}

/// Pure: keep a user's file name only as display text: no paths, no control characters, short.
pub fn display_name(raw: &str) -> String {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    if clean.trim().is_empty() {
        "document".into()
    } else {
        clean.trim().to_string()
    }
}

/// What the user asked to be done with the document.
#[derive(Clone, Debug, PartialEq)]
pub struct UploadOptions {
    pub preset: Preset,
    /// Target language for `translate`.
    pub language: Option<String>,
    /// Where to report the job's ending (checked by [`crate::webhooks::completion::for_upload`];
    /// not part of the idempotency key: it says where to tell, not what to do).
    pub callback_url: Option<String>,
    /// When the user needs it done (not part of the idempotency key either: the same work).
    pub due_by: Option<chrono::DateTime<chrono::Utc>>,
    /// The user asked for the urgent lane.
    pub urgent: bool,
    /// The user asked for the economy lane: done through the provider's batch API within its
    /// window, at its discount.
    pub economy: bool,
    /// A translation's glossary (pasted, a file's, or saved: merged by
    /// [`UploadOptions::resolve_glossary`]) and formality.
    pub guidance: super::glossary::Guidance,
    /// A glossary saved in the account, by name, to use (under the pasted one's entries).
    pub glossary_name: Option<String>,
    /// Save the pasted glossary in the account under this name.
    pub save_glossary_as: Option<String>,
    /// A translation into several languages: those after `language`, each its own job.
    pub also_into: Vec<String>,
    /// The language a scan is read in by OCR (checked against the operator's list).
    pub document_language: Option<String>,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            preset: Preset::Summarize,
            language: None,
            callback_url: None,
            due_by: None,
            urgent: false,
            economy: false,
            guidance: Default::default(),
            glossary_name: None,
            save_glossary_as: None,
            also_into: Vec::new(),
            document_language: None,
        }
    }
}

/// How far ahead a deadline may be (a year: further is a typo, not a plan).
pub const MAX_DUE_AHEAD: chrono::TimeDelta = chrono::TimeDelta::days(366);

/// Pure: a deadline in RFC 3339 (`2026-12-05T17:00:00Z`, or with an offset): none when empty,
/// else after `now` and within [`MAX_DUE_AHEAD`].
pub fn parse_due_by(value: &str, now: chrono::DateTime<chrono::Utc>) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let due = chrono::DateTime::parse_from_rfc3339(value)
        .map_err(|_| {
            EngineError::Invalid("due_by should be a date and time with its zone, like \"2026-12-05T17:00:00Z\"".into())
        })?
        .with_timezone(&chrono::Utc);
    if due <= now {
        return Err(EngineError::Invalid("due_by is in the past; give a time still to come".into()));
    }
    if due - now > MAX_DUE_AHEAD {
        return Err(EngineError::Invalid("due_by is more than a year ahead".into()));
    }
    Ok(Some(due))
}

/// Pure: a yes or no of a form (`true`/`false`, `1`/`0`, `on`/`off`, or empty for no).
pub fn parse_flag(name: &str, value: &str) -> Result<bool> {
    match value.trim() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "" | "false" | "0" | "off" | "no" => Ok(false),
        _ => Err(EngineError::Invalid(format!("{name} should be true or false"))),
    }
}

/// Pure: the lane a form asks for: `economy` (through the provider's batch API, at its
/// discount) or `standard` (the default).
pub fn parse_lane(value: &str) -> Result<bool> {
    match value.trim() {
        "economy" => Ok(true),
        "" | "standard" => Ok(false),
        _ => Err(EngineError::Invalid("lane is standard or economy".into())),
    }
}

/// The language a translation is into when the upload names none (as most translation APIs
/// default to their most asked-for target).
pub const DEFAULT_TARGET_LANGUAGE: &str = "English";

/// Pure: a preset by its form name exactly, or a message listing the names.
pub fn parse_preset(value: &str) -> Result<Preset> {
    Preset::parse(value).ok_or_else(|| {
        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.as_str()).collect();
        EngineError::Invalid(format!("unknown preset {value:?}; use one of {}", names.join(", ")))
    })
}

/// Pure: a language name: none when empty, else 1 to 40 characters, no control characters,
/// not blank at either end (what the API's contract says, so a fuzzer finds no gap).
pub fn parse_language(value: &str) -> Result<Option<String>> {
    if value.is_empty() {
        return Ok(None);
    }
    let count = value.chars().count();
    if count > 40 || value.chars().any(|c| c.is_control()) || value.trim().chars().count() != count {
        return Err(EngineError::Invalid("the language should be a name like \"German\"".into()));
    }
    Ok(Some(value.to_string()))
}

/// The most languages one upload is translated into.
pub const MAX_LANGUAGES: usize = 10;

/// Pure: a comma-separated list of 1 to [`MAX_LANGUAGES`] languages, each as
/// [`parse_language`] takes it, none twice.
pub fn parse_languages(value: &str) -> Result<Vec<String>> {
    let mut languages: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(language) = parse_language(name)? else { continue };
        if languages.iter().any(|l| l.to_lowercase() == language.to_lowercase()) {
            return Err(EngineError::Invalid(format!("{language} is named twice")));
        }
        languages.push(language);
    }
    match languages.len() {
        0 => Err(EngineError::Invalid("languages should name one language or more, comma-separated".into())),
        n if n > MAX_LANGUAGES => {
            Err(EngineError::Invalid(format!("a translation names at most {MAX_LANGUAGES} languages, not {n}")))
        }
        _ => Ok(languages),
    }
}

impl UploadOptions {
    /// The same options for `language` (one more of an upload's languages).
    pub fn into_language(&self, language: &str) -> UploadOptions {
        UploadOptions {
            language: Some(language.to_string()),
            also_into: Vec::new(),
            save_glossary_as: None,
            ..self.clone()
        }
    }

    /// Pure: can this server do what was asked? `offered` are the presets its provider supports.
    /// A translation that names no language is into [`DEFAULT_TARGET_LANGUAGE`].
    pub fn complete(&mut self, offered: &[Preset]) -> Result<()> {
        if !offered.contains(&self.preset) {
            return Err(EngineError::Invalid(format!(
                "\"{}\" needs a language model, and this server has none configured",
                self.preset.label()
            )));
        }
        if self.preset == Preset::Translate && self.language.is_none() {
            self.language = Some(DEFAULT_TARGET_LANGUAGE.to_string());
        }
        if self.preset != Preset::Translate && !self.also_into.is_empty() {
            return Err(EngineError::Invalid("several languages are for translations only".into()));
        }
        let glossary_asked = self.glossary_name.is_some() || self.save_glossary_as.is_some();
        if self.preset != Preset::Translate && (!self.guidance.is_empty() || glossary_asked) {
            return Err(EngineError::Invalid("a glossary and a formality are for translations only".into()));
        }
        Ok(())
    }

    /// The economy lane is asked for only where it is offered, and never with what it cannot
    /// keep: the urgent lane or a deadline (it answers within its window, not sooner).
    pub fn check_lane(&self, economy_offered: bool) -> Result<()> {
        match (self.economy, economy_offered) {
            (false, _) => Ok(()),
            (true, false) => Err(EngineError::Invalid(
                "the economy lane needs a provider with a batch API, and this server has none configured".into(),
            )),
            (true, true) if self.urgent => {
                Err(EngineError::Invalid("a document is urgent or in the economy lane, not both".into()))
            }
            (true, true) if self.due_by.is_some() => Err(EngineError::Invalid(
                "an economy document is done within the lane's window; a deadline is for the standard lane".into(),
            )),
            (true, true) => Ok(()),
        }
    }

    /// The glossary in full: a saved one named (its entries under the pasted ones). An unknown
    /// name is refused, and so is a name to save under with nothing pasted.
    pub async fn resolve_glossary(&mut self, pool: &PgPool, owner: i64) -> Result<()> {
        if self.save_glossary_as.is_some() && self.guidance.glossary.is_empty() {
            return Err(EngineError::Invalid("save_glossary_as needs a glossary to save".into()));
        }
        if let Some(name) = &self.glossary_name {
            let saved = super::glossaries::get(pool, owner, name).await.map_err(|e| match e {
                EngineError::NotFound => EngineError::Invalid(format!("you have no glossary named {name:?}")),
                other => other,
            })?;
            self.guidance.glossary = super::glossary::merged(&self.guidance.glossary, &saved);
        }
        Ok(())
    }

    /// Save the pasted glossary under its name, when asked (once the upload is admitted: a
    /// refused upload saves nothing). Its entries are the pasted ones only.
    pub async fn save_glossary(&self, pool: &PgPool, owner: i64, pasted: &[super::glossary::Entry]) -> Result<()> {
        match &self.save_glossary_as {
            Some(name) => super::glossaries::save(pool, owner, name, pasted).await,
            None => Ok(()),
        }
    }

    /// Pure: the idempotency key: same bytes and same options are the same job (a glossary or
    /// a formality makes another translation).
    pub fn content_key(&self, upload: &CheckedUpload) -> String {
        self.content_key_of(&upload.sha256)
    }

    /// Pure: [`Self::content_key`] of the document whose bytes hash to `sha256`.
    pub fn content_key_of(&self, sha256: &str) -> String {
        let mut key = format!("{sha256}:{}:{}", self.preset.as_str(), self.language.as_deref().unwrap_or(""));
        // The economy lane is other work (other price, other time): not a duplicate.
        if self.economy {
            key.push_str(":economy");
        }
        // A scan read in another language is another reading.
        if let Some(language) = &self.document_language {
            key.push_str(&format!(":ocr={language}"));
        }
        match self.guidance.digest() {
            digest if digest.is_empty() => key,
            digest => format!("{key}:{digest}"),
        }
    }
}

/// An upload that passed every check and is stored under a fresh key.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredUpload {
    pub key: String,
    pub upload: CheckedUpload,
}

/// Check an upload while streaming it into blob storage, so memory is bounded by a chunk and
/// a blob part, never by the file. A refused or broken upload leaves no blob behind.
/// `check` says what the upload may be ([`UploadCheck::new`], [`UploadCheck::with_ceiling`]).
pub async fn receive<S, E>(blobs: &Blobs, mut check: UploadCheck, body: S) -> Result<StoredUpload>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let key = Blobs::new_key();
    let mut writer = blobs.writer(&key).await?;
    let streamed = stream_checked(&mut check, body, Keep::Blob(&mut writer)).await;
    if let Err(e) = streamed {
        writer.abort().await;
        return Err(e);
    }
    match check.finish() {
        Ok(upload) => {
            writer.finish().await?;
            Ok(StoredUpload { key, upload })
        }
        Err(e) => {
            writer.abort().await;
            Err(e)
        }
    }
}

/// The most of a PDF or an image an estimate holds in memory for its [`survey`]: a larger one
/// is estimated by its size (its upload is surveyed from the store). Estimates run 32 at once.
pub const MAX_SURVEYED_IN_MEMORY: usize = 16 << 20;

/// The same checks as [`receive`], storing nothing: what an upload would be (its type, size
/// and tokens), for an estimate before it is sent for good. A PDF's or an image's bytes are
/// kept (up to [`MAX_SURVEYED_IN_MEMORY`]) for its [`survey`].
pub async fn measure<S, E>(mut check: UploadCheck, body: S) -> Result<(CheckedUpload, Option<Bytes>)>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut kept = Some(Vec::new());
    stream_checked(&mut check, body, Keep::InMemory(&mut kept)).await?;
    let checked = check.finish()?;
    let kept = kept.filter(|_| checked.doc_type.has_pages()).map(Bytes::from);
    Ok((checked, kept))
}

/// Where checked bytes go: into blob storage, or memory while they may be a scan's.
enum Keep<'a> {
    Blob(&'a mut BlobWriter),
    /// None once it is known not to be surveyed.
    InMemory(&'a mut Option<Vec<u8>>),
}

impl Keep<'_> {
    async fn write(&mut self, doc_type: Option<DocType>, bytes: &[u8]) -> Result<()> {
        match self {
            Keep::Blob(writer) => writer.write(bytes).await,
            // Text is never surveyed: only a document that may be a scan is held (its size is
            // already within the upload's cap).
            Keep::InMemory(kept) => {
                let fits = kept.as_ref().is_some_and(|k| k.len() + bytes.len() <= MAX_SURVEYED_IN_MEMORY);
                match kept {
                    Some(held) if fits && doc_type.is_none_or(DocType::has_pages) => held.extend_from_slice(bytes),
                    // Text, or too large: not surveyed, and nothing more is held.
                    _ => **kept = None,
                }
                Ok(())
            }
        }
    }
}

/// Feed `body` through `check`, writing each checked piece to `keep` if given. UTF-16 and Latin-1 text
/// become UTF-8 before the checks see them (the bounds apply to what is stored).
async fn stream_checked<S, E>(check: &mut UploadCheck, mut body: S, mut keep: Keep<'_>) -> Result<()>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut text = Transcoder::default();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| EngineError::Invalid(format!("the upload broke off: {e}")))?;
        if let Some(utf8) = text.push(chunk).map_err(EngineError::UnsupportedType)? {
            check.push(&utf8)?;
            keep.write(check.doc_type, &utf8).await?;
        }
    }
    if let Some(utf8) = text.finish().map_err(EngineError::UnsupportedType)? {
        check.push(&utf8)?;
        keep.write(check.doc_type, &utf8).await?;
    }
    Ok(())
}

/// What a checked upload costs: the price table at its estimated tokens, settled once its
/// bytes are in (the estimate before reading, from the declared size, was only a hint).
pub fn price(config: &AdmissionConfig, upload: &CheckedUpload, preset: Preset, economy: bool) -> i64 {
    document_price(config, upload.size(), preset, economy).1
}

/// A stored document's estimated input tokens and what admission charges: its price, or for a
/// PDF the price held until its text is read (see [`document_price_by_size`]).
/// The price covers what the provider bills: a translation's answer too
/// ([`capacity::billed_tokens`]).
/// In the economy lane, at its terms' discount.
pub fn document_price(config: &AdmissionConfig, size: DocumentSize, preset: Preset, economy: bool) -> (u64, i64) {
    let tokens = size.input_tokens();
    if size.is_scan() {
        return (tokens, scan_price(config, size, preset, economy));
    }
    let priced = settlement::hold_tokens(size_kind(size.doc_type), tokens, config.max_document_tokens);
    (tokens, in_lane(config, config.prices.price(capacity::billed_tokens(preset, priced)), economy))
}

/// A price in the interactive lane as the lane asked for charges it.
pub fn in_lane(config: &AdmissionConfig, credits: i64, economy: bool) -> i64 {
    match config.economy.filter(|_| economy) {
        Some(terms) => terms.price(credits),
        None => credits,
    }
}

/// A document's price by its size alone: what a PDF costs if its text is never read (an
/// unreadable one past the day's allowance), before it is settled to its text.
pub fn document_price_by_size(config: &AdmissionConfig, size: DocumentSize, preset: Preset, economy: bool) -> i64 {
    if size.is_scan() {
        return scan_price(config, size, preset, economy);
    }
    in_lane(config, config.prices.price(capacity::billed_tokens(preset, size.input_tokens())), economy)
}

/// A surveyed scan's price: its text layer by its tokens, its scanned pages by page.
fn scan_price(config: &AdmissionConfig, size: DocumentSize, preset: Preset, economy: bool) -> i64 {
    let text_tokens = size.tokens.unwrap_or(0).saturating_add(capacity::PROMPT_OVERHEAD_TOKENS);
    in_lane(config, config.prices.scanned_document_price(preset, text_tokens, size.scanned_pages), economy)
}

/// The longest a survey may take (wall clock and CPU) before its upload is priced by size.
pub const SURVEY_WALL_CLOCK: std::time::Duration = std::time::Duration::from_secs(15);
/// The longest an upload waits for a reader to survey it.
pub const SURVEY_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Survey a stored or measured PDF or image in the sandboxed reader: its pages, those without a
/// text layer (scans, read by OCR and priced by page) and its text layer's tokens. A PDF the
/// survey cannot read is priced by its size as before (its job says why it cannot be read); an
/// image it cannot read (damaged, or past its bounds: a decompression bomb) is refused, and a
/// scan where no OCR is installed is refused in words, before anything is charged.
pub async fn survey(reader: &super::sandbox::SandboxConfig, upload: &mut CheckedUpload, bytes: Bytes) -> Result<()> {
    if !upload.doc_type.has_pages() {
        return Ok(());
    }
    // Quicker than a job's reading: a PDF that takes longer is priced by its size, and its job
    // reads it within the reader's own bounds.
    // An upload waits a few seconds at most for a reader: surveys have slots of their own.
    let mut quick = reader.clone();
    quick.wall_clock = quick.wall_clock.min(SURVEY_WALL_CLOCK);
    quick.cpu_secs = quick.cpu_secs.min(SURVEY_WALL_CLOCK.as_secs());
    quick.turn_wait = Some(SURVEY_TURN_WAIT);
    let extracted = match super::sandbox::extract_in_child(&quick, upload.doc_type, bytes).await {
        Ok(extracted) => extracted,
        // A photo is priced by its survey alone: without one, it is asked for again shortly.
        Err(e) if upload.doc_type.is_image() && e.message == super::sandbox::READERS_BUSY => {
            return Err(EngineError::ReadersBusy { retry_after_secs: SURVEY_TURN_WAIT.as_secs().max(1) });
        }
        Err(e) if upload.doc_type.is_image() => return Err(EngineError::Invalid(e.message)),
        Err(_) => return Ok(()),
    };
    if extracted.scanned.is_empty() {
        return Ok(());
    }
    match &reader.ocr {
        None if extracted.text.trim().is_empty() => {
            return Err(EngineError::Invalid(super::ocr::no_ocr_error().message));
        }
        Some(ocr) if extracted.scanned.len() as u32 > ocr.max_pages => {
            return Err(EngineError::Invalid(super::ocr::too_many_pages(
                extracted.scanned.len() as u32,
                ocr.max_pages,
            )));
        }
        _ => {}
    }
    let text = extracted.text;
    upload.tokens = Some(tokens::count_off_runtime(text).await);
    upload.pages = extracted.pages;
    upload.scanned_pages = Some(extracted.scanned.len() as u32);
    Ok(())
}

/// What a document's first claim reserves from the token budget: all of it, or its first
/// part's worth when it is longer than one call.
fn first_claim_tokens(config: &AdmissionConfig, tokens: u64) -> i64 {
    tokens.min(config.max_call_tokens.unwrap_or(u64::MAX)).min(i64::MAX as u64) as i64
}

/// A stored upload on its way into the queue.
pub struct Intake<'a> {
    pub user_id: i64,
    pub stored: StoredUpload,
    pub options: UploadOptions,
    /// A REST client's `Idempotency-Key`, if sent.
    pub client_key: Option<String>,
    pub admission: &'a AdmissionConfig,
    /// Where to report the job's ending, already checked.
    pub callback: Option<Callback>,
    /// How long it should run once started (for its deadline: see [`super::estimate::expected_run`]).
    pub expected_run: std::time::Duration,
}

impl UploadOptions {
    /// Its lane and deadline, for a document of `tokens` expected to run `expected_run`.
    pub fn lane(&self, tokens: u64, expected_run: std::time::Duration) -> crate::queue::LaneRequest {
        crate::queue::LaneRequest {
            urgent: self.urgent,
            document_tokens: tokens.min(i64::MAX as u64) as i64,
            due_by: self.due_by,
            expected_run,
        }
    }
}

/// Admit a stored upload. A refused, failed or duplicate upload's blob is deleted.
pub async fn submit(pool: &PgPool, blobs: &Blobs, intake: Intake<'_>) -> Result<Admission> {
    let StoredUpload { key, upload } = intake.stored;
    let content_key = intake.options.content_key(&upload);
    let job = DocumentJob {
        document: DocumentRef {
            key: key.clone(),
            doc_type: upload.doc_type,
            sha256: upload.sha256.clone(),
            size: upload.size,
            name: upload.name.clone(),
            tokens: upload.tokens,
            scanned_pages: upload.scanned_pages,
        },
        document_language: intake.options.document_language.clone(),
        preset: intake.options.preset,
        language: intake.options.language.clone(),
        guidance: intake.options.guidance.clone(),
        economy: intake.options.economy,
        economy_discount: intake.admission.economy.filter(|_| intake.options.economy).map(|t| t.discount),
    };
    let mut payload = serde_json::to_value(job).expect("a document job serialises");
    if let Some(callback) = &intake.callback {
        payload["callback"] = serde_json::to_value(callback).expect("a callback serialises");
    }
    let submission = Submission {
        shared_document: None,
        user_id: intake.user_id,
        payload,
        fingerprint: content_key.clone(),
        content_key,
        client_key: intake.client_key,
        cost: price(intake.admission, &upload, intake.options.preset, intake.options.economy),
        est_input_tokens: first_claim_tokens(intake.admission, upload.estimated_tokens()),
        price_by_size: Some(document_price_by_size(
            intake.admission,
            upload.size(),
            intake.options.preset,
            intake.options.economy,
        )),
        lane: intake.options.lane(upload.estimated_tokens(), intake.expected_run),
    };
    let admitted = admission::submit(pool, intake.admission, &submission).await;
    if !matches!(admitted, Ok(Admission::Accepted { .. })) {
        // Refused, failed or a duplicate: this upload's bytes are not needed, unless the
        // admission committed after all (its answer lost): checked under the document's lock.
        if let Err(e) = crate::documents::sweep::delete_if_unneeded(pool, blobs, &key).await {
            tracing::warn!(%key, error = %e, "could not delete a refused upload's file; the orphan sweep will");
        }
    }
    admitted
}

/// "Run again": the user means to process a document of theirs again (another preset, or
/// after a cancel), so this is a new job with a new debit, never a duplicate of the earlier one
/// (DESIGN: idempotency). It shares the stored document (no copy of its bytes); the document is
/// deleted once no job naming it needs it. `Err(NotFound)` when the document is no longer kept.
pub async fn run_again(
    pool: &PgPool,
    admission: &AdmissionConfig,
    user_id: i64,
    earlier: &serde_json::Value,
    options: &UploadOptions,
) -> Result<Admission> {
    // Its own key: asked for explicitly, so never the earlier job again.
    share_document(pool, admission, user_id, earlier, options, format!("again:{}", Blobs::new_key())).await
}

/// One upload's translation into one more of its languages: a job of its own on the same
/// stored document (no copy), priced on its own, and keyed as an upload of it in that
/// language is (the same upload sent again finds it).
pub async fn also_into(
    pool: &PgPool,
    admission: &AdmissionConfig,
    user_id: i64,
    earlier: &serde_json::Value,
    options: &UploadOptions,
) -> Result<Admission> {
    let job: DocumentJob = serde_json::from_value(earlier.clone())
        .map_err(|_| EngineError::Invalid("only a document job has languages".into()))?;
    let key = options.content_key_of(&job.document.sha256);
    let mut admitted = share_document(pool, admission, user_id, earlier, options, key).await;
    // Its ending is reported where the first language's is.
    if let (Ok(Admission::Accepted { job_id }), Some(callback)) = (&admitted, earlier.get("callback")) {
        let set = sqlx::query("UPDATE jobs SET payload = jsonb_set(payload, '{callback}', $2) WHERE id = $1")
            .bind(job_id)
            .bind(callback)
            .execute(pool)
            .await;
        if let Err(e) = set {
            admitted = Err(e.into());
        }
    }
    admitted
}

/// A new job on the document of `earlier`'s job, as `options` say, under `content_key`.
async fn share_document(
    pool: &PgPool,
    admission: &AdmissionConfig,
    user_id: i64,
    earlier: &serde_json::Value,
    options: &UploadOptions,
    content_key: String,
) -> Result<Admission> {
    let job: DocumentJob = serde_json::from_value(earlier.clone())
        .map_err(|_| EngineError::Invalid("only a document job can be run again".into()))?;
    let (tokens, cost) = document_price(admission, job.document.size_for_price(), options.preset, options.economy);
    // Refused before anything is copied (a user out of credits copies nothing).
    if let Some(refusal) = admission::precheck(pool, admission, user_id, cost, 0).await? {
        return Ok(Admission::Refused(refusal));
    }
    // The same stored document, not a copy: it is shared by the jobs that name it, and kept
    // while one of them needs it (`sweep::delete_if_unneeded`).
    let key = job.document.key.clone();
    let again = DocumentJob {
        preset: options.preset,
        language: options.language.clone(),
        guidance: options.guidance.clone(),
        economy: options.economy,
        economy_discount: admission.economy.filter(|_| options.economy).map(|t| t.discount),
        ..job
    };
    let submission = Submission {
        user_id,
        payload: serde_json::to_value(&again).expect("a document job serialises"),
        fingerprint: format!("again:{key}"),
        content_key,
        client_key: None,
        cost,
        est_input_tokens: first_claim_tokens(admission, tokens),
        shared_document: Some(key),
        price_by_size: Some(document_price_by_size(
            admission,
            again.document.size_for_price(),
            again.preset,
            again.economy,
        )),
        lane: options.lane(tokens, std::time::Duration::ZERO),
    };
    admission::submit(pool, admission, &submission).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pdf_is_charged_a_hold_of_its_worst_case_and_a_text_its_price() {
        let config = AdmissionConfig { prices: capacity::PriceTable::default(), ..AdmissionConfig::default() };
        // 600 KB of PDF suggests 15K tokens (1 credit); its hold is priced at 120K (4 credits).
        assert_eq!(document_price(&config, by_size(DocType::Pdf, 600_000), Preset::Summarize, false), (15_040, 4));
        assert_eq!(document_price_by_size(&config, by_size(DocType::Pdf, 600_000), Preset::Summarize, false), 1);
        // A text's price is its price: nothing held.
        assert_eq!(
            document_price(&config, by_size(DocType::PlainText, 60_000), Preset::Summarize, false).1,
            document_price_by_size(&config, by_size(DocType::PlainText, 60_000), Preset::Summarize, false)
        );
        // A Word file suggests a token per 2 bytes: 30 KB is 15K tokens, held at 120K as well;
        // a page's markup already overstates its text, so it is held at its estimate alone.
        assert_eq!(document_price(&config, by_size(DocType::Docx, 30_000), Preset::Summarize, false), (15_040, 4));
        assert_eq!(document_price(&config, by_size(DocType::Odt, 30_000), Preset::Summarize, false).1, 4);
        assert_eq!(document_price(&config, by_size(DocType::Html, 60_000), Preset::Summarize, false), (15_040, 1));
        // The hold never passes the document ceiling.
        let capped = AdmissionConfig { max_document_tokens: Some(50_000), ..config };
        assert_eq!(document_price(&capped, by_size(DocType::Pdf, 600_000), Preset::Summarize, false).1, 2);
    }

    fn by_size(doc_type: DocType, bytes: u64) -> DocumentSize {
        DocumentSize { doc_type, bytes, tokens: None, scanned_pages: 0 }
    }

    #[test]
    fn a_text_is_priced_by_its_tokens_counted_as_it_streams_in_not_four_bytes_a_token() {
        // 24,000 emoji: 96 KB, "24K tokens" at four bytes a token (1 credit), far more counted.
        let emoji = "🎉🚀🧪🦀".repeat(6_000);
        let checked = check_in_chunks(emoji.as_bytes(), 4_096, 1 << 20).unwrap();
        let counted = checked.tokens.unwrap();
        assert_eq!(counted, crate::documents::tokens::count(&emoji));
        assert!(counted > emoji.len() as u64 / 4, "{counted} tokens in {} bytes", emoji.len());
        let config = AdmissionConfig { prices: capacity::PriceTable::default(), ..AdmissionConfig::default() };
        assert_eq!(
            document_price_by_size(&config, by_size(DocType::PlainText, emoji.len() as u64), Preset::Summarize, false),
            1
        );
        assert!(price(&config, &checked, Preset::Summarize, false) >= 2, "priced by what the provider counts");
        // The ceiling is held to the counted tokens too, as the bytes arrive.
        let mut check = UploadCheck::new(Some("a.txt"), 1 << 20).with_ceiling(Some(10_000));
        let refused = emoji.as_bytes().chunks(4_096).try_for_each(|part| check.push(part));
        assert!(matches!(refused, Err(EngineError::TooManyTokens { max_tokens: 10_000 })), "{refused:?}");
    }

    fn check_in_chunks(bytes: &[u8], chunk: usize, limit: u64) -> Result<CheckedUpload> {
        let mut check = UploadCheck::new(Some("a.txt"), limit);
        for part in bytes.chunks(chunk) {
            check.push(part)?;
        }
        check.finish()
    }

    #[tokio::test]
    async fn an_estimate_holds_a_pdf_for_its_survey_but_never_text_or_more_than_its_bound() {
        let chunks = |bytes: Vec<u8>| {
            futures::stream::iter(
                bytes.chunks(64 * 1024).map(|c| Ok::<_, String>(Bytes::copy_from_slice(c))).collect::<Vec<_>>(),
            )
        };
        let pdf = b"%PDF-1.7\n\xff binary".to_vec();
        let (checked, kept) = measure(UploadCheck::new(None, 1 << 30), chunks(pdf.clone())).await.unwrap();
        assert_eq!((checked.doc_type, kept.as_deref()), (DocType::Pdf, Some(&pdf[..])));
        let text = "plain words ".repeat(2_000).into_bytes();
        assert_eq!(measure(UploadCheck::new(None, 1 << 30), chunks(text)).await.unwrap().1, None);
        let mut large = b"%PDF-1.7\n".to_vec();
        large.resize(MAX_SURVEYED_IN_MEMORY + 1, b' ');
        let (checked, kept) = measure(UploadCheck::new(None, 1 << 30), chunks(large)).await.unwrap();
        assert_eq!((checked.doc_type, kept), (DocType::Pdf, None), "past the bound it is priced by its size");
    }

    #[test]
    fn a_scan_is_priced_by_its_pages_and_its_text_pages_by_their_text() {
        let pdf = CheckedUpload {
            name: None,
            size: 2_000_000,
            sha256: String::new(),
            doc_type: DocType::Pdf,
            tokens: Some(0),
            pages: Some(40),
            scanned_pages: Some(40),
        };
        // 40 pages at 0.3 credits, and no text layer: 12 credits, not 2 MB of PDF's hold.
        let config = AdmissionConfig { prices: capacity::PriceTable::default(), ..AdmissionConfig::default() };
        assert_eq!(price(&config, &pdf, Preset::Translate, false), 12);
        assert_eq!(document_price_by_size(&config, pdf.size(), Preset::Translate, false), 12);
        // Its text pages by their text: 30K tokens translated is 60K billed, 2 credits more.
        let mixed = CheckedUpload { tokens: Some(30_000), ..pdf };
        assert_eq!(price(&config, &mixed, Preset::Translate, false), 14);
    }

    #[test]
    fn file_names_are_display_text_only() {
        assert_eq!(display_name("../../etc/passwd"), "passwd");
        assert_eq!(display_name("C:\\Users\\me\\report.pdf"), "report.pdf");
        assert_eq!(display_name("a\u{0}b\nc.pdf"), "abc.pdf");
        assert_eq!(display_name("   "), "document");
    }

    #[test]
    fn uploads_are_checked_whatever_the_chunking() {
        let text = "Grüße aus Köln. ".repeat(2000);
        for chunk in [1, 3, 1000, 8192, 100_000] {
            let checked = check_in_chunks(text.as_bytes(), chunk, 1 << 20).unwrap();
            assert_eq!(checked.doc_type, DocType::PlainText);
            assert_eq!(checked.size, text.len() as u64);
            assert_eq!(checked.sha256, hex::encode(Sha256::digest(text.as_bytes())));
        }
        let mut bad = text.clone().into_bytes();
        bad.extend_from_slice(b"\xff\xfe tail");
        for chunk in [1, 7, 9000] {
            assert!(matches!(check_in_chunks(&bad, chunk, 1 << 20), Err(EngineError::UnsupportedType(_))));
        }
    }

    #[test]
    fn the_cap_empty_files_and_types_are_refused() {
        assert!(matches!(check_in_chunks(&[b'a'; 11], 4, 10), Err(EngineError::TooLarge { limit_bytes: 10 })));
        assert!(matches!(UploadCheck::new(None, 10).finish(), Err(EngineError::Invalid(_))));
        assert!(matches!(check_in_chunks(b"<svg><script>x()</script>", 4, 100), Err(EngineError::UnsupportedType(_))));
        // A page is taken as it comes (read in the sandbox): no text checks, no tokens counted.
        let page = check_in_chunks(b"<html><body>\xff<script>", 4, 100).unwrap();
        assert_eq!(page.doc_type, DocType::Html);
        assert!(page.tokens.is_some_and(|t| t > 0), "its tokens, markup and all, are counted for its price");
        let late_svg = format!("{}\n<svg onload=alert(1)>", "plain notes ".repeat(2000));
        assert!(matches!(check_in_chunks(late_svg.as_bytes(), 4096, 1 << 20), Err(EngineError::UnsupportedType(_))));
        let pdf = check_in_chunks(b"%PDF-1.7\n\xff\xfe binary", 5, 100).unwrap();
        assert_eq!(pdf.doc_type, DocType::Pdf);
    }

    #[test]
    fn options_are_checked_against_what_the_server_offers() {
        let local = [Preset::Summarize, Preset::KeyFacts];
        assert!(UploadOptions::default().complete(&local).is_ok());
        let translate = UploadOptions { preset: Preset::Translate, ..UploadOptions::default() };
        assert!(translate.clone().complete(&local).is_err());
        let mut into_english = translate.clone();
        into_english.complete(&Preset::ALL).unwrap();
        assert_eq!(into_english.language.as_deref(), Some("English"), "a translation names no language: English");
        let mut into_german = UploadOptions { language: Some("German".into()), ..translate };
        into_german.complete(&Preset::ALL).unwrap();
        // The economy lane: where offered, and not with the urgent lane or a deadline.
        assert_eq!(parse_lane("economy").unwrap(), true);
        assert_eq!(parse_lane(" standard ").unwrap(), false);
        assert!(parse_lane("cheap").is_err());
        let economy = UploadOptions { economy: true, ..UploadOptions::default() };
        assert!(economy.check_lane(true).is_ok());
        assert!(economy.check_lane(false).unwrap_err().to_string().contains("batch API"));
        assert!(UploadOptions { urgent: true, ..economy.clone() }.check_lane(true).is_err());
        assert!(UploadOptions { due_by: Some(chrono::Utc::now()), ..economy }.check_lane(true).is_err());
        assert_eq!(into_german.language.as_deref(), Some("German"));
        assert!(parse_preset("nope").is_err());
        assert_eq!(parse_language("").unwrap(), None);
        assert!(parse_language("  ").is_err(), "a blank name is no name");
        assert!(parse_language(" German").is_err());
        assert_eq!(parse_language("Brazilian Portuguese").unwrap().as_deref(), Some("Brazilian Portuguese"));
        assert!(parse_language(&"x".repeat(41)).is_err());
    }
}
