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

/// Tokens in `text`: the same count as `bpe_openai::o200k_base().count(text)`, from the same
/// pieces ([`pieces`](super::pieces)) and the same encoding of each. A text repeats its words,
/// and encoding a piece costs far more than looking it up, so each thread keeps the counts of
/// the short pieces it has met. Linear in the text's length (in a release build, measured once:
/// about 200 MB/s for plain English prose, 100 MB/s for Markdown with code; other scripts go
/// at the crate's own pace, a regex search a piece); callers on the async runtime hand long
/// texts to a blocking thread ([`count_off_runtime`]).
pub fn count(text: &str) -> u64 {
    let bpe = &bpe_openai::o200k_base().bpe;
    MEMO.with_borrow_mut(|memo| super::pieces::pieces(text).map(|piece| memo.count(bpe, piece.as_bytes())).sum())
}

/// Pieces longer than this are encoded each time (a word is shorter; a long run of symbols
/// would only crowd the memo).
const MEMO_PIECE_BYTES: usize = 24;
/// The most pieces a thread's memo holds (about 0.7 MB: its table and keys); a full memo starts
/// again empty, so a text of endless distinct pieces costs what it would without one. A memo
/// lives as long as its thread: the runtime's workers and the blocking threads that counted.
const MEMO_PIECES: usize = 8_192;

thread_local! {
    static MEMO: std::cell::RefCell<PieceMemo> = Default::default();
}

#[derive(Default)]
struct PieceMemo(rustc_hash::FxHashMap<Box<[u8]>, u32>);

impl PieceMemo {
    fn count(&mut self, bpe: &bpe_openai::byte_pair_encoding::BytePairEncoding, piece: &[u8]) -> u64 {
        if piece.len() > MEMO_PIECE_BYTES {
            return bpe.count(piece) as u64;
        }
        if let Some(&tokens) = self.0.get(piece) {
            return tokens as u64;
        }
        let tokens = bpe.count(piece) as u32;
        if self.0.len() >= MEMO_PIECES {
            self.0.clear();
        }
        self.0.insert(piece.into(), tokens);
        tokens as u64
    }
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

    fn reference(text: &str) -> u64 {
        bpe_openai::o200k_base().count(text) as u64
    }

    #[test]
    fn the_count_is_o200k_bases_own_for_prose_code_and_other_scripts() {
        let texts = [
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/documents/tokens.rs")).unwrap(),
            "The supplier's goods arrive by 12/31/2026.\r\n\n  Don't   WAIT—we'LL ship 1,234,567 units.  ".repeat(40),
            "契約の当事者は、本契約に定める条件に従い、café naïve Über ſ 🎉🚀 ١٢٣ «x»\u{a0}\u{2003}".repeat(40),
        ];
        for text in texts {
            // Twice: the second count comes from the memo the first one filled.
            assert_eq!(count(&text), reference(&text), "{}", &text[..60.min(text.len())]);
            assert_eq!(count(&text), reference(&text));
        }
    }

    #[test]
    fn a_memo_filled_past_its_bound_starts_again_and_still_counts_right() {
        // Distinct short pieces, more than the memo holds.
        let words: String = (0..(MEMO_PIECES as u64 * 3)).map(|n| format!(" w{:x}q", n * 7919)).collect();
        assert_eq!(count(&words), reference(&words));
        MEMO.with_borrow(|memo| assert!(memo.0.len() <= MEMO_PIECES, "{} pieces held", memo.0.len()));
        let long = "=".repeat(10_000) + " " + &"ab".repeat(5_000);
        assert_eq!(count(&long), reference(&long));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]
        #[test]
        fn any_text_counts_as_o200k_base_counts_it(text in "[a-zA-Z0-9 \t\n\r',./!()é日🎉\u{a0}\u{301}]{0,120}") {
            proptest::prop_assert_eq!(count(&text), reference(&text));
        }
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
