//! The pieces `o200k_base` encodes: its pre-tokenizer, the regex that cuts a text into words,
//! numbers, punctuation and spaces before byte-pair encoding runs on each. `bpe_openai` runs
//! that regex once a piece, and it cost as much as the encoding (half of an upload's CPU), so
//! here a piece of ASCII is found by hand, in a few byte comparisons. A piece whose cut depends
//! on a byte past ASCII (a letter, a digit or a space of another script, say) is left to the
//! regex: the pieces are always the regex's (a property test holds this).
//!
//! The regex, as `bpe_openai` writes it (its one negative look-ahead, `\s+(?!\S)`, rewritten
//! as `\s+\s` less its last character), tried in this order at each piece's start:
//! 1. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 2. `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//! 3. `\p{N}{1,3}`
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
//! 5. `\s*[\r\n]+`
//! 6. `\s+$`
//! 7. `\s+\s`, less the last character
//! 8. `\s+`
//!
//! In ASCII, `\p{Lu}` is A–Z, `\p{Ll}` a–z, `\p{N}` 0–9 and `\s` tab, line feed, vertical tab,
//! form feed, carriage return and space; no ASCII character is in `Lt`, `Lm`, `Lo` or `M`.

/// The pieces of `text`, in order: the same as `bpe_openai::o200k_base().split(text)`.
pub fn pieces(text: &str) -> Pieces<'_> {
    Pieces { text, at: 0 }
}

/// See [`pieces`].
pub struct Pieces<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.at >= self.text.len() {
            return None;
        }
        let end = match ascii_piece(self.text.as_bytes(), self.at) {
            Ok(end) => end,
            Err(PastAscii) => self.at + bpe_openai::o200k_base().split(&self.text[self.at..]).next()?.len(),
        };
        let piece = &self.text[self.at..end];
        self.at = end;
        Some(piece)
    }
}

/// The piece's cut would look at a byte past ASCII.
struct PastAscii;

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Upper,
    Lower,
    Digit,
    /// `\r` or `\n`.
    LineBreak,
    /// The other ASCII whitespace.
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

use Class::*;

/// The class of the byte at `i`; `None` past the end.
fn class_at(text: &[u8], i: usize) -> Result<Option<Class>, PastAscii> {
    let Some(&byte) = text.get(i) else { return Ok(None) };
    Ok(Some(match byte {
        b'A'..=b'Z' => Upper,
        b'a'..=b'z' => Lower,
        b'0'..=b'9' => Digit,
        b'\r' | b'\n' => LineBreak,
        b' ' | b'\t' | 0x0B | 0x0C => Space,
        0x80.. => return Err(PastAscii),
        _ => Other,
    }))
}

/// Where the run of bytes in `class` starting at `i` ends (at most `max` bytes long).
fn run_end(text: &[u8], mut i: usize, max: usize, in_run: impl Fn(Class) -> bool) -> Result<usize, PastAscii> {
    let limit = i.saturating_add(max);
    while i < limit {
        match class_at(text, i)? {
            Some(class) if in_run(class) => i += 1,
            _ => break,
        }
    }
    Ok(i)
}

fn whitespace(class: Class) -> bool {
    matches!(class, Space | LineBreak)
}

/// The end of the piece that starts at `at` (before the end of `text`), or `PastAscii`.
fn ascii_piece(text: &[u8], at: usize) -> Result<usize, PastAscii> {
    let first = class_at(text, at)?.expect("a piece starts before the end");
    // 1 and 2: a word, after one character that is not a line break, a letter or a digit.
    // With that character or without it: only one of the two can start a word here.
    let word = match first {
        Space | Other => Some(at + 1),
        Upper | Lower => Some(at),
        Digit | LineBreak => None,
    };
    if let Some(start) = word {
        let upper_end = run_end(text, start, usize::MAX, |c| c == Upper)?;
        // 1 wants a lower-case letter after the capitals; 2 wants a capital.
        if class_at(text, upper_end)? == Some(Lower) || upper_end > start {
            let lower_end = run_end(text, upper_end, usize::MAX, |c| c == Lower)?;
            return contraction_end(text, lower_end);
        }
    }
    match first {
        Digit => run_end(text, at, 3, |c| c == Digit),
        Upper | Lower => unreachable!("a letter starts a word"),
        Other | Space | LineBreak => {
            // 4: punctuation, after one space if any, and the line breaks and slashes after it.
            let symbols = match first {
                Other => Some(at),
                _ if text[at] == b' ' && class_at(text, at + 1)? == Some(Other) => Some(at + 1),
                _ => None,
            };
            if let Some(start) = symbols {
                let symbols_end = run_end(text, start, usize::MAX, |c| c == Other)?;
                let mut end = symbols_end;
                while let Some(&byte) = text.get(end) {
                    match byte {
                        b'\r' | b'\n' | b'/' => end += 1,
                        _ => break,
                    }
                }
                return Ok(end);
            }
            let spaces_end = run_end(text, at, usize::MAX, whitespace)?;
            if let Some(last_break) = text[at..spaces_end].iter().rposition(|b| matches!(b, b'\r' | b'\n')) {
                return Ok(at + last_break + 1); // 5
            }
            if spaces_end == text.len() || spaces_end - at == 1 {
                return Ok(spaces_end); // 6, or 8
            }
            Ok(spaces_end - 1) // 7
        }
    }
}

/// After a word: `'s`, `'t`, `'re`, `'ve`, `'m`, `'ll` or `'d`, in any case, if one follows.
fn contraction_end(text: &[u8], at: usize) -> Result<usize, PastAscii> {
    if text.get(at) != Some(&b'\'') {
        return Ok(at);
    }
    // Past ASCII, `ſ` is an `s` to a case-blind match: leave it to the regex.
    let lower = |i: usize| match text.get(i) {
        Some(&byte) if byte >= 0x80 => Err(PastAscii),
        byte => Ok(byte.map(u8::to_ascii_lowercase)),
    };
    Ok(match (lower(at + 1)?, lower(at + 2)?) {
        (Some(b's' | b't' | b'm' | b'd'), _) => at + 2,
        (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => at + 3,
        _ => at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn regex_pieces(text: &str) -> Vec<&str> {
        bpe_openai::o200k_base().split(text).collect()
    }

    #[test]
    fn pieces_of_english_prose_and_code_are_the_regexs() {
        for text in [
            "The supplier's goods, named in schedule A, arrive by 12/31/2026.\n\n  Don't   WAIT—we'LL ship.",
            "fn main() {\n    let x = 1234567;\r\n\tprintln!(\"{x}\");\n}\n   ",
            "HELLOworld helloWORLD I'M  'S '  ''  ...//\n/ \x0b\x0c\x00\x1f end  ",
            "",
            " ",
            "\n",
            "a",
            "x  ",
            "x \n ",
        ] {
            assert_eq!(pieces(text).collect::<Vec<_>>(), regex_pieces(text), "{text:?}");
        }
    }

    #[test]
    fn a_piece_that_depends_on_a_byte_past_ascii_is_the_regexs() {
        for text in [
            "café Über naïve ſ it'ſ don'ſ",
            "word\u{a0} \u{a0}x  \u{2003}\n\u{85}",
            "١٢٣4 12٣ 〇",
            "契約の当事者は、本契約に定める条件に従い",
            "🎉🚀 (emoji) «quotes» — dash",
            "e\u{301}clair A\u{300}B",
        ] {
            assert_eq!(pieces(text).collect::<Vec<_>>(), regex_pieces(text), "{text:?}");
        }
    }

    /// Texts from an alphabet of every class the regex tells apart, ASCII and not.
    fn mixed_text() -> impl Strategy<Value = String> {
        let alphabet: Vec<char> =
            "aAzZsStTmMdDrRvVeElLqQ09 \t\n\r\x0b\x0c'/.,!-_\"\x00\x1féÉſǅʰא\u{301}١\u{a0}\u{2003}\u{85}🎉"
                .chars()
                .collect();
        proptest::collection::vec(proptest::sample::select(alphabet), 0..60).prop_map(|c| c.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]
        #[test]
        fn pieces_are_always_the_regexs(text in mixed_text()) {
            prop_assert_eq!(pieces(&text).collect::<Vec<_>>(), regex_pieces(&text));
        }

        #[test]
        fn pieces_of_ascii_are_the_regexs(text in "[ -~\t\n\r\x0b\x0c\x00-\x08]{0,80}") {
            prop_assert_eq!(pieces(&text).collect::<Vec<_>>(), regex_pieces(&text));
        }
    }
}
