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
pub mod upload;

/// Pure: the text with its first letter in upper case.
pub fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|c| c.to_uppercase().collect::<String>() + chars.as_str()).unwrap_or_default()
}

/// Pure: "1 credit", "3 credits".
pub fn credits_text(n: i64) -> String {
    if n == 1 {
        "1 credit".into()
    } else {
        format!("{n} credits")
    }
}
