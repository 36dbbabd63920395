//! Scans: documents (or pages) without a text layer, read by OCR. What a user is told about
//! them (which pages OCR read, with what confidence, which it skipped) and what they cost.

use serde::{Deserialize, Serialize};

/// One page read by OCR: its number (1-based) and the recogniser's mean word confidence (0–100).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OcrPage {
    pub page: u32,
    pub confidence: f32,
    /// Under the operator's confidence floor: worth checking against the original.
    #[serde(default)]
    pub low: bool,
}

/// A page OCR did not read (past its time or memory bound), and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkippedPage {
    pub page: u32,
    pub reason: String,
}

/// How a document with scanned pages was read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScanReport {
    /// The document's pages in all (text pages and scanned ones).
    pub pages: u32,
    /// The OCR language used (Tesseract's code, e.g. `eng`).
    pub language: String,
    /// The pages OCR read, in order.
    pub read: Vec<OcrPage>,
    /// The pages it could not read (left out of the text).
    #[serde(default)]
    pub skipped: Vec<SkippedPage>,
    /// The confidence under which a page is flagged.
    pub confidence_floor: f32,
}

impl ScanReport {
    /// The pages flagged under the confidence floor.
    pub fn low_pages(&self) -> Vec<u32> {
        self.read.iter().filter(|p| p.low).map(|p| p.page).collect()
    }
}

/// What OCR'd pages cost: `millicredits_per_page` each (thousandths of a credit), rounded up
/// to a whole credit over the document (40 pages at 0.3 credits: 12).
pub fn scan_credits(pages: u32, millicredits_per_page: u32) -> i64 {
    (u64::from(pages) * u64::from(millicredits_per_page)).div_ceil(1000).min(i32::MAX as u64) as i64
}

/// Pure: `0.3` (credits per page, as an operator writes it) in thousandths of a credit.
pub fn parse_page_price(text: &str) -> Result<u32, String> {
    let credits: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of credits"))?;
    if !credits.is_finite() || !(0.0..=1000.0).contains(&credits) {
        return Err("a page's price is between 0 and 1000 credits".into());
    }
    Ok((credits * 1000.0).round() as u32)
}

/// A page's price, in credits, as an operator writes it (`0.3`).
pub fn page_price_text(millicredits_per_page: u32) -> String {
    let text = format!("{:.3}", f64::from(millicredits_per_page) / 1000.0);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_priced_in_thousandths_and_rounded_up_over_the_document() {
        assert_eq!(scan_credits(40, 300), 12);
        assert_eq!(scan_credits(1, 300), 1, "a started credit is a credit");
        assert_eq!(scan_credits(0, 300), 0);
        assert_eq!(scan_credits(3, 0), 0);
        assert_eq!(scan_credits(u32::MAX, u32::MAX), i32::MAX as i64, "never past what a cost column holds");
        assert_eq!(parse_page_price("0.3"), Ok(300));
        assert_eq!(parse_page_price(" 2 "), Ok(2000));
        assert!(parse_page_price("-1").is_err());
        assert!(parse_page_price("NaN").is_err());
        assert!(parse_page_price("lots").is_err());
        assert_eq!(page_price_text(300), "0.3");
        assert_eq!(page_price_text(2000), "2");
        assert_eq!(page_price_text(0), "0");
    }
}
