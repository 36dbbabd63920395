//! Text extraction: a document's text, ready for a provider.

use super::office::Flavour;
use super::sniff::DocType;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// A document's text, ready for a provider.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    pub text: String,
    /// PDFs and images only.
    pub pages: Option<u32>,
    /// A PDF's or an image's text page by page (its `text` is them joined); a page without a
    /// text layer is empty. Empty for other documents.
    pub page_texts: Vec<String>,
    /// The pages (1-based, in order) without a text layer that show an image: scans, for OCR.
    /// A page with neither text nor image is blank, and left as it is.
    pub scanned: Vec<u32>,
}

impl Extracted {
    /// A document read page by page, with its scanned pages.
    pub fn of_pages(page_texts: Vec<String>, scanned: Vec<u32>) -> Extracted {
        Extracted { text: page_texts.concat(), pages: Some(page_texts.len() as u32), page_texts, scanned }
    }

    /// Its text, not read page by page.
    pub fn whole(text: String) -> Extracted {
        Extracted { text, pages: None, page_texts: Vec::new(), scanned: Vec::new() }
    }
}

fn invalid(message: &str) -> JobError {
    JobError::new(ErrorClass::InvalidInput, message)
}

/// Extract the text. Encrypted PDFs, PDFs without a text layer and damaged files fail as
/// `invalid_input` with a reason a user understands (never retried). CPU-heavy: run it on a
/// blocking thread.
pub fn extract_text(doc_type: DocType, bytes: &[u8]) -> Result<Extracted, JobError> {
    match doc_type {
        DocType::PlainText | DocType::Markdown => {
            let text = std::str::from_utf8(bytes).map_err(|_| invalid("the text is not valid UTF-8"))?;
            if text.trim().is_empty() {
                return Err(invalid("the document is empty"));
            }
            Ok(Extracted::whole(text.to_string()))
        }
        DocType::Pdf => extract_pdf(bytes),
        // A photo of a page has no text layer: every frame is a page for OCR, once its
        // headers say it is within bounds.
        DocType::Png | DocType::Jpeg | DocType::Tiff => {
            let size = super::images::measure(bytes, super::images::ImageBounds::DEFAULT)
                .map_err(|reason| invalid(&reason))?;
            Ok(Extracted::of_pages(vec![String::new(); size.frames as usize], (1..=size.frames).collect()))
        }
        DocType::Docx => office(Flavour::Word, bytes),
        DocType::Odt => office(Flavour::OpenDocument, bytes),
        DocType::Html => {
            let page = String::from_utf8_lossy(bytes);
            let text = super::html::extract(&page).map_err(|reason| invalid(&reason))?;
            Ok(Extracted::whole(text))
        }
    }
}

fn office(flavour: Flavour, bytes: &[u8]) -> Result<Extracted, JobError> {
    let text = super::office::extract(flavour, bytes).map_err(|reason| invalid(&reason))?;
    Ok(Extracted::whole(text))
}

fn extract_pdf(bytes: &[u8]) -> Result<Extracted, JobError> {
    if is_encrypted(bytes) {
        return Err(invalid("the PDF is encrypted (password-protected); upload a copy without protection"));
    }
    let doc = lopdf::Document::load_mem(bytes).map_err(|_| invalid("the PDF is damaged and cannot be read"))?;
    // Page by page, so a scanned page among text pages is known (and read by OCR). A page
    // whose text cannot be read is as one without text; pdf-extract can panic on unusual
    // files, and a panic is the file's fault, not a transient one.
    let mut page_texts = Vec::new();
    let mut scanned = Vec::new();
    let mut failed = 0;
    for (number, id) in doc.get_pages() {
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut text = String::new();
            let mut output = pdf_extract::PlainTextOutput::new(&mut text);
            pdf_extract::output_doc_page(&doc, &mut output, number).map(|()| text)
        }));
        let text = match read {
            Ok(Ok(text)) => text,
            _ => {
                failed += 1;
                String::new()
            }
        };
        if text.trim().is_empty() && shows_an_image(&doc, id) {
            scanned.push(number);
        }
        page_texts.push(text);
    }
    if page_texts.is_empty() {
        return Err(invalid("the PDF has no pages"));
    }
    if failed == page_texts.len() {
        return Err(invalid("the PDF's text could not be read"));
    }
    if scanned.is_empty() && page_texts.iter().all(|t| t.trim().is_empty()) {
        return Err(invalid(NO_TEXT_LAYER));
    }
    Ok(Extracted::of_pages(page_texts, scanned))
}

/// Whether a page shows an image: an image XObject in its resources (or in a form's it
/// draws, one level down, as some scanners wrap them), or an inline image in its content.
fn shows_an_image(doc: &lopdf::Document, page: lopdf::ObjectId) -> bool {
    let is_image = |object: &lopdf::Object| match doc.dereference(object) {
        Ok((_, lopdf::Object::Stream(stream))) => {
            stream.dict.get(b"Subtype").and_then(|s| s.as_name()).is_ok_and(|name| name == b"Image")
        }
        _ => false,
    };
    let images_in = |resources: &lopdf::Dictionary| -> bool {
        let Ok((_, lopdf::Object::Dictionary(xobjects))) = resources.get(b"XObject").and_then(|x| doc.dereference(x))
        else {
            return false;
        };
        xobjects.iter().take(256).any(|(_, object)| {
            is_image(object)
                || (matches!(doc.dereference(object), Ok((_, lopdf::Object::Stream(form)))
                if form.dict.get(b"Resources").and_then(|r| doc.dereference(r)).is_ok_and(|(_, r)| {
                    r.as_dict().is_ok_and(|r| {
                        r.get(b"XObject").and_then(|x| doc.dereference(x)).is_ok_and(|(_, x)| {
                            x.as_dict().is_ok_and(|x| x.iter().take(256).any(|(_, o)| is_image(o)))
                        })
                    })
                })))
        })
    };
    let (own, inherited) = doc.get_page_resources(page).unwrap_or((None, Vec::new()));
    if own.is_some_and(|r| images_in(r)) {
        return true;
    }
    if inherited.iter().take(32).any(|id| doc.get_dictionary(*id).is_ok_and(|r| images_in(r))) {
        return true;
    }
    // An inline image: `BI … ID … EI` in the page's content.
    doc.get_page_content(page).is_ok_and(|content| content.windows(3).any(|w| w == b"BI\n" || w == b"BI "))
}

/// The refusal for a PDF without text where no OCR reads it.
pub const NO_TEXT_LAYER: &str = "the PDF has no text layer (is it a scan?); upload a PDF with selectable text";

/// An encrypted PDF names an `/Encrypt` dictionary in its trailer (plain text even when the
/// cross-reference table is a stream).
fn is_encrypted(bytes: &[u8]) -> bool {
    bytes.windows(8).enumerate().any(|(i, w)| {
        w == b"/Encrypt"
            && bytes.get(i + 8).is_some_and(|b| b.is_ascii_whitespace() || *b == b'<' || b.is_ascii_digit())
    })
}
