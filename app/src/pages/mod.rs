//! The app's pages.

pub mod account;
pub mod admin;
pub mod admin_capacity;
pub mod admin_reviews;
pub mod admin_support;
pub mod auth;
pub mod clock;
pub mod console;
pub mod endings;
pub mod jobs;
pub mod polling;
pub mod settings;
pub mod upload;
