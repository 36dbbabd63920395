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

/// The most bytes a tally holds back waiting for a space (a text without spaces, say
/// Japanese, is counted at a character boundary past this).
const MAX_CARRY: usize = 64 * 1024;

/// Counts a text's tokens as it streams in, chunk by chunk, with memory bounded by a chunk: each
/// chunk is counted up to its last whitespace (a word keeps the space before it, a line break
/// stays with what it ends, as the tokenizer's own pre-split does), the rest carried into the
/// next. A cut inside a long run without spaces can count a token or two more than the whole
/// text would: never fewer.
#[derive(Debug, Default)]
pub struct TokenTally {
    carry: Vec<u8>,
    /// Where the last whitespace in `carry` is (each byte is looked at once, however small
    /// the chunks come).
    last_space: Option<usize>,
    tokens: u64,
}

impl TokenTally {
    /// Count the next bytes of the text (UTF-8; anything else is counted as replacement
    /// characters, and refused elsewhere).
    pub fn push(&mut self, chunk: &[u8]) {
        let start = self.carry.len();
        self.carry.extend_from_slice(chunk);
        if let Some(j) = chunk.iter().rposition(|b| b.is_ascii_whitespace()) {
            self.last_space = Some(start + j);
        }
        let cut = match self.last_space {
            // Only once a word follows it (the run may go on). After a line break, which
            // belongs to what comes before it (".\n\n" is one token); before a space, which
            // belongs to the word after it (" The").
            Some(i) if i + 1 < self.carry.len() => {
                if matches!(self.carry[i], b'\n' | b'\r') {
                    i + 1
                } else {
                    i
                }
            }
            _ if self.carry.len() > MAX_CARRY => {
                // The last character boundary: not a UTF-8 continuation byte.
                self.carry.iter().rposition(|b| (b & 0xC0) != 0x80).unwrap_or(self.carry.len())
            }
            _ => 0,
        };
        if cut > 0 {
            self.tokens += count(&String::from_utf8_lossy(&self.carry[..cut]));
            self.carry.drain(..cut);
            self.last_space = self.last_space.and_then(|i| i.checked_sub(cut));
        }
    }

    /// Tokens counted so far (what is carried is not yet).
    pub fn so_far(&self) -> u64 {
        self.tokens
    }

    /// The whole text's tokens.
    pub fn finish(mut self) -> u64 {
        let rest = std::mem::take(&mut self.carry);
        self.tokens + count(&String::from_utf8_lossy(&rest))
    }
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

    #[test]
    fn a_tally_in_chunks_counts_as_the_whole_text_or_a_little_more() {
        let english = "The supplier delivers the goods named in schedule A by the agreed date.\n\n".repeat(2_000);
        let japanese = "契約の当事者は、本契約に定める条件に従い、商品を引き渡すものとする。".repeat(5_000);
        let emoji = "🎉🚀 done. ".repeat(3_000);
        for text in [english, japanese, emoji] {
            let whole = count(&text);
            for chunk in [1, 7, 4096, 65_536, 1 << 20] {
                let mut tally = TokenTally::default();
                for piece in text.as_bytes().chunks(chunk) {
                    tally.push(piece);
                }
                let counted = tally.finish();
                assert!(counted >= whole, "chunks of {chunk}: {counted} < {whole}");
                assert!(counted <= whole + whole / 50 + 2, "chunks of {chunk}: {counted} against {whole}");
            }
        }
    }
}
