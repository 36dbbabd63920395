//! A translation's glossary and formality (pure). A glossary comes pasted in the upload form,
//! as a file in DeepL's glossary format (CSV or TSV: a term and its translation a line), or
//! saved in the user's account by name. Each call carries the entries whose terms occur in
//! its text; after each answer, a term present in the source whose agreed translation is
//! missing from the answer is asked again once, then reported on the job.

use serde::{Deserialize, Serialize};

/// The most entries a glossary may have.
pub const MAX_ENTRIES: usize = 1_000;
/// The most characters a term or its translation may have.
pub const MAX_TERM_CHARS: usize = 200;
/// The most bytes a glossary's text may have.
pub const MAX_BYTES: usize = 60 * 1024;
/// The most key terms one call finds in a translation's opening.
pub const MAX_FOUND_TERMS: usize = 30;
/// The most characters of a translation's opening its key terms are looked for in.
pub const OPENING_CHARS: usize = 12_000;

/// Pure: the key terms a model listed (`term<TAB>translation` a line; other lines, and terms
/// a glossary could not take, left out), at most [`MAX_FOUND_TERMS`].
pub fn found_terms(answer: &str) -> Vec<Entry> {
    let mut found: Vec<Entry> = Vec::new();
    for line in answer.lines() {
        let line = line.trim().trim_start_matches(['-', '*', ' ']);
        let Some((source, target)) = line.split_once('\t') else { continue };
        let (source, target) = (source.trim(), target.trim());
        let fits = |t: &str| !t.is_empty() && t.chars().count() <= MAX_TERM_CHARS && !t.chars().any(char::is_control);
        let new = !found.iter().any(|e| e.source.to_lowercase() == source.to_lowercase());
        if fits(source) && fits(target) && new && found.len() < MAX_FOUND_TERMS {
            found.push(Entry { source: source.to_string(), target: target.to_string() });
        }
    }
    found
}

/// The most characters a saved glossary's name may have.
pub const MAX_NAME_CHARS: usize = 60;

/// A term and its agreed translation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Entry {
    pub source: String,
    pub target: String,
}

/// How a translation addresses its reader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Formality {
    /// As the source does.
    #[default]
    AsSource,
    Formal,
    Informal,
}

impl Formality {
    /// Its form name, or a message listing them.
    pub fn parse(value: &str) -> Result<Formality, String> {
        match value.trim() {
            "" | "as_source" => Ok(Formality::AsSource),
            "formal" => Ok(Formality::Formal),
            "informal" => Ok(Formality::Informal),
            _ => Err("formality should be formal, informal or as_source".into()),
        }
    }

    /// What the prompt says of it.
    pub fn instruction(self) -> &'static str {
        match self {
            Formality::AsSource => "",
            Formality::Formal => " Address the reader formally (as German \"Sie\" or French \"vous\" do).",
            Formality::Informal => " Address the reader informally (as German \"du\" or French \"tu\" do).",
        }
    }
}

/// What a translation is asked to keep to: its glossary and formality (none: as the source).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guidance {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub glossary: Vec<Entry>,
    #[serde(default, skip_serializing_if = "is_as_source")]
    pub formality: Formality,
}

fn is_as_source(formality: &Formality) -> bool {
    *formality == Formality::AsSource
}

impl Guidance {
    pub fn is_empty(&self) -> bool {
        *self == Guidance::default()
    }

    /// The same guidance with only the entries whose terms occur in `text`.
    pub fn for_text(&self, text: &str) -> Guidance {
        Guidance { glossary: occurring(&self.glossary, text).into_iter().cloned().collect(), formality: self.formality }
    }

    /// A short stable digest of it, for an upload's idempotency key ("" when empty).
    pub fn digest(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        use sha2::Digest;
        let json = serde_json::to_vec(self).expect("guidance serialises");
        hex::encode(&sha2::Sha256::digest(&json)[..8])
    }

    /// The prompt's lines for it (empty when there is nothing to say).
    pub fn prompt(&self) -> String {
        let mut out = self.formality.instruction().trim_start().to_string();
        if !self.glossary.is_empty() {
            let pairs: Vec<String> =
                self.glossary.iter().map(|e| format!("\"{}\" as \"{}\"", e.source, e.target)).collect();
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("Translate these terms as agreed: {}.", pairs.join("; ")));
        }
        out
    }
}

/// Pure: a glossary's text in DeepL's format: a term and its translation a line, separated by
/// a tab (TSV) or a comma (CSV, fields may be quoted), with two language columns after them
/// allowed and ignored; blank lines skipped. Every refusal names its line.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    if text.len() > MAX_BYTES {
        return Err(format!("the glossary is over {} KB", MAX_BYTES / 1024));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let tabs = text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.contains('\t'));
    let mut entries: Vec<Entry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let at = |why: &str| format!("glossary line {}: {why}", i + 1);
        let fields =
            if tabs { line.split('\t').map(str::to_string).collect() } else { csv_fields(line).map_err(at)? };
        if !(fields.len() == 2 || fields.len() == 4) {
            return Err(at("give a term and its translation (and, optionally, the two languages)"));
        }
        let (source, target) = (fields[0].trim(), fields[1].trim());
        if source.is_empty() || target.is_empty() {
            return Err(at("a term and its translation may not be empty"));
        }
        if source.chars().count() > MAX_TERM_CHARS || target.chars().count() > MAX_TERM_CHARS {
            return Err(at(&format!("a term is longer than {MAX_TERM_CHARS} characters")));
        }
        if source.chars().chain(target.chars()).any(char::is_control) {
            return Err(at("a term holds a control character"));
        }
        if entries.iter().any(|e| e.source.to_lowercase() == source.to_lowercase()) {
            return Err(at(&format!("\"{source}\" is given twice")));
        }
        if entries.len() == MAX_ENTRIES {
            return Err(format!("the glossary has more than {MAX_ENTRIES} entries"));
        }
        entries.push(Entry { source: source.to_string(), target: target.to_string() });
    }
    Ok(entries)
}

/// One CSV line's fields (RFC 4180 quoting: `"a, b"`, `""` for a quote).
fn csv_fields(line: &str) -> Result<Vec<String>, &'static str> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("one field at least");
        match (c, quoted) {
            ('"', false) if field.trim().is_empty() => {
                field.clear();
                quoted = true;
            }
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', true) => quoted = false,
            (',', false) => fields.push(String::new()),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return Err("a quote is not closed");
    }
    Ok(fields)
}

/// Pure: `user`'s entries, then those of `found` for terms the user did not give.
pub fn merged(user: &[Entry], found: &[Entry]) -> Vec<Entry> {
    let mut all = user.to_vec();
    for entry in found {
        if !all.iter().any(|e| e.source.to_lowercase() == entry.source.to_lowercase()) && all.len() < MAX_ENTRIES {
            all.push(entry.clone());
        }
    }
    all
}

/// Whether `needle` occurs in `haystack` as whole words, case aside.
fn occurs(haystack: &str, needle: &str) -> bool {
    let (haystack, needle) = (haystack.to_lowercase(), needle.to_lowercase());
    if needle.is_empty() {
        return false;
    }
    haystack.match_indices(&needle).any(|(at, _)| {
        let before = haystack[..at].chars().next_back();
        let after = haystack[at + needle.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Pure: the entries whose terms occur in `text`.
pub fn occurring<'a>(entries: &'a [Entry], text: &str) -> Vec<&'a Entry> {
    entries.iter().filter(|e| occurs(text, &e.source)).collect()
}

/// Pure: of the entries whose terms occur in `source`, those whose agreed translation is not
/// in `answer`.
pub fn missed<'a>(entries: &'a [Entry], source: &str, answer: &str) -> Vec<&'a Entry> {
    let answer = answer.to_lowercase();
    occurring(entries, source).into_iter().filter(|e| !answer.contains(&e.target.to_lowercase())).collect()
}

/// An entry as a job reports it missed: `Supplier → Lieferant`.
pub fn shown(entry: &Entry) -> String {
    format!("{} → {}", entry.source, entry.target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(source: &str, target: &str) -> Entry {
        Entry { source: source.into(), target: target.into() }
    }

    #[test]
    fn deepl_csv_and_tsv_are_read_and_bad_lines_named() {
        assert_eq!(
            parse("Supplier,Lieferant\n\"terms, page\",\"AGB-Seite \"\"neu\"\"\",en,de\n\n").unwrap(),
            vec![entry("Supplier", "Lieferant"), entry("terms, page", "AGB-Seite \"neu\"")]
        );
        assert_eq!(parse("\u{feff}Supplier\tLieferant\r\nbuyer\tKäufer").unwrap().len(), 2);
        assert!(parse("Supplier").unwrap_err().contains("line 1"));
        assert!(parse("a,b\nSupplier,").unwrap_err().contains("line 2"));
        assert!(parse("a,b\nA,c").unwrap_err().contains("given twice"));
        assert!(parse("\"a,b").unwrap_err().contains("quote"));
        assert!(parse(&"x".repeat(MAX_BYTES + 1)).unwrap_err().contains("KB"));
        let many: String = (0..=MAX_ENTRIES).map(|i| format!("t{i},u{i}\n")).collect();
        assert!(parse(&many).unwrap_err().contains("more than"));
        assert!(parse("a\u{7},b").unwrap_err().contains("control"));
    }

    #[test]
    fn terms_occur_as_whole_words_and_a_missing_translation_is_found() {
        let glossary = vec![entry("Supplier", "Lieferant"), entry("ship", "versenden")];
        let source = "The supplier ships the goods; the Supplier pays.";
        assert_eq!(occurring(&glossary, source), vec![&glossary[0]], "\"ships\" is not \"ship\"");
        assert_eq!(missed(&glossary, source, "Der Anbieter liefert."), vec![&glossary[0]]);
        assert!(missed(&glossary, source, "Der LIEFERANT liefert.").is_empty());
        assert_eq!(
            merged(&[entry("supplier", "Anbieter")], &glossary),
            vec![entry("supplier", "Anbieter"), entry("ship", "versenden")]
        );
    }

    #[test]
    fn the_key_terms_a_model_lists_are_read_leniently_and_bounded() {
        let answer = "Here are the terms:\n- Supplier\tLieferant\nBuyer\tKäufer\nsupplier\tAnbieter\nno tab here\n\t\n";
        assert_eq!(found_terms(answer), vec![entry("Supplier", "Lieferant"), entry("Buyer", "Käufer")]);
        let many: String = (0..100).map(|i| format!("t{i}\tu{i}\n")).collect();
        assert_eq!(found_terms(&many).len(), MAX_FOUND_TERMS);
    }

    #[test]
    fn guidance_says_its_formality_and_the_terms_of_its_text() {
        let guidance = Guidance {
            glossary: vec![entry("Supplier", "Lieferant"), entry("Buyer", "Käufer")],
            formality: Formality::Formal,
        };
        let part = guidance.for_text("The Supplier delivers.");
        assert_eq!(part.glossary.len(), 1);
        assert!(part.prompt().contains("formally") && part.prompt().contains("\"Supplier\" as \"Lieferant\""));
        assert_eq!(Guidance::default().prompt(), "");
        assert_eq!(Guidance::default().digest(), "");
        assert_ne!(guidance.digest(), part.digest());
        assert_eq!(Formality::parse("informal"), Ok(Formality::Informal));
        assert!(Formality::parse("rude").is_err());
    }

    proptest! {
        #[test]
        fn any_text_is_read_or_refused_in_words(text in "[a-z,\"\t\n ]{0,200}") {
            match parse(&text) {
                Ok(entries) => prop_assert!(entries.iter().all(|e| !e.source.is_empty() && !e.target.is_empty())),
                Err(why) => prop_assert!(why.starts_with("glossary") || why.contains("the glossary")),
            }
        }
    }
}
