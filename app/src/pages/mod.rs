//! The app's pages.

pub mod auth;
pub mod jobs;
pub mod upload;
