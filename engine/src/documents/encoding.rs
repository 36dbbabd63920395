//! Text as people save it: UTF-16 with a byte-order mark (older Windows editors) and Latin-1
//! (read as Windows-1252, its superset) are transcoded to UTF-8 as they stream in, so
//! everything after (the type check, the markup scan, storage, extraction) sees UTF-8 and the
//! same bounds apply. UTF-8 and PDFs pass through byte for byte. Pure: bytes in, bytes out, in
//! any chunking.
//!
//! Latin-1 is decided by the first byte that is not UTF-8 while everything before it was
//! ASCII (the two read the same there), wherever in the file it comes. Latin-1 decodes any
//! byte, so the bytes no text has (C0 controls but tab, newline, form feed and return; DEL;
//! the five Windows-1252 leaves undefined) are refused anywhere in it: binary cannot pass as
//! text behind a readable start.

use bytes::Bytes;
use encoding_rs::{Decoder, Encoding, UTF_16BE, UTF_16LE, WINDOWS_1252};

use super::sniff::SNIFF_BYTES;

/// The refusal for bytes that are in no text.
pub const BINARY_REFUSAL: &str = "this file is neither a PDF nor text (it has binary content)";

/// Turns an upload's chunks into UTF-8 where it is UTF-16 or Latin-1.
pub struct Transcoder {
    state: State,
}

enum State {
    /// The first bytes, until there are enough to decide.
    Undecided(Vec<u8>),
    /// ASCII so far (as UTF-8 and as Latin-1 alike); `carry` holds a character that may be
    /// cut at the end of the last chunk.
    Ascii { carry: Vec<u8> },
    /// UTF-8 text, a PDF, or something the type check will refuse: as it is.
    PassThrough,
    /// UTF-16 or Latin-1 (then `latin1`, whose bytes are checked for binary).
    Decoding { decoder: Decoder, latin1: bool },
}

impl Default for Transcoder {
    fn default() -> Self {
        Transcoder { state: State::Undecided(Vec::new()) }
    }
}

/// Pure: what a document's first bytes call for. `complete` says they are the whole file (a
/// character cut at their end is then not UTF-8).
fn first_decision(head: &[u8], complete: bool) -> State {
    if head.starts_with(&[0xFF, 0xFE]) {
        return decoding(UTF_16LE);
    }
    if head.starts_with(&[0xFE, 0xFF]) {
        return decoding(UTF_16BE);
    }
    // A PDF, or a known binary format (the type check refuses it under its own name).
    if head.trim_ascii_start().starts_with(b"%PDF-") || infer::get(head).is_some() {
        return State::PassThrough;
    }
    match std::str::from_utf8(head) {
        Ok(text) if text.is_ascii() => State::Ascii { carry: Vec::new() },
        Ok(_) => State::PassThrough,
        // A character cut at the end of the sample is still UTF-8 (unless nothing follows).
        Err(e) if e.error_len().is_none() && !complete => {
            if head[..e.valid_up_to()].is_ascii() {
                State::Ascii { carry: Vec::new() }
            } else {
                State::PassThrough
            }
        }
        Err(e) if head[..e.valid_up_to()].is_ascii() => decoding(WINDOWS_1252),
        // UTF-8 with a broken character: the UTF-8 check refuses it.
        Err(_) => State::PassThrough,
    }
}

fn decoding(encoding: &'static Encoding) -> State {
    State::Decoding { decoder: encoding.new_decoder_with_bom_removal(), latin1: encoding == WINDOWS_1252 }
}

impl Transcoder {
    /// The next chunk, as UTF-8; nothing while the head is still undecided (it is held: at
    /// most [`SNIFF_BYTES`] and one chunk). `Err` with the 415 reason for binary.
    pub fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, String> {
        match &mut self.state {
            State::PassThrough => Ok(Some(chunk)),
            State::Undecided(head) => {
                head.extend_from_slice(&chunk);
                if head.len() < SNIFF_BYTES {
                    return Ok(None);
                }
                let head = std::mem::take(head);
                self.state = first_decision(&head[..SNIFF_BYTES], false);
                self.feed(head, false)
            }
            _ => self.feed(chunk.to_vec(), false),
        }
    }

    /// The end of the upload: whatever is still held, decided and flushed.
    pub fn finish(&mut self) -> Result<Option<Bytes>, String> {
        if let State::Undecided(head) = &mut self.state {
            let head = std::mem::take(head);
            self.state = first_decision(&head, true);
            return self.feed(head, true);
        }
        self.feed(Vec::new(), true)
    }

    /// Bytes in the decided state (possibly moving from ASCII to Latin-1 or UTF-8).
    fn feed(&mut self, bytes: Vec<u8>, last: bool) -> Result<Option<Bytes>, String> {
        let out = match &mut self.state {
            State::Undecided(_) => unreachable!("decided before feeding"),
            State::PassThrough => bytes,
            State::Decoding { decoder, latin1 } => {
                if *latin1 {
                    refuse_binary(&bytes)?;
                }
                decode(decoder, &bytes, last)
            }
            State::Ascii { carry } => {
                let bytes = [std::mem::take(carry), bytes].concat();
                let (next, out) = after_ascii(bytes, last);
                let latin1 = matches!(next, State::Decoding { .. });
                self.state = next;
                if latin1 {
                    return self.feed(out, last);
                }
                out
            }
        };
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

/// Pure: the state after `bytes` that came while the text was ASCII only, and what to emit (for
/// Latin-1, the bytes still to decode).
fn after_ascii(mut bytes: Vec<u8>, last: bool) -> (State, Vec<u8>) {
    match std::str::from_utf8(&bytes) {
        Ok(text) if text.is_ascii() => (State::Ascii { carry: Vec::new() }, bytes),
        Ok(_) => (State::PassThrough, bytes),
        // A character cut at the end: keep it for the next chunk.
        Err(e) if e.error_len().is_none() && !last => {
            let carry = bytes.split_off(e.valid_up_to());
            if bytes.is_ascii() {
                (State::Ascii { carry }, bytes)
            } else {
                bytes.extend(carry);
                (State::PassThrough, bytes)
            }
        }
        // Not UTF-8, after ASCII only: Latin-1 from the start (the ASCII reads the same).
        Err(e) if bytes[..e.valid_up_to()].is_ascii() => (decoding(WINDOWS_1252), bytes),
        // UTF-8, then a broken character: the UTF-8 check refuses it.
        Err(_) => (State::PassThrough, bytes),
    }
}

/// Latin-1 decodes any byte: refuse those no text has.
fn refuse_binary(bytes: &[u8]) -> Result<(), String> {
    let binary = |b: &u8| matches!(b, 0x00..=0x08 | 0x0B | 0x0E..=0x1F | 0x7F | 0x81 | 0x8D | 0x8F | 0x90 | 0x9D);
    match bytes.iter().any(binary) {
        true => Err(BINARY_REFUSAL.into()),
        false => Ok(()),
    }
}

/// Decode `input` (all of it: the buffer is sized for the worst case) to UTF-8.
fn decode(decoder: &mut Decoder, input: &[u8], last: bool) -> Vec<u8> {
    let capacity = decoder.max_utf8_buffer_length(input.len()).unwrap_or(input.len().saturating_mul(3) + 16);
    let mut out = String::with_capacity(capacity);
    let (_, read, _) = decoder.decode_to_string(input, &mut out, last);
    debug_assert_eq!(read, input.len(), "the buffer holds the worst case");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn transcode(input: &[u8], chunk: usize) -> Result<Vec<u8>, String> {
        let (mut t, mut out) = (Transcoder::default(), Vec::new());
        for piece in input.chunks(chunk.max(1)) {
            out.extend(t.push(Bytes::copy_from_slice(piece))?.unwrap_or_default());
        }
        out.extend(t.finish()?.unwrap_or_default());
        Ok(out)
    }

    fn utf16(text: &str, little: bool) -> Vec<u8> {
        let mut out = if little { vec![0xFF, 0xFE] } else { vec![0xFE, 0xFF] };
        for unit in text.encode_utf16() {
            out.extend(if little { unit.to_le_bytes() } else { unit.to_be_bytes() });
        }
        out
    }

    fn latin1(text: &str) -> Vec<u8> {
        text.chars().map(|c| c as u32 as u8).collect()
    }

    #[test]
    fn utf16_with_a_bom_and_latin1_become_utf8() {
        let text = "Résumé: naïve café, 10 €, 日本語.\n".repeat(500);
        assert_eq!(transcode(&utf16(&text, true), 4096).unwrap(), text.as_bytes());
        assert_eq!(transcode(&utf16(&text, false), 777).unwrap(), text.as_bytes());
        assert_eq!(transcode(&latin1("Café crème, déjà vu.\n"), 3).unwrap(), "Café crème, déjà vu.\n".as_bytes());
        // Windows-1252's printable 0x80-0x9F: the euro sign and curly quotes.
        assert_eq!(transcode(b"\x80 5 \x93quoted\x94", 64).unwrap(), "€ 5 “quoted”".as_bytes());
    }

    #[test]
    fn latin1_is_found_past_an_ascii_start_and_in_the_last_byte() {
        let late = [b"Plain ASCII for a long while.\n".repeat(1000), latin1("Then: à bientôt.\n")].concat();
        let expected = ["Plain ASCII for a long while.\n".repeat(1000), "Then: à bientôt.\n".into()].concat();
        for chunk in [1, 7, 8192, 100_000] {
            assert_eq!(transcode(&late, chunk).unwrap(), expected.as_bytes(), "chunk {chunk}");
        }
        assert_eq!(transcode(&latin1("René"), 2).unwrap(), "René".as_bytes(), "a file that ends on its only accent");
        // UTF-8 past an ASCII start stays UTF-8, also with a character cut between chunks.
        let utf8 = ["ascii ".repeat(3000), "déjà".into()].concat();
        assert_eq!(transcode(utf8.as_bytes(), 18_001).unwrap(), utf8.as_bytes());
    }

    #[test]
    fn binary_cannot_pass_as_latin1_anywhere() {
        let behind = [b"A readable start. ".repeat(1000), vec![0xE9, 0x00, 0x01, 0x02]].concat();
        assert_eq!(transcode(&behind, 4096), Err(BINARY_REFUSAL.to_string()));
        assert_eq!(transcode(b"caf\xe9\x7f", 64), Err(BINARY_REFUSAL.to_string()));
    }

    #[test]
    fn utf8_and_pdfs_pass_byte_for_byte() {
        let text = "Plain UTF-8, déjà, 日本語.\n".repeat(1000);
        assert_eq!(transcode(text.as_bytes(), 1000).unwrap(), text.as_bytes());
        let pdf = b"%PDF-1.7\n\xE2\xE3\xCF\xD3\n1 0 obj".to_vec();
        assert_eq!(transcode(&pdf, 5).unwrap(), pdf);
        // A known binary format passes unchanged: the type check refuses it by name.
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        assert_eq!(transcode(&png, 3).unwrap(), png);
        assert!(transcode(b"", 10).unwrap().is_empty());
        // Broken UTF-8 after UTF-8 is left for the UTF-8 check to refuse.
        let broken = [text.as_bytes(), b"\xff"].concat();
        assert_eq!(transcode(&broken, 999).unwrap(), broken);
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_text(text in "\\PC{0,3000}", chunk in 1usize..9000, little in any::<bool>()) {
            let whole = transcode(&utf16(&text, little), usize::MAX).unwrap();
            prop_assert_eq!(&whole, text.as_bytes());
            prop_assert_eq!(transcode(&utf16(&text, little), chunk).unwrap(), whole);
            prop_assert_eq!(transcode(text.as_bytes(), chunk).unwrap(), text.as_bytes());
        }

        #[test]
        fn latin1_text_in_any_chunking(text in "[ -~àéèüöäßçñ\n]{0,3000}", chunk in 1usize..9000) {
            // (None of these bytes is a UTF-8 continuation byte, so the text is not also UTF-8.)
            let bytes = latin1(&text);
            prop_assert_eq!(transcode(&bytes, chunk).unwrap(), text.as_bytes());
        }
    }
}
