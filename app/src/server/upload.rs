//! The one upload path, for the upload server function and the REST API alike: per-user and
//! overall bounds, admission refused before the body is read, the multipart form read in
//! bounded memory and time, the file streamed through the engine's intake into storage, and
//! the job admitted. Callers only authenticate and shape the answer.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::HeaderMap;

use engine::accounts::admission::{self, Admission, Refusal};
use engine::accounts::User;
use engine::documents::intake::{self, CheckedUpload, Intake, StoredUpload, UploadCheck, UploadOptions};
use engine::documents::sweep::PendingBlob;
use engine::documents::Blobs;
use engine::Preset;
use sluice_types::capacity::{estimate_input_tokens, SizeKind};

use super::session::ServerContext;
use crate::errors::AppError;

/// What an upload became.
#[derive(Clone, Debug)]
pub struct Uploaded {
    pub job_id: uuid::Uuid,
    /// The same client key was used before: this is the earlier job, nothing new was charged.
    pub duplicate: bool,
    /// Credits this upload took (0 for a duplicate).
    pub charged: i64,
    /// With a client key: when it stops naming this job.
    pub key_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A translation into several languages: its other languages' jobs, or why each was
    /// refused.
    pub also: Vec<crate::model::AlsoInto>,
}

impl Uploaded {
    /// Where its state is read.
    pub fn status_url(&self) -> String {
        format!("/api/v1/jobs/{}", self.job_id)
    }

    /// The answer the UI and programs get.
    pub fn reply(&self) -> crate::model::UploadReply {
        crate::model::UploadReply {
            id: self.job_id.to_string(),
            status_url: self.status_url(),
            duplicate: self.duplicate,
            charged: self.charged,
            idempotency_key_expires_at: self.key_expires_at.map(|at| at.to_rfc3339()),
            also: self.also.clone(),
        }
    }
}

/// The slowest average an upload may keep (bytes per second), judged once it has run this long:
/// 50 MiB at 10 KB/s is an hour and a half, longer than anyone waits.
/// Downloads are held to the same floor (their bytes taken by the client).
pub const MIN_RATE: u64 = 10_000;
pub const MIN_RATE_AFTER: Duration = Duration::from_secs(60);

/// Pure: whether `received` bytes in `elapsed` is below [`MIN_RATE`] (judged after [`MIN_RATE_AFTER`]).
pub fn too_slow(received: u64, elapsed: Duration) -> bool {
    elapsed > MIN_RATE_AFTER && received < MIN_RATE * elapsed.as_secs()
}
/// Side fields (`preset`, `language`) are short words: longer ones are refused unread.
const MAX_FIELD_BYTES: usize = 200;
/// `languages`: up to ten names of up to 40 characters, comma-separated.
const MAX_LANGUAGES_BYTES: usize = 10 * 42;
/// A form is a file and its options (at most one of each); a form with more parts is refused.
const MAX_PARTS: usize = 12;
/// The most a form's other bytes can take of its length (boundaries, part headers, the side
/// fields, a callback URL and a glossary): the rest of a declared length is the file.
const MAX_FORM_OVERHEAD: u64 = (16 << 10) + engine::documents::glossary::MAX_BYTES as u64;
/// Bytes handed to the parser while no field's data is being read: the preamble, boundaries
/// and part headers, plus the start of a field's data that arrives in the same network chunk
/// (a chunk can be a few hundred KiB). What the parser may buffer looking for a boundary.
const MAX_OUTSIDE_FIELDS: usize = 4 << 20;

/// The `Idempotency-Key` header, checked: 1 to 200 visible ASCII characters.
pub fn client_key(headers: &HeaderMap) -> Result<Option<String>, AppError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value.to_str().map_err(|_| AppError::invalid("the Idempotency-Key must be visible ASCII"))?.trim();
    if key.is_empty() || key.len() > 200 {
        return Err(AppError::invalid("the Idempotency-Key must have 1 to 200 characters"));
    }
    Ok(Some(key.to_string()))
}

/// Take `user`'s upload from `body` (a `multipart/form-data` body, per `headers`) to an
/// admitted job. Refusals that need no bytes (429, 402, 503) come before any is read. Each
/// outcome is counted (`sluice_uploads_total` by outcome: accepted, duplicate, or the status).
pub async fn upload<S, E>(
    ctx: &ServerContext,
    user: &User,
    token_id: Option<i64>,
    client: &str,
    headers: &HeaderMap,
    body: S,
) -> Result<Uploaded, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let uploaded = admit_upload(ctx, user, token_id, client, headers, body).await;
    let outcome = match &uploaded {
        Ok(Uploaded { duplicate: false, .. }) => "accepted".to_string(),
        Ok(Uploaded { duplicate: true, .. }) => "duplicate".to_string(),
        Err(e) => e.status().to_string(),
    };
    metrics::counter!("sluice_uploads_total", "outcome" => outcome).increment(1);
    if let Ok(Uploaded { duplicate: false, charged, .. }) = &uploaded {
        metrics::counter!("sluice_credits_debited_total").increment((*charged).max(0) as u64);
    }
    uploaded
}

async fn admit_upload<S, E>(
    ctx: &ServerContext,
    user: &User,
    token_id: Option<i64>,
    client: &str,
    headers: &HeaderMap,
    body: S,
) -> Result<Uploaded, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let client_key = client_key(headers)?;
    // A full store is known before a byte is read: waiting helps, reading would not.
    if ctx.blobs.is_full() {
        return Err(AppError::store_full());
    }
    let settings = &ctx.settings;
    let _turn = take_turn(ctx, user, client).await?;
    // Refuse before reading the file: a refused upload costs its headers, nothing more.
    let retried = match &client_key {
        Some(key) => {
            admission::client_key_used(&ctx.pool, user.id, key, settings.admission.client_key_lifetime).await?
        }
        None => false,
    };
    if let Some(refusal) = refusal_unread(ctx, user, headers).await? {
        // A retried key may get its earlier job back whatever the balance, so only an
        // overloaded intake refuses it unread; everyone else is refused here.
        if !retried || matches!(refusal, Refusal::Overloaded { .. }) {
            return Err(refusal.into());
        }
    }
    let form = paced_multipart(headers, body)?;
    let (FormFile::Stored(mut stored), mut options) =
        read_form(form, FileSink::Store(&ctx.blobs), form_rules(settings)).await?
    else {
        return Err(AppError::Internal);
    };
    // From here until a job names it, the stored file is deleted if this request ends any
    // other way (its client gone, the server shutting down).
    let pending = PendingBlob::new(&ctx.pool, &ctx.blobs, &stored.key);
    // A PDF or an image is surveyed: a scan is priced by its pages, and an image past its
    // bounds, or a scan where no OCR reads it, is refused before anything is charged.
    if let Err(e) = survey_stored(ctx, &mut stored).await {
        pending.delete().await;
        return Err(e);
    }
    // The pasted glossary (before a saved one is merged under it), saved once admitted.
    let pasted = options.guidance.glossary.clone();
    if let Err(e) = options.resolve_glossary(&ctx.pool, user.id).await {
        pending.delete().await;
        return Err(e.into());
    }
    // The callback (sent with the upload, or registered on the token) is checked before the
    // job exists; a refused one leaves no blob behind.
    let callback = engine::webhooks::completion::for_upload(
        &ctx.pool,
        &settings.webhook_policy,
        token_id,
        options.callback_url.as_deref(),
    )
    .await;
    let callback = match callback {
        Ok(callback) => callback,
        Err(e) => {
            pending.delete().await;
            return Err(e.into());
        }
    };
    let price = intake::price(&settings.admission, &stored.upload, options.preset, options.economy);
    let keyed = client_key.clone();
    // A deadline is kept by when the work must start: its expected run time before it.
    let expected_run = match options.due_by {
        Some(_) => {
            let tokens =
                intake::document_price(&settings.admission, stored.upload.size(), options.preset, options.economy).0;
            let settings = estimate_settings(ctx).await?;
            engine::documents::estimate::expected_run(&ctx.pool, &settings, tokens, options.preset).await?
        }
        None => Duration::ZERO,
    };
    let also_options = options.clone();
    let submission = Intake {
        user_id: user.id,
        stored,
        options,
        client_key,
        admission: &settings.admission,
        callback,
        expected_run,
    };
    let lifetime = settings.admission.client_key_lifetime;
    // Whatever admission answers, the stored file is its business now (kept by the job, or
    // deleted by the intake).
    let admitted = intake::submit(&ctx.pool, &ctx.blobs, submission).await;
    pending.keep();
    let (job_id, duplicate, charged) = match admitted? {
        Admission::Accepted { job_id } => (job_id, false, price),
        Admission::Existing { job_id } => (job_id, true, 0),
        Admission::Refused(refusal) => return Err(refusal.into()),
    };
    also_options.save_glossary(&ctx.pool, user.id, &pasted).await?;
    let key_expires_at = match keyed {
        Some(key) => admission::client_key_expires_at(&ctx.pool, job_id, &key, lifetime).await?,
        None => None,
    };
    let (also, also_charged) = also_into(ctx, user, job_id, &also_options).await?;
    Ok(Uploaded { job_id, duplicate, charged: charged + also_charged, key_expires_at, also })
}

/// Survey a stored upload that may be a scan (see [`intake::survey`]).
async fn survey_stored(ctx: &ServerContext, stored: &mut StoredUpload) -> Result<(), AppError> {
    let Some(reader) = &ctx.settings.survey_reader else { return Ok(()) };
    if !stored.upload.doc_type.has_pages() {
        return Ok(());
    }
    let bytes = ctx.blobs.get(&stored.key).await?;
    Ok(intake::survey(reader, &mut stored.upload, bytes).await?)
}

/// A translation's other languages, each its own job on the first one's document, admitted
/// (and priced) one by one: one refused (out of credits, too many in flight) does not undo the
/// others. Their answers, and the credits they took.
async fn also_into(
    ctx: &ServerContext,
    user: &User,
    first: uuid::Uuid,
    options: &intake::UploadOptions,
) -> Result<(Vec<crate::model::AlsoInto>, i64), AppError> {
    if options.also_into.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let payload: serde_json::Value = sqlx::query_scalar("SELECT payload FROM jobs WHERE id = $1")
        .bind(first)
        .fetch_one(&ctx.pool)
        .await
        .map_err(engine::EngineError::from)?;
    let (mut also, mut charged) = (Vec::new(), 0);
    for language in &options.also_into {
        let admission = &ctx.settings.admission;
        let options = options.into_language(language);
        let admitted = intake::also_into(&ctx.pool, admission, user.id, &payload, &options).await;
        let (id, refused) = match admitted {
            Ok(Admission::Accepted { job_id }) => {
                charged += sqlx::query_scalar::<_, i32>("SELECT cost FROM jobs WHERE id = $1")
                    .bind(job_id)
                    .fetch_one(&ctx.pool)
                    .await
                    .map_err(engine::EngineError::from)? as i64;
                (Some(job_id.to_string()), None)
            }
            Ok(Admission::Existing { job_id }) => (Some(job_id.to_string()), None),
            Ok(Admission::Refused(refusal)) => (None, Some(AppError::from(refusal).to_string())),
            Err(e) => (None, Some(AppError::from(e).to_string())),
        };
        also.push(crate::model::AlsoInto { language: language.clone(), id, refused });
    }
    Ok((also, charged))
}

/// Would `user` be refused before the body is read? The price is settled from the bytes; before
/// them, the declared length gives the least it can be (as if a PDF, the fewest tokens a byte),
/// so nobody is refused who could pay.
async fn refusal_unread(ctx: &ServerContext, user: &User, headers: &HeaderMap) -> Result<Option<Refusal>, AppError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let file_at_least = declared.saturating_sub(MAX_FORM_OVERHEAD);
    let admission = &ctx.settings.admission;
    // A scan is priced by its pages: a large photo of one page may cost a credit.
    let least_price =
        admission.prices.price(estimate_input_tokens(SizeKind::Pdf, file_at_least)).min(admission.prices.scan_price(1));
    Ok(admission::precheck(&ctx.pool, admission, user.id, least_price, file_at_least).await?)
}

/// A turn to send a body: one user's uploads at once are bounded, so one account cannot take
/// every slot (past it an upload waits its turn, unread, then gets 429), and so are all
/// uploads read at once (past it, a short wait, then 503).
async fn take_turn(
    ctx: &ServerContext,
    user: &User,
    client: &str,
) -> Result<(super::session::UserUpload, tokio::sync::OwnedSemaphorePermit), AppError> {
    let settings = &ctx.settings;
    let waiting_since = tokio::time::Instant::now();
    let mine = loop {
        if let Some(mine) = ctx.begin_upload(user.id, client) {
            break mine;
        }
        if waiting_since.elapsed() >= settings.busy_uploads_wait {
            return Err(AppError::TooManyUploads {
                limit: settings.max_uploads_per_user,
                retry_after_secs: settings.busy_uploads_wait.as_secs().max(1),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let slot = tokio::time::timeout(settings.busy_uploads_wait, ctx.uploads.clone().acquire_owned()).await;
    let Ok(Ok(slot)) = slot else {
        return Err(AppError::Overloaded { retry_after_secs: settings.busy_uploads_wait.as_secs().max(1) });
    };
    Ok((mine, slot))
}

/// What `user`'s upload in `body` (the same form as an upload) would cost and when it should
/// be done, read through the same checks and stored nowhere. Refused as the upload would be
/// (402, 429, 503, 507 before its body is read; 413, 415, 422 while reading it); nothing is
/// charged.
pub async fn estimate<S, E>(
    ctx: &ServerContext,
    user: &User,
    headers: &HeaderMap,
    body: S,
) -> Result<crate::model::Estimate, AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    // Refused as the upload would be, before a byte is read: a full store, then admission.
    if ctx.blobs.is_full() {
        return Err(AppError::store_full());
    }
    // Its own small rate and slots: estimates never hold uploads' slots or crowd them out.
    // A slot first (a refusal for want of one does not spend the rate), then the rate: per
    // account, not per address (many honest accounts share an office's address, and an
    // estimate costs little now that it reads one counter).
    let _turn = ctx.begin_estimate(user.id)?;
    let key = format!("estimate:user:{}", user.id);
    engine::accounts::throttle::take(&ctx.pool, &key, super::session::ESTIMATES_PER_MINUTE, Duration::from_secs(60))
        .await?;
    if let Some(refusal) = refusal_unread(ctx, user, headers).await? {
        return Err(refusal.into());
    }
    let settings = &ctx.settings;
    let form = paced_multipart(headers, body)?;
    let (upload, options) = read_form(form, FileSink::Count, form_rules(settings)).await?;
    let FormFile::Counted(mut upload, kept) = upload else { return Err(AppError::Internal) };
    if let (Some(reader), Some(bytes)) = (&settings.survey_reader, kept) {
        intake::survey(reader, &mut upload, bytes).await?;
    }
    let estimate_settings = estimate_settings(ctx).await?;
    let estimate = engine::documents::estimate::estimate(
        &ctx.pool,
        estimate_settings,
        user.id,
        &upload,
        options.preset,
        options.economy,
    )
    .await?;
    let estimate = estimate.map_err(AppError::from)?;
    let meets_deadline = options.due_by.and_then(|due| estimate.meets(due, chrono::Utc::now()));
    let estimate = crate::model::Estimate::from(estimate);
    // Each language its own job, priced on its own.
    let languages = 1 + options.also_into.len() as i64;
    Ok(crate::model::Estimate {
        meets_deadline,
        credits: estimate.credits * languages,
        least_credits: estimate.least_credits * languages,
        ..estimate
    })
}

/// What an estimate goes by: parts planned as the workers plan them (by the provider's count of
/// tokens, learned), the provider's time limits and the pace of recent attempts.
async fn estimate_settings(ctx: &ServerContext) -> Result<engine::documents::estimate::EstimateSettings<'_>, AppError> {
    let settings = &ctx.settings;
    let ratio = match &settings.tokenizer {
        Some(tokenizer) => engine::documents::ratio::learned(&ctx.pool, tokenizer).await?.0,
        None => 1.0,
    };
    Ok(engine::documents::estimate::EstimateSettings {
        admission: &settings.admission,
        calls: settings.call_limits.in_our_tokens(ratio),
        time_limits: settings.time_limits,
        paces: &ctx.paces,
    })
}

impl From<engine::documents::estimate::UploadEstimate> for crate::model::Estimate {
    fn from(e: engine::documents::estimate::UploadEstimate) -> Self {
        use engine::queue::policy::position::RunTime;
        let (runs_for, basis) = match e.run_time {
            RunTime::Measured(d) => (d, "measured"),
            RunTime::AtMost(d) => (d, "deadline"),
        };
        let secs = |d: Duration| d.as_secs_f64().ceil() as u64;
        crate::model::Estimate {
            doc_type: e.doc_type.extension().to_string(),
            bytes: e.bytes,
            counted_tokens: e.counted_tokens,
            input_tokens: e.input_tokens,
            credits: e.credits,
            held: e.held,
            least_credits: e.least_credits,
            parts: e.parts,
            jobs_ahead: e.jobs_ahead,
            starts_in_secs: e.starts_in.map(secs),
            runs_for_secs: secs(runs_for),
            run_time_basis: basis.to_string(),
            done_in_secs: e.done_in().map(secs),
            processing_paused: !e.processing_enabled,
            meets_deadline: None,
            pages: e.pages,
            scanned_pages: e.scanned_pages,
            scan_credits: e.scan_credits,
        }
    }
}

/// "Run again": one of `user`'s jobs as a new job (new debit) with the same document, and the
/// given preset and language or else the earlier ones. Another user's job is not found (an
/// admin does not spend a user's credits); 410 when the document is no longer kept.
pub async fn run_again(
    ctx: &ServerContext,
    user: &User,
    id: &str,
    preset: Option<&str>,
    language: Option<&str>,
) -> Result<Uploaded, AppError> {
    let earlier = crate::server::session::visible_job(&ctx.pool, user, id).await?;
    if earlier.owner_id != user.id {
        return Err(AppError::NotFound);
    }
    let spec: Option<engine::documents::payload::DocumentJob> = serde_json::from_value(earlier.payload.clone()).ok();
    let mut options = UploadOptions {
        preset: match preset {
            Some(p) => intake::parse_preset(p)?,
            None => spec.as_ref().map(|s| s.preset).unwrap_or(engine::Preset::Summarize),
        },
        language: match language {
            // Sent, a language is a name (the contract's pattern): an empty one is refused.
            Some("") => return Err(AppError::invalid("the language should be a name like \"German\"")),
            Some(l) => intake::parse_language(l)?,
            None => spec.as_ref().and_then(|s| s.language.clone()),
        },
        ..UploadOptions::default()
    };
    options.complete(&ctx.settings.presets)?;
    // What this run costs: its own preset's price (a translation's answer is billed too).
    let charged = spec.as_ref().map_or(0, |s| {
        intake::document_price(&ctx.settings.admission, s.document.size_for_price(), options.preset, options.economy).1
    });
    let admitted = intake::run_again(&ctx.pool, &ctx.settings.admission, user.id, &earlier.payload, &options).await;
    match admitted {
        Ok(Admission::Accepted { job_id }) => {
            Ok(Uploaded { job_id, duplicate: false, charged, key_expires_at: None, also: Vec::new() })
        }
        Ok(Admission::Existing { job_id }) => {
            Ok(Uploaded { job_id, duplicate: true, charged: 0, key_expires_at: None, also: Vec::new() })
        }
        Ok(Admission::Refused(refusal)) => Err(refusal.into()),
        Err(engine::EngineError::NotFound) => Err(AppError::Gone),
        Err(e) => Err(e.into()),
    }
}

/// The multipart parser (multer) pulls everything the connection has ready into its buffer
/// each time it is polled; when the network is faster than storage, that buffer would grow
/// towards the whole file. Handing it one chunk per poll keeps it to a chunk.
///
/// It also bounds what the parser may buffer outside a field's data (the preamble and part
/// headers, where it looks for a boundary): past [`MAX_OUTSIDE_FIELDS`] bytes the body fails.
struct OneChunkPerPoll<S> {
    inner: S,
    just_yielded: bool,
    /// When reading began and the bytes read since: a client that trickles (a byte now and
    /// then, never idle long enough to time out) fails [`MIN_RATE`] instead of holding a slot.
    started: std::time::Instant,
    received: u64,
    /// Set while a field's data is being read (see [`FieldGate`]).
    in_field: Arc<AtomicBool>,
    /// Bytes handed over since the last field data.
    outside: usize,
}

impl<S, E> Stream for OneChunkPerPoll<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    type Item = Result<Bytes, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.just_yielded {
            self.just_yielded = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        self.just_yielded = next.is_ready();
        match next {
            Poll::Ready(Some(Ok(chunk))) => {
                self.received += chunk.len() as u64;
                if too_slow(self.received, self.started.elapsed()) {
                    return Poll::Ready(Some(Err(format!(
                        "the upload is too slow (under {} KB/s); try again on a faster connection",
                        MIN_RATE / 1000
                    ))));
                }
                if self.in_field.load(Ordering::Relaxed) {
                    self.outside = 0;
                } else {
                    self.outside += chunk.len();
                    if self.outside > MAX_OUTSIDE_FIELDS {
                        return Poll::Ready(Some(Err("too much data outside the form's fields".into())));
                    }
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.to_string()))),
            other => other.map(|_| None),
        }
    }
}

/// Marks the stretch where a field's data is read, so the pacing wrapper counts the rest.
#[derive(Clone)]
struct FieldGate(Arc<AtomicBool>);

impl FieldGate {
    async fn reading<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        self.0.store(true, Ordering::Relaxed);
        let out = work.await;
        self.0.store(false, Ordering::Relaxed);
        out
    }
}

/// The body fed to the multipart parser a chunk at a time, and the gate that tells the pacing
/// which bytes are field data.
fn paced_multipart<S, E>(headers: &HeaderMap, body: S) -> Result<(multer::Multipart<'static>, FieldGate), AppError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let content_type = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let boundary = multer::parse_boundary(content_type)
        .map_err(|_| AppError::invalid("send the document as multipart/form-data"))?;
    let gate = FieldGate(Arc::new(AtomicBool::new(false)));
    let paced = OneChunkPerPoll {
        inner: body,
        just_yielded: false,
        started: std::time::Instant::now(),
        received: 0,
        in_field: gate.0.clone(),
        outside: 0,
    };
    Ok((multer::Multipart::new(paced, boundary), gate))
}

/// A field's chunks, each within `idle` of the last: a client that stops sending loses its
/// slot instead of holding it.
fn with_idle_timeout(field: multer::Field<'_>, idle: Duration) -> impl Stream<Item = Result<Bytes, String>> + '_ {
    Box::pin(futures::stream::unfold(Some(field), move |field| async move {
        let mut field = field?;
        match tokio::time::timeout(idle, field.chunk()).await {
            Ok(Ok(Some(chunk))) => Some((Ok(chunk), Some(field))),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(e.to_string()), None)),
            Err(_) => Some((Err(format!("nothing arrived for {} s", idle.as_secs())), None)),
        }
    }))
}

/// A side field's text, read up to `max` bytes.
async fn read_short_field(field: multer::Field<'_>, idle: Duration, max: usize) -> Result<String, AppError> {
    let name = field.name().unwrap_or("").to_string();
    let mut chunks = with_idle_timeout(field, idle);
    let mut value = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| AppError::invalid(format!("the upload broke off: {e}")))?;
        if value.len() + chunk.len() > max {
            return Err(AppError::invalid(format!("the `{name}` field is too long")));
        }
        value.extend_from_slice(&chunk);
    }
    String::from_utf8(value).map_err(|_| AppError::invalid(format!("the `{name}` field is not UTF-8")))
}

/// What a form must be: its file at most `max_bytes` and (a text) no longer than the
/// document ceiling, the presets this server offers, and how long its reading may take.
#[derive(Clone, Copy)]
struct FormRules<'a> {
    max_bytes: u64,
    max_document_tokens: Option<u64>,
    presets: &'a [Preset],
    /// The economy lane is offered (the provider has a batch API).
    economy: bool,
    /// The longest nothing may arrive, and the longest the whole form may take.
    /// How scans are read here (none: no OCR), for the document language asked for.
    ocr: Option<&'a engine::documents::ocr::OcrConfig>,
    idle: Duration,
    deadline: Duration,
}

fn form_rules(settings: &super::session::WebSettings) -> FormRules<'_> {
    FormRules {
        max_bytes: settings.max_upload_bytes,
        max_document_tokens: settings.admission.max_document_tokens,
        presets: &settings.presets,
        economy: settings.admission.economy.is_some(),
        ocr: settings.survey_reader.as_ref().and_then(|reader| reader.ocr.as_deref()),
        idle: settings.upload_idle,
        deadline: settings.upload_deadline,
    }
}

/// Where a form's file goes: into storage (an upload), or nowhere once checked (an estimate).
#[derive(Clone, Copy)]
enum FileSink<'a> {
    Store(&'a Blobs),
    Count,
}

/// A form's file: stored, or only checked and counted.
enum FormFile {
    Stored(StoredUpload),
    /// Checked and counted, with a PDF's or an image's bytes for its survey.
    Counted(CheckedUpload, Option<Bytes>),
}

impl FileSink<'_> {
    async fn take<S, E>(self, check: UploadCheck, chunks: S) -> Result<FormFile, engine::EngineError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        match self {
            FileSink::Store(blobs) => intake::receive(blobs, check, chunks).await.map(FormFile::Stored),
            FileSink::Count => {
                intake::measure(check, chunks).await.map(|(checked, kept)| FormFile::Counted(checked, kept))
            }
        }
    }

    /// Undo [`FileSink::take`]: a stored file is deleted.
    async fn discard(self, file: FormFile) {
        if let (FileSink::Store(blobs), FormFile::Stored(stored)) = (self, file) {
            let _ = blobs.delete(&stored.key).await;
        }
    }
}

/// Read the form: the file streams through the engine's checks into `sink`, the options are
/// short words. Unknown or surplus parts are refused. If anything is wrong after the file was
/// stored (its deadline passed included), its blob is deleted again before this returns.
async fn read_form(
    (mut multipart, gate): (multer::Multipart<'static>, FieldGate),
    sink: FileSink<'_>,
    rules: FormRules<'_>,
) -> Result<(FormFile, UploadOptions), AppError> {
    let FormRules { idle, deadline, .. } = rules;
    let malformed = |e: multer::Error| AppError::invalid(format!("malformed multipart body: {e}"));
    let mut file: Option<FormFile> = None;
    let mut options = UploadOptions::default();
    let read = async {
        let mut parts = 0;
        loop {
            // The wait for the next part (its headers) is bounded like a field's data.
            let next = tokio::time::timeout(idle, multipart.next_field()).await.map_err(|_| {
                AppError::invalid(format!("the upload broke off: nothing arrived for {} s", idle.as_secs()))
            })?;
            let Some(field) = next.map_err(malformed)? else { break };
            parts += 1;
            if parts > MAX_PARTS {
                return Err(AppError::invalid("the form has too many parts"));
            }
            match field.name() {
                Some("file") if file.is_none() => {
                    let name = field.file_name().map(str::to_string);
                    let chunks = with_idle_timeout(field, idle);
                    let check =
                        UploadCheck::new(name.as_deref(), rules.max_bytes).with_ceiling(rules.max_document_tokens);
                    file = Some(gate.reading(sink.take(check, chunks)).await?);
                }
                Some("file") => return Err(AppError::invalid("send one file per upload")),
                Some("preset") => {
                    options.preset =
                        intake::parse_preset(&gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?)?;
                }
                Some("language") => {
                    if options.language.is_some() {
                        return Err(AppError::invalid("send language or languages, not both"));
                    }
                    options.language =
                        intake::parse_language(&gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?)?;
                }
                Some("callback_url") => {
                    let max = engine::webhooks::target::MAX_URL_LEN;
                    options.callback_url = Some(gate.reading(read_short_field(field, idle, max)).await?);
                }
                Some("due_by") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    options.due_by = intake::parse_due_by(&value, chrono::Utc::now())?;
                }
                Some("urgent") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    options.urgent = intake::parse_flag("urgent", &value)?;
                }
                Some("lane") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    options.economy = intake::parse_lane(&value)?;
                }
                // A translation's glossary in DeepL's CSV or TSV, pasted or a file's text.
                Some("glossary") => {
                    let max = engine::documents::glossary::MAX_BYTES;
                    let value = gate.reading(read_short_field(field, idle, max)).await?;
                    options.guidance.glossary =
                        engine::documents::glossary::parse(&value).map_err(AppError::invalid)?;
                }
                Some(which @ ("glossary_name" | "save_glossary_as")) => {
                    let which = which.to_string();
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    let name = (!value.trim().is_empty())
                        .then(|| engine::documents::glossaries::check_name(&value))
                        .transpose()?;
                    match which.as_str() {
                        "glossary_name" => options.glossary_name = name,
                        _ => options.save_glossary_as = name,
                    }
                }
                Some("languages") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_LANGUAGES_BYTES)).await?;
                    let mut languages = intake::parse_languages(&value)?.into_iter();
                    if options.language.is_some() {
                        return Err(AppError::invalid("send language or languages, not both"));
                    }
                    options.language = languages.next();
                    options.also_into = languages.collect();
                }
                Some("document_language") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    options.document_language = match rules.ocr {
                        Some(ocr) if !value.trim().is_empty() => {
                            Some(ocr.language_for(Some(&value)).map_err(AppError::invalid)?)
                        }
                        _ => None,
                    };
                }
                Some("formality") => {
                    let value = gate.reading(read_short_field(field, idle, MAX_FIELD_BYTES)).await?;
                    options.guidance.formality =
                        engine::documents::glossary::Formality::parse(&value).map_err(AppError::invalid)?;
                }
                other => {
                    let name = other.unwrap_or("").chars().take(40).collect::<String>();
                    return Err(AppError::invalid(format!(
                        "unknown form field {name:?}; send `file`, `preset`, `language` (or `languages`), `due_by`, \
                         `urgent`, `lane`, `callback_url`, `glossary`, `glossary_name`, `save_glossary_as`, `formality` and \
                         `document_language`"
                    )));
                }
            }
        }
        options.complete(rules.presets)?;
        options.check_lane(rules.economy)?;
        Ok::<_, AppError>(())
    };
    // The deadline drops the reading, not this function: what was stored is deleted below.
    let read = tokio::time::timeout(deadline, read)
        .await
        .unwrap_or_else(|_| Err(AppError::invalid("the upload took too long; try again on a faster connection")));
    match (read, file) {
        (Ok(()), Some(file)) => Ok((file, options)),
        (Ok(()), None) => Err(AppError::invalid("the form needs a `file` field")),
        (Err(e), file) => {
            if let Some(file) = file {
                sink.discard(file).await;
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trickle_fails_after_a_minute_but_a_slow_honest_upload_does_not() {
        assert!(!too_slow(10, Duration::from_secs(59)), "judged only after a minute");
        assert!(too_slow(100, Duration::from_secs(61)), "a byte now and then");
        assert!(!too_slow(50 << 20, Duration::from_secs(600)), "50 MiB in 10 minutes is 87 KB/s");
        assert!(too_slow(500_000, Duration::from_secs(120)));
    }
}
