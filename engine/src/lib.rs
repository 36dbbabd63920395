//! Sluice's engine: the durable job queue in Postgres, the accounts that pay for it, and the
//! documents it processes. No HTTP and no Leptos: the web layer calls in, IO stays at the edges
//! and the policies are pure.
//!
//! - [`queue`]: states, enqueue, fair gated claims, fenced transitions, the worker runtime,
//!   maintenance, the dead-letter queue, the kill switch and gate, vital signs, and the pure
//!   [`queue::policy`] modules (retry, drain estimate, place in line).
//! - [`accounts`]: users and log-in, API tokens, the credit ledger, notices, and admission (the
//!   one conditional write that takes credits and counts a job in flight).
//! - [`documents`]: type sniffing, text extraction, blob storage, upload intake, the document
//!   processor and the AI providers.
//! - [`audit`]: the audit log every admin action writes to.
//! - [`alerts`]: alert rules, evaluated by one process at a time, and their firings.
//! - [`webhooks`]: the signed, retried outgoing webhooks (alerts, job endings).
//! - [`reconcile`] and [`repair`]: checking that money and jobs add up (reports only), and the
//!   explicit, audited repair of a user's counters.
//! - [`hooks`]: the terminal hooks the server runs the queue with (accounts + webhooks).
//! - [`db`]: connecting and migrating.
//! - `testing` (feature `testing`): helpers for tests and benchmarks, like River's `rivertest`.

pub mod accounts;
pub mod acks;
pub mod alerts;
pub mod audit;
pub mod backup;
pub mod db;
pub mod documents;
pub mod error;
pub mod hooks;
pub mod mail;
pub mod maintenance;
pub mod periodic;
pub mod queue;
pub mod reconcile;
pub mod repair;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod webhooks;

pub use error::EngineError;
pub use sluice_types::capacity as sizing;
pub use sluice_types::scan;
pub use sluice_types::settlement;
pub use sluice_types::{FailureKind, JobStage, JobState, Preset};
