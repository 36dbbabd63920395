//! Text extraction: a document's text, ready for a provider.

use super::office::Flavour;
use super::sniff::DocType;
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// A document's text, ready for a provider.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted {
    pub text: String,
    /// PDFs only.
    pub pages: Option<u32>,
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
            Ok(Extracted { text: text.to_string(), pages: None })
        }
        DocType::Pdf => extract_pdf(bytes),
        DocType::Docx => office(Flavour::Word, bytes),
        DocType::Odt => office(Flavour::OpenDocument, bytes),
        DocType::Html => {
            let page = String::from_utf8_lossy(bytes);
            Ok(Extracted { text: super::html::extract(&page).map_err(|reason| invalid(&reason))?, pages: None })
        }
    }
}

fn office(flavour: Flavour, bytes: &[u8]) -> Result<Extracted, JobError> {
    let text = super::office::extract(flavour, bytes).map_err(|reason| invalid(&reason))?;
    Ok(Extracted { text, pages: None })
}

fn extract_pdf(bytes: &[u8]) -> Result<Extracted, JobError> {
    if is_encrypted(bytes) {
        return Err(invalid("the PDF is encrypted (password-protected); upload a copy without protection"));
    }
    let doc = lopdf::Document::load_mem(bytes).map_err(|_| invalid("the PDF is damaged and cannot be read"))?;
    let pages = doc.get_pages().len() as u32;
    // pdf-extract can panic on unusual files; a panic here is the file's fault, not a transient one.
    let text = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem(bytes))
        .map_err(|_| invalid("the PDF's text could not be read"))?
        .map_err(|_| invalid("the PDF's text could not be read"))?;
    if text.trim().is_empty() {
        return Err(invalid("the PDF has no text layer (is it a scan?); upload a PDF with selectable text"));
    }
    Ok(Extracted { text, pages: Some(pages) })
}

/// An encrypted PDF names an `/Encrypt` dictionary in its trailer (plain text even when the
/// cross-reference table is a stream).
fn is_encrypted(bytes: &[u8]) -> bool {
    bytes.windows(8).enumerate().any(|(i, w)| {
        w == b"/Encrypt"
            && bytes.get(i + 8).is_some_and(|b| b.is_ascii_whitespace() || *b == b'<' || b.is_ascii_digit())
    })
}
