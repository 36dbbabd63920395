//! Word files, OpenDocument texts and web pages: told apart by their content, read in the
//! sandboxed child, and every crafted one (a zip bomb that lies, a billion laughs, nesting,
//! an entry leaving the archive, ten thousand entries) refused in plain words while this
//! process stays small.

use engine::documents::extract::extract_text;
use engine::documents::sandbox::{extract_in_child, SandboxConfig};
use engine::documents::sniff::sniff;
use engine::documents::DocType;
use engine::queue::policy::retry::ErrorClass;
use engine::testing::*;

fn sandbox() -> SandboxConfig {
    let mut config = SandboxConfig::new(env!("CARGO_BIN_EXE_sluice-extract").into(), Vec::new());
    config.memory_bytes = 512 << 20;
    config
}

/// A Word body with what contracts hold: a heading, a list, a table, formatted runs.
const CONTRACT: &str = r#"
    <w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr><w:r><w:t>Service agreement</w:t></w:r></w:p>
    <w:p><w:r><w:t xml:space="preserve">The supplier </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>shall</w:t></w:r><w:r><w:t xml:space="preserve"> deliver &amp; install.</w:t></w:r></w:p>
    <w:p><w:pPr><w:numPr><w:ilvl w:val="0"/><w:numId w:val="1"/></w:numPr></w:pPr><w:r><w:t>Delivery within 30 days</w:t></w:r></w:p>
    <w:tbl><w:tr><w:tc><w:p><w:r><w:t>Price</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>100 EUR</w:t></w:r></w:p></w:tc></w:tr></w:tbl>
"#;

#[test]
fn the_content_decides_the_type_whatever_the_name() {
    assert_eq!(sniff(&docx_of(CONTRACT)[..8192.min(docx_of(CONTRACT).len())]), Ok(DocType::Docx));
    assert_eq!(sniff(&odt_of("<text:p>x</text:p>")), Ok(DocType::Odt));
    assert_eq!(sniff(&pdf_with_text(&["a .docx that is a PDF"])), Ok(DocType::Pdf));
    assert_eq!(sniff(b"<!DOCTYPE html><html><body><p>a .docx that is a page</p></body></html>"), Ok(DocType::Html));
    let not_word = zip_of(&[("notes/hello.txt", b"hello")]);
    assert!(sniff(&not_word).unwrap_err().contains("not a Word (.docx) or OpenDocument text (.odt)"));
    let spreadsheet =
        zip_of(&[("mimetype", b"application/vnd.oasis.opendocument.spreadsheet"), ("content.xml", b"<a/>")]);
    assert!(sniff(&spreadsheet).is_err(), "a spreadsheet is not a text");
}

#[test]
fn paragraphs_headings_lists_and_tables_come_out_in_order() {
    let text = extract_text(DocType::Docx, &docx_of(CONTRACT)).unwrap().text;
    assert_eq!(
        text,
        "# Service agreement\n\nThe supplier <b1>shall</b1> deliver & install.\n\n- Delivery within 30 days\n\nPrice\n\n100 EUR"
    );
    let odt = odt_of(
        r#"<text:h text:outline-level="2">Setup</text:h><text:p>Press<text:s/>the <text:span>red</text:span> button.</text:p>
           <text:list><text:list-item><text:p>Wait</text:p></text:list-item></text:list>"#,
    );
    assert_eq!(extract_text(DocType::Odt, &odt).unwrap().text, "## Setup\n\nPress the <s1>red</s1> button.\n\n- Wait");
    let page = b"<html><head><script>steal()</script></head><body><h2>News</h2><p>It rained.</p></body></html>";
    assert_eq!(extract_text(DocType::Html, page).unwrap().text, "## News\n\nIt rained.");
}

/// What each crafted file is, its type, and a part of the reason its sender reads.
fn hostile_office_files() -> Vec<(&'static str, DocType, Vec<u8>, &'static str)> {
    let laughs = format!(
        r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">{}]><w:document><w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>"#,
        (1..10).map(|n| format!("<!ENTITY lol{n} \"{}\">", format!("&lol{};", n - 1).repeat(10))).collect::<String>()
    );
    let laughs = zip_of(&[("[Content_Types].xml", b"<Types/>"), ("word/document.xml", laughs.as_bytes())]);
    // Each level told apart (as Word's revision ids do), so it is the nesting that is refused,
    // not a ratio.
    let opening: String =
        (0..300_000u64).map(|i| format!("<w:p w:rsidR=\"{:08X}\">", i.wrapping_mul(2_654_435_761))).collect();
    let deep = docx_of(&format!("{opening}<w:t>deep</w:t>{}", "</w:p>".repeat(300_000)));
    let escaping =
        zip_of(&[("word/document.xml", docx_body_xml("fine").as_bytes()), ("../../etc/cron.d/evil", b"* * * * * x")]);
    let many: Vec<(String, Vec<u8>)> = (0..10_000).map(|i| (format!("word/media/{i}.xml"), Vec::new())).collect();
    let many: Vec<(&str, &[u8])> = many.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    // Issue 55, item 3: 300 headers of repeated XML, each under the one-part ratio's floor,
    // about 18 MB from a few hundred KB: the whole file's inflation is bounded, not each part's.
    let header = format!("<w:hdr>{}</w:hdr>", "<w:p><w:r><w:t>x</w:t></w:r></w:p>".repeat(1_800));
    let mut headers: Vec<(String, Vec<u8>)> =
        (1..=300).map(|i| (format!("word/header{i}.xml"), header.clone().into_bytes())).collect();
    headers.push(("word/document.xml".into(), docx_body_xml("fine").into_bytes()));
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    let mut truncated = docx_of(CONTRACT);
    truncated.truncate(truncated.len() / 2);
    vec![
        ("zip bomb: 1 GiB declared as 1 KiB", DocType::Docx, docx_zip_bomb(1 << 30), "zip bomb"),
        ("billion laughs", DocType::Docx, laughs, "DTD"),
        ("300 small headers of repeated XML", DocType::Docx, zip_of(&headers), "zip bomb"),
        ("300,000 nested paragraphs", DocType::Docx, deep, "nests deeper"),
        ("an entry leaving the archive", DocType::Docx, escaping, "leaves the archive"),
        ("10,000 entries", DocType::Docx, zip_of(&many), "entries"),
        ("a zip without a Word body", DocType::Docx, zip_of(&[("word/styles.xml", b"<a/>")]), "no word/document.xml"),
        ("half a Word file", DocType::Docx, truncated, "damaged"),
        (
            "an OpenDocument spreadsheet",
            DocType::Odt,
            zip_of(&[("mimetype", b"application/vnd.oasis.opendocument.spreadsheet"), ("content.xml", b"<a/>")]),
            "not a text document",
        ),
    ]
}

fn docx_body_xml(text: &str) -> String {
    format!("<w:document><w:body><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:body></w:document>")
}

#[tokio::test]
async fn crafted_office_files_fail_in_the_child_with_plain_reasons_and_this_process_stays_small() {
    for (name, doc_type, bytes, reason) in hostile_office_files() {
        let error = extract_in_child(&sandbox(), doc_type, bytes.into()).await.expect_err(name);
        assert_eq!(error.class, ErrorClass::InvalidInput, "{name}: never retried");
        assert!(error.message.contains(reason), "{name}: {}", error.message);
    }
    let honest = extract_in_child(&sandbox(), DocType::Docx, docx_of(CONTRACT).into()).await.unwrap();
    assert!(honest.text.starts_with("# Service agreement"));
    // A long honest document: 20,000 paragraphs.
    let paragraphs: Vec<String> = (0..20_000).map(|i| format!("Clause {i} binds both parties.")).collect();
    let refs: Vec<&str> = paragraphs.iter().map(String::as_str).collect();
    let long = extract_in_child(&sandbox(), DocType::Docx, docx_with_paragraphs(&refs).into()).await.unwrap();
    assert_eq!(long.text.split("\n\n").count(), 20_000);
    let peak = peak_rss_mib();
    assert!(peak < 300, "this process never inflated a byte of the bombs: peak RSS {peak} MiB");
}

/// A paragraph as a model translates it: its Markdown marker kept, its words changed.
fn translated(paragraph: &str) -> String {
    let marker_end = paragraph.find(|c: char| c != '#' && c != '-' && c != ' ').unwrap_or(0);
    format!("{}[de] {}", &paragraph[..marker_end], &paragraph[marker_end..])
}

#[tokio::test]
async fn a_translated_word_file_comes_back_whole_with_every_paragraph_in_place() {
    use engine::documents::sandbox::rebuild_in_child;
    let body =
        format!("{CONTRACT}<w:p><w:r><w:t>See note</w:t></w:r><w:r><w:footnoteReference w:id=\"1\"/></w:r></w:p>");
    let document = format!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="w"><w:body>{body}<w:sectPr/></w:body></w:document>"#
    );
    let footnotes = r#"<w:footnotes xmlns:w="w"><w:footnote w:id="1"><w:p><w:r><w:t>Prices exclude tax.</w:t></w:r></w:p></w:footnote></w:footnotes>"#;
    let types =
        br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>"#;
    let original = zip_of(&[
        ("[Content_Types].xml", types),
        ("word/document.xml", document.as_bytes()),
        ("word/footnotes.xml", footnotes.as_bytes()),
        ("word/header1.xml", br#"<w:hdr xmlns:w="w"><w:p><w:r><w:t>Confidential</w:t></w:r></w:p></w:hdr>"#),
        ("word/footer1.xml", br#"<w:ftr xmlns:w="w"><w:p><w:r><w:t>Page footer</w:t></w:r></w:p></w:ftr>"#),
        ("word/media/logo.png", b"\x89PNG not really"),
    ]);
    let text = extract_text(DocType::Docx, &original).unwrap().text;
    let paragraphs: Vec<String> = text.split("\n\n").map(translated).collect();
    assert_eq!(paragraphs.len(), 9, "{text}");
    assert!(
        text.ends_with("Prices exclude tax.\n\nPage footer\n\nConfidential"),
        "notes, then footers and headers: {text}"
    );

    let rebuilt = rebuild_in_child(&sandbox(), DocType::Docx, original.clone().into(), &paragraphs).await.unwrap();
    // It opens as a Word file whose text is the translation, paragraph by paragraph.
    assert_eq!(sniff(&rebuilt), Ok(DocType::Docx));
    assert_eq!(extract_text(DocType::Docx, &rebuilt).unwrap().text, paragraphs.join("\n\n"));
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&rebuilt)).unwrap();
    let entry = |archive: &mut zip::ZipArchive<_>, name: &str| {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut archive.by_name(name).unwrap(), &mut bytes).unwrap();
        bytes
    };
    assert_eq!(entry(&mut archive, "[Content_Types].xml"), types, "every other entry as it was");
    assert_eq!(entry(&mut archive, "word/media/logo.png"), b"\x89PNG not really");
    let xml = String::from_utf8(entry(&mut archive, "word/document.xml")).unwrap();
    for kept in [
        "<w:pStyle w:val=\"Heading1\"/>",
        "<w:numPr>",
        "<w:tbl>",
        "<w:b/>",
        "<w:footnoteReference w:id=\"1\"/>",
        "<w:sectPr/>",
    ] {
        assert!(xml.contains(kept), "{kept} is kept: {xml}");
    }
    // The bold word in a bold run of its own, the note's reference where the answer put it.
    assert!(
        xml.contains(
            r#"[de] The supplier </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t xml:space="preserve">shall</w:t></w:r>"#
        ),
        "{xml}"
    );
    assert!(xml.contains(r#"[de] See note</w:t></w:r><w:r><w:footnoteReference w:id="1"/></w:r></w:p>"#), "{xml}");
    let notes = String::from_utf8(entry(&mut archive, "word/footnotes.xml")).unwrap();
    assert!(notes.contains("[de] Prices exclude tax."), "{notes}");
    let header = String::from_utf8(entry(&mut archive, "word/header1.xml")).unwrap();
    assert!(header.contains("<w:t>[de] Confidential</w:t>"), "headers are translated too: {header}");

    // A translation that lost a paragraph is not forced into the file.
    let error = rebuild_in_child(&sandbox(), DocType::Docx, original.into(), &paragraphs[1..]).await.unwrap_err();
    assert!(error.message.contains("download the Markdown"), "{}", error.message);
}

#[tokio::test]
async fn a_translated_opendocument_text_comes_back_whole() {
    use engine::documents::sandbox::rebuild_in_child;
    let original = odt_of(
        r#"<text:h text:outline-level="1">Manual</text:h><text:p>Press <text:span text:style-name="B">the</text:span> button.</text:p>
           <text:list><text:list-item><text:p>Wait</text:p></text:list-item></text:list>"#,
    );
    let text = extract_text(DocType::Odt, &original).unwrap().text;
    let paragraphs: Vec<String> = text.split("\n\n").map(translated).collect();
    let rebuilt = rebuild_in_child(&sandbox(), DocType::Odt, original.into(), &paragraphs).await.unwrap();
    assert_eq!(sniff(&rebuilt), Ok(DocType::Odt), "the mimetype entry stays first and stored");
    assert_eq!(
        extract_text(DocType::Odt, &rebuilt).unwrap().text,
        "# [de] Manual\n\n[de] Press <s1>the</s1> button.\n\n- [de] Wait"
    );
}

#[tokio::test]
async fn an_opendocument_texts_spans_and_links_come_back_around_the_translated_words() {
    use engine::documents::sandbox::rebuild_in_child;
    let original = odt_of(
        r#"<text:p>The <text:span text:style-name="Bold">Supplier</text:span> delivers; see <text:a xmlns:xlink="http://www.w3.org/1999/xlink" xlink:href="https://example.com/terms">our <text:span text:style-name="Em">terms</text:span> page</text:a>.<text:bookmark text:name="here"/></text:p>
           <text:p>Plain <text:span text:style-name="Bold">lost</text:span></text:p>"#,
    );
    let text = extract_text(DocType::Odt, &original).unwrap().text;
    assert_eq!(
        text,
        "The <s1>Supplier</s1> delivers; see <a2>our </a2><a3>terms</a3><a4> page</a4>.\n\nPlain <s1>lost</s1>"
    );
    let translated = [
        "Siehe <a2>unsere </a2><a3>AGB</a3><a4>-Seite</a4>; der <s1>Lieferant</s1>  liefert.".to_string(),
        "Schlicht verloren".to_string(),
    ];
    let rebuilt = rebuild_in_child(&sandbox(), DocType::Odt, original.into(), &translated).await.unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&rebuilt)).unwrap();
    let mut xml = String::new();
    std::io::Read::read_to_string(&mut archive.by_name("content.xml").unwrap(), &mut xml).unwrap();
    for expected in [
        r#"<text:p>Siehe <text:a xmlns:xlink="http://www.w3.org/1999/xlink" xlink:href="https://example.com/terms">unsere </text:a>"#,
        r#"<text:a xmlns:xlink="http://www.w3.org/1999/xlink" xlink:href="https://example.com/terms"><text:span text:style-name="Em">AGB</text:span></text:a>"#,
        r#"; der <text:span text:style-name="Bold">Lieferant</text:span> <text:s text:c="1"/>liefert."#,
        // What tags cannot say stays: the bookmark.
        r#"<text:bookmark text:name="here"/>"#,
    ] {
        assert!(xml.contains(expected), "{expected}\nin\n{xml}");
    }
    assert!(!xml.contains("Supplier") && !xml.contains("our "), "{xml}");
    let last = xml.split("<text:p>").last().unwrap();
    assert!(last.contains("Schlicht verloren") && !last.contains("lost"), "plain in its first look: {last}");
    // Read again, the same spans in their new order (numbered as they now come).
    assert_eq!(
        extract_text(DocType::Odt, &rebuilt).unwrap().text,
        "Siehe <a1>unsere </a1><a2>AGB</a2><a3>-Seite</a3>; der <s4>Lieferant</s4>  liefert.\n\nSchlicht verloren"
    );
}

#[tokio::test]
async fn bold_italic_links_and_note_references_come_back_around_the_translated_words() {
    use engine::documents::sandbox::rebuild_in_child;
    let original = docx_of(
        r#"<w:p><w:r><w:t xml:space="preserve">The </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>Supplier</w:t></w:r><w:r><w:t xml:space="preserve"> delivers </w:t></w:r><w:r><w:rPr><w:i/></w:rPr><w:t>in good time</w:t></w:r><w:r><w:t>.</w:t></w:r><w:r><w:rPr><w:rStyle w:val="FootnoteReference"/></w:rPr><w:footnoteReference w:id="1"/></w:r></w:p>
           <w:p><w:r><w:t xml:space="preserve">Questions go to </w:t></w:r><w:hyperlink xmlns:r="r" r:id="rId9" w:history="1"><w:r><w:rPr><w:rStyle w:val="Hyperlink"/></w:rPr><w:t>our terms page</w:t></w:r></w:hyperlink><w:r><w:t xml:space="preserve"> before signing.</w:t></w:r></w:p>
           <w:p><w:r><w:t xml:space="preserve">Plain </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>lost</w:t></w:r></w:p>"#,
    );
    let text = extract_text(DocType::Docx, &original).unwrap().text;
    assert_eq!(
        text,
        "The <b1>Supplier</b1> delivers <i2>in good time</i2>.<f3/>\n\n\
         Questions go to <a1>our terms page</a1> before signing.\n\nPlain <b1>lost</b1>",
        "the runs that differ from their paragraph's look travel as tags"
    );
    // As a model translates it: the spans moved where German puts them, the last one's tags lost.
    let translated = [
        "Der <b1>Lieferant</b1> liefert <i2>rechtzeitig</i2>.<f3/>".to_string(),
        "Fragen gehen vor der Unterschrift an <a1>unsere AGB-Seite</a1>.".to_string(),
        "Schlicht verloren".to_string(),
    ];
    let rebuilt = rebuild_in_child(&sandbox(), DocType::Docx, original.into(), &translated).await.unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&rebuilt)).unwrap();
    let mut xml = String::new();
    std::io::Read::read_to_string(&mut archive.by_name("word/document.xml").unwrap(), &mut xml).unwrap();
    for expected in [
        // The bold and italic words in runs of their own look.
        r#"<w:r><w:t xml:space="preserve">Der </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t xml:space="preserve">Lieferant</w:t></w:r>"#,
        r#"<w:r><w:rPr><w:i/></w:rPr><w:t xml:space="preserve">rechtzeitig</w:t></w:r><w:r><w:t xml:space="preserve">.</w:t></w:r>"#,
        // The note's reference as it was, where the answer put it.
        r#"<w:r><w:rPr><w:rStyle w:val="FootnoteReference"/></w:rPr><w:footnoteReference w:id="1"/></w:r></w:p>"#,
        // The link around its translated words, pointing where it pointed.
        r#"<w:hyperlink xmlns:r="r" r:id="rId9" w:history="1"><w:r><w:rPr><w:rStyle w:val="Hyperlink"/></w:rPr><w:t xml:space="preserve">unsere AGB-Seite</w:t></w:r></w:hyperlink><w:r><w:t xml:space="preserve">.</w:t></w:r>"#,
    ] {
        assert!(xml.contains(expected), "{expected}\nin\n{xml}");
    }
    assert!(!xml.contains("our terms page") && !xml.contains("Supplier"), "no words of the original left: {xml}");
    // The paragraph whose tags were lost: its words in its first run's look, nothing bold.
    let last = xml.split("<w:p>").last().unwrap();
    assert!(last.contains("Schlicht verloren") && !last.contains("lost"), "{last}");
    assert_eq!(
        extract_text(DocType::Docx, &rebuilt).unwrap().text,
        format!("{}\n\n{}\n\nSchlicht verloren", translated[0], translated[1])
    );
}
