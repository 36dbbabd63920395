//! The Sluice server: the command line ([`cli`]), the database or its embedded default
//! ([`database`]), the HTTP surface ([`http`]), start-up and shutdown ([`startup`]) and the
//! operator commands ([`operator`]). `main.rs` only parses the command line and dispatches.

pub mod cli;
pub mod database;
pub mod http;
pub mod metrics;
pub mod operator;
pub mod startup;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

pub use startup::{spawn_web, Application, Role};
