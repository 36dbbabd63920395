//! What an upload would cost and when it should be done, before it is sent for good: its
//! price (or the hold a PDF, Word file or page is charged until its text is read), its parts,
//! its place in line and its run time at the pace of recent attempts. Admission's refusals
//! (402, 429, 503, the storage quota) come as they would for the upload; nothing is stored.

use std::time::Duration;

use sqlx::PgPool;

use super::calls::{expected_parts, CallLimits};
use super::intake::{document_price, CheckedUpload};
use super::payload::size_kind;
use super::sniff::DocType;
use crate::accounts::admission::{self, AdmissionConfig, Refusal};
use crate::error::Result;
use crate::queue::capacity::attempt_stats;
use crate::queue::place_for_new_job;
use crate::queue::policy::position::{run_time, MeasuredPace, RunTime};
use crate::Preset;
use sluice_types::capacity::TimeLimits;

/// What an estimate goes by besides the upload.
#[derive(Clone, Copy, Debug)]
pub struct EstimateSettings<'a> {
    pub admission: &'a AdmissionConfig,
    pub calls: CallLimits,
    pub time_limits: TimeLimits,
    pub paces: &'a PaceCache,
}

/// An upload's estimate.
#[derive(Clone, Debug, PartialEq)]
pub struct UploadEstimate {
    pub doc_type: DocType,
    pub bytes: u64,
    /// A text's or a page's tokens, counted (none for a PDF or a Word file: read later).
    pub counted_tokens: Option<u64>,
    /// What its calls will carry, counted or estimated from its size.
    pub input_tokens: u64,
    /// Credits the upload takes: its price, or for a document priced once read its hold.
    pub credits: i64,
    /// The price is a hold, settled to its text's price once read, down to `least_credits`.
    pub held: bool,
    pub least_credits: i64,
    /// Provider calls for its text (a summary of many parts adds a combining step).
    pub parts: u64,
    /// Jobs claimed before it, were it admitted now.
    pub jobs_ahead: u64,
    /// Its wait to start; `None` while processing is paused or nothing finished lately.
    pub starts_in: Option<Duration>,
    pub run_time: RunTime,
    pub processing_enabled: bool,
    /// A PDF's or an image's pages, and those read by OCR (a scan's) with their price.
    pub pages: Option<u32>,
    pub scanned_pages: Option<u32>,
    pub scan_credits: Option<i64>,
}

impl UploadEstimate {
    /// When it should be done from now, when its start can be told.
    pub fn done_in(&self) -> Option<Duration> {
        let run = match self.run_time {
            RunTime::Measured(d) | RunTime::AtMost(d) => d,
        };
        self.starts_in.map(|start| start + run)
    }

    /// Pure: would it be done by `due_by`, admitted at `now`? `None` while its start cannot be
    /// told (paused, or nothing finished lately).
    pub fn meets(&self, due_by: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) -> Option<bool> {
        let done_in = chrono::TimeDelta::from_std(self.done_in()?).unwrap_or(chrono::TimeDelta::MAX);
        Some(now.checked_add_signed(done_in).is_some_and(|done| done <= due_by))
    }
}

/// Estimate `upload` for `user_id` as `preset` would do it (in the economy lane, at its
/// price): `Err(refusal)` where its upload would be refused before a job exists (as the same
/// check answers it then).
pub async fn estimate(
    pool: &PgPool,
    settings: EstimateSettings<'_>,
    user_id: i64,
    upload: &CheckedUpload,
    preset: Preset,
    economy: bool,
) -> Result<std::result::Result<UploadEstimate, Refusal>> {
    let (input_tokens, credits) = document_price(settings.admission, upload.size(), preset, economy);
    if let Some(refusal) = admission::precheck(pool, settings.admission, user_id, credits, upload.size).await? {
        return Ok(Err(refusal));
    }
    let held = size_kind(upload.doc_type).priced_once_read();
    let place = place_for_new_job(pool, user_id).await?;
    let run = expected_run_time(pool, &settings, input_tokens, preset).await?;
    Ok(Ok(UploadEstimate {
        doc_type: upload.doc_type,
        bytes: upload.size,
        counted_tokens: upload.tokens,
        input_tokens,
        credits,
        held,
        least_credits: if held {
            super::intake::in_lane(settings.admission, settings.admission.prices.cheapest(), economy).min(credits)
        } else {
            credits
        },
        parts: expected_parts(preset, input_tokens, settings.calls),
        jobs_ahead: place.ahead,
        starts_in: place.starts_in,
        run_time: run,
        processing_enabled: place.processing_enabled,
        pages: upload.pages,
        scanned_pages: upload.scanned_pages,
        scan_credits: upload.scanned_pages.map(|pages| {
            super::intake::in_lane(settings.admission, settings.admission.prices.scan_price(pages), economy)
        }),
    }))
}

/// How long a document of `input_tokens` should run once started, as its estimate says.
async fn expected_run_time(
    pool: &PgPool,
    settings: &EstimateSettings<'_>,
    input_tokens: u64,
    preset: Preset,
) -> Result<RunTime> {
    let pace = settings.paces.pace(pool, preset).await?;
    Ok(run_time(input_tokens, pace, settings.time_limits.attempt_secs(input_tokens as f64)))
}

/// How long an upload should run once started, for its deadline: it must start this long
/// before it is due (the measured pace, or with none the most its attempt may take).
pub async fn expected_run(
    pool: &PgPool,
    settings: &EstimateSettings<'_>,
    input_tokens: u64,
    preset: Preset,
) -> Result<Duration> {
    Ok(match expected_run_time(pool, settings, input_tokens, preset).await? {
        RunTime::Measured(d) | RunTime::AtMost(d) => d,
    })
}

/// The median successful attempts of the last day, per preset, read at most once a minute
/// (until some are measured, at every estimate):
/// the percentiles sort a day's attempts, and an estimate comes with every file chosen. One per
/// process (its server context).
#[derive(Debug, Default)]
pub struct PaceCache(std::sync::Mutex<Option<(std::time::Instant, Vec<(String, MeasuredPace)>)>>);

const PACE_FRESH_FOR: Duration = Duration::from_secs(60);

impl PaceCache {
    /// The median successful attempt of the last day for `preset`, or of all presets when it
    /// has none (a first translation is timed by the summaries before it).
    async fn pace(&self, pool: &PgPool, preset: Preset) -> Result<Option<MeasuredPace>> {
        let cached = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let paces = match cached {
            Some((at, paces)) if at.elapsed() < PACE_FRESH_FOR => paces,
            _ => {
                let paces: Vec<(String, MeasuredPace)> = attempt_stats(pool, 1)
                    .await?
                    .into_iter()
                    .filter(|s| s.attempts > 0)
                    .map(|s| (s.preset, MeasuredPace { secs: s.duration_secs.p50, input_tokens: s.input_tokens.p50 }))
                    .collect();
                // Nothing measured yet is not kept: the first attempts time the next estimate.
                if !paces.is_empty() {
                    *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((std::time::Instant::now(), paces.clone()));
                }
                paces
            }
        };
        let of = |name: &str| paces.iter().find(|(p, _)| p == name).map(|(_, pace)| *pace);
        Ok(of(preset.as_str()).or_else(|| of("all")))
    }
}
