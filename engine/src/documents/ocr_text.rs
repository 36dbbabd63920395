//! What Tesseract answers, made into a page's text and its confidence; and how finely a page is
//! rendered for it. Pure: the OCR itself runs in the sandbox ([`super::ocr`]).

/// One page as OCR read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PageText {
    /// Lines joined by newlines, paragraphs by a blank line, as the page lays them out.
    pub text: String,
    /// The mean confidence of its words (0–100), weighted by their length; none without words.
    pub confidence: Option<f32>,
}

/// Pure: Tesseract's TSV answer (`tesseract … tsv`) as pages, in its `page_num` order (a TIFF
/// of several frames gives several). Rows it cannot read are left out.
pub fn parse_tsv(tsv: &str) -> Vec<PageText> {
    struct Building {
        page: u32,
        text: String,
        key: Option<(u32, u32, u32)>,
        weighted: f64,
        letters: f64,
    }
    let mut pages: Vec<Building> = Vec::new();
    for row in tsv.lines().skip(1) {
        let fields: Vec<&str> = row.splitn(12, '\t').collect();
        if fields.len() < 11 {
            continue;
        }
        let number = |i: usize| fields[i].trim().parse::<u32>().ok();
        let (Some(level), Some(page)) = (number(0), number(1)) else { continue };
        if pages.last().is_none_or(|p| p.page != page) {
            pages.push(Building { page, text: String::new(), key: None, weighted: 0.0, letters: 0.0 });
        }
        let building = pages.last_mut().expect("pushed above");
        let word = fields.get(11).map(|w| w.trim()).unwrap_or("");
        if level != 5 || word.is_empty() {
            continue;
        }
        let (Some(block), Some(paragraph), Some(line)) = (number(2), number(3), number(4)) else { continue };
        let key = (block, paragraph, line);
        match building.key {
            None => {}
            Some((b, p, _)) if (b, p) != (block, paragraph) => building.text.push_str("\n\n"),
            Some(last) if last != key => building.text.push('\n'),
            Some(_) => building.text.push(' '),
        }
        building.key = Some(key);
        building.text.push_str(word);
        if let Ok(confidence) = fields[10].trim().parse::<f64>() {
            if (0.0..=100.0).contains(&confidence) {
                let letters = word.chars().count() as f64;
                building.weighted += confidence * letters;
                building.letters += letters;
            }
        }
    }
    pages
        .into_iter()
        .map(|p| PageText { confidence: (p.letters > 0.0).then(|| (p.weighted / p.letters) as f32), text: p.text })
        .collect()
}

/// Pure: the resolution a page of `width_pt` × `height_pt` points is rendered at: `max_dpi`,
/// or less so it stays within `max_pixels` (a page that claims to be 200 inches square is
/// rendered coarsely, never as a billion pixels). At least 1.
pub fn dpi_for(width_pt: f64, height_pt: f64, max_pixels: u64, max_dpi: u32) -> u32 {
    let (w, h) = (width_pt.abs() / 72.0, height_pt.abs() / 72.0);
    if !(w.is_finite() && h.is_finite()) || w * h <= 0.0 {
        return max_dpi.max(1);
    }
    let fits = (max_pixels as f64 / (w * h)).sqrt().floor();
    (fits.min(f64::from(max_dpi)) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HEADER: &str =
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext";

    fn word(page: u32, block: u32, par: u32, line: u32, conf: f64, text: &str) -> String {
        format!("5\t{page}\t{block}\t{par}\t{line}\t1\t0\t0\t10\t10\t{conf}\t{text}")
    }

    #[test]
    fn words_become_lines_and_paragraphs_with_a_weighted_confidence() {
        let tsv = [
            HEADER.to_string(),
            "1\t1\t0\t0\t0\t0\t0\t0\t1275\t1650\t-1\t".into(),
            word(1, 1, 1, 1, 90.0, "The"),
            word(1, 1, 1, 1, 90.0, "tenant"),
            word(1, 1, 1, 2, 60.0, "pays."),
            word(1, 2, 1, 1, 96.0, "Signed"),
            "5\t1\t2\t1\t1\t2\t0\t0\t10\t10\t-1\t ".into(),
        ]
        .join("\n");
        let pages = parse_tsv(&tsv);
        assert_eq!(pages.len(), 1);
        assert_eq!(pages[0].text, "The tenant\npays.\n\nSigned");
        // (3×90 + 6×90 + 5×60 + 6×96) / 20
        assert!((pages[0].confidence.unwrap() - 84.3).abs() < 0.01, "{:?}", pages[0].confidence);
    }

    #[test]
    fn frames_are_pages_and_an_empty_page_has_no_confidence() {
        let tsv = [HEADER.to_string(), "1\t1\t0\t0\t0\t0\t0\t0\t10\t10\t-1\t".into(), word(2, 1, 1, 1, 80.0, "two")]
            .join("\n");
        let pages = parse_tsv(&tsv);
        assert_eq!(pages.len(), 2);
        assert_eq!((pages[0].text.as_str(), pages[0].confidence), ("", None));
        assert_eq!(pages[1].text, "two");
        assert!(parse_tsv("").is_empty());
        assert!(parse_tsv("garbage\nmore garbage\t\t").is_empty());
    }

    #[test]
    fn pages_render_at_the_cap_or_within_the_pixels() {
        // A letter page at 300 DPI is 8.4 megapixels: within 25.
        assert_eq!(dpi_for(612.0, 792.0, 25_000_000, 300), 300);
        // 200 inches square within 25 megapixels: 25 DPI.
        let dpi = dpi_for(14_400.0, 14_400.0, 25_000_000, 300);
        assert_eq!(dpi, 25);
        assert_eq!(dpi_for(0.0, 792.0, 25_000_000, 300), 300, "a page without a size gets the cap");
        assert_eq!(dpi_for(f64::NAN, 1.0, 1, 300), 300);
        assert_eq!(dpi_for(1e12, 1e12, 1, 300), 1);
    }

    proptest! {
        #[test]
        fn a_rendered_page_stays_within_its_pixels(w in 1.0f64..1e6, h in 1.0f64..1e6, max in 1_000u64..100_000_000) {
            let dpi = dpi_for(w, h, max, 600);
            let pixels = (w / 72.0 * f64::from(dpi)) * (h / 72.0 * f64::from(dpi));
            prop_assert!(dpi == 1 || pixels <= max as f64 * 1.0001, "{dpi} DPI: {pixels} pixels");
        }

        #[test]
        fn any_answer_parses(tsv in "[0-9\t a-z\n-]{0,300}") {
            let _ = parse_tsv(&tsv);
        }
    }
}
