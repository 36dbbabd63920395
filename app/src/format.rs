//! How numbers, sizes, credits and durations are written for people: one place the pages and
//! the error messages share.

pub use sluice_types::thousands;

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
        format!("{} credits", thousands(n))
    }
}

/// Pure: a size for people: "976 KB", "3.8 MB".
pub fn size_text(bytes: u64) -> String {
    let mb = bytes as f64 / (1024.0 * 1024.0);
    if mb >= 10.0 * 1024.0 {
        format!("{} GB", (mb / 1024.0).floor())
    } else if mb >= 10.0 {
        format!("{} MB", mb.floor())
    } else if mb >= 1.0 {
        format!("{:.1} MB", (mb * 10.0).floor() / 10.0)
    } else {
        format!("{} KB", bytes / 1024)
    }
}

/// Pure: a duration in words: "42 s", "3 min", "2 h 5 min".
pub fn duration_text(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_text(0), "0 s");
        assert_eq!(duration_text(119), "119 s");
        assert_eq!(duration_text(125), "2 min");
        assert_eq!(duration_text(7260), "2 h 1 min");
        assert_eq!(duration_text(-5), "0 s");
    }

    #[test]
    fn numbers_and_credits_read_naturally() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(credits_text(1), "1 credit");
        assert_eq!(credits_text(3), "3 credits");
        assert_eq!(capitalise("the PDF"), "The PDF");
    }
}
