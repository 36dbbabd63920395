//! Tokens counted, not guessed: OpenAI's `o200k_base` byte-pair encoding, whose vocabulary
//! ships inside the `bpe-openai` crate (nothing is downloaded). Chinese, Japanese, Korean,
//! emoji and code run one to three characters a token, so four characters a token
//! underprices them up to fourfold and sizes parts past the context.
//!
//! Anthropic's tokenizer is not public; it counts somewhat more than `o200k_base` for the
//! same text, so parts are planned with [`PLANNING_MARGIN`] of headroom.

/// The share of a limit a part is planned to: what the provider counts differs from our count
/// by a few percent (another tokenizer, the message framing).
pub const PLANNING_MARGIN: f64 = 0.9;

/// Tokens in `text`. Linear in its length (about 50 MB/s in a release build); callers on the
/// async runtime hand long texts to a blocking thread ([`count_off_runtime`]).
pub fn count(text: &str) -> u64 {
    bpe_openai::o200k_base().count(text) as u64
}

/// [`count`] on a blocking thread, for texts long enough to stall an async worker.
pub async fn count_off_runtime(text: String) -> u64 {
    if text.len() < 64 * 1024 {
        return count(&text);
    }
    // With the other CPU work on user text: at most cores - 1 at once, so the web keeps a core.
    crate::documents::cpu::run(move || count(&text)).await.unwrap_or(u64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_scripts_count_far_more_than_four_characters_a_token() {
        let english = "The supplier delivers the goods named in schedule A by the agreed date. ".repeat(50);
        let per_token = english.chars().count() as f64 / count(&english) as f64;
        assert!(per_token > 3.5, "English runs about four characters a token: {per_token}");
        let japanese = "契約の当事者は、本契約に定める条件に従い、納品日までに商品を引き渡すものとする。".repeat(50);
        let per_token = japanese.chars().count() as f64 / count(&japanese) as f64;
        assert!(per_token < 2.0, "Japanese runs one to two characters a token: {per_token}");
        let emoji = "🎉🚀🧪🦀".repeat(100);
        assert!(count(&emoji) >= 400, "an emoji is at least one token: {}", count(&emoji));
        assert_eq!(count(""), 0);
    }
}
