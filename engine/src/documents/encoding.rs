//! Text as people save it: UTF-16 with a byte-order mark (older Windows editors) and Latin-1
//! (Windows-1252) are transcoded to UTF-8 as they stream in, so everything after (the type
//! check, the markup scan, storage, extraction) sees UTF-8 and the same bounds apply. UTF-8
//! and PDFs pass through byte for byte. Pure: bytes in, bytes out, in any chunking.

use bytes::Bytes;
use encoding_rs::{Decoder, Encoding, UTF_16BE, UTF_16LE, WINDOWS_1252};

use super::sniff::SNIFF_BYTES;

/// Turns an upload's chunks into UTF-8 where its head says it is UTF-16 or Latin-1.
#[derive(Default)]
pub struct Transcoder {
    state: State,
}

enum State {
    /// The first bytes, until there are enough to decide.
    Undecided(Vec<u8>),
    /// UTF-8 text, a PDF, or something the type check will refuse: as it is.
    PassThrough,
    Decoding(Decoder),
}

impl Default for State {
    fn default() -> Self {
        State::Undecided(Vec::new())
    }
}

/// Pure: the encoding a document's first bytes call for, if not UTF-8 (or binary, or a PDF).
pub fn text_encoding(head: &[u8]) -> Option<&'static Encoding> {
    if head.starts_with(&[0xFF, 0xFE]) {
        return Some(UTF_16LE);
    }
    if head.starts_with(&[0xFE, 0xFF]) {
        return Some(UTF_16BE);
    }
    let utf8 = match std::str::from_utf8(head) {
        Ok(_) => true,
        // A character cut at the end of the sample is still UTF-8.
        Err(e) => e.error_len().is_none(),
    };
    // A known binary format is the type check's to refuse, under its own name.
    if utf8 || infer::get(head).is_some() || head.trim_ascii_start().starts_with(b"%PDF-") {
        return None;
    }
    Some(WINDOWS_1252)
}

impl Transcoder {
    /// The next chunk, as UTF-8 where decoding; nothing while the head is still undecided
    /// (it is held: at most [`SNIFF_BYTES`] and one chunk).
    pub fn push(&mut self, chunk: &[u8]) -> Option<Bytes> {
        let head = match &mut self.state {
            State::PassThrough => return Some(Bytes::copy_from_slice(chunk)),
            State::Decoding(decoder) => return Some(decode(decoder, chunk, false)),
            State::Undecided(head) => {
                head.extend_from_slice(chunk);
                if head.len() < SNIFF_BYTES {
                    return None;
                }
                std::mem::take(head)
            }
        };
        Some(self.decide(head, false))
    }

    /// The end of the upload: whatever is still held, decided and flushed.
    pub fn finish(&mut self) -> Option<Bytes> {
        let out = match &mut self.state {
            State::Undecided(head) => {
                let head = std::mem::take(head);
                self.decide(head, true)
            }
            State::Decoding(decoder) => decode(decoder, &[], true),
            State::PassThrough => return None,
        };
        (!out.is_empty()).then_some(out)
    }

    fn decide(&mut self, head: Vec<u8>, last: bool) -> Bytes {
        match text_encoding(&head[..head.len().min(SNIFF_BYTES)]) {
            None => {
                self.state = State::PassThrough;
                Bytes::from(head)
            }
            Some(encoding) => {
                let mut decoder = encoding.new_decoder_with_bom_removal();
                let out = decode(&mut decoder, &head, last);
                self.state = State::Decoding(decoder);
                out
            }
        }
    }
}

/// Decode `input` (all of it: the buffer is sized for the worst case) to UTF-8.
fn decode(decoder: &mut Decoder, input: &[u8], last: bool) -> Bytes {
    let capacity = decoder.max_utf8_buffer_length(input.len()).unwrap_or(input.len().saturating_mul(3) + 16);
    let mut out = String::with_capacity(capacity);
    let (_, read, _) = decoder.decode_to_string(input, &mut out, last);
    debug_assert_eq!(read, input.len(), "the buffer holds the worst case");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn transcode(input: &[u8], chunk: usize) -> Vec<u8> {
        let (mut t, mut out) = (Transcoder::default(), Vec::new());
        for piece in input.chunks(chunk.max(1)) {
            out.extend(t.push(piece).unwrap_or_default());
        }
        out.extend(t.finish().unwrap_or_default());
        out
    }

    fn utf16(text: &str, little: bool) -> Vec<u8> {
        let mut out = if little { vec![0xFF, 0xFE] } else { vec![0xFE, 0xFF] };
        for unit in text.encode_utf16() {
            out.extend(if little { unit.to_le_bytes() } else { unit.to_be_bytes() });
        }
        out
    }

    #[test]
    fn utf16_with_a_bom_and_latin1_become_utf8() {
        let text = "Résumé: naïve café, 10 €, 日本語.\n".repeat(500);
        assert_eq!(transcode(&utf16(&text, true), 4096), text.as_bytes());
        assert_eq!(transcode(&utf16(&text, false), 777), text.as_bytes());
        let latin1: Vec<u8> = "Café crème, déjà vu.\n".chars().map(|c| c as u32 as u8).collect();
        assert_eq!(transcode(&latin1, 3), "Café crème, déjà vu.\n".as_bytes());
        // Windows-1252's printable 0x80-0x9F: the euro sign and curly quotes.
        assert_eq!(transcode(b"\x80 5 \x93quoted\x94", 64), "€ 5 “quoted”".as_bytes());
    }

    #[test]
    fn utf8_and_pdfs_pass_byte_for_byte() {
        let text = "Plain UTF-8, déjà, 日本語.\n".repeat(1000);
        assert_eq!(transcode(text.as_bytes(), 1000), text.as_bytes());
        let pdf = b"%PDF-1.7\n\xE2\xE3\xCF\xD3\n1 0 obj".to_vec();
        assert_eq!(transcode(&pdf, 5), pdf);
        assert_eq!(text_encoding(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), None, "binary is the type check's to refuse");
        assert!(transcode(b"", 10).is_empty());
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_text(text in "\\PC{0,3000}", chunk in 1usize..9000, little in any::<bool>()) {
            let whole = transcode(&utf16(&text, little), usize::MAX);
            prop_assert_eq!(&whole, text.as_bytes());
            prop_assert_eq!(transcode(&utf16(&text, little), chunk), whole);
            prop_assert_eq!(transcode(text.as_bytes(), chunk), text.as_bytes());
        }
    }
}
