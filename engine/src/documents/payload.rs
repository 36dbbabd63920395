//! What a document job's payload holds (ids and metadata, never the bytes), and what that
//! says about its size: shared by the upload (`intake`), the worker (`processor`) and whatever
//! deletes documents (`sweep`, account deletion).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sniff::DocType;
use crate::Preset;
use sluice_types::capacity::{self, SizeKind};

/// What a document job's payload holds (ids and metadata, never the bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentRef {
    pub key: String,
    #[serde(rename = "type")]
    pub doc_type: DocType,
    pub sha256: String,
    pub size: u64,
    /// The user's file name, sanitised, for display only.
    pub name: Option<String>,
    /// A text's tokens as counted at upload (none for a PDF, or a document stored before
    /// tokens were counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// A scan's pages without a text layer, as surveyed at upload (then `tokens` are its text
    /// layer's): priced by page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scanned_pages: Option<u32>,
}

impl DocumentRef {
    /// What it is, as admission prices it.
    pub fn size_for_price(&self) -> DocumentSize {
        DocumentSize {
            doc_type: self.doc_type,
            bytes: self.size,
            tokens: self.tokens,
            scanned_pages: self.scanned_pages.unwrap_or(0),
        }
    }
}

/// A document job's payload: the document and what to do with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentJob {
    pub document: DocumentRef,
    pub preset: Preset,
    #[serde(default)]
    pub language: Option<String>,
    /// A translation's glossary and formality.
    #[serde(default, skip_serializing_if = "super::glossary::Guidance::is_empty")]
    pub guidance: super::glossary::Guidance,
    /// In the economy lane: its calls go to the provider's batch API first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub economy: bool,
    /// The economy lane's discount when it was admitted (a held document is settled at it,
    /// whatever the lane's terms are by then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub economy_discount: Option<f64>,
    /// The language its scanned pages are read in by OCR (Tesseract's code, or `auto`); none:
    /// the operator's first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_language: Option<String>,
}

impl DocumentJob {
    /// The type its result also comes back in as a file: a translated Word or OpenDocument
    /// file's or web page's own (None: the result is Markdown only).
    pub fn translated_file_type(&self) -> Option<DocType> {
        let rebuilt = matches!(self.document.doc_type, DocType::Docx | DocType::Odt | DocType::Html);
        (self.preset == Preset::Translate && rebuilt).then_some(self.document.doc_type)
    }
}

/// A document as admission prices it: its type and bytes, and a text's tokens as counted while
/// it streamed in (a document stored before tokens were counted has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DocumentSize {
    pub doc_type: DocType,
    pub bytes: u64,
    pub tokens: Option<u64>,
    /// Pages read by OCR (a scan's, surveyed at upload): its `tokens` are its text layer's.
    pub scanned_pages: u32,
}

/// About what a page of text read by OCR adds to a document's tokens (a dense typed page).
pub const TOKENS_PER_SCANNED_PAGE: u64 = 700;

impl DocumentSize {
    /// Its provider request's input tokens: counted (with a scan's pages at about a dense
    /// page's each), or estimated from its size and type.
    pub fn input_tokens(&self) -> u64 {
        let scanned = u64::from(self.scanned_pages) * TOKENS_PER_SCANNED_PAGE;
        match self.tokens {
            Some(tokens) => tokens.saturating_add(scanned).saturating_add(capacity::PROMPT_OVERHEAD_TOKENS),
            None => capacity::estimate_input_tokens(size_kind(self.doc_type), self.bytes),
        }
    }

    /// Whether it is a scan surveyed at upload, priced by page.
    pub fn is_scan(&self) -> bool {
        self.scanned_pages > 0 && self.tokens.is_some()
    }
}

/// How a document type's size turns into tokens.
pub fn size_kind(doc_type: DocType) -> SizeKind {
    match doc_type {
        // An image is priced by its pages once surveyed; by size it is held as a PDF is.
        DocType::Pdf | DocType::Png | DocType::Jpeg | DocType::Tiff => SizeKind::Pdf,
        DocType::PlainText | DocType::Markdown => SizeKind::Text,
        DocType::Docx | DocType::Odt => SizeKind::Packed,
        DocType::Html => SizeKind::Page,
    }
}

/// The blob key a job's payload points at, for retention.
pub fn blob_key(payload: &Value) -> Option<&str> {
    payload.pointer("/document/key").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_translated_word_or_opendocument_file_comes_back_as_a_file() {
        let job = |doc_type, preset| DocumentJob {
            guidance: Default::default(),
            economy: false,
            economy_discount: None,
            document: DocumentRef {
                key: "k".into(),
                doc_type,
                sha256: String::new(),
                size: 1,
                name: None,
                tokens: None,
                scanned_pages: None,
            },
            document_language: None,
            preset,
            language: Some("German".into()),
        };
        assert_eq!(job(DocType::Docx, Preset::Translate).translated_file_type(), Some(DocType::Docx));
        assert_eq!(job(DocType::Odt, Preset::Translate).translated_file_type(), Some(DocType::Odt));
        assert_eq!(job(DocType::Docx, Preset::Summarize).translated_file_type(), None);
        assert_eq!(job(DocType::Pdf, Preset::Translate).translated_file_type(), None);
    }
}
