//! What an upload costs and when it is refused before its bytes are read: prices, the
//! document ceiling, the backlog bounds, idempotency keys and storage quotas (turned into
//! admission's `AdmissionConfig`).

use std::time::Duration;

use clap::Args;

use engine::accounts::admission::AdmissionConfig;
use engine::sizing::PriceTable;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Admission and prices")]
pub struct AdmissionArgs {
    /// Credits by a document's estimated input tokens, as steps `TOKENS:CREDITS,...` (the first
    /// step a document fits in is its price; past the last, the last). A bare number is a flat price.
    #[arg(long, env = "SLUICE_PRICES", default_value = "25000:1,100000:2,200000:4", global = true)]
    pub prices: PriceTable,
    /// Credits a scanned page costs (read by OCR; rounded up over the document: 40 pages at
    /// 0.3 are 12). A scan's text layer, if it has one, is priced by the table above.
    #[arg(long, env = "SLUICE_SCAN_PAGE_CREDITS", default_value = "0.3", value_parser = engine::scan::parse_page_price, global = true)]
    pub scan_page_credits: u32,
    /// The most estimated tokens one document may have: longer texts are refused at upload
    /// (413, before their bytes are stored), longer PDFs fail once read (refunded). 0 = no limit.
    #[arg(long, env = "SLUICE_MAX_DOCUMENT_TOKENS", default_value_t = 2_000_000, global = true)]
    pub max_document_tokens: u64,
    /// Intake bound: refuse uploads (503) past this many waiting jobs.
    #[arg(long, env = "SLUICE_MAX_BACKLOG", default_value_t = 10_000, global = true)]
    pub max_backlog: i64,
    /// Intake bound: refuse uploads (503) while the oldest waiting job has waited this long.
    #[arg(long, env = "SLUICE_MAX_OLDEST_WAIT_SECS", default_value_t = 1800, global = true)]
    pub max_oldest_wait_secs: u64,
    /// Hours a client's `Idempotency-Key` names its job; after that it is forgotten (a repeat
    /// makes a new job). Uploads' answers say when (`idempotency_key_expires_at`).
    #[arg(long, env = "SLUICE_IDEMPOTENCY_KEY_HOURS", default_value_t = 24.0, global = true)]
    pub idempotency_key_hours: f64,
    /// Storage per user, in MiB: the documents of their jobs that keep them (shared ones once).
    /// Uploads past it get 413 `storage_full` before their body is read. 0 = none.
    #[arg(long, env = "SLUICE_STORAGE_QUOTA_MIB", default_value_t = 1024, global = true)]
    pub storage_quota_mib: u64,
    /// The economy lane ("by tomorrow, at half the credits"; offered when the provider has a
    /// batch API): the share of a document's price taken off (0 to 0.9).
    #[arg(long, env = "SLUICE_ECONOMY_DISCOUNT", default_value_t = 0.5, global = true)]
    pub economy_discount: f64,
    /// Hours an economy document may take: its batch's answers are awaited this long, then
    /// whatever it did not answer is done at once, at the same price.
    #[arg(long, env = "SLUICE_ECONOMY_WINDOW_HOURS", default_value_t = 24.0, global = true)]
    pub economy_window_hours: f64,
    /// Seconds between asking the provider where each open batch stands.
    #[arg(long, env = "SLUICE_ECONOMY_POLL_SECS", default_value_t = 30.0, global = true)]
    pub economy_poll_secs: f64,
}

impl AdmissionArgs {
    /// Admission's settings, with the most tokens one call may carry (`max_call_tokens`, the
    /// provider's) and the attempts a job gets.
    pub fn admission_config(&self, max_call_tokens: Option<u64>, max_attempts: u32) -> AdmissionConfig {
        AdmissionConfig {
            prices: self.price_table(),
            max_document_tokens: self.document_ceiling(),
            max_call_tokens,
            max_backlog: self.max_backlog,
            max_oldest_wait: Duration::from_secs(self.max_oldest_wait_secs),
            max_attempts: max_attempts.max(1) as i32,
            storage_quota_bytes: (self.storage_quota_mib > 0).then(|| self.storage_quota_mib.saturating_mul(1 << 20)),
            client_key_lifetime: self.client_key_lifetime(),
            ..Default::default()
        }
    }

    /// The price table, scanned pages and all.
    pub fn price_table(&self) -> PriceTable {
        self.prices.clone().with_scan_page_price(self.scan_page_credits)
    }

    /// The economy lane's terms as set (a window of 1 minute to 7 days, a discount of 0 to 90 %).
    pub fn economy_terms(&self) -> engine::sizing::EconomyTerms {
        let finite = |v: f64, default: f64| if v.is_finite() { v } else { default };
        engine::sizing::EconomyTerms {
            discount: finite(self.economy_discount, 0.5).clamp(0.0, 0.9),
            window_hours: finite(self.economy_window_hours, 24.0).clamp(1.0 / 60.0, 168.0),
        }
    }

    /// How often open batches are polled (1 s to an hour).
    pub fn economy_poll(&self) -> Duration {
        let secs = if self.economy_poll_secs.is_finite() { self.economy_poll_secs } else { 30.0 };
        Duration::from_secs_f64(secs.clamp(1.0, 3600.0))
    }

    /// The most estimated tokens one document may have (None: no ceiling).
    pub fn document_ceiling(&self) -> Option<u64> {
        (self.max_document_tokens > 0).then_some(self.max_document_tokens)
    }

    /// How long a client's `Idempotency-Key` names its job (1 minute to 30 days).
    pub fn client_key_lifetime(&self) -> Duration {
        let hours = if self.idempotency_key_hours.is_finite() { self.idempotency_key_hours } else { 24.0 };
        Duration::from_secs_f64(hours.clamp(1.0 / 60.0, 720.0) * 3600.0)
    }
}
