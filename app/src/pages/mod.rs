//! The app's pages.

pub mod account;
pub mod admin;
pub mod auth;
pub mod jobs;
pub mod upload;
