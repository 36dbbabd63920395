//! Inline formatting as it travels to a model and back (pure). A Word paragraph's runs that
//! differ from its look (bold, italic, underlined, another style, a hyperlink) become numbered
//! tags around their words, `<b1>Supplier</b1>`, and a footnote's reference a placeholder,
//! `<f2/>`; the model is told to keep them around the translated words. An answer's
//! paragraph keeps its formatting when it holds exactly its source's tags, each pair once and
//! none inside another; otherwise it falls back to plain text in its paragraph's look. The
//! letter says what the tag is (for the Markdown a user reads); the number which runs it
//! stands for (for the rebuilt file).

/// A tag's letter: what the runs it stands for look like.
pub const BOLD: char = 'b';
pub const ITALIC: char = 'i';
pub const UNDERLINE: char = 'u';
/// Another look (a colour, a font, a character style).
pub const STYLED: char = 's';
pub const LINK: char = 'a';
/// A footnote's or an endnote's reference (a placeholder, no words).
pub const REFERENCE: char = 'f';
const LETTERS: [char; 6] = [BOLD, ITALIC, UNDERLINE, STYLED, LINK, REFERENCE];
/// The most digits a tag's number has.
const MAX_DIGITS: usize = 4;

/// One tag: its letter and number, and whether it opens, closes or stands alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tag {
    pub letter: char,
    pub number: u32,
    pub form: Form,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    Open,
    Close,
    Alone,
}

impl Tag {
    pub fn text(&self) -> String {
        match self.form {
            Form::Open => format!("<{}{}>", self.letter, self.number),
            Form::Close => format!("</{}{}>", self.letter, self.number),
            Form::Alone => format!("<{}{}/>", self.letter, self.number),
        }
    }
}

/// The tag at the start of `text`, and its length.
fn tag_at(text: &str) -> Option<(Tag, usize)> {
    let rest = text.strip_prefix('<')?;
    let (closing, rest) = match rest.strip_prefix('/') {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let letter = rest.chars().next().filter(|c| LETTERS.contains(c))?;
    let rest = &rest[1..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > MAX_DIGITS {
        return None;
    }
    let number = rest[..digits].parse().ok()?;
    let after = &rest[digits..];
    let (form, end) = if after.starts_with("/>") && !closing {
        (Form::Alone, 2)
    } else if after.starts_with('>') {
        (if closing { Form::Close } else { Form::Open }, 1)
    } else {
        return None;
    };
    let len = 1 + usize::from(closing) + 1 + digits + end;
    Some((Tag { letter, number, form }, len))
}

/// A stretch of a tagged paragraph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Tag(Tag),
}

/// `text` cut into words and tags.
pub fn pieces(text: &str) -> Vec<Piece<'_>> {
    let mut found = Vec::new();
    let (mut start, mut i) = (0, 0);
    while let Some(offset) = text[i..].find('<') {
        let at = i + offset;
        match tag_at(&text[at..]) {
            Some((tag, len)) => {
                if at > start {
                    found.push(Piece::Text(&text[start..at]));
                }
                found.push(Piece::Tag(tag));
                start = at + len;
                i = start;
            }
            None => i = at + 1,
        }
    }
    if start < text.len() {
        found.push(Piece::Text(&text[start..]));
    }
    found
}

/// A document's own text that would read as a tag, made plain (`‹b1>`), so every tag a model
/// sees is Sluice's.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        out.push(if tag_at(&rest[at..]).is_some() { '‹' } else { '<' });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// The tags of `text`, sorted (a multiset).
fn tag_set(text: &str) -> Vec<Tag> {
    let mut tags: Vec<Tag> =
        pieces(text).into_iter().filter_map(|p| if let Piece::Tag(t) = p { Some(t) } else { None }).collect();
    tags.sort();
    tags
}

/// Whether `text`'s tags pair up: each open one closed by its own before another opens.
fn flat_and_paired(text: &str) -> bool {
    let mut open: Option<Tag> = None;
    for piece in pieces(text) {
        let Piece::Tag(tag) = piece else { continue };
        match (tag.form, open) {
            (Form::Open, None) => open = Some(tag),
            (Form::Close, Some(o)) if (o.letter, o.number) == (tag.letter, tag.number) => open = None,
            (Form::Alone, None) => {}
            _ => return false,
        }
    }
    open.is_none()
}

/// Whether `answer` keeps `source`'s inline formatting: the same tags, each once, paired.
pub fn keeps_tags(source: &str, answer: &str) -> bool {
    let wanted = tag_set(source);
    tag_set(answer) == wanted && flat_and_paired(answer) && wanted.windows(2).all(|w| w[0] != w[1])
}

/// Whether `text` has tags at all.
pub fn has_tags(text: &str) -> bool {
    pieces(text).iter().any(|p| matches!(p, Piece::Tag(_)))
}

/// `text` without its tags (a reference's placeholder leaves nothing).
pub fn strip(text: &str) -> String {
    pieces(text).into_iter().filter_map(|p| if let Piece::Text(t) = p { Some(t) } else { None }).collect()
}

/// `text` as a reader's Markdown: bold and italic spans marked as Markdown marks them,
/// other tags left out.
pub fn to_markdown(text: &str) -> String {
    let mark = |letter: char| match letter {
        BOLD => "**",
        ITALIC => "*",
        _ => "",
    };
    pieces(text)
        .into_iter()
        .map(|p| match p {
            Piece::Text(t) => t.to_string(),
            Piece::Tag(Tag { letter, form: Form::Open | Form::Close, .. }) => mark(letter).to_string(),
            Piece::Tag(_) => String::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SOURCE: &str = "The <b1>Supplier</b1> delivers; see <a2>our terms page</a2><f3/> before <i4>signing</i4>.";

    #[test]
    fn an_answer_with_its_sources_tags_keeps_its_formatting_and_others_do_not() {
        assert!(keeps_tags(
            SOURCE,
            "Der <b1>Lieferant</b1> liefert; <i4>vor</i4> der Unterschrift <a2>unsere Seite</a2><f3/>."
        ));
        assert!(!keeps_tags(SOURCE, "Der Lieferant liefert."), "tags lost");
        assert!(!keeps_tags(SOURCE, "Der <b1>Lieferant</b1> <a2>x</a2><f3/> <i4>y</i4> <b5>z</b5>"), "a tag made up");
        assert!(!keeps_tags(SOURCE, "<b1>Der <a2>Lieferant</b1></a2><f3/><i4>y</i4>"), "crossed");
        assert!(!keeps_tags(SOURCE, "</b1>Der<b1> <a2>x</a2><f3/><i4>y</i4>"), "closed before opened");
        assert!(!keeps_tags(SOURCE, "<b1>a</b1><b1>b</b1><a2>x</a2><f3/><i4>y</i4>"), "twice");
        assert!(keeps_tags("plain", "schlicht"));
    }

    #[test]
    fn a_reader_sees_markdown_and_plain_text_loses_every_tag() {
        assert_eq!(to_markdown(SOURCE), "The **Supplier** delivers; see our terms page before *signing*.");
        assert_eq!(strip(SOURCE), "The Supplier delivers; see our terms page before signing.");
        assert_eq!(strip("a <b> c <b12345> d < e"), "a <b> c <b12345> d < e", "not tags");
    }

    #[test]
    fn a_documents_own_tag_like_text_is_made_plain() {
        assert_eq!(escape("x <b1>y</b1> <br> 3 < 4"), "x ‹b1>y‹/b1> <br> 3 < 4");
        assert!(!has_tags(&escape("x <b1>y</b1>")));
    }

    proptest! {
        #[test]
        fn reading_any_text_never_panics_and_stripping_leaves_no_tag(text in "[<>/a-z0-9 ]{0,60}") {
            let _ = (strip(&text), to_markdown(&text), keeps_tags(&text, &text));
            prop_assert!(!has_tags(&escape(&text)));
        }
    }
}
