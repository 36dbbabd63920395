//! Server functions, grouped by feature. Each does its work right here, next to the types it
//! returns (Leptos' `todo_app_sqlite_axum` way): it authenticates through [`session`], calls the
//! engine, and maps the engine's error to an HTTP status through [`crate::errors`]. The browser
//! build keeps only the generated client stubs.

pub mod account;
pub mod admin;
pub mod auth;
pub mod console;
pub mod jobs;
#[cfg(feature = "ssr")]
pub mod session;
#[cfg(feature = "ssr")]
pub mod upload;
