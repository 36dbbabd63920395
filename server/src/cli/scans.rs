//! Scans: how pages without a text layer are read by OCR (Tesseract and poppler's `pdftoppm`,
//! found at start), in which languages, within what bounds per page (turned into the reader's
//! `OcrConfig`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use engine::documents::ocr::{
    self, OcrConfig, DEFAULT_CONFIDENCE_FLOOR, DEFAULT_MAX_DPI, DEFAULT_MAX_PAGES, DEFAULT_MAX_PAGE_PIXELS,
    DEFAULT_PAGE_CPU_SECS, DEFAULT_PAGE_MEMORY_BYTES, DEFAULT_PAGE_WALL_CLOCK,
};

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Scans (OCR)")]
pub struct ScanArgs {
    /// Read no scans, even where Tesseract is installed (they are then refused in words, free).
    #[arg(long, env = "SLUICE_NO_OCR", global = true)]
    pub no_ocr: bool,
    /// The languages scans may be read in (Tesseract's codes, comma-separated; each needs its
    /// `tesseract-ocr-<code>` package). The first is a document's unless its upload names one.
    #[arg(long, env = "SLUICE_OCR_LANGUAGES", default_value = "eng", value_delimiter = ',', global = true)]
    pub ocr_languages: Vec<String>,
    /// Let an upload ask for `auto`: its first scanned page is read in each language above,
    /// and the one read with most confidence is used.
    #[arg(long, env = "SLUICE_OCR_DETECT_LANGUAGE", global = true)]
    pub ocr_detect_language: bool,
    /// Seconds one page may take to render and read; a page past it is skipped with a note.
    #[arg(long, env = "SLUICE_OCR_PAGE_SECS", default_value_t = DEFAULT_PAGE_WALL_CLOCK.as_secs(), global = true)]
    pub ocr_page_secs: u64,
    /// CPU seconds one page may use.
    #[arg(long, env = "SLUICE_OCR_PAGE_CPU_SECS", default_value_t = DEFAULT_PAGE_CPU_SECS, global = true)]
    pub ocr_page_cpu_secs: u64,
    /// Address space of one page's renderer and recogniser, in MiB.
    #[arg(long, env = "SLUICE_OCR_PAGE_MEMORY_MIB", default_value_t = DEFAULT_PAGE_MEMORY_BYTES >> 20, global = true)]
    pub ocr_page_memory_mib: u64,
    /// The finest a page is rendered at (never finer than its scan was made at).
    #[arg(long, env = "SLUICE_OCR_MAX_DPI", default_value_t = DEFAULT_MAX_DPI, global = true)]
    pub ocr_max_dpi: u32,
    /// The most pixels a rendered page or a photo may have, in millions.
    #[arg(long, env = "SLUICE_OCR_MAX_MEGAPIXELS", default_value_t = DEFAULT_MAX_PAGE_PIXELS / 1_000_000, global = true)]
    pub ocr_max_megapixels: u64,
    /// Scanned pages one document may have; more are refused at upload (split it).
    #[arg(long, env = "SLUICE_OCR_MAX_PAGES", default_value_t = DEFAULT_MAX_PAGES, global = true)]
    pub ocr_max_pages: u32,
    /// Pages read under this mean confidence (0 to 100) are flagged for checking.
    #[arg(long, env = "SLUICE_OCR_CONFIDENCE_FLOOR", default_value_t = DEFAULT_CONFIDENCE_FLOOR, global = true)]
    pub ocr_confidence_floor: f32,
    /// Tesseract's program.
    #[arg(long, env = "SLUICE_TESSERACT", default_value = "/usr/bin/tesseract", global = true)]
    pub tesseract: PathBuf,
    /// poppler's `pdftoppm`, which renders a PDF's page for Tesseract.
    #[arg(long, env = "SLUICE_PDFTOPPM", default_value = "/usr/bin/pdftoppm", global = true)]
    pub pdftoppm: PathBuf,
}

impl ScanArgs {
    /// How scans are read, once the tools are found (reported at start: found, version,
    /// languages); none when OCR is off or missing, said in words.
    pub fn ocr_config(&self) -> Option<OcrConfig> {
        if self.no_ocr {
            tracing::info!("OCR is off (--no-ocr): scans are refused in words, free");
            return None;
        }
        // The reader may read only the tools' own folders: absolute paths, never the root.
        if let Some(tool) = [&self.tesseract, &self.pdftoppm].into_iter().find(|p| ocr::tool_folder(p).is_none()) {
            tracing::warn!(tool = %tool.display(), "OCR is off: name the OCR tools by absolute paths outside /");
            return None;
        }
        let tools = match ocr::probe(&self.tesseract, &self.pdftoppm) {
            Ok(tools) => tools,
            Err(why) => {
                tracing::warn!("OCR is not available: {why}. Scans are refused in words, free");
                return None;
            }
        };
        let missing = ocr::missing_languages(&self.ocr_languages, &tools.languages);
        if !missing.is_empty() {
            tracing::warn!(
                missing = %missing.join(","),
                "OCR languages not installed (apt-get install tesseract-ocr-<code>); left out"
            );
        }
        let languages: Vec<String> = self.ocr_languages.iter().filter(|l| !missing.contains(l)).cloned().collect();
        if languages.is_empty() {
            tracing::warn!("none of the OCR languages is installed: scans are refused in words, free");
            return None;
        }
        tracing::info!(version = %tools.version, languages = %languages.join(","), "OCR found: scans are read");
        Some(OcrConfig {
            tesseract: self.tesseract.clone(),
            pdftoppm: self.pdftoppm.clone(),
            detect_language: self.ocr_detect_language && languages.len() > 1,
            languages,
            page_wall_clock: Duration::from_secs(self.ocr_page_secs.max(1)),
            page_cpu_secs: self.ocr_page_cpu_secs.max(1),
            page_memory_bytes: self.ocr_page_memory_mib.max(64) << 20,
            max_page_pixels: self.ocr_max_megapixels.clamp(1, 500) * 1_000_000,
            max_dpi: self.ocr_max_dpi.clamp(72, 1200),
            confidence_floor: self.ocr_confidence_floor.clamp(0.0, 100.0),
            max_pages: self.ocr_max_pages.max(1),
            ..OcrConfig::new(Vec::new())
        })
    }
}
