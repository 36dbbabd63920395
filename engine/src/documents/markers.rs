//! Paragraph markers for translations (pure). Each paragraph of a text to translate starts
//! with a numbered marker (`⟦12⟧`) the model is told to keep in front of its translation; an
//! answer is then checked paragraph by paragraph: what came back whole is kept, and only the
//! rest is asked again (a cut answer, a merged, dropped or reordered paragraph). The numbers
//! run through the whole document, so the joined answer has exactly the source's paragraphs,
//! in order: a Word or OpenDocument file is rebuilt by them. Markers never reach a result.

/// A marker's brackets: rare in any text, and a source's own are replaced ([`mark`]).
const OPEN: char = '⟦';
const CLOSE: char = '⟧';
/// The most digits a marker's number has (a document has far fewer paragraphs).
const MAX_DIGITS: usize = 7;

/// One marked stretch of a text: its marker's number (none: text before any marker) and its
/// text, trimmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub number: Option<u32>,
    pub text: &'a str,
}

/// `text`'s paragraphs (separated by blank lines), each numbered from 1: `⟦1⟧ first\n\n⟦2⟧
/// second`. A source's own brackets become plain ones, so no marker comes from the document.
pub fn mark(text: &str) -> String {
    paragraphs(text)
        .enumerate()
        .map(|(i, p)| format!("{OPEN}{}{CLOSE} {}", i + 1, p.replace(OPEN, "[").replace(CLOSE, "]")))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Whether `text` carries markers (a part stored before markers did not).
pub fn is_marked(text: &str) -> bool {
    segments(text).iter().any(|s| s.number.is_some())
}

/// The non-blank paragraphs of `text`, trimmed.
fn paragraphs(text: &str) -> impl Iterator<Item = &str> {
    blank_line_separated(text).map(str::trim).filter(|p| !p.is_empty())
}

/// `text` cut at its blank lines (a line of only white space counts as blank).
fn blank_line_separated(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut offset = 0;
        while let Some(nl) = rest[offset..].find('\n') {
            let after = offset + nl + 1;
            let line_end = rest[after..].find('\n').map(|n| after + n);
            if let Some(end) = line_end.filter(|end| rest[after..*end].trim().is_empty()) {
                let paragraph = &rest[..offset + nl];
                rest = &rest[end + 1..];
                return Some(paragraph);
            }
            offset = after;
        }
        let paragraph = rest;
        rest = "";
        Some(paragraph)
    })
}

/// The marker at the start of `text`, if one is: its number and the length it takes.
fn marker_at(text: &str) -> Option<(u32, usize)> {
    let inner = text.strip_prefix(OPEN)?;
    let digits = inner.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > MAX_DIGITS || !inner[digits..].starts_with(CLOSE) {
        return None;
    }
    let number = inner[..digits].parse().ok()?;
    Some((number, OPEN.len_utf8() + digits + CLOSE.len_utf8()))
}

/// `text` cut at every marker (wherever it stands: a model may run two paragraphs together).
pub fn segments(text: &str) -> Vec<Segment<'_>> {
    let mut found = Vec::new();
    let (mut current, mut start) = (None, 0);
    let mut i = 0;
    while let Some(offset) = text[i..].find(OPEN) {
        let at = i + offset;
        match marker_at(&text[at..]) {
            Some((number, len)) => {
                found.push(Segment { number: current, text: text[start..at].trim() });
                current = Some(number);
                start = at + len;
                i = start;
            }
            None => i = at + OPEN.len_utf8(),
        }
    }
    found.push(Segment { number: current, text: text[start..].trim() });
    // Nothing before the first marker is no segment.
    if found.first().is_some_and(|s| s.number.is_none() && s.text.is_empty()) {
        found.remove(0);
    }
    found
}

/// Whether a paragraph's text has words (not only inline tags: those alone are no translation).
pub fn has_words(text: &str) -> bool {
    !super::inline::strip(text).trim().is_empty()
}

/// The marker numbers of a marked text, in order.
pub fn numbers(text: &str) -> Vec<u32> {
    segments(text).iter().filter_map(|s| s.number).collect()
}

/// A paragraph's text as one paragraph: no blank line inside it (that would make two).
fn one_paragraph(text: &str) -> String {
    paragraphs(text).collect::<Vec<_>>().join("\n")
}

/// `⟦n⟧ text`.
pub fn marked(number: u32, text: &str) -> String {
    format!("{OPEN}{number}{CLOSE} {}", one_paragraph(text))
}

/// Of a marked text, only the paragraphs numbered in `wanted`, marked, in the text's order.
pub fn only(text: &str, wanted: &[u32]) -> String {
    segments(text)
        .into_iter()
        .filter_map(|s| s.number.filter(|n| wanted.contains(n)).map(|n| marked(n, s.text)))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// What an answer to a marked text holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// The paragraphs that came back whole, marked, in the asked order.
    pub kept: Vec<(u32, String)>,
    /// The asked paragraphs to ask again, in order.
    pub missing: Vec<u32>,
    /// Bytes of the answer outside any asked paragraph (a preface, an unknown marker's text).
    pub outside: usize,
}

impl Checked {
    /// The kept paragraphs as a marked text.
    pub fn kept_text(&self) -> String {
        self.kept.iter().map(|(n, text)| marked(*n, text)).collect::<Vec<_>>().join("\n\n")
    }
}

/// Check an answer to a text whose paragraphs were marked `asked` (in order). A paragraph is
/// kept when its marker came back once, with text after it, followed at once by the next
/// asked marker (or, for the last one, by the end of an answer that was not `cut`): a
/// paragraph followed by anything else may hold the next one's words (merged) or stop short
/// (cut), so it is asked again with the ones missing.
pub fn check(answer: &str, asked: &[u32], cut: bool) -> Checked {
    let found = segments(answer);
    let once = |n: u32| found.iter().filter(|s| s.number == Some(n)).count() == 1;
    let mut checked = Checked::default();
    for (i, number) in asked.iter().copied().enumerate() {
        let at = found.iter().position(|s| s.number == Some(number));
        let whole = at.filter(|_| once(number)).is_some_and(|at| {
            let next = found.get(at + 1).and_then(|s| s.number);
            let followed = match asked.get(i + 1) {
                Some(expected) => next == Some(*expected),
                None => at + 1 == found.len() && !cut,
            };
            followed && has_words(found[at].text)
        });
        match (whole, at) {
            (true, Some(at)) => checked.kept.push((number, found[at].text.to_string())),
            _ => checked.missing.push(number),
        }
    }
    checked.outside = found.iter().filter(|s| s.number.is_none_or(|n| !asked.contains(&n))).map(|s| s.text.len()).sum();
    checked
}

/// The result of a translation from its parts' marked answers, in order: each paragraph's
/// text without its marker, a paragraph cut across parts (the same number twice in a row)
/// joined again, one paragraph a blank line apart. Text before any marker (an answer stored
/// before markers) is kept as it is.
pub fn unmark(answers: &[String]) -> String {
    let mut paragraphs: Vec<(Option<u32>, String)> = Vec::new();
    for answer in answers {
        for segment in segments(answer) {
            let text = match segment.number {
                Some(_) => one_paragraph(segment.text),
                None => segment.text.to_string(),
            };
            match paragraphs.last_mut() {
                Some((Some(last), joined)) if segment.number == Some(*last) => {
                    joined.push(' ');
                    joined.push_str(&text);
                }
                _ => paragraphs.push((segment.number, text)),
            }
        }
    }
    paragraphs.into_iter().map(|(_, text)| text).filter(|t| !t.is_empty()).collect::<Vec<_>>().join("\n\n")
}

/// Bodies for `text[range]` of a marked text cut into pieces: a piece that starts inside a
/// paragraph starts with that paragraph's marker again, so every piece's answer is checked
/// and the pieces are joined back into one paragraph ([`unmark`]).
pub fn pieces(text: &str, ranges: impl IntoIterator<Item = (usize, usize)>) -> Vec<String> {
    let mut bodies = Vec::new();
    let mut last_marker: Option<u32> = None;
    let mut scanned = 0;
    for (start, end) in ranges {
        // The last marker before `start`.
        for segment_start in marker_starts(&text[scanned..start.max(scanned)]) {
            last_marker = marker_at(&text[scanned + segment_start..]).map(|(n, _)| n).or(last_marker);
        }
        scanned = scanned.max(start);
        let body = &text[start..end];
        let starts_marked = marker_at(body.trim_start()).is_some();
        bodies.push(match last_marker.filter(|_| !starts_marked && !body.trim().is_empty()) {
            Some(n) => format!("{OPEN}{n}{CLOSE} {}", body.trim_start()),
            None => body.to_string(),
        });
    }
    bodies
}

/// Byte offsets of the markers in `text`.
fn marker_starts(text: &str) -> Vec<usize> {
    text.match_indices(OPEN).map(|(i, _)| i).filter(|i| marker_at(&text[*i..]).is_some()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn answer(parts: &[(u32, &str)]) -> String {
        parts.iter().map(|(n, t)| format!("⟦{n}⟧ {t}")).collect::<Vec<_>>().join("\n\n")
    }

    #[test]
    fn paragraphs_are_numbered_and_a_sources_own_brackets_are_not_markers() {
        let text = "# Title\n\nFirst line\nsecond line\n \n\n⟦9⟧ sneaky\n";
        assert_eq!(mark(text), "⟦1⟧ # Title\n\n⟦2⟧ First line\nsecond line\n\n⟦3⟧ [9] sneaky");
        assert_eq!(numbers(&mark(text)), vec![1, 2, 3]);
        assert!(!is_marked("plain ⟦x⟧ text ⟦12345678⟧"));
    }

    #[test]
    fn a_whole_answer_is_kept_and_its_preface_is_left_out() {
        let checked =
            check(&format!("Here is the translation:\n\n{}", answer(&[(1, "Eins"), (2, "Zwei")])), &[1, 2], false);
        assert_eq!(checked.kept, vec![(1, "Eins".into()), (2, "Zwei".into())]);
        assert!(checked.missing.is_empty());
        assert_eq!(checked.outside, "Here is the translation:".len());
    }

    #[test]
    fn a_cut_answer_keeps_its_complete_paragraphs_only() {
        let checked = check(&answer(&[(4, "Vier"), (5, "Fünf"), (6, "Sech")]), &[4, 5, 6, 7], true);
        assert_eq!(checked.kept, vec![(4, "Vier".into()), (5, "Fünf".into())]);
        assert_eq!(checked.missing, vec![6, 7]);
        // Cut in its last paragraph: that one is asked again.
        let checked = check(&answer(&[(4, "Vier"), (5, "Fü")]), &[4, 5], true);
        assert_eq!(checked.missing, vec![5]);
    }

    #[test]
    fn merged_dropped_repeated_and_empty_paragraphs_are_asked_again_with_their_neighbour() {
        // 2 and 3 merged under 2: 2 may hold 3's words.
        assert_eq!(check(&answer(&[(1, "a"), (2, "b c"), (4, "d")]), &[1, 2, 3, 4], false).missing, vec![2, 3]);
        // The last dropped.
        assert_eq!(check(&answer(&[(1, "a"), (2, "b")]), &[1, 2, 3], false).missing, vec![2, 3]);
        // A marker twice, and one with no text.
        assert_eq!(check(&answer(&[(1, "a"), (2, "b"), (2, "b"), (3, "c")]), &[1, 2, 3], false).missing, vec![2]);
        assert_eq!(check(&answer(&[(1, ""), (2, "b")]), &[1, 2], false).missing, vec![1]);
        assert_eq!(check(&answer(&[(1, "<b1></b1>"), (2, "b")]), &[1, 2], false).missing, vec![1], "tags alone");
        // Swapped.
        assert_eq!(check(&answer(&[(2, "b"), (1, "a")]), &[1, 2], false).missing, vec![1, 2]);
        // An answer with no markers at all.
        assert_eq!(check("Eins Zwei", &[1, 2], false).missing, vec![1, 2]);
    }

    #[test]
    fn the_result_has_the_sources_paragraphs_without_markers() {
        let parts = vec![
            answer(&[(1, "# Titel"), (2, "Erster Teil")]),
            answer(&[(2, "zweiter Teil"), (3, "- Punkt\n\n\nmehr")]),
        ];
        assert_eq!(unmark(&parts), "# Titel\n\nErster Teil zweiter Teil\n\n- Punkt\nmehr");
        assert_eq!(unmark(&["an answer from before markers".to_string()]), "an answer from before markers");
    }

    #[test]
    fn a_piece_starting_inside_a_paragraph_carries_its_marker() {
        let text = mark("one two three four\n\nfive six");
        let cut = text.find("three").unwrap();
        let bodies = pieces(&text, [(0, cut), (cut, text.len())]);
        assert_eq!(bodies, vec!["⟦1⟧ one two ".to_string(), "⟦1⟧ three four\n\n⟦2⟧ five six".to_string()]);
        assert_eq!(only(&bodies[1], &[2]), "⟦2⟧ five six");
    }

    proptest! {
        /// Whatever comes back, every asked paragraph is kept or missing (once, in order); a
        /// faithful answer keeps them all.
        #[test]
        fn every_asked_paragraph_is_kept_or_missing(
            texts in proptest::collection::vec("[a-zäöü ⟦⟧0-9\n]{0,30}", 1..12),
            drop in 0usize..12,
            cut: bool,
            noise in "[a-z⟦⟧0-9 \n]{0,40}",
        ) {
            let source = texts.iter().map(|t| format!("w{t}")).collect::<Vec<_>>().join("\n\n");
            let marked_source = mark(&source);
            let asked = numbers(&marked_source);
            let faithful = segments(&marked_source).iter().map(|s| marked(s.number.unwrap(), &s.text.to_uppercase())).collect::<Vec<_>>().join("\n\n");
            let all = check(&faithful, &asked, false);
            prop_assert!(all.missing.is_empty());
            prop_assert_eq!(all.kept.len(), asked.len());
            prop_assert_eq!(unmark(&[all.kept_text()]).split("\n\n").count(), asked.len());
            let mut flawed: Vec<String> = faithful.split("\n\n⟦").map(String::from).collect();
            if drop < flawed.len() { flawed.remove(drop); }
            let flawed = format!("{noise}{}", flawed.join("\n\n⟦"));
            let checked = check(&flawed, &asked, cut);
            let mut seen: Vec<u32> = checked.kept.iter().map(|(n, _)| *n).chain(checked.missing.iter().copied()).collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, asked.clone());
            prop_assert!(checked.kept.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}
