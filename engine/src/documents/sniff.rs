//! A document's type, decided by its content (magic bytes, UTF-8, markup), never by its name
//! or a Content-Type claim.

use serde::{Deserialize, Serialize};

/// The documents Sluice accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocType {
    Pdf,
    PlainText,
    Markdown,
    /// Word (Office Open XML, `.docx`).
    Docx,
    /// OpenDocument text (`.odt`).
    Odt,
    /// A saved web page.
    Html,
    /// Photos and scans of pages, read by OCR.
    Png,
    Jpeg,
    Tiff,
}

impl DocType {
    pub const ALL: [DocType; 9] = [
        DocType::Pdf,
        DocType::PlainText,
        DocType::Markdown,
        DocType::Docx,
        DocType::Odt,
        DocType::Html,
        DocType::Png,
        DocType::Jpeg,
        DocType::Tiff,
    ];

    /// The Content-Type a download of it carries.
    pub fn mime(self) -> &'static str {
        match self {
            DocType::Pdf => "application/pdf",
            DocType::PlainText => "text/plain; charset=utf-8",
            DocType::Markdown => "text/markdown; charset=utf-8",
            DocType::Docx => DOCX_MIME,
            DocType::Odt => ODT_MIME,
            DocType::Html => "text/html; charset=utf-8",
            DocType::Png => "image/png",
            DocType::Jpeg => "image/jpeg",
            DocType::Tiff => "image/tiff",
        }
    }

    /// The file extension for a download without a name.
    pub fn extension(self) -> &'static str {
        match self {
            DocType::Pdf => "pdf",
            DocType::PlainText => "txt",
            DocType::Markdown => "md",
            DocType::Docx => "docx",
            DocType::Odt => "odt",
            DocType::Html => "html",
            DocType::Png => "png",
            DocType::Jpeg => "jpg",
            DocType::Tiff => "tiff",
        }
    }

    /// Whether its bytes are taken as they come (text, checked as UTF-8 and counted while it
    /// streams in) rather than read in the sandbox before its text is known.
    pub fn is_text(self) -> bool {
        matches!(self, DocType::PlainText | DocType::Markdown)
    }

    /// Whether it is a photo or scan of pages (read by OCR only).
    pub fn is_image(self) -> bool {
        matches!(self, DocType::Png | DocType::Jpeg | DocType::Tiff)
    }

    /// Whether it is read page by page, and a page without text is read by OCR.
    pub fn has_pages(self) -> bool {
        self == DocType::Pdf || self.is_image()
    }
}

const DOCX_MIME: &str = "application/vnd.openxmlformats-officedocument.wordprocessingml.document";
const ODT_MIME: &str = "application/vnd.oasis.opendocument.text";

/// How many leading bytes [`sniff`] wants to see (fewer only if the file is shorter).
pub const SNIFF_BYTES: usize = 8192;

/// Pure: decide a document's type from its first bytes, whatever its name or Content-Type
/// claim. `Err` carries a reason for a 415.
pub fn sniff(head: &[u8]) -> Result<DocType, String> {
    let trimmed = trim_start(head);
    if trimmed.starts_with(b"%PDF-") {
        return Ok(DocType::Pdf);
    }
    if head.starts_with(b"PK\x03\x04") {
        return office_type(head);
    }
    match super::images::format_of(head) {
        Some(super::images::ImageFormat::Png) => return Ok(DocType::Png),
        Some(super::images::ImageFormat::Jpeg) => return Ok(DocType::Jpeg),
        Some(super::images::ImageFormat::Tiff) => return Ok(DocType::Tiff),
        None => {}
    }
    let lossy = String::from_utf8_lossy(head);
    if looks_like_html_page(&lossy) {
        return Ok(DocType::Html);
    }
    if looks_like_markup(&lossy) {
        return Err(MARKUP_REFUSAL.into());
    }
    // Text first: a text that happens to begin like a binary format's signature ("BMW's
    // report" is a BMP's "BM", "MZ" an executable's) is still text.
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        // A multi-byte character cut at the end of the sample is fine.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    let printable = text.filter(|t| !t.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t' | '\u{c}')));
    match printable {
        Some(text) => Ok(if looks_like_markdown(text) { DocType::Markdown } else { DocType::PlainText }),
        None => match infer::get(head) {
            Some(kind) => Err(format!("this is a {} file ({}), not {ACCEPTED}", kind.extension(), kind.mime_type())),
            None if text.is_some() => Err("this file is neither a PDF nor UTF-8 text (it has binary content)".into()),
            None => Err("this file is neither a PDF nor UTF-8 text".into()),
        },
    }
}

/// What is accepted, in words.
const ACCEPTED: &str =
    "a PDF, Word, OpenDocument text, web page, text or Markdown document, or a PNG, JPEG or TIFF scan";

/// The 415 reason for markup posing as text.
pub const MARKUP_REFUSAL: &str =
    "SVG and XML files, and text with HTML inside it, are not accepted; upload a web page \
     as a whole .html file, or a PDF, Word, OpenDocument text, text or Markdown document";

/// A zip: a Word or OpenDocument text file by its content (the first entries' names, or the
/// `mimetype` entry OpenDocument puts first), anything else refused with what it is.
fn office_type(head: &[u8]) -> Result<DocType, String> {
    match infer::get(head).map(|kind| (kind.mime_type(), kind.extension())) {
        Some((DOCX_MIME, _)) => return Ok(DocType::Docx),
        Some((ODT_MIME, _)) => return Ok(DocType::Odt),
        Some((mime, extension)) if mime != "application/zip" => {
            return Err(format!("this is a {extension} file ({mime}), not {ACCEPTED}"))
        }
        _ => {}
    }
    let names = zip_entry_names(head);
    if names.iter().any(|name| name.starts_with("word/")) {
        return Ok(DocType::Docx);
    }
    let declares_text = head.windows(ODT_MIME.len()).any(|w| w == ODT_MIME.as_bytes());
    if names.first().is_some_and(|name| name == "mimetype") && declares_text {
        return Ok(DocType::Odt);
    }
    Err(format!("this zip archive is not a Word (.docx) or OpenDocument text (.odt) file; upload {ACCEPTED}"))
}

/// Pure: the names of the zip entries whose local headers lie wholly in `head`, in order.
pub fn zip_entry_names(head: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut at = 0usize;
    let field = |at: usize, len: usize| -> Option<u64> {
        head.get(at..at + len).map(|b| b.iter().rev().fold(0u64, |n, byte| (n << 8) | u64::from(*byte)))
    };
    while head.get(at..at + 4) == Some(b"PK\x03\x04") && names.len() < 64 {
        let (Some(compressed), Some(name_len), Some(extra_len)) =
            (field(at + 18, 4), field(at + 26, 2), field(at + 28, 2))
        else {
            break;
        };
        let Some(name) = head.get(at + 30..at + 30 + name_len as usize) else { break };
        names.push(String::from_utf8_lossy(name).into_owned());
        // Sizes after the data (a data descriptor) leave the next header unknown.
        if compressed == 0 {
            break;
        }
        at = at.saturating_add(30 + name_len as usize + extra_len as usize).saturating_add(compressed as usize);
    }
    names
}

/// A whole web page, as a browser saves one: it starts as HTML does.
fn looks_like_html_page(text: &str) -> bool {
    let lower = text.trim_start_matches('\u{feff}').trim_start().to_lowercase();
    ["<!doctype html", "<html", "<head", "<body", "<meta ", "<title"].iter().any(|m| lower.starts_with(m))
}

/// HTML, SVG or XML (which browsers would render, scripts and all).
fn looks_like_markup(text: &str) -> bool {
    let lower = text.trim_start_matches('\u{feff}').trim_start().to_lowercase();
    const MARKUP: [&str; 9] = ["<!doctype", "<html", "<?xml", "<svg", "<head", "<body", "<script", "<iframe", "<!--"];
    MARKUP.iter().any(|m| lower.starts_with(m)) || lower.contains("<script") || lower.contains("<html")
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    &bytes[start..]
}

fn looks_like_markdown(text: &str) -> bool {
    let mut signs = 0;
    for line in text.lines().take(200) {
        let l = line.trim_start();
        if l.starts_with("# ") || l.starts_with("## ") || l.starts_with("```") || l.starts_with("> ") {
            signs += 2;
        } else if l.starts_with("- ") || l.starts_with("* ") || l.starts_with("1. ") {
            signs += 1;
        }
        if l.contains("](") || l.contains("**") {
            signs += 1;
        }
    }
    signs >= 2
}

/// Finds markup anywhere in a streamed text (not only in its first bytes): `<script`, `<svg`,
/// `<html` and `<iframe`, in any case, also when a chunk boundary cuts the tag.
#[derive(Default)]
pub struct MarkupScan {
    /// The end of the previous chunk, long enough to hold the start of a cut tag.
    tail: Vec<u8>,
}

impl MarkupScan {
    const TAGS: [&'static [u8]; 4] = [b"<script", b"<svg", b"<html", b"<iframe"];
    /// The longest tag's length, less one: the most of a cut tag the previous chunk can hold.
    const CUT: usize = 6;

    /// Look at the next chunk; `Err` with the 415 reason once markup is seen.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), String> {
        // Where the last boundary is: the previous chunk's end and this one's start.
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(Self::CUT)]);
        if Self::has_tag(&seam) || Self::has_tag(chunk) {
            return Err(MARKUP_REFUSAL.into());
        }
        let kept = if chunk.len() >= Self::CUT { chunk } else { &seam };
        self.tail = kept[kept.len().saturating_sub(Self::CUT)..].to_vec();
        Ok(())
    }

    /// Whether a whole tag is in `bytes`, in any case. Only where a `<` is (found a word at a
    /// time), so a chunk costs little more than reading it.
    fn has_tag(bytes: &[u8]) -> bool {
        memchr::memchr_iter(b'<', bytes).any(|at| {
            let rest = &bytes[at..];
            Self::TAGS.iter().any(|tag| rest.len() >= tag.len() && rest[..tag.len()].eq_ignore_ascii_case(tag))
        })
    }
}

/// Checks that a streamed text upload is UTF-8 throughout (chunks may split characters).
#[derive(Default)]
pub struct Utf8Stream {
    carry: Vec<u8>,
}

impl Utf8Stream {
    /// Check the next chunk; a character split across chunks is carried over.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.carry.extend_from_slice(chunk);
        match std::str::from_utf8(&self.carry) {
            Ok(_) => self.carry.clear(),
            Err(e) if e.error_len().is_none() => {
                let keep = self.carry.split_off(e.valid_up_to());
                self.carry = keep;
            }
            Err(_) => return Err("this text file is not valid UTF-8".into()),
        }
        if self.carry.len() > 4 {
            return Err("this text file is not valid UTF-8".into());
        }
        Ok(())
    }

    /// The stream ended: a character still cut in two is an error.
    pub fn finish(self) -> Result<(), String> {
        if self.carry.is_empty() {
            Ok(())
        } else {
            Err("this text file ends in the middle of a character".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_come_from_content_not_names() {
        assert_eq!(sniff(b"%PDF-1.7\n..."), Ok(DocType::Pdf));
        assert_eq!(sniff(b"Just some plain words.\nAnother line."), Ok(DocType::PlainText));
        assert_eq!(sniff(b"# Title\n\nSome **bold** text and a [link](http://x).\n- item"), Ok(DocType::Markdown));
        // A page is a page whatever it is called or holds; SVG, XML and bare scripts are not.
        assert_eq!(sniff(b"<!DOCTYPE html><html><body>%PDF-1.7</body></html>"), Ok(DocType::Html));
        assert_eq!(sniff(b"  <html><script>alert(1)</script></html>"), Ok(DocType::Html));
        assert!(sniff(b"<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>").unwrap_err().starts_with("SVG and XML"));
        assert!(sniff(b"<?xml version=\"1.0\"?><a/>").is_err());
        assert!(sniff(b"<script>alert(1)</script>").is_err());
        assert!(sniff(b"PK\x03\x04\x14\x00\x00\x00\x08\x00").unwrap_err().contains("not a Word"), "zip");
        assert!(sniff(b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00").is_err(), "executable");
        assert!(sniff(b"MZ\x90\x00\x03\x00\x00\x00\x04\x00").is_err(), "windows executable");
        // Photos and scans of pages are read by OCR; other images are refused by name.
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), Ok(DocType::Png));
        assert_eq!(sniff(b"\xff\xd8\xff\xe0\x00\x10JFIF"), Ok(DocType::Jpeg));
        assert_eq!(sniff(b"II*\x00\x08\x00\x00\x00"), Ok(DocType::Tiff));
        assert_eq!(sniff(b"MM\x00*\x00\x00\x00\x08"), Ok(DocType::Tiff));
        assert!(sniff(b"GIF89a\x01\x00\x01\x00\x80\x00\x00").unwrap_err().contains("gif"), "gif, named");
        // Text that begins like a binary signature is text (found by the contract fuzzer).
        for text in ["BMW's annual report", "MZ is a postcode", "ID3 tags, explained", "GIF87a was a format"] {
            assert_eq!(sniff(text.as_bytes()), Ok(DocType::PlainText), "{text}");
        }
        assert!(sniff(b"text with a \x00 nul").is_err());
        assert!(sniff(b"\xff\xfe\xfd not utf-8").is_err());
    }

    #[test]
    fn a_character_cut_at_the_end_of_the_sample_is_fine() {
        let mut head = "Grüße ".repeat(10).into_bytes();
        head.extend_from_slice(&"ü".as_bytes()[..1]);
        assert_eq!(sniff(&head), Ok(DocType::PlainText));
    }

    #[test]
    fn markup_is_found_anywhere_even_cut_by_a_chunk() {
        let text = format!("{}<SvG onload=alert(1)>", "harmless words ".repeat(1000));
        for chunk in [1, 3, 8192, 100_000] {
            let mut scan = MarkupScan::default();
            let found = text.as_bytes().chunks(chunk).map(|c| scan.push(c)).any(|r| r.is_err());
            assert!(found, "chunks of {chunk}");
        }
        let mut clean = MarkupScan::default();
        assert!(clean.push(b"a < b and <scri").is_ok() && clean.push(b"bble> is fine").is_ok());
        // Cut across three chunks, the middle one shorter than the tag.
        let mut cut = MarkupScan::default();
        let pushed = [&b"words <IF"[..], b"ra", b"me src=x>"].map(|c| cut.push(c));
        assert!(pushed[..2].iter().all(Result::is_ok) && pushed[2].is_err(), "{pushed:?}");
        let mut late = MarkupScan::default();
        assert!(late.push(b"x").is_ok() && late.push(b"y<htm").is_ok() && late.push(b"L>").is_err());
    }

    proptest::proptest! {
        #[test]
        fn markup_is_found_whatever_the_chunks_exactly_when_the_whole_text_has_it(
            text in "[<scriptSCRIPTvghmlfaHTML >x]{0,40}",
            cuts in proptest::collection::vec(1usize..9, 1..12),
        ) {
            let lower = text.to_ascii_lowercase();
            let whole = MarkupScan::TAGS.iter().any(|tag| lower.as_bytes().windows(tag.len()).any(|w| w == *tag));
            let mut scan = MarkupScan::default();
            let (mut rest, mut found) = (text.as_bytes(), false);
            for cut in cuts.iter().cycle().take(text.len()) {
                if rest.is_empty() {
                    break;
                }
                let (chunk, after) = rest.split_at((*cut).min(rest.len()));
                found |= scan.push(chunk).is_err();
                rest = after;
            }
            proptest::prop_assert_eq!(found, whole, "{:?} in chunks of {:?}", text, cuts);
        }
    }

    #[test]
    fn utf8_is_checked_across_chunks() {
        let bytes = "naïve café — ok".as_bytes();
        let mut s = Utf8Stream::default();
        for chunk in bytes.chunks(3) {
            s.push(chunk).unwrap();
        }
        s.finish().unwrap();
        let mut bad = Utf8Stream::default();
        assert!(bad.push(b"fine").is_ok());
        assert!(bad.push(b"\xff\xff").is_err());
        let mut cut = Utf8Stream::default();
        cut.push(&"é".as_bytes()[..1]).unwrap();
        assert!(cut.finish().is_err());
    }
}
