//! Scans read by OCR: Tesseract (the field's standard engine) and poppler's `pdftoppm`, run by
//! the sandboxed reader one page at a time. A reader for OCR is the same wall as any other
//! (nobody, seccomp, landlock, limits, its own network namespace), but may read and run the
//! programs in the system's folders (at `SCHED_IDLE`): it renders the page, checks the image's size, and gives it
//! to Tesseract, within the page's own wall clock, CPU time and memory. A page past its bounds
//! is skipped with a note; the document is not.
//!
//! The parent side is [`read_in_child`]: the processor calls it for one page at a time, shows
//! "reading page n of N" between them, and composes the text with [`compose`], pages in order.
//! The programs' landlock folders: `/usr`, `/lib*`, `/bin`, the loader's cache, `/etc/fonts`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::images::{self, ImageBounds};
use super::ocr_text::{dpi_for, parse_tsv};
use super::sandbox::{run_reader, Limits, ReaderRun, RunAs, SandboxConfig};
use super::sniff::DocType;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// The reader's argument for an OCR run.
pub const OCR_ARG: &str = "ocr";

pub use super::ocr_config::{
    OcrConfig, AUTO, DEFAULT_CONFIDENCE_FLOOR, DEFAULT_MAX_DPI, DEFAULT_MAX_PAGES, DEFAULT_MAX_PAGE_PIXELS,
    DEFAULT_PAGE_CPU_SECS, DEFAULT_PAGE_MEMORY_BYTES, DEFAULT_PAGE_WALL_CLOCK,
};

/// The reader's side, whatever it was started for: an OCR run, or reading (or rebuilding) a
/// document ([`super::sandbox::child_main`]). The server's `extract` command and
/// `sluice-extract` are this.
pub fn reader_main(arg: Option<&str>, run_as: Option<&str>) -> ExitCode {
    if arg == Some(OCR_ARG) {
        // No limits, no reading: a reader never runs unconfined.
        let limits = std::env::var(super::sandbox::LIMITS_VAR).ok().and_then(|v| Limits::parse(&v));
        if !limits.is_some_and(super::sandbox::confine) {
            return ExitCode::from(2);
        }
        return child_main(run_as);
    }
    super::sandbox::child_main(arg, run_as)
}

/// The variable an OCR run finds its request in.
const REQUEST_VAR: &str = "SLUICE_OCR_REQUEST";

/// What the server found at start: Tesseract's version and languages.
#[derive(Clone, Debug, PartialEq)]
pub struct OcrTools {
    pub version: String,
    pub languages: Vec<String>,
}

/// Find the tools (at start: no document involved): Tesseract's version and its installed
/// languages, and `pdftoppm`. `Err` says in words what is missing.
pub fn probe(tesseract: &Path, pdftoppm: &Path) -> Result<OcrTools, String> {
    let run = |program: &Path, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} cannot run ({e}); install tesseract-ocr and poppler-utils", program.display()))
    };
    let version = run(tesseract, &["--version"])?;
    let all = [version.stdout, version.stderr].concat();
    let version = String::from_utf8_lossy(&all).lines().next().unwrap_or("").trim().to_string();
    let listed = run(tesseract, &["--list-langs"])?;
    let languages = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "osd")
        .map(str::to_string)
        .collect();
    run(pdftoppm, &["-v"])?;
    Ok(OcrTools { version, languages })
}

/// Pure: the offered languages that are not installed.
pub fn missing_languages(offered: &[String], installed: &[String]) -> Vec<String> {
    offered.iter().filter(|l| !installed.contains(l)).cloned().collect()
}

/// What is read: a PDF's page, or an image's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OcrSource {
    PdfPage(u32),
    /// A photo of `frames` pages (a TIFF's frames), read in one run.
    Image {
        frames: u32,
    },
}

/// An OCR run's request, given to the reader in [`REQUEST_VAR`].
#[derive(Clone, Debug, Serialize, Deserialize)]
struct OcrRequest {
    source: OcrSource,
    language: String,
    tesseract: PathBuf,
    pdftoppm: PathBuf,
    /// A rendered page's pixels at most; a photo's are its own bound.
    max_pixels: u64,
    max_dpi: u32,
    image_bounds: ImageBounds,
    wall_clock_ms: u64,
}

/// One page as a reader read it: its text and confidence, or why it was skipped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PageReading {
    pub page: u32,
    pub text: String,
    pub confidence: Option<f32>,
    pub skipped: Option<String>,
    /// Skipped at its wall clock (a slow page, or a server too busy to read it in time).
    #[serde(default)]
    pub timed_out: bool,
}

/// Read `source` of `document` (a PDF or an image) by OCR in a sandboxed reader, in `language`.
/// A page past its bounds comes back skipped; an `Err` is the reader's own failure.
pub async fn read_in_child(
    sandbox: &SandboxConfig,
    config: &OcrConfig,
    source: OcrSource,
    language: &str,
    document: Bytes,
) -> Result<Vec<PageReading>, JobError> {
    let frames = match source {
        OcrSource::PdfPage(_) => 1,
        OcrSource::Image { frames } => frames.clamp(1, config.image_bounds.max_frames.max(1)),
    };
    // An image's frames are read in one run: its wall clock and CPU time are a page's for each.
    let wall_clock = config.page_wall_clock.saturating_mul(frames);
    let request = OcrRequest {
        source,
        language: language.to_string(),
        tesseract: config.tesseract.clone(),
        pdftoppm: config.pdftoppm.clone(),
        max_pixels: config.max_page_pixels,
        max_dpi: config.max_dpi,
        image_bounds: config.image_bounds,
        wall_clock_ms: wall_clock.as_millis() as u64,
    };
    let run = ReaderRun {
        arg: OCR_ARG,
        output_limit: 16 << 20,
        limits: Limits {
            memory_bytes: config.page_memory_bytes,
            cpu_secs: config.page_cpu_secs.saturating_mul(u64::from(frames)),
        },
        // The reader keeps its own clock on the tools; this one is for the reader itself.
        wall_clock: wall_clock + Duration::from_secs(5),
        request: Some((REQUEST_VAR, serde_json::to_string(&request).expect("a request serialises"))),
    };
    let page = match source {
        OcrSource::PdfPage(page) => page,
        OcrSource::Image { .. } => 1,
    };
    let skipped = |reason: &str| vec![PageReading { page, skipped: Some(reason.to_string()), ..Default::default() }];
    match run_reader(sandbox, run, document).await {
        Ok(output) => match serde_json::from_slice::<Vec<PageReading>>(&output) {
            Ok(pages) => Ok(pages),
            Err(_) => Ok(skipped("the reader's answer could not be read")),
        },
        // The reader itself was stopped at a limit: the page's fault, so skipped.
        Err(e) if e.class == ErrorClass::InvalidInput => Ok(skipped(&e.message)),
        Err(e) => Err(e),
    }
}

/// The reader's side of an OCR run: lock down (with the system's folders to read and run
/// programs from), read the document from stdin, read the page(s), answer JSON.
pub fn child_main(run_as: Option<&str>) -> ExitCode {
    let Some(request) = std::env::var(REQUEST_VAR).ok().and_then(|r| serde_json::from_str::<OcrRequest>(&r).ok())
    else {
        return ExitCode::from(2);
    };
    let Ok(run_as) = RunAs::from_arg(run_as) else { return ExitCode::from(2) };
    // OCR is minutes of CPU a scan: it takes only the CPU nobody else wants (SCHED_IDLE, kept
    // by the tools it starts), so polls and uploads keep their latency while it reads. A page
    // starved past its wall clock is skipped with a note, as a slow one is.
    // SAFETY: plain syscall on this process; lowering one's own policy needs no privilege.
    unsafe {
        let idle = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle);
    }
    // The programs, their libraries and data; of /etc only the loader's cache and the fonts'
    // settings (nothing there is the server's: no settings file, no key).
    let mut readable: Vec<PathBuf> =
        ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/fonts"].into_iter().map(PathBuf::from).collect();
    readable.extend([&request.tesseract, &request.pdftoppm].into_iter().filter_map(|p| tool_folder(p)));
    if super::sandbox::lock_down_with(run_as, 64, &readable).is_err() {
        return ExitCode::from(6);
    }
    let mut document = Vec::new();
    if std::io::stdin().read_to_end(&mut document).is_err() {
        return ExitCode::from(3);
    }
    super::sandbox::write_json(&read_pages_here(&request, &document))
}

/// The folder a tool is run from, where it may be read: an absolute path's parent, never the
/// root (which would open everything).
pub fn tool_folder(program: &Path) -> Option<PathBuf> {
    let parent = program.parent().filter(|p| program.is_absolute() && *p != Path::new("/"))?;
    Some(parent.to_path_buf())
}

/// In the reader: the page(s) asked for, each read or skipped with its reason.
fn read_pages_here(request: &OcrRequest, document: &[u8]) -> Vec<PageReading> {
    let deadline = std::time::Instant::now() + Duration::from_millis(request.wall_clock_ms);
    let skip = |page: u32, failure: ToolFailure| {
        let timed_out = matches!(failure, ToolFailure::TimedOut);
        vec![PageReading { page, skipped: Some(failure.to_string()), timed_out, ..Default::default() }]
    };
    let (page, image) = match request.source {
        OcrSource::PdfPage(page) => {
            // At most the resolution its scan was made at: rendering finer reads no better.
            let (size, native) = page_size_and_scan_dpi(document, page);
            let max_dpi = native.map_or(request.max_dpi, |native| native.clamp(72, request.max_dpi.max(72)));
            let dpi = size.map(|(w, h)| dpi_for(w, h, request.max_pixels, max_dpi)).unwrap_or(max_dpi.min(150));
            let args = [
                "-f".to_string(),
                page.to_string(),
                "-l".into(),
                page.to_string(),
                "-r".into(),
                dpi.to_string(),
                "-gray".into(),
                "-png".into(),
                "-".into(),
            ];
            let limit = (2 * request.max_pixels + (1 << 20)) as usize;
            match run_tool(&request.pdftoppm, &args, document, limit, deadline) {
                Ok(png) => (page, png),
                Err(failure) => return skip(page, failure),
            }
        }
        OcrSource::Image { .. } => (1, document.to_vec()),
    };
    // The rendered page (or the photo, within the bounds its upload was checked by) is checked
    // before Tesseract decodes it.
    let bounds = match request.source {
        OcrSource::PdfPage(_) => ImageBounds { max_pixels: request.max_pixels, ..request.image_bounds },
        OcrSource::Image { .. } => request.image_bounds,
    };
    if let Err(reason) = images::measure(&image, bounds) {
        return skip(page, ToolFailure::Failed(reason));
    }
    let args = ["stdin", "stdout", "-l", &request.language, "--psm", "3", "tsv"].map(str::to_string);
    let tsv = match run_tool(&request.tesseract, &args, &image, 16 << 20, deadline) {
        Ok(tsv) => tsv,
        Err(failure) => return skip(page, failure),
    };
    let pages = parse_tsv(&String::from_utf8_lossy(&tsv));
    if pages.is_empty() {
        return vec![PageReading { page, ..Default::default() }];
    }
    (0..)
        .zip(pages)
        .map(|(i, read)| PageReading {
            page: page + i,
            text: read.text,
            confidence: read.confidence,
            ..Default::default()
        })
        .collect()
}

/// A PDF page's size in points (its MediaBox, inherited from its parents) and the resolution
/// of the finest image it shows across its width, where they can be told.
fn page_size_and_scan_dpi(document: &[u8], page: u32) -> (Option<(f64, f64)>, Option<u32>) {
    let Ok(doc) = lopdf::Document::load_mem(document) else { return (None, None) };
    let Some(&id) = doc.get_pages().get(&page) else { return (None, None) };
    let size = page_size(&doc, id);
    let widest = doc.get_page_resources(id).ok().and_then(|(own, _)| {
        let (_, xobjects) = doc.dereference(own?.get(b"XObject").ok()?).ok()?;
        xobjects
            .as_dict()
            .ok()?
            .iter()
            .take(256)
            .filter_map(|(_, object)| match doc.dereference(object) {
                Ok((_, lopdf::Object::Stream(image))) => image.dict.get(b"Width").ok()?.as_i64().ok(),
                _ => None,
            })
            .max()
    });
    let native = match (size, widest) {
        (Some((width, _)), Some(pixels)) if width > 0.0 && pixels > 0 => {
            Some((pixels as f64 / (width / 72.0)).round().min(f64::from(u32::MAX)) as u32)
        }
        _ => None,
    };
    (size, native)
}

/// A PDF page's size in points (its MediaBox, inherited from its parents), if it can be told.
fn page_size(doc: &lopdf::Document, mut id: lopdf::ObjectId) -> Option<(f64, f64)> {
    // The chain of parents is bounded: a loop of them ends here, not in the renderer.
    for _ in 0..32 {
        let dict = doc.get_dictionary(id).ok()?;
        if let Ok(lopdf::Object::Array(corners)) =
            dict.get(b"MediaBox").and_then(|b| doc.dereference(b).map(|(_, o)| o))
        {
            let n: Vec<f64> = corners.iter().filter_map(|c| c.as_float().ok().map(f64::from)).collect();
            if n.len() == 4 {
                let unit = dict.get(b"UserUnit").ok().and_then(|u| u.as_float().ok()).map_or(1.0, f64::from);
                return Some(((n[2] - n[0]) * unit, (n[3] - n[1]) * unit));
            }
        }
        id = dict.get(b"Parent").ok()?.as_reference().ok()?;
    }
    None
}

/// Why a tool gave no answer.
#[derive(Debug)]
enum ToolFailure {
    /// Past the page's wall clock (a slow page, or one starved by a busy server).
    TimedOut,
    /// Anything else, in words (a limit, a crash, a refusal).
    Failed(String),
}

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolFailure::TimedOut => f.write_str("reading the page took longer than its time allows"),
            ToolFailure::Failed(reason) => f.write_str(reason),
        }
    }
}

/// Run `program` with `args`, `input` on its stdin; its stdout (at most `limit` bytes) once it
/// exits well by `deadline`. It is killed at the deadline, and with this reader's process group
/// (its parent kills the group when the reader is stopped).
fn run_tool(
    program: &Path,
    args: &[String],
    input: &[u8],
    limit: usize,
    deadline: std::time::Instant,
) -> Result<Vec<u8>, ToolFailure> {
    use std::os::unix::process::ExitStatusExt;
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        // One thread: the reader's share of the cores is the readers' count, not Tesseract's.
        .env("OMP_THREAD_LIMIT", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // The reader's own stderr is nothing already (no file here may be opened).
        .stderr(Stdio::inherit());
    let mut child = command.spawn().map_err(|e| ToolFailure::Failed(format!("{name} could not start ({e})")))?;
    let pid = child.id();
    let timed_out = Arc::new(Mutex::new(false));
    let watchdog = {
        let timed_out = timed_out.clone();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let wait = deadline.saturating_duration_since(std::time::Instant::now());
        let thread = std::thread::spawn(move || {
            if stopped.recv_timeout(wait) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                *timed_out.lock().unwrap_or_else(|e| e.into_inner()) = true;
                // SAFETY: plain syscall on our own child, not yet reaped (we wait for this
                // thread before reaping it).
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        });
        (stop, thread)
    };
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        // A tool that stops reading (it failed) makes this fail; its status says why.
        let _ = stdin.write_all(&input);
    });
    let mut output = Vec::new();
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut too_much = false;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stdout.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) if output.len() + n > limit => {
                too_much = true;
                // SAFETY: plain syscall on our own unreaped child.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                break;
            }
            Ok(n) => output.extend_from_slice(&buffer[..n]),
        }
    }
    drop(stdout);
    let _ = feeder.join();
    let _ = watchdog.0.send(());
    let _ = watchdog.1.join();
    let status = child.wait().map_err(|_| ToolFailure::Failed(format!("{name} could not be waited for")))?;
    if *timed_out.lock().unwrap_or_else(|e| e.into_inner()) {
        return Err(ToolFailure::TimedOut);
    }
    if too_much {
        return Err(ToolFailure::Failed("the page is too large to read".into()));
    }
    match status {
        s if s.success() => Ok(output),
        s if s.signal().is_some() => Err(ToolFailure::Failed("the page is too complex or too large to read".into())),
        _ => Err(ToolFailure::Failed(format!("the page could not be read ({name} failed)"))),
    }
}

/// Pure: the text of a document read page by page: its text pages as they were, its scanned
/// ones as OCR read them (a skipped page is left out), in page order.
pub fn compose(page_texts: &[String], read: &[PageReading]) -> String {
    let mut text = String::new();
    for (number, page) in (1..).zip(page_texts) {
        if !page.trim().is_empty() {
            text.push_str(page);
            continue;
        }
        if let Some(reading) = read.iter().find(|r| r.page == number && r.skipped.is_none()) {
            if !reading.text.trim().is_empty() {
                if !text.is_empty() && !text.ends_with("\n\n") {
                    text.push_str(if text.ends_with('\n') { "\n" } else { "\n\n" });
                }
                text.push_str(&reading.text);
                text.push_str("\n\n");
            }
        }
    }
    text
}

/// Pure: how a document's scanned pages were read, for its owner.
pub fn report(pages: u32, language: &str, read: &[PageReading], floor: f32) -> sluice_types::scan::ScanReport {
    use sluice_types::scan::{OcrPage, ScanReport, SkippedPage};
    ScanReport {
        pages,
        language: language.to_string(),
        read: read
            .iter()
            .filter(|r| r.skipped.is_none())
            .map(|r| {
                let confidence = r.confidence.unwrap_or(0.0);
                OcrPage { page: r.page, confidence: (confidence * 10.0).round() / 10.0, low: confidence < floor }
            })
            .collect(),
        skipped: read
            .iter()
            .filter_map(|r| r.skipped.as_ref().map(|reason| SkippedPage { page: r.page, reason: reason.clone() }))
            .collect(),
        confidence_floor: floor,
    }
}

/// The refusal for a scan where no OCR is installed (nobody's fault but the server's: free).
pub fn no_ocr_error() -> JobError {
    JobError::new(
        ErrorClass::InvalidInput,
        "this document is a scan (pages without a text layer), and this server cannot read scans: \
         its operator has not installed OCR",
    )
}

/// Pure: the refusal for a scan of more pages than are read in one document.
pub fn too_many_pages(scanned: u32, most: u32) -> String {
    format!("the document has {scanned} scanned pages; Sluice reads at most {most} by OCR in one document: split it")
}

/// Whether `doc_type` may hold scanned pages.
pub fn may_be_scanned(doc_type: DocType) -> bool {
    doc_type.has_pages()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(page: u32, text: &str) -> PageReading {
        PageReading { page, text: text.into(), confidence: Some(90.0), ..Default::default() }
    }

    #[test]
    fn scanned_pages_take_their_place_among_the_text_pages() {
        let pages = ["First page.\n\n".to_string(), String::new(), "Third page.\n\n".into(), " \n".into()];
        let readings =
            [read(2, "Second, scanned."), PageReading { page: 4, skipped: Some("slow".into()), ..read(4, "") }];
        assert_eq!(compose(&pages, &readings), "First page.\n\nSecond, scanned.\n\nThird page.\n\n");
        assert_eq!(compose(&[String::new()], &[read(1, "Only page")]), "Only page\n\n");
        assert_eq!(compose(&[String::new()], &[]), "");
    }

    #[test]
    fn the_report_flags_pages_under_the_floor_and_names_the_skipped() {
        let readings = [
            read(1, "a"),
            PageReading { confidence: Some(41.26), ..read(2, "b") },
            PageReading { skipped: Some("took too long".into()), ..read(3, "") },
        ];
        let report = report(3, "eng", &readings, 60.0);
        assert_eq!(report.read.len(), 2);
        assert_eq!(report.low_pages(), vec![2]);
        assert_eq!(report.read[1].confidence, 41.3);
        assert_eq!(report.skipped[0].page, 3);
    }

    #[test]
    fn a_document_language_is_one_offered_or_auto_where_allowed() {
        let mut config = OcrConfig::new(vec!["eng".into(), "deu".into()]);
        assert_eq!(config.language_for(None).unwrap(), "eng");
        assert_eq!(config.language_for(Some(" ")).unwrap(), "eng");
        assert_eq!(config.language_for(Some("deu")).unwrap(), "deu");
        assert!(config.language_for(Some("fra")).unwrap_err().contains("eng, deu"));
        assert!(config.language_for(Some("auto")).is_err(), "detection is the operator's choice");
        config.detect_language = true;
        assert_eq!(config.language_for(Some("auto")).unwrap(), "auto");
        assert_eq!(missing_languages(&config.languages, &["eng".to_string()]), vec!["deu".to_string()]);
    }
}
