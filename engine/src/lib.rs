//! Sluice's engine: the durable job queue in Postgres and the pure policies around it.
//!
//! Layout (IO at the edges, pure logic in small modules):
//! - [`retry`], [`drain`], [`position`]: pure policy, no IO, unit- and property-tested.
//! - [`queue`]: enqueue (inside the caller's transaction), fair gated claims, fenced results.
//! - [`settings`]: kill switch and gate size, audited.
//! - [`dlq`], [`vitals`]: the dead-letter queue and the queue's vital signs.
//! - [`worker`]: the worker runtime (claim loop, heartbeat, graceful shutdown).
//! - [`maintenance`]: lease rescue and retention.
//! - [`hooks`]: the seam where accounts plug into terminal transitions.
//! - [`accounts`], [`ledger`], [`admission`], [`tokens`], [`notices`]: users, credits, the
//!   one-write admission check, API tokens and notices.

pub mod accounts;
pub mod admission;
pub mod blobs;
pub mod db;
pub mod demo;
pub mod dlq;
pub mod documents;
pub mod drain;
pub mod error;
pub mod hooks;
pub mod ledger;
pub mod maintenance;
pub mod notices;
pub mod position;
pub mod processing;
pub mod providers;
pub mod queue;
pub mod retry;
pub mod settings;
pub mod testing;
pub mod tokens;
pub mod vitals;
pub mod worker;

pub use error::EngineError;

/// The NOTIFY channel workers listen on.
pub const JOBS_CHANNEL: &str = "sluice_jobs";
