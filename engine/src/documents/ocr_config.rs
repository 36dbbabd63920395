//! How scans are read by OCR (the operator's settings, with their defaults beside them), apart
//! from the reading itself ([`super::ocr`]) so the sandboxed reader's settings can name it.

use std::path::PathBuf;
use std::time::Duration;

use super::images::ImageBounds;

/// How scans are read, with the defaults beside it.
#[derive(Clone, Debug)]
pub struct OcrConfig {
    pub tesseract: PathBuf,
    pub pdftoppm: PathBuf,
    /// The languages the operator offers (Tesseract's codes, e.g. `eng`, `deu`); the first is
    /// a document's language unless its upload names another.
    pub languages: Vec<String>,
    /// A document's language may be `auto`: its first scanned page is read in each offered
    /// language, and the one read with most confidence is used for the rest.
    pub detect_language: bool,
    /// Each page's wall clock, CPU time and address space (the renderer's and Tesseract's).
    pub page_wall_clock: Duration,
    pub page_cpu_secs: u64,
    pub page_memory_bytes: u64,
    /// A rendered page's pixels and resolution at most.
    pub max_page_pixels: u64,
    pub max_dpi: u32,
    /// Pages read under this mean confidence (0–100) are flagged for checking.
    pub confidence_floor: f32,
    /// Photos' bounds (pixels, sides, frames), checked from their headers.
    pub image_bounds: ImageBounds,
    /// Scanned pages read in one document at most (more is refused at upload).
    pub max_pages: u32,
}

/// Scanned pages one document may have by default.
pub const DEFAULT_MAX_PAGES: u32 = 500;

/// A page's wall clock by default.
pub const DEFAULT_PAGE_WALL_CLOCK: Duration = Duration::from_secs(60);
/// A page's CPU seconds by default.
pub const DEFAULT_PAGE_CPU_SECS: u64 = 30;
/// A page's address space by default (Tesseract on a 300 DPI page needs a few hundred MiB).
pub const DEFAULT_PAGE_MEMORY_BYTES: u64 = 1 << 30;
/// A rendered page's pixels by default: a letter or A4 page at 300 DPI is about 9 million.
pub const DEFAULT_MAX_PAGE_PIXELS: u64 = 25_000_000;
/// The resolution pages are rendered at by default (Tesseract reads best at about 300 DPI).
pub const DEFAULT_MAX_DPI: u32 = 300;
/// The confidence under which a page is flagged, by default.
pub const DEFAULT_CONFIDENCE_FLOOR: f32 = 60.0;

impl OcrConfig {
    /// The tools at their usual paths with the defaults above, reading `languages`.
    pub fn new(languages: Vec<String>) -> OcrConfig {
        OcrConfig {
            tesseract: PathBuf::from("/usr/bin/tesseract"),
            pdftoppm: PathBuf::from("/usr/bin/pdftoppm"),
            languages,
            detect_language: false,
            page_wall_clock: DEFAULT_PAGE_WALL_CLOCK,
            page_cpu_secs: DEFAULT_PAGE_CPU_SECS,
            page_memory_bytes: DEFAULT_PAGE_MEMORY_BYTES,
            max_page_pixels: DEFAULT_MAX_PAGE_PIXELS,
            max_dpi: DEFAULT_MAX_DPI,
            confidence_floor: DEFAULT_CONFIDENCE_FLOOR,
            image_bounds: ImageBounds::DEFAULT,
            max_pages: DEFAULT_MAX_PAGES,
        }
    }

    /// The language a document is read in when its upload names none.
    pub fn default_language(&self) -> &str {
        self.languages.first().map(String::as_str).unwrap_or("eng")
    }

    /// Pure: the language an upload asks for, checked against those offered (`auto` where
    /// detection is allowed); none asked is the default.
    pub fn language_for(&self, asked: Option<&str>) -> Result<String, String> {
        let asked = asked.map(str::trim).filter(|a| !a.is_empty());
        match asked {
            None => Ok(self.default_language().to_string()),
            Some(AUTO) if self.detect_language => Ok(AUTO.to_string()),
            Some(code) if self.languages.iter().any(|l| l == code) => Ok(code.to_string()),
            Some(code) => Err(format!(
                "the document language {code:?} is not offered; use one of {}{}",
                self.languages.join(", "),
                if self.detect_language { " or auto" } else { "" }
            )),
        }
    }
}

/// A document language asking for detection from its first scanned page.
pub const AUTO: &str = "auto";
