//! Word (.docx) and OpenDocument (.odt) files: zips of XML, read only in the sandboxed reader.
//! Their text comes out as Markdown-like paragraphs (headings with `#`, list items with `- `,
//! one blank line between paragraphs, which is where parts are cut). Beside the reader's own
//! walls (memory, CPU, time), a zip gets walls of its own: the entries it may have, the bytes
//! one XML part and all of them may inflate to, how far one entry may inflate per byte, how
//! deep its XML may nest, and no DTD at all (Word and OpenDocument files never declare
//! entities, so nothing can expand). An entry whose name leaves the archive is refused, though
//! nothing is ever written out. Every refusal is a reason a user can act on.

use std::borrow::Cow;
use std::io::{Cursor, Read};

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

/// The most entries a document's zip may have (Word's own files have a few dozen).
pub const MAX_ENTRIES: usize = 1_000;
/// The most bytes one XML part may inflate to.
pub const MAX_PART_BYTES: u64 = 64 << 20;
/// The most bytes all the parts read may inflate to.
pub const MAX_TOTAL_BYTES: u64 = 128 << 20;
/// The most one entry may inflate per compressed byte once past [`RATIO_FLOOR`] (honest XML
/// stays well under 100).
pub const MAX_RATIO: u64 = 200;
/// Below this many inflated bytes an entry's ratio is not looked at (a tiny part, a few
/// styles, may inflate a lot); kept small, since the text is priced only once read.
const RATIO_FLOOR: u64 = 64 << 10;
/// The most all the parts read may inflate per compressed byte, together: many small parts
/// each under [`RATIO_FLOOR`] (a hundred headers of repeated XML) cannot pass where one
/// large part would not. Honest documents stay far below (Word's XML deflates 5-20 fold).
pub const MAX_TOTAL_RATIO: u64 = 100;

/// What reading a file's parts has inflated so far, against its walls.
#[derive(Debug)]
struct Inflation {
    /// Bytes that may still be inflated ([`MAX_TOTAL_BYTES`] at first).
    left: u64,
    inflated: u64,
    compressed: u64,
    /// The whole file's size: entries that overlap in the archive cannot claim more
    /// compressed bytes than the file holds.
    file_bytes: u64,
}

impl Inflation {
    fn new(file_bytes: u64) -> Self {
        Inflation { left: MAX_TOTAL_BYTES, inflated: 0, compressed: 0, file_bytes: file_bytes.max(1) }
    }

    /// Count one entry read; refused when all read so far inflates past [`MAX_TOTAL_RATIO`]
    /// (once past the floor, counted over all of them: no part is below it on its own).
    fn add(&mut self, inflated: u64, compressed: u64) -> Result<(), String> {
        self.left = self.left.saturating_sub(inflated);
        self.inflated += inflated;
        self.compressed = (self.compressed + compressed.max(1)).min(self.file_bytes);
        if self.inflated > RATIO_FLOOR && self.inflated / self.compressed > MAX_TOTAL_RATIO {
            return Err(format!(
                "the file's parts inflate {}-fold together: it looks like a zip bomb",
                self.inflated / self.compressed
            ));
        }
        Ok(())
    }
}

/// The deepest the XML may nest (tables in tables in text boxes stay far below).
pub const MAX_DEPTH: usize = 256;

/// Which kind of office file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Word,
    OpenDocument,
}

/// The OpenDocument text type, as its `mimetype` entry names it.
const ODT_MIMETYPE: &[u8] = b"application/vnd.oasis.opendocument.text";

/// The document's text, or why it cannot be read.
pub fn extract(flavour: Flavour, bytes: &[u8]) -> Result<String, String> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|_| "the file is damaged: it is not a readable zip archive".to_string())?;
    if archive.len() > MAX_ENTRIES {
        return Err(format!(
            "the file holds {} entries; a Word or OpenDocument file holds far fewer (at most {MAX_ENTRIES} are read)",
            archive.len()
        ));
    }
    for name in archive.file_names() {
        let name = name.map_err(|_| "the file is damaged: an entry's name cannot be read".to_string())?;
        if !name_stays_inside(&name) {
            return Err(format!("the file has an entry whose name leaves the archive ({:?})", shorten(&name)));
        }
    }
    let mut budget = Inflation::new(bytes.len() as u64);
    match flavour {
        Flavour::Word if archive.index_for_name("word/document.xml").is_none() => {
            return Err("this zip is not a Word document: it has no word/document.xml".into())
        }
        Flavour::Word => {}
        Flavour::OpenDocument => {
            let mimetype = read_entry(&mut archive, "mimetype", &mut budget)?
                .ok_or("this zip is not an OpenDocument file: it has no mimetype entry")?;
            if mimetype.trim_ascii() != ODT_MIMETYPE {
                return Err(format!(
                    "this OpenDocument file is not a text document ({}); upload an .odt",
                    shorten(&String::from_utf8_lossy(&mimetype))
                ));
            }
            if archive.index_for_name("content.xml").is_none() {
                return Err("this OpenDocument file has no content.xml".into());
            }
        }
    }
    let mut blocks = Vec::new();
    for part in text_parts(flavour, &archive) {
        if let Some(xml) = read_entry(&mut archive, &part, &mut budget)? {
            blocks.extend(paragraphs(flavour, &xml)?.into_iter().map(|(_, block)| block));
        }
    }
    let text = blocks.iter().map(Block::markdown).collect::<Vec<_>>().join("\n\n");
    if text.trim().is_empty() {
        return Err("the document has no text".into());
    }
    Ok(text)
}

/// Pure: whether an entry's name stays inside the archive (no `..`, no absolute path, no drive).
pub fn name_stays_inside(name: &str) -> bool {
    let name = name.replace('\\', "/");
    !name.starts_with('/') && !name.split('/').any(|part| part == "..") && !name.contains(':') && !name.contains('\0')
}

fn shorten(text: &str) -> String {
    text.chars().take(80).collect()
}

/// One entry's bytes (`None` when absent), inflated within the walls: what it declares, what
/// it really gives (a header may lie), its ratio, and what is left of the budget.
fn read_entry<R: Read + std::io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    name: &str,
    budget: &mut Inflation,
) -> Result<Option<Vec<u8>>, String> {
    let entry = match archive.by_name(name) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(zip::result::ZipError::UnsupportedArchive(why)) => {
            return Err(format!("the file cannot be read: {why} (is it encrypted?)"))
        }
        Err(_) => return Err("the file is damaged: an entry cannot be read".into()),
    };
    let limit = MAX_PART_BYTES.min(budget.left);
    if entry.size() > limit {
        return Err(format!("the file's {name} inflates to {} MiB, more than is read", entry.size() >> 20));
    }
    let compressed = entry.compressed_size().max(1);
    let ratio_bomb = |inflated: u64| inflated > RATIO_FLOOR && inflated / compressed > MAX_RATIO;
    if ratio_bomb(entry.size()) {
        return Err(format!("the file's {name} inflates {}-fold: it looks like a zip bomb", entry.size() / compressed));
    }
    let mut bytes = Vec::with_capacity(entry.size().min(limit) as usize);
    entry
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| format!("the file's {name} does not inflate to what it declares: it is damaged, or a zip bomb"))?;
    let inflated = bytes.len() as u64;
    if inflated > limit || ratio_bomb(inflated) {
        return Err(format!("the file's {name} inflates past what it declares: it looks like a zip bomb"));
    }
    budget.add(inflated, compressed)?;
    Ok(Some(bytes))
}

/// A paragraph of the document, as the provider reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub kind: BlockKind,
    /// Its words; a Word paragraph's runs that differ from its look are tagged
    /// ([`super::inline`]).
    pub text: String,
    /// The looks its tags stand for (none: no tags, or a paragraph tags cannot carry).
    pub looks: Option<Looks>,
}

/// A Word paragraph's looks, for its tags: its own, and each tag's (by its number, from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Looks {
    /// The run properties (`w:rPr`, as XML) most of its words have; empty when none.
    pub base: String,
    pub spans: Vec<SpanLook>,
}

/// What a tag stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanLook {
    /// Its runs' properties (`w:rPr`, as XML).
    pub props: String,
    /// The hyperlink around them: its start and end tags, as XML.
    pub link: Option<(String, String)>,
    /// A note's reference: its whole run, as XML (put back as it was).
    pub reference: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Paragraph,
    /// Level 1 to 6.
    Heading(u8),
    ListItem,
}

impl Block {
    /// The block as Markdown: `# ` for a heading, `- ` for a list item.
    pub fn markdown(&self) -> String {
        self.markdown_of(&self.text)
    }

    /// `text` shown as this block is (a heading's `#`, a list item's `- `).
    fn markdown_of(&self, text: &str) -> String {
        let text = text.trim();
        match self.kind {
            BlockKind::Paragraph => text.to_string(),
            BlockKind::Heading(level) => format!("{} {text}", "#".repeat(level.clamp(1, 6) as usize)),
            BlockKind::ListItem => format!("- {text}"),
        }
    }
}

/// The XML events of a part, within the depth wall, with entity references resolved (only
/// XML's five and character references: a DTD is refused, so no others can mean anything).
fn walk_xml(xml: &[u8], mut on: impl FnMut(XmlStep<'_>, &Event<'_>)) -> Result<(), String> {
    let mut reader = Reader::from_reader(xml);
    let mut buf = Vec::new();
    let mut depth = 0usize;
    loop {
        let event = reader.read_event_into(&mut buf).map_err(|_| "the document's XML is damaged".to_string())?;
        match event {
            Event::Start(ref e) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!("the document's XML nests deeper than {MAX_DEPTH} levels"));
                }
                on(XmlStep::Open(e, false), &event);
            }
            Event::Empty(ref e) => on(XmlStep::Open(e, true), &event),
            Event::End(ref e) => {
                depth = depth.saturating_sub(1);
                on(XmlStep::Close(e.local_name().as_ref()), &event);
            }
            Event::Text(ref e) => {
                let text = e.decode().map_err(|_| "the document's XML is not valid UTF-8".to_string())?;
                on(XmlStep::Text(text), &event);
            }
            Event::CData(ref e) => on(XmlStep::Text(String::from_utf8_lossy(e).into_owned().into()), &event),
            Event::GeneralRef(ref e) => {
                let resolved = match e.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    Ok(None) => match &**e {
                        b"amp" => "&".into(),
                        b"lt" => "<".into(),
                        b"gt" => ">".into(),
                        b"quot" => "\"".into(),
                        b"apos" => "'".into(),
                        _ => return Err("the document's XML refers to an entity it does not define".into()),
                    },
                    Err(_) => return Err("the document's XML has a broken character reference".into()),
                };
                on(XmlStep::Text(resolved.into()), &event);
            }
            Event::DocType(_) => {
                return Err("the document's XML declares a DTD, which Word and OpenDocument files never do".into())
            }
            Event::Eof => return Ok(()),
            _ => on(XmlStep::Other, &event),
        }
        buf.clear();
    }
}

enum XmlStep<'a> {
    /// An element opened (`true`: and closed at once, `<x/>`).
    Open(&'a BytesStart<'a>, bool),
    Close(&'a [u8]),
    Text(Cow<'a, str>),
    /// A declaration, a comment, a processing instruction: kept as it is.
    Other,
}

fn attribute(e: &BytesStart<'_>, local: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.local_name().as_ref() == local)
        .map(|a| String::from_utf8_lossy(&a.value).into_owned())
}

/// What one step of a part's XML means for its paragraphs.
enum Meaning {
    /// A paragraph starts (nested ones, in a text box or a note, are paragraphs of their own).
    Start(BlockKind),
    /// The paragraph being read is of this kind after all (a Word style, a numbering).
    Kind(BlockKind),
    /// Text of the paragraph being read (from a text node, or a tab, a space, a break).
    Text(String),
    /// The paragraph being read ends.
    End,
    Nothing,
}

/// Which part is read, and what the reading keeps track of.
enum PartReader {
    /// A Word part: only text inside `w:t` runs counts.
    Word { in_text: bool },
    /// OpenDocument's `content.xml`: how deep in list items, and how deep inside what is not
    /// the document's text (a comment with its author and date, a note's citation number).
    OpenDocument { in_list_item: usize, skipping: usize },
}

impl PartReader {
    fn for_flavour(flavour: Flavour) -> PartReader {
        match flavour {
            Flavour::Word => PartReader::Word { in_text: false },
            Flavour::OpenDocument => PartReader::OpenDocument { in_list_item: 0, skipping: 0 },
        }
    }

    fn meaning(&mut self, step: &XmlStep<'_>) -> Meaning {
        if let PartReader::OpenDocument { skipping, .. } = self {
            let not_text = matches!(step, XmlStep::Open(e, false)
                if matches!(e.local_name().as_ref(), b"annotation" | b"note-citation"));
            match step {
                XmlStep::Open(_, false) if *skipping > 0 || not_text => {
                    *skipping += 1;
                    return Meaning::Nothing;
                }
                XmlStep::Close(_) if *skipping > 0 => {
                    *skipping -= 1;
                    return Meaning::Nothing;
                }
                _ if *skipping > 0 => return Meaning::Nothing,
                _ => {}
            }
        }
        match (self, step) {
            (PartReader::Word { in_text }, XmlStep::Open(e, empty)) => match e.local_name().as_ref() {
                b"p" if !empty => Meaning::Start(BlockKind::Paragraph),
                b"t" if !empty => {
                    *in_text = true;
                    Meaning::Nothing
                }
                b"tab" => Meaning::Text("\t".into()),
                b"br" | b"cr" => Meaning::Text("\n".into()),
                b"pStyle" => {
                    let style = attribute(e, b"val").unwrap_or_default().to_ascii_lowercase();
                    let level = match style.strip_prefix("heading") {
                        Some(n) => n.trim().parse::<u8>().ok(),
                        None => (style == "title").then_some(1),
                    };
                    match level.filter(|l| (1..=6).contains(l)) {
                        Some(level) => Meaning::Kind(BlockKind::Heading(level)),
                        None => Meaning::Nothing,
                    }
                }
                b"numPr" => Meaning::Kind(BlockKind::ListItem),
                _ => Meaning::Nothing,
            },
            (PartReader::Word { in_text }, XmlStep::Close(name)) => match *name {
                b"p" => Meaning::End,
                b"t" => {
                    *in_text = false;
                    Meaning::Nothing
                }
                _ => Meaning::Nothing,
            },
            (PartReader::Word { in_text: true }, XmlStep::Text(text)) => Meaning::Text(text.to_string()),
            (PartReader::OpenDocument { in_list_item, .. }, XmlStep::Open(e, empty)) => match e.local_name().as_ref() {
                b"p" if !empty => {
                    Meaning::Start(if *in_list_item > 0 { BlockKind::ListItem } else { BlockKind::Paragraph })
                }
                b"h" if !empty => {
                    let level = attribute(e, b"outline-level").and_then(|l| l.parse::<u8>().ok()).unwrap_or(1);
                    Meaning::Start(BlockKind::Heading(level.clamp(1, 6)))
                }
                b"list-item" if !empty => {
                    *in_list_item += 1;
                    Meaning::Nothing
                }
                b"s" => {
                    let count = attribute(e, b"c").and_then(|c| c.parse::<usize>().ok()).unwrap_or(1);
                    Meaning::Text(" ".repeat(count.min(100)))
                }
                b"tab" => Meaning::Text("\t".into()),
                b"line-break" => Meaning::Text("\n".into()),
                _ => Meaning::Nothing,
            },
            (PartReader::OpenDocument { in_list_item, .. }, XmlStep::Close(name)) => match *name {
                b"p" | b"h" => Meaning::End,
                b"list-item" => {
                    *in_list_item = in_list_item.saturating_sub(1);
                    Meaning::Nothing
                }
                _ => Meaning::Nothing,
            },
            (PartReader::OpenDocument { .. }, XmlStep::Text(text)) => Meaning::Text(text.to_string()),
            _ => Meaning::Nothing,
        }
    }
}

/// A paragraph being read: its start's ordinal, the block so far, and its runs.
type OpenParagraph = (usize, Block, RunsRead);

/// A part's paragraphs with text, in the order they end (a nested one before the one around
/// it), each with the ordinal of its start among all paragraph starts.
fn paragraphs(flavour: Flavour, xml: &[u8]) -> Result<Vec<(usize, Block)>, String> {
    let mut reader = PartReader::for_flavour(flavour);
    let mut open: Vec<OpenParagraph> = Vec::new();
    let mut done: Vec<(usize, Block)> = Vec::new();
    let mut starts = 0;
    walk_xml(xml, |step, event| {
        let meaning = reader.meaning(&step);
        if !matches!(meaning, Meaning::Start(_)) {
            if let Some((_, _, runs)) = open.last_mut() {
                match flavour {
                    Flavour::Word => runs.step(&step, event, &meaning),
                    Flavour::OpenDocument => runs.step_odt(&step, event, &meaning),
                }
            }
        }
        match meaning {
            Meaning::Start(kind) => {
                // A paragraph inside another (a text box, a note): the outer one stays plain.
                if let Some((_, _, runs)) = open.last_mut() {
                    runs.plain = true;
                }
                open.push((starts, Block { kind, text: String::new(), looks: None }, RunsRead::default()));
                starts += 1;
            }
            Meaning::Kind(kind) => {
                if let Some((_, block, _)) = open.last_mut() {
                    block.kind = kind;
                }
            }
            Meaning::Text(text) => {
                if let Some((_, block, _)) = open.last_mut() {
                    block.text.push_str(&text);
                }
            }
            Meaning::End => {
                if let Some((start, block, runs)) = open.pop() {
                    let (tagged, looks) = match runs.tagged() {
                        Some((tagged, looks)) => (tagged, Some(looks)),
                        None => (super::inline::escape(&block.text), None),
                    };
                    let text = one_paragraph(&tagged);
                    if !super::inline::strip(&text).trim().is_empty() {
                        done.push((start, Block { text, looks, ..block }));
                    }
                }
            }
            Meaning::Nothing => {}
        }
    })?;
    Ok(done)
}

/// A paragraph is one paragraph to the provider: no blank line inside it (two line breaks in
/// a row) may split it in two.
fn one_paragraph(text: &str) -> String {
    text.split('\n').filter(|line| !line.trim().is_empty()).collect::<Vec<_>>().join("\n")
}

/// A paragraph's runs as read, for its inline tags: a Word paragraph's `w:r` runs (in their
/// hyperlinks), or an OpenDocument paragraph's stretches of text (in their spans and links).
#[derive(Default)]
struct RunsRead {
    /// Elements open inside the paragraph (local names), its children first.
    path: Vec<Vec<u8>>,
    runs: Vec<RunRead>,
    current: Option<RunRead>,
    /// What the text read now is wrapped in: a Word hyperlink's start and end tags, or an
    /// OpenDocument paragraph's links and spans open now (their start tags in order, their
    /// end tags in reverse).
    link: Option<(String, String)>,
    /// OpenDocument: the links and spans open now, outermost first (start tag, end tag, a link).
    wrappers: Vec<(String, String, bool)>,
    /// Something tags cannot carry (a nested paragraph, a drawing, a field, a run inside
    /// another element than the paragraph or a hyperlink): the paragraph stays plain.
    plain: bool,
}

/// The tagged span being written: its runs' properties, their wrappers, and its letter.
type OpenSpan = (Vec<u8>, Option<(String, String)>, char);

/// One run as read.
#[derive(Default)]
struct RunRead {
    /// Its properties (`w:rPr`), as XML, and whether they are being read.
    props: Vec<u8>,
    in_props: bool,
    /// What its properties make it: bold, italic, underlined ([`super::inline`]'s letters).
    letter: Option<char>,
    text: String,
    /// The whole run, as XML (a note's reference is put back as it was).
    raw: Vec<u8>,
    reference: bool,
    link: Option<(String, String)>,
}

/// `event` as XML.
fn xml_of(event: &Event<'_>) -> Vec<u8> {
    let mut writer = quick_xml::Writer::new(Vec::new());
    let _ = writer.write_event(event.borrow());
    writer.into_inner()
}

impl RunsRead {
    /// One step of the paragraph's XML (its own start excluded).
    fn step(&mut self, step: &XmlStep<'_>, event: &Event<'_>, meaning: &Meaning) {
        if self.plain {
            return;
        }
        if let Some(run) = self.current.as_mut() {
            run.raw.extend(xml_of(event));
            if run.in_props {
                run.props.extend(xml_of(event));
            }
        }
        match step {
            XmlStep::Open(e, empty) => {
                let name = e.local_name().as_ref().to_vec();
                match (name.as_slice(), self.current.as_mut()) {
                    (b"r", None) => {
                        let inside_paragraph = self.path.is_empty() || self.path == [b"hyperlink".to_vec()];
                        if !inside_paragraph {
                            self.plain = true;
                            return;
                        }
                        if !empty {
                            // A hyperlink's run is a link, whatever it looks like.
                            let letter = self.link.is_some().then_some(super::inline::LINK);
                            self.current = Some(RunRead {
                                raw: xml_of(event),
                                link: self.link.clone(),
                                letter,
                                ..RunRead::default()
                            });
                        }
                    }
                    (b"hyperlink", None) if self.path.is_empty() && !empty => {
                        let end = format!("</{}>", String::from_utf8_lossy(e.name().as_ref()));
                        self.link = Some((String::from_utf8_lossy(&xml_of(event)).into_owned(), end));
                    }
                    (b"rPr", Some(run)) if !empty => {
                        run.in_props = true;
                        run.props = xml_of(event);
                    }
                    (b"b" | b"i" | b"u", Some(run)) if run.in_props => {
                        let off = attribute(e, b"val").is_some_and(|v| matches!(v.as_str(), "0" | "false" | "none"));
                        if !off && run.letter.is_none() {
                            run.letter = Some(match name.as_slice() {
                                b"b" => super::inline::BOLD,
                                b"i" => super::inline::ITALIC,
                                _ => super::inline::UNDERLINE,
                            });
                        }
                    }
                    (b"footnoteReference" | b"endnoteReference", Some(run)) => run.reference = true,
                    // A run's content tags cannot carry (a note's own number mark, a symbol, a
                    // comment's anchor, a page or column break, a tracked formatting change):
                    // the paragraph stays plain.
                    (b"footnoteRef" | b"endnoteRef" | b"sym" | b"commentReference" | b"annotationRef", Some(_))
                    | (b"separator" | b"continuationSeparator" | b"pgNum" | b"ptab" | b"rPrChange", Some(_)) => {
                        self.plain = true;
                    }
                    (b"br", Some(_)) if attribute(e, b"type").is_some_and(|t| t != "textWrapping") => self.plain = true,
                    (
                        b"drawing" | b"pict" | b"object" | b"fldChar" | b"instrText" | b"AlternateContent" | b"ruby",
                        _,
                    )
                    | (b"fldSimple" | b"smartTag" | b"sdt" | b"ins" | b"del" | b"moveTo" | b"customXml", _) => {
                        self.plain = true;
                    }
                    _ => {}
                }
                if !empty {
                    self.path.push(name);
                }
            }
            XmlStep::Close(name) => {
                self.path.pop();
                match (*name, self.current.as_mut()) {
                    (b"rPr", Some(run)) => run.in_props = false,
                    (b"r", Some(_)) if self.path.len() <= 1 => {
                        let run = self.current.take().expect("a run is open");
                        self.runs.push(run);
                    }
                    (b"hyperlink", None) if self.path.is_empty() => self.link = None,
                    _ => {}
                }
            }
            _ => {}
        }
        if let (Meaning::Text(text), Some(run)) = (meaning, self.current.as_mut()) {
            run.text.push_str(text);
        }
    }

    /// One step of an OpenDocument paragraph's XML (its own start excluded): its text is read in
    /// stretches, each in the spans and links around it.
    fn step_odt(&mut self, step: &XmlStep<'_>, event: &Event<'_>, meaning: &Meaning) {
        if self.plain {
            return;
        }
        match step {
            XmlStep::Open(e, false) if matches!(e.local_name().as_ref(), b"span" | b"a") => {
                let end = format!("</{}>", String::from_utf8_lossy(e.name().as_ref()));
                let link = e.local_name().as_ref() == b"a";
                self.wrappers.push((String::from_utf8_lossy(&xml_of(event)).into_owned(), end, link));
                self.link = self.wrapped();
            }
            XmlStep::Open(e, _) => {
                // Spaces, tabs, breaks and bookmarks are carried; anything else (a note, a
                // frame, a comment, a field) is not: the paragraph stays plain.
                let carried = matches!(
                    e.local_name().as_ref(),
                    b"s" | b"tab"
                        | b"line-break"
                        | b"soft-page-break"
                        | b"bookmark"
                        | b"bookmark-start"
                        | b"bookmark-end"
                );
                self.plain |= !carried;
            }
            XmlStep::Close(name) if matches!(*name, b"span" | b"a") => {
                self.wrappers.pop();
                self.link = self.wrapped();
            }
            _ => {}
        }
        if let Meaning::Text(text) = meaning {
            match self.runs.last_mut() {
                Some(run) if run.link == self.link => run.text.push_str(text),
                _ => {
                    let letter = if self.wrappers.iter().any(|(_, _, link)| *link) {
                        super::inline::LINK
                    } else {
                        super::inline::STYLED
                    };
                    self.runs.push(RunRead {
                        text: text.clone(),
                        link: self.link.clone(),
                        letter: Some(letter),
                        ..RunRead::default()
                    });
                }
            }
        }
    }

    /// The OpenDocument wrappers open now, as one start and one end.
    fn wrapped(&self) -> Option<(String, String)> {
        (!self.wrappers.is_empty()).then(|| {
            let open = self.wrappers.iter().map(|(open, _, _)| open.as_str()).collect::<String>();
            let close = self.wrappers.iter().rev().map(|(_, close, _)| close.as_str()).collect::<String>();
            (open, close)
        })
    }

    /// The paragraph's text with its differing runs tagged, and what the tags stand for; none
    /// when it has no such run or tags cannot carry it.
    fn tagged(self) -> Option<(String, Looks)> {
        if self.plain || self.current.is_some() {
            return None;
        }
        // Its look: the properties most of its plain words have.
        let mut weights: Vec<(&[u8], usize)> = Vec::new();
        for run in self.runs.iter().filter(|r| r.link.is_none() && !r.reference) {
            match weights.iter_mut().find(|(props, _)| *props == run.props.as_slice()) {
                Some((_, n)) => *n += run.text.chars().count(),
                None => weights.push((&run.props, run.text.chars().count())),
            }
        }
        let base = weights.iter().max_by_key(|(_, n)| *n).map(|(props, _)| props.to_vec()).unwrap_or_default();
        let mut text = String::new();
        let mut spans: Vec<SpanLook> = Vec::new();
        let mut open: Option<OpenSpan> = None;
        let close = |text: &mut String, spans: &[SpanLook], open: &mut Option<OpenSpan>| {
            if let Some((_, _, letter)) = open.take() {
                text.push_str(&format!("</{letter}{}>", spans.len()));
            }
        };
        for run in &self.runs {
            let plain = run.link.is_none() && !run.reference && run.props == base;
            if run.reference {
                close(&mut text, &spans, &mut open);
                spans.push(SpanLook {
                    props: String::new(),
                    link: None,
                    reference: Some(String::from_utf8_lossy(&run.raw).into_owned()),
                });
                text.push_str(&format!("<{}{}/>", super::inline::REFERENCE, spans.len()));
                continue;
            }
            if run.text.is_empty() {
                continue;
            }
            let same = open.as_ref().is_some_and(|(props, link, _)| *props == run.props && *link == run.link);
            if !same {
                close(&mut text, &spans, &mut open);
                if !plain {
                    let letter = run.letter.unwrap_or(super::inline::STYLED);
                    spans.push(SpanLook {
                        props: String::from_utf8_lossy(&run.props).into_owned(),
                        link: run.link.clone(),
                        reference: None,
                    });
                    text.push_str(&format!("<{letter}{}>", spans.len()));
                    open = Some((run.props.clone(), run.link.clone(), letter));
                }
            }
            text.push_str(&super::inline::escape(&run.text));
        }
        close(&mut text, &spans, &mut open);
        if spans.is_empty() {
            return None;
        }
        Some((text, Looks { base: String::from_utf8_lossy(&base).into_owned(), spans }))
    }
}

/// A Word part's paragraphs: `w:p`, its text in `w:t` runs, tabs and breaks; a heading by its
/// style (`Heading1`..`Heading6`, `Title`), a list item by its numbering.
pub fn word_blocks(xml: &[u8]) -> Result<Vec<Block>, String> {
    Ok(paragraphs(Flavour::Word, xml)?.into_iter().map(|(_, block)| block).collect())
}

/// An OpenDocument text's paragraphs: `text:p` and `text:h` (its outline level), list items,
/// spaces (`text:s`), tabs and line breaks.
pub fn odt_blocks(xml: &[u8]) -> Result<Vec<Block>, String> {
    Ok(paragraphs(Flavour::OpenDocument, xml)?.into_iter().map(|(_, block)| block).collect())
}

/// The parts whose paragraphs are the document's text, in its order: Word's body, its notes,
/// then its headers and footers by name; OpenDocument's content.
fn text_parts<R: Read + std::io::Seek>(flavour: Flavour, archive: &zip::ZipArchive<R>) -> Vec<String> {
    match flavour {
        Flavour::Word => {
            let mut around: Vec<String> = archive
                .file_names()
                .flatten()
                .filter(|name| {
                    let file = name.strip_prefix("word/").unwrap_or("");
                    (file.starts_with("header") || file.starts_with("footer"))
                        && file.ends_with(".xml")
                        && !file.contains('/')
                })
                .map(|name| name.into_owned())
                .collect();
            around.sort();
            ["word/document.xml", "word/footnotes.xml", "word/endnotes.xml"]
                .into_iter()
                .map(String::from)
                .chain(around)
                .collect()
        }
        Flavour::OpenDocument => vec!["content.xml".into()],
    }
}

/// Pure: a translated paragraph without the Markdown its original's kind was shown with (the
/// style carries a heading or a list item in the file).
pub(crate) fn without_marker(kind: BlockKind, text: &str) -> &str {
    let text = text.trim();
    match kind {
        BlockKind::Heading(_) => text.trim_start_matches('#').trim_start(),
        BlockKind::ListItem => text.strip_prefix("- ").or_else(|| text.strip_prefix("* ")).unwrap_or(text),
        BlockKind::Paragraph => text,
    }
}

/// The document again with each paragraph's text replaced by `translated` (one per paragraph
/// of [`extract`]'s text, in its order): everything else (styles, numbering, tables, headers,
/// images, every other entry) as it was. A paragraph's text goes into its first run, so the
/// paragraph keeps that run's formatting; its other runs are emptied. Read within the same
/// walls as [`extract`].
pub fn rebuild(flavour: Flavour, bytes: &[u8], translated: &[String]) -> Result<Vec<u8>, String> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|_| "the file is damaged: it is not a readable zip archive".to_string())?;
    if archive.len() > MAX_ENTRIES {
        return Err(format!("the file holds {} entries, more than are read", archive.len()));
    }
    let mut budget = Inflation::new(bytes.len() as u64);
    let mut rewritten = Vec::new();
    let mut next = 0usize;
    for part in text_parts(flavour, &archive) {
        let Some(xml) = read_entry(&mut archive, &part, &mut budget)? else { continue };
        let found = paragraphs(flavour, &xml)?;
        let mut by_start = std::collections::HashMap::new();
        for (start, block) in found {
            let text = translated.get(next).ok_or_else(|| too_few(translated.len()))?;
            let text = without_marker(block.kind, text);
            // Its runs again, each tagged span in its own look, when the answer kept the tags;
            // else the words in the paragraph's first run.
            let replacement = match block.looks {
                Some(looks) if super::inline::keeps_tags(&block.text, text) => {
                    Replacement::Runs { looks, text: text.to_string() }
                }
                _ => Replacement::Text(super::inline::strip(text)),
            };
            by_start.insert(start, replacement);
            next += 1;
        }
        let xml = rewrite(flavour, &xml, &by_start)?;
        rewritten.push((part, xml));
    }
    if next != translated.len() {
        return Err(format!(
            "the translation has {} paragraphs where the document has {next}; download the Markdown instead",
            translated.len()
        ));
    }
    // What opening the file would fetch from elsewhere (a remote template, a linked image or
    // frame) is pointed nowhere: staff may open a user's rebuilt file. Links stay links.
    // Part names are case-insensitive (OPC): `.RELS` is a relationships part too.
    let rels: Vec<String> = archive
        .file_names()
        .flatten()
        .filter(|name| name.to_ascii_lowercase().ends_with(".rels"))
        .map(|name| name.into_owned())
        .collect();
    for name in rels {
        let Some(xml) = read_entry(&mut archive, &name, &mut budget)? else { continue };
        if let Some(xml) = without_remote_fetches(&xml)? {
            rewritten.push((name, xml));
        }
    }
    let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let damaged = |_| "the file is damaged: an entry cannot be copied".to_string();
    for index in 0..archive.len() {
        let entry = archive.by_index_raw(index).map_err(damaged)?;
        let name = entry.name().map_err(damaged)?.into_owned();
        match rewritten.iter().find(|(part, _)| *part == name) {
            Some((_, xml)) => {
                drop(entry);
                let options =
                    zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
                out.start_file(name, options).map_err(|_| "the new file could not be written".to_string())?;
                std::io::Write::write_all(&mut out, xml)
                    .map_err(|_| "the new file could not be written".to_string())?;
            }
            None => out.raw_copy_file(entry).map_err(damaged)?,
        }
    }
    Ok(out.finish().map_err(|_| "the new file could not be written".to_string())?.into_inner())
}

/// Pure: `text` escaped for XML, without the characters XML cannot hold (control characters
/// and the non-characters U+FFFE and U+FFFF a provider's answer may carry) or should not
/// (the other non-characters), so the rebuilt part stays well-formed.
fn xml_text(text: &str) -> String {
    let allowed = text.chars().filter(|c| (matches!(c, '\t' | '\n' | '\r') || !c.is_control()) && !is_noncharacter(*c));
    quick_xml::escape::escape(allowed.collect::<String>().as_str()).into_owned()
}

/// Pure: Unicode's non-characters: U+FDD0..U+FDEF and the last two code points of every plane.
fn is_noncharacter(c: char) -> bool {
    ('\u{FDD0}'..='\u{FDEF}').contains(&c) || (c as u32) & 0xFFFE == 0xFFFE
}

fn too_few(paragraphs: usize) -> String {
    format!("the translation has {paragraphs} paragraphs, fewer than the document; download the Markdown instead")
}

/// Whether an element directly in a paragraph given new runs is replaced by them: Word's runs
/// and hyperlinks; OpenDocument's spans, links, spaces, tabs and line breaks.
fn replaced_inline(flavour: Flavour, name: &[u8]) -> bool {
    match flavour {
        Flavour::Word => matches!(name, b"r" | b"hyperlink"),
        Flavour::OpenDocument => matches!(name, b"span" | b"a" | b"s" | b"tab" | b"line-break"),
    }
}

/// What a paragraph's text becomes.
enum Replacement {
    /// Words, in the paragraph's first text node (its first run's look).
    Text(String),
    /// Tagged words, as runs in the looks their tags stand for (a Word paragraph whose
    /// translation kept its tags).
    Runs { looks: Looks, text: String },
}

/// A Word paragraph being given new runs: how deep inside it the walk is, how deep inside an
/// old run or hyperlink (dropped), and whether the new runs are written.
struct NewRuns {
    depth: usize,
    skipping: usize,
    written: bool,
    runs: String,
}

/// Pure: `text` (tagged) as Word runs in `looks`, with the namespace prefix `prefix`: plain
/// words in the paragraph's look, a tagged span in its own (inside its hyperlink), a note's
/// reference as it was; line breaks and tabs as Word writes them.
fn runs_xml(flavour: Flavour, prefix: &str, looks: &Looks, text: &str) -> String {
    use super::inline::{Form, Piece, Tag};
    let run = |props: &str, words: &str| {
        if flavour == Flavour::OpenDocument {
            return odt_text(prefix, words);
        }
        let name = |local: &str| qualified(prefix, local);
        let (r, t) = (name("r"), name("t"));
        let mut out = format!("<{r}>{props}");
        for (i, line) in words.split('\n').enumerate() {
            if i > 0 {
                out.push_str(&format!("<{}/>", name("br")));
            }
            for (j, cell) in line.split('\t').enumerate() {
                if j > 0 {
                    out.push_str(&format!("<{}/>", name("tab")));
                }
                if !cell.is_empty() {
                    out.push_str(&format!("<{t} xml:space=\"preserve\">{}</{t}>", xml_text(cell)));
                }
            }
        }
        out.push_str(&format!("</{r}>"));
        out
    };
    let span = |number: u32| looks.spans.get((number as usize).wrapping_sub(1));
    let mut out = String::new();
    let mut current: Option<&SpanLook> = None;
    for piece in super::inline::pieces(text) {
        match piece {
            Piece::Text(words) => match current {
                None => out.push_str(&run(&looks.base, words)),
                Some(look) => match &look.link {
                    Some((open, close)) => out.push_str(&format!("{open}{}{close}", run(&look.props, words))),
                    None => out.push_str(&run(&look.props, words)),
                },
            },
            Piece::Tag(Tag { form: Form::Open, number, .. }) => current = span(number),
            Piece::Tag(Tag { form: Form::Close, .. }) => current = None,
            Piece::Tag(Tag { form: Form::Alone, number, .. }) => {
                if let Some(reference) = span(number).and_then(|l| l.reference.as_ref()) {
                    out.push_str(reference);
                }
            }
        }
    }
    out
}

/// Pure: an element's name with `prefix` (none: the default namespace's).
fn qualified(prefix: &str, local: &str) -> String {
    if prefix.is_empty() {
        local.to_string()
    } else {
        format!("{prefix}:{local}")
    }
}

/// Pure: `words` as OpenDocument text: escaped, tabs and line breaks as elements, and a run of
/// spaces as one space and `text:s` for the others (ODF collapses spaces in text).
fn odt_text(prefix: &str, words: &str) -> String {
    let name = |local: &str| qualified(prefix, local);
    let mut out = String::new();
    let mut spaces = 0usize;
    let flush = |out: &mut String, spaces: &mut usize| {
        match *spaces {
            0 => {}
            1 => out.push(' '),
            n => out.push_str(&format!(" <{} {}=\"{}\"/>", name("s"), name("c"), n - 1)),
        }
        *spaces = 0;
    };
    for c in words.chars() {
        match c {
            ' ' => spaces += 1,
            '\t' => {
                flush(&mut out, &mut spaces);
                out.push_str(&format!("<{}/>", name("tab")));
            }
            '\n' => {
                flush(&mut out, &mut spaces);
                out.push_str(&format!("<{}/>", name("line-break")));
            }
            c => {
                flush(&mut out, &mut spaces);
                out.push_str(&xml_text(c.encode_utf8(&mut [0; 4])));
            }
        }
    }
    flush(&mut out, &mut spaces);
    out
}

/// A part's XML with the text of the paragraphs in `by_start` (by the ordinal of their start)
/// replaced: new words go into a paragraph's first text node (its others are dropped), or a
/// Word paragraph's runs and hyperlinks are replaced by new ones.
fn rewrite(
    flavour: Flavour,
    xml: &[u8],
    by_start: &std::collections::HashMap<usize, Replacement>,
) -> Result<Vec<u8>, String> {
    let mut reader = PartReader::for_flavour(flavour);
    let mut writer = quick_xml::Writer::new(Vec::with_capacity(xml.len()));
    // The paragraphs open now: their start's ordinal, and whether their new text is written.
    let mut open: Vec<(usize, bool)> = Vec::new();
    let mut starts = 0;
    let mut failed = false;
    let mut new_runs: Option<NewRuns> = None;
    walk_xml(xml, |step, event| {
        let is_text_node = matches!(event, Event::Text(_) | Event::GeneralRef(_) | Event::CData(_));
        let meaning = reader.meaning(&step);
        if let Some(runs) = new_runs.as_mut() {
            // Inside a paragraph given new runs: its old runs and hyperlinks are dropped, the
            // new runs written where the first was, everything else kept.
            let write = match &step {
                _ if runs.skipping > 0 => {
                    match &step {
                        XmlStep::Open(_, false) => runs.skipping += 1,
                        XmlStep::Close(_) => runs.skipping -= 1,
                        _ => {}
                    }
                    false
                }
                XmlStep::Open(e, empty) if runs.depth == 0 && replaced_inline(flavour, e.local_name().as_ref()) => {
                    if !runs.written {
                        writer.get_mut().extend_from_slice(runs.runs.as_bytes());
                        runs.written = true;
                    }
                    runs.skipping = usize::from(!empty);
                    false
                }
                XmlStep::Open(_, empty) => {
                    runs.depth += usize::from(!empty);
                    true
                }
                XmlStep::Close(_) if runs.depth == 0 => {
                    // The paragraph's end.
                    if !runs.written {
                        writer.get_mut().extend_from_slice(runs.runs.as_bytes());
                    }
                    new_runs = None;
                    open.pop();
                    true
                }
                XmlStep::Close(_) => {
                    runs.depth -= 1;
                    true
                }
                // An OpenDocument paragraph's own text is its content: replaced too.
                XmlStep::Text(_) if flavour == Flavour::OpenDocument && runs.depth == 0 => {
                    if !runs.written {
                        writer.get_mut().extend_from_slice(runs.runs.as_bytes());
                        runs.written = true;
                    }
                    false
                }
                _ => true,
            };
            if write {
                failed |= writer.write_event(event.borrow()).is_err();
            }
            return;
        }
        let write = match meaning {
            Meaning::Start(_) => {
                if let (Some(Replacement::Runs { looks, text }), XmlStep::Open(e, false)) =
                    (by_start.get(&starts), &step)
                {
                    let name = e.name();
                    // The paragraph's own prefix (none when its namespace is the default one).
                    let prefix =
                        name.prefix().map_or(String::new(), |p| String::from_utf8_lossy(p.as_ref()).into_owned());
                    let runs = runs_xml(flavour, &prefix, looks, text);
                    new_runs = Some(NewRuns { depth: 0, skipping: 0, written: false, runs });
                }
                open.push((starts, false));
                starts += 1;
                Some(event.borrow())
            }
            Meaning::End => {
                open.pop();
                Some(event.borrow())
            }
            Meaning::Text(_) if is_text_node => match open.last_mut() {
                Some((start, written)) => match by_start.get(start) {
                    Some(Replacement::Text(text)) if !*written => {
                        *written = true;
                        Some(Event::Text(quick_xml::events::BytesText::from_escaped(xml_text(text))))
                    }
                    Some(_) => None,
                    None => Some(event.borrow()),
                },
                None => Some(event.borrow()),
            },
            _ => Some(event.borrow()),
        };
        if let Some(event) = write {
            failed |= writer.write_event(event).is_err();
        }
    })?;
    if failed {
        return Err("the new file could not be written".into());
    }
    Ok(writer.into_inner())
}

/// Where an external relationship that is not a hyperlink is pointed instead.
const NOWHERE: &str = "about:blank";

/// Pure: a relationships part with every external target that opening the file would fetch
/// (anything but a hyperlink: a template, an image, a frame, an OLE object) pointed at
/// [`NOWHERE`]; `None` when it has none.
fn without_remote_fetches(xml: &[u8]) -> Result<Option<Vec<u8>>, String> {
    // Read as Word reads it, or not at all: UTF-16 (or anything not UTF-8) would parse here as
    // something else than what Word sees, so it is refused rather than copied unread.
    let unreadable = || "the file's relationships are not UTF-8 XML; download the Markdown instead".to_string();
    if std::str::from_utf8(xml).is_err() || xml.contains(&0) {
        return Err(unreadable());
    }
    let mut writer = quick_xml::Writer::new(Vec::with_capacity(xml.len()));
    let mut changed = false;
    let mut failed = false;
    walk_xml(xml, |step, event| {
        let remote = match &step {
            XmlStep::Open(e, _) if e.local_name().as_ref() == b"Relationship" => {
                // Values as Word reads them: entities and character references resolved.
                let attr = |key: &[u8]| {
                    e.attributes().flatten().find(|a| a.key.local_name().as_ref() == key).map(|a| {
                        a.unescape_value()
                            .map(|v| v.trim().to_string())
                            .unwrap_or_else(|_| String::from_utf8_lossy(&a.value).into_owned())
                    })
                };
                let external = attr(b"TargetMode").is_some_and(|m| m.eq_ignore_ascii_case("external"));
                let hyperlink = attr(b"Type").is_some_and(|t| t.ends_with("/hyperlink"));
                (external && !hyperlink).then(|| e.to_owned())
            }
            _ => None,
        };
        let written = match remote {
            Some(element) => {
                changed = true;
                let mut safe = BytesStart::new(String::from_utf8_lossy(element.name().as_ref()).into_owned());
                for attr in element.attributes().flatten() {
                    if attr.key.local_name().as_ref() == b"Target" {
                        safe.push_attribute(("Target", NOWHERE));
                    } else {
                        safe.push_attribute(attr);
                    }
                }
                match event {
                    Event::Empty(_) => writer.write_event(Event::Empty(safe)),
                    _ => writer.write_event(Event::Start(safe)),
                }
            }
            None => writer.write_event(event.borrow()),
        };
        failed |= written.is_err();
    })?;
    if failed {
        return Err("the new file could not be written".into());
    }
    Ok(changed.then(|| writer.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_characters_from_a_providers_answer_are_dropped_from_the_rebuilt_xml() {
        assert_eq!(xml_text("a\u{FFFE}b\u{FFFF}c\u{FDD0}d\u{1FFFF}e"), "abcde");
        assert_eq!(xml_text("é\u{FFFD}"), "é\u{FFFD}", "the replacement character is a character");
    }

    #[test]
    fn a_rebuilt_file_fetches_nothing_from_elsewhere_but_keeps_its_links() {
        let rels = br#"<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/attachedTemplate" Target="https://evil.example/t.dotm" TargetMode="External"/><Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink" Target="https://example.org/" TargetMode="External"/><Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles" Target="styles.xml"/></Relationships>"#;
        let safe = String::from_utf8(without_remote_fetches(rels).unwrap().expect("changed")).unwrap();
        assert!(!safe.contains("evil.example"), "{safe}");
        assert!(safe.contains(r#"Id="rId1""#) && safe.contains(r#"Target="about:blank""#), "{safe}");
        assert!(safe.contains("https://example.org/") && safe.contains(r#"Target="styles.xml""#), "{safe}");
        let plain = br#"<Relationships><Relationship Id="rId3" Type="x/styles" Target="styles.xml"/></Relationships>"#;
        assert_eq!(without_remote_fetches(plain).unwrap(), None);
        // Written the ways Word still reads as external: a character reference, spaces.
        for mode in ["&#69;xternal", " External ", "EXTERNAL"] {
            let sneaky = format!(
                r#"<Relationships><Relationship Id="rId1" Type="x/attachedTemplate" Target="https://evil.example/t.dotm" TargetMode="{mode}"/></Relationships>"#
            );
            let safe = String::from_utf8(without_remote_fetches(sneaky.as_bytes()).unwrap().expect(mode)).unwrap();
            assert!(!safe.contains("evil.example"), "{mode}: {safe}");
        }
        // Not UTF-8 (here UTF-16): refused, never copied unread.
        let utf16: Vec<u8> = "<Relationships/>".encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert!(without_remote_fetches(&utf16).is_err());
    }

    #[test]
    fn word_paragraphs_headings_lists_and_entities_come_out_as_markdown() {
        let xml = br#"<?xml version="1.0"?><w:document xmlns:w="x"><w:body>
            <w:p><w:pPr><w:pStyle w:val="Heading2"/></w:pPr><w:r><w:t>Terms</w:t></w:r></w:p>
            <w:p><w:r><w:t xml:space="preserve">Fish &amp; chips </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>&#233;t&#xE9;</w:t></w:r></w:p>
            <w:p><w:pPr><w:numPr><w:ilvl w:val="0"/></w:numPr></w:pPr><w:r><w:t>first</w:t></w:r></w:p>
            <w:p><w:r><w:delText>gone</w:delText></w:r></w:p>
            <w:tbl><w:tr><w:tc><w:p><w:r><w:t>cell</w:t></w:r></w:p></w:tc></w:tr></w:tbl>
        </w:body></w:document>"#;
        let blocks: Vec<String> = word_blocks(xml).unwrap().iter().map(Block::markdown).collect();
        assert_eq!(blocks, ["## Terms", "Fish & chips <b1>été</b1>", "- first", "cell"], "a bold run is tagged");
    }

    #[test]
    fn a_paragraph_tags_cannot_carry_stays_plain() {
        for inner in [
            // A tracked formatting change: its old look is an rPr inside the run's.
            r#"<w:r><w:rPr><w:b/><w:rPrChange w:id="1"><w:rPr><w:i/></w:rPr></w:rPrChange></w:rPr><w:t>x</w:t></w:r>"#,
            // A note's own number mark, a symbol, a page break.
            r#"<w:r><w:rPr><w:b/></w:rPr><w:footnoteRef/><w:t>x</w:t></w:r>"#,
            r#"<w:r><w:rPr><w:b/></w:rPr><w:sym w:char="F0FE"/><w:t>x</w:t></w:r>"#,
            r#"<w:r><w:rPr><w:b/></w:rPr><w:br w:type="page"/><w:t>x</w:t></w:r>"#,
            // A run inside a tracked insertion.
            r#"<w:ins><w:r><w:rPr><w:b/></w:rPr><w:t>x</w:t></w:r></w:ins>"#,
        ] {
            let xml = format!(
                r#"<w:document xmlns:w="w"><w:body><w:p><w:r><w:t>plain </w:t></w:r>{inner}</w:p></w:body></w:document>"#
            );
            let blocks = word_blocks(xml.as_bytes()).unwrap();
            assert_eq!(blocks[0].looks, None, "{inner}");
            assert_eq!(blocks[0].text.replace('\n', ""), "plain x", "no tags: {inner}");
        }
    }

    #[test]
    fn new_runs_take_the_paragraphs_own_prefix_or_none() {
        let looks =
            Looks { base: String::new(), spans: vec![SpanLook { props: "<b/>".into(), link: None, reference: None }] };
        assert_eq!(
            runs_xml(Flavour::Word, "", &looks, "a\t<b1>b</b1>"),
            r#"<r><t xml:space="preserve">a</t><tab/></r><r><b/><t xml:space="preserve">b</t></r>"#
        );
        assert_eq!(
            runs_xml(Flavour::OpenDocument, "text", &looks, "a   b\n<b1>c</b1>"),
            r#"a <text:s text:c="2"/>b<text:line-break/>c"#
        );
    }

    #[test]
    fn odt_headings_lists_and_spaces_come_out_as_markdown() {
        let xml = br#"<office:document-content xmlns:text="t"><office:body><office:text>
            <text:h text:outline-level="1">Title</text:h>
            <text:p>a<text:s text:c="3"/>b<text:span>c</text:span></text:p>
            <text:list><text:list-item><text:p>item</text:p></text:list-item></text:list>
            <text:p/>
        </office:text></office:body></office:document-content>"#;
        let blocks: Vec<String> = odt_blocks(xml).unwrap().iter().map(Block::markdown).collect();
        assert_eq!(blocks, ["# Title", "a   b<s1>c</s1>", "- item"], "a span's words are tagged");
    }

    #[test]
    fn a_blank_line_inside_a_paragraph_does_not_split_it_and_comments_are_not_text() {
        let word = br#"<w:p><w:r><w:t>A</w:t><w:br/><w:br/><w:t>B</w:t></w:r></w:p>"#;
        assert_eq!(word_blocks(word).unwrap()[0].text, "A\nB");
        let odt = br#"<text:p><office:annotation><dc:creator>Ann</dc:creator><dc:date>2024-01-01</dc:date>
            <text:p>a comment</text:p></office:annotation>Hello<text:note><text:note-citation>1</text:note-citation>
            <text:note-body><text:p>the note</text:p></text:note-body></text:note><text:line-break/><text:line-break/>world</text:p>"#;
        let blocks: Vec<String> = odt_blocks(odt).unwrap().into_iter().map(|b| b.text).collect();
        assert_eq!(blocks, ["the note", "Hello\nworld"]);
    }

    #[test]
    fn a_provider_answer_with_control_characters_stays_well_formed_xml() {
        assert_eq!(xml_text("a\u{1}b <c> & \t"), "ab &lt;c&gt; &amp; \t");
    }

    #[test]
    fn a_dtd_an_unknown_entity_and_deep_nesting_are_refused() {
        let laughs = br#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><w:p><w:t>&lol2;</w:t></w:p>"#;
        assert!(word_blocks(laughs).unwrap_err().contains("DTD"));
        assert!(word_blocks(b"<w:p><w:t>&lol;</w:t></w:p>").unwrap_err().contains("entity"));
        let deep = format!("{}{}", "<a>".repeat(MAX_DEPTH + 1), "</a>".repeat(MAX_DEPTH + 1));
        assert!(word_blocks(deep.as_bytes()).unwrap_err().contains("nests deeper"));
        let fine = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        assert!(word_blocks(fine.as_bytes()).is_ok());
    }

    #[test]
    fn names_leaving_the_archive_are_seen() {
        for bad in ["../evil.xml", "/etc/passwd", "word/../../x", "C:\\x", "a\\..\\b"] {
            assert!(!name_stays_inside(bad), "{bad}");
        }
        for good in ["word/document.xml", "[Content_Types].xml", "word/..hidden", "mimetype"] {
            assert!(name_stays_inside(good), "{good}");
        }
    }
}
