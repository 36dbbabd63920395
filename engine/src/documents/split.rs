//! Splitting a document's text into parts that each fit one provider call. Pure: text in,
//! byte ranges out.
//!
//! A part ends at the best boundary in the second half of its window: a page break first,
//! then a heading, a paragraph, a sentence, and last a space (never inside a word; only a
//! "word" longer than a whole part is cut, at a character boundary). Parts partition the text:
//! every byte is in exactly one part's body. A part may also carry an *overlap*: the end of
//! the previous part, given to the provider as context only (summaries read better with it;
//! a translation would repeat it, so it gets none).

/// One part: its body is `text[start..end]`; `text[overlap_start..start]` is the context it
/// carries from the part before (empty when there is none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub overlap_start: usize,
    pub start: usize,
    pub end: usize,
}

impl Part {
    /// The part's own text.
    pub fn body<'a>(&self, text: &'a str) -> &'a str {
        &text[self.start..self.end]
    }

    /// The text before it given as context.
    pub fn overlap<'a>(&self, text: &'a str) -> &'a str {
        &text[self.overlap_start..self.start]
    }
}

/// Boundaries from the strongest to the weakest; a part prefers to end at the strongest one it
/// can find in the second half of its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Boundary {
    Word = 0,
    Sentence = 1,
    Paragraph = 2,
    Heading = 3,
    Page = 4,
}

/// Split `text` into parts of at most `max_chars` characters each, overlap included: each
/// part after the first carries up to `overlap_chars` characters of the text before it,
/// starting at a word (`overlap_chars` is capped at a quarter of `max_chars`). Deterministic.
pub fn split(text: &str, max_chars: usize, overlap_chars: usize) -> Vec<Part> {
    let max_chars = max_chars.max(8);
    let overlap_chars = overlap_chars.min(max_chars / 4);
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let overlap_start = if parts.is_empty() { start } else { overlap_before(text, start, overlap_chars) };
        let room = max_chars - text[overlap_start..start].chars().count();
        let end = part_end(text, start, room);
        parts.push(Part { overlap_start, start, end });
        start = end;
    }
    parts
}

/// Where the part starting at `start` ends when it may hold `room` characters.
fn part_end(text: &str, start: usize, room: usize) -> usize {
    let rest = &text[start..];
    // The byte just past `room` characters, or the end of the text if it fits.
    let Some((limit, _)) = rest.char_indices().nth(room) else { return text.len() };
    let half = rest.char_indices().nth(room / 2).map_or(0, |(i, _)| i);
    // The last cut of each kind in the window, and the last one of any kind in its second half.
    let mut best: Option<(Boundary, usize)> = None;
    let mut last_any: Option<usize> = None;
    let bytes = rest.as_bytes();
    for (i, c) in rest[..limit].char_indices() {
        let after = i + c.len_utf8();
        let kind = match c {
            '\u{c}' => Some(Boundary::Page),
            '\n' if bytes.get(after) == Some(&b'#') => Some(Boundary::Heading),
            '\n' if i > 0 && bytes[i - 1] == b'\n' => Some(Boundary::Paragraph),
            ' ' | '\n' | '\t' if i > 0 && matches!(bytes[i - 1], b'.' | b'!' | b'?') => Some(Boundary::Sentence),
            c if c.is_whitespace() => Some(Boundary::Word),
            _ => None,
        };
        // A cut falls after the boundary's character, and never leaves an empty part.
        let Some(kind) = kind else { continue };
        if after > limit || after == 0 {
            continue;
        }
        last_any = Some(after);
        if after >= half && best.is_none_or(|(b, _)| kind >= b) {
            best = Some((kind, after));
        }
    }
    start + best.map(|(_, at)| at).or(last_any).unwrap_or(limit)
}

/// Where an overlap of at most `chars` characters before `start` begins: at a word.
fn overlap_before(text: &str, start: usize, chars: usize) -> usize {
    if chars == 0 {
        return start;
    }
    let before = &text[..start];
    let from = before.char_indices().rev().nth(chars - 1).map_or(0, |(i, _)| i);
    if from == 0 {
        return 0;
    }
    // Move forward to just after the first whitespace, so the overlap starts with a word.
    match before[from..].find(char::is_whitespace) {
        Some(ws) => {
            let at = from + ws;
            at + before[at..].chars().next().map_or(0, char::len_utf8)
        }
        None => start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bodies<'a>(text: &'a str, parts: &[Part]) -> Vec<&'a str> {
        parts.iter().map(|p| p.body(text)).collect()
    }

    #[test]
    fn a_text_that_fits_is_one_part() {
        assert_eq!(split("short text", 100, 10), vec![Part { overlap_start: 0, start: 0, end: 10 }]);
        assert!(split("", 100, 10).is_empty());
    }

    #[test]
    fn pages_and_headings_win_over_paragraphs_and_sentences() {
        let text = "Intro words here.\n\nMore words. Then some.\u{c}Page two starts here and goes on.";
        let parts = split(text, 50, 0);
        assert_eq!(bodies(text, &parts)[0], "Intro words here.\n\nMore words. Then some.\u{c}");
        let text = "Some opening lines. And more.\n\n# Heading\nbody body body body body";
        assert_eq!(bodies(text, &split(text, 40, 0))[0], "Some opening lines. And more.\n\n");
        let text = "First sentence is here. Second one, longer, goes past the limit of the part";
        assert_eq!(bodies(text, &split(text, 40, 0))[0], "First sentence is here. ");
    }

    #[test]
    fn never_inside_a_word_unless_the_word_is_longer_than_a_part() {
        let text = "alpha beta gamma delta epsilon zeta eta theta iota kappa";
        for part in bodies(text, &split(text, 12, 0)) {
            assert!(part.ends_with(' ') || text.ends_with(part), "{part:?} ends inside a word");
        }
        let long = "x".repeat(30);
        assert_eq!(bodies(&long, &split(&long, 10, 0)), vec!["xxxxxxxxxx"; 3]);
    }

    #[test]
    fn the_overlap_is_the_end_of_the_part_before_starting_at_a_word() {
        let text = "one two three four five six seven eight nine ten eleven twelve";
        let parts = split(text, 24, 6);
        assert!(parts.len() > 2);
        for pair in parts.windows(2) {
            let overlap = pair[1].overlap(text);
            assert!(pair[0].body(text).ends_with(overlap));
            assert!(overlap.is_empty() || !overlap.starts_with(' '));
            assert!(overlap.chars().count() <= 6);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn parts_partition_the_text_fit_the_budget_and_are_deterministic(
            text in "([a-zé漢]{1,12}[ .!?\n\u{c}#]{0,3}){0,120}",
            max_chars in 8usize..200,
            overlap in 0usize..40,
        ) {
            let parts = split(&text, max_chars, overlap);
            // Every byte in exactly one body, in order.
            let joined: String = parts.iter().map(|p| p.body(&text)).collect();
            prop_assert_eq!(&joined, &text);
            let mut at = 0;
            for p in &parts {
                prop_assert_eq!(p.start, at);
                prop_assert!(p.end > p.start);
                prop_assert!(p.overlap_start <= p.start);
                at = p.end;
                // No part (overlap included) over budget.
                prop_assert!(text[p.overlap_start..p.end].chars().count() <= max_chars.max(8));
                prop_assert!(p.overlap(&text).chars().count() <= overlap.min(max_chars.max(8) / 4));
            }
            prop_assert_eq!(split(&text, max_chars, overlap), parts);
        }

        #[test]
        fn cuts_fall_at_whitespace_when_the_window_has_any(
            words in proptest::collection::vec("[a-z]{1,8}", 1..80),
            max_chars in 10usize..60,
        ) {
            let text = words.join(" ");
            let parts = split(&text, max_chars, 0);
            for p in &parts[..parts.len() - 1] {
                prop_assert!(p.body(&text).ends_with(' '), "{:?} was cut inside a word", p.body(&text));
            }
        }
    }
}
