//! Writes the browser suite's scanned PDF (`end2end/fixtures/scan.pdf`): twelve pages rendered
//! to images by poppler's `pdftoppm`, no text layer, as a scanner makes them.
//! `cargo run -p engine --example scan_fixture -- end2end/fixtures/scan.pdf`

use engine::testing::{pdf_of_pages, TestPage};

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "scan.pdf".into());
    let pages: Vec<TestPage> = (1..=12)
        .map(|n| {
            TestPage::Scanned(vec![
                format!("Survey reference 4471, page {n}."),
                format!("Finding {n}: the north wall needs repointing."),
            ])
        })
        .collect();
    std::fs::write(&out, pdf_of_pages(&pages)).expect("write the scan");
}
