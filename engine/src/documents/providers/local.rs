//! The built-in `local` processor: no network, deterministic, and useful. An extractive
//! summary (the sentences that carry the document's most frequent content words), a title
//! guess, statistics, top terms, and key facts (dates, amounts, e-mail addresses).

use std::collections::{HashMap, HashSet};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{Preset, Provider, ProviderOutput, Task};
use crate::queue::policy::retry::ErrorClass;
use crate::queue::JobError;

/// The built-in provider: deterministic, no network, no language model.
pub struct LocalProvider;

impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn supports(&self, preset: Preset) -> bool {
        !preset.needs_language_model()
    }

    fn run<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<ProviderOutput, JobError>> {
        Box::pin(async move {
            // CPU work on user text stays off the async runtime's threads.
            let (text, pages) = (task.text.clone(), task.pages);
            let analysis = tokio::task::spawn_blocking(move || analyse(&text, pages))
                .await
                .map_err(|_| JobError::new(ErrorClass::InvalidInput, "the document's text could not be analysed"))?;
            let text = match task.preset {
                Preset::KeyFacts => facts_markdown(&analysis),
                _ => summary_markdown(&analysis),
            };
            Ok(ProviderOutput {
                text,
                data: serde_json::to_value(&analysis).unwrap_or_default(),
                input_tokens: Some(task.estimated_tokens()),
                output_tokens: Some(0),
            })
        })
    }
}

/// What the local provider finds in a text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub title: String,
    pub summary: Vec<String>,
    pub words: usize,
    pub sentences: usize,
    pub pages: Option<u32>,
    pub reading_minutes: u32,
    pub top_terms: Vec<(String, usize)>,
    pub dates: Vec<String>,
    pub amounts: Vec<String>,
    pub emails: Vec<String>,
}

const STOPWORDS: &[&str] = &[
    "the", "and", "for", "that", "with", "this", "are", "was", "were", "from", "have", "has", "had", "not", "but",
    "you", "your", "our", "their", "its", "his", "her", "they", "them", "she", "him", "will", "would", "can", "could",
    "should", "which", "what", "when", "where", "who", "how", "all", "any", "each", "more", "most", "other", "some",
    "such", "than", "then", "there", "these", "those", "into", "out", "about", "over", "under", "also", "only", "been",
    "being", "may", "must", "shall", "one", "two", "per", "via", "a", "an", "of", "to", "in", "on", "at", "by", "or",
    "as", "is", "it", "be", "we", "i", "if", "so", "no", "do", "up", "us", "our", "my", "me",
];

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '-')
        .map(|w| w.trim_matches(|c: char| c == '\'' || c == '-').to_lowercase())
        .filter(|w| !w.is_empty())
}

/// Split text into sentences at ". ", "? " and "! " and at blank lines, in one pass: each byte
/// is looked at once, so a hostile single-line text costs linear time.
fn sentences(text: &str) -> Vec<String> {
    fn flush(current: &mut String, out: &mut Vec<String>) {
        let sentence = current.trim();
        if !sentence.is_empty() {
            out.push(sentence.to_string());
        }
        current.clear();
    }
    let ends_sentence = |b: u8| matches!(b, b'.' | b'?' | b'!');
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim().trim_start_matches('#').trim();
        if line.is_empty() {
            flush(&mut current, &mut out);
            continue;
        }
        if current.as_bytes().last().copied().is_some_and(ends_sentence) {
            flush(&mut current, &mut out);
        }
        if !current.is_empty() {
            current.push(' ');
        }
        let bytes = line.as_bytes();
        let mut start = 0;
        for i in 0..bytes.len().saturating_sub(1) {
            if ends_sentence(bytes[i]) && bytes[i + 1] == b' ' {
                current.push_str(&line[start..=i]);
                flush(&mut current, &mut out);
                start = i + 2;
            }
        }
        current.push_str(&line[start..]);
    }
    flush(&mut current, &mut out);
    out.into_iter().filter(|s| s.chars().any(char::is_alphabetic)).collect()
}

/// Pure analysis of a document's text.
pub fn analyse(text: &str, pages: Option<u32>) -> Analysis {
    let stop: HashSet<&str> = STOPWORDS.iter().copied().collect();
    let all_words: Vec<String> = words(text).collect();
    let mut freq: HashMap<&str, usize> = HashMap::new();
    for w in &all_words {
        if w.len() > 2 && !stop.contains(w.as_str()) && !w.chars().all(|c| c.is_ascii_digit()) {
            *freq.entry(w.as_str()).or_default() += 1;
        }
    }
    let mut top_terms: Vec<(String, usize)> = freq.iter().map(|(w, n)| (w.to_string(), *n)).collect();
    top_terms.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top_terms.truncate(8);

    let sents = sentences(text);
    // Score each sentence by its content words' frequencies, normalised by length; keep the
    // best three in document order.
    let mut scored: Vec<(usize, f64)> = sents
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ws: Vec<String> = words(s).collect();
            let score: usize = ws.iter().map(|w| freq.get(w.as_str()).copied().unwrap_or(0)).sum();
            (i, score as f64 / (ws.len() as f64).sqrt().max(1.0))
        })
        .collect();
    scored.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<usize> = scored.iter().take(3).map(|(i, _)| *i).collect();
    chosen.sort_unstable();

    let title = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .find(|l| l.chars().any(char::is_alphabetic))
        .map(|l| l.chars().take(120).collect::<String>())
        .unwrap_or_else(|| "Untitled document".into());

    Analysis {
        title,
        summary: chosen.into_iter().map(|i| sents[i].chars().take(400).collect()).collect(),
        words: all_words.len(),
        sentences: sents.len(),
        pages,
        reading_minutes: ((all_words.len() as f64 / 230.0).ceil() as u32).max(1),
        top_terms,
        dates: unique(find_dates(text)),
        amounts: unique(find_amounts(text)),
        emails: unique(find_emails(text)),
    }
}

fn unique(items: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    items.into_iter().filter(|i| seen.insert(i.clone())).take(20).collect()
}

fn tokens(text: &str) -> Vec<&str> {
    text.split_whitespace().map(|t| t.trim_matches(|c: char| matches!(c, ',' | ';' | '(' | ')' | '"' | '\''))).collect()
}

const MONTHS: &[&str] = &[
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn find_dates(text: &str) -> Vec<String> {
    let toks = tokens(text);
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        let t = t.trim_end_matches('.');
        let parts: Vec<&str> = t.split(['-', '/', '.']).collect();
        let numeric = parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        if numeric && (parts[0].len() == 4 || parts[2].len() == 4) {
            out.push(t.to_string());
            continue;
        }
        // "12 March 2024" and "March 12, 2024"
        if MONTHS.contains(&t.to_lowercase().as_str()) {
            let before = i
                .checked_sub(1)
                .and_then(|j| toks.get(j))
                .filter(|d| d.len() <= 2 && d.chars().all(|c| c.is_ascii_digit()));
            let after: Vec<&str> = toks.iter().skip(i + 1).take(2).copied().collect();
            let year = |s: &str| s.len() == 4 && s.chars().all(|c| c.is_ascii_digit());
            if let (Some(day), Some(y)) = (before, after.first()) {
                if year(y.trim_end_matches('.')) {
                    out.push(format!("{day} {t} {}", y.trim_end_matches('.')));
                }
            } else if after.len() == 2
                && after[0].len() <= 2
                && after[0].chars().all(|c| c.is_ascii_digit())
                && year(after[1].trim_end_matches('.'))
            {
                out.push(format!("{t} {} {}", after[0], after[1].trim_end_matches('.')));
            }
        }
    }
    out
}

fn find_amounts(text: &str) -> Vec<String> {
    let toks = tokens(text);
    let is_number = |s: &str| {
        let s = s.trim_end_matches('.');
        !s.is_empty()
            && s.chars().next().is_some_and(|c| c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '.')
    };
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if let Some(rest) = t.strip_prefix(['$', '€', '£']) {
            if is_number(rest) {
                out.push(t.trim_end_matches('.').to_string());
            }
        } else if ["usd", "eur", "gbp", "chf"].contains(&t.to_lowercase().trim_end_matches('.')) {
            if let Some(n) = i.checked_sub(1).and_then(|j| toks.get(j)).filter(|n| is_number(n)) {
                out.push(format!("{n} {}", t.trim_end_matches('.').to_uppercase()));
            } else if let Some(n) = toks.get(i + 1).filter(|n| is_number(n)) {
                out.push(format!("{} {}", t.to_uppercase(), n.trim_end_matches('.')));
            }
        }
    }
    out
}

fn find_emails(text: &str) -> Vec<String> {
    tokens(text)
        .into_iter()
        .map(|t| t.trim_matches(|c: char| matches!(c, '<' | '>' | '.' | ':')))
        .filter(|t| {
            t.split_once('@').is_some_and(|(local, domain)| {
                !local.is_empty() && domain.contains('.') && !domain.ends_with('.') && !domain.contains('@')
            })
        })
        .map(str::to_string)
        .collect()
}

fn summary_markdown(a: &Analysis) -> String {
    let mut out = format!("# {}\n\n", a.title);
    for s in &a.summary {
        out.push_str(&format!("- {s}\n"));
    }
    out.push_str(&format!(
        "\n**{} words**, {} sentences{}, about {} min to read.\n",
        a.words,
        a.sentences,
        a.pages.map(|p| format!(", {p} pages")).unwrap_or_default(),
        a.reading_minutes
    ));
    if !a.top_terms.is_empty() {
        let terms: Vec<String> = a.top_terms.iter().map(|(t, n)| format!("{t} ({n})")).collect();
        out.push_str(&format!("\nTop terms: {}\n", terms.join(", ")));
    }
    out
}

fn facts_markdown(a: &Analysis) -> String {
    let mut out = format!("# Key facts: {}\n", a.title);
    let mut section = |name: &str, items: &[String]| {
        out.push_str(&format!("\n## {name}\n"));
        if items.is_empty() {
            out.push_str("- none found\n");
        }
        for i in items {
            out.push_str(&format!("- {i}\n"));
        }
    };
    section("Dates", &a.dates);
    section("Amounts", &a.amounts);
    section("E-mail addresses", &a.emails);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# Supply agreement\n\nThis agreement between Acme and Globex covers the supply of widgets. \
        Acme delivers widgets every month. Globex pays $12,500.00 per delivery of widgets. \
        The weather was nice. Payment is due on 2024-03-31 and the contract ends 12 March 2026. \
        Questions go to billing@globex.example or 4,000 EUR in penalties apply.";

    #[test]
    fn analysis_finds_title_summary_and_facts() {
        let a = analyse(TEXT, Some(2));
        assert_eq!(a.title, "Supply agreement");
        assert_eq!(a.summary.len(), 3);
        assert!(a.summary.iter().any(|s| s.contains("widgets")));
        assert!(!a.summary.iter().any(|s| s.contains("weather")), "{:?}", a.summary);
        assert!(a.top_terms.iter().take(2).any(|(t, n)| t == "widgets" && *n == 3), "{:?}", a.top_terms);
        assert_eq!(a.dates, vec!["2024-03-31", "12 March 2026"]);
        assert_eq!(a.amounts, vec!["$12,500.00", "4,000 EUR"]);
        assert_eq!(a.emails, vec!["billing@globex.example"]);
        assert_eq!(a.pages, Some(2));
        assert!(a.words > 40);
    }

    #[test]
    fn sentences_split_at_ends_and_blank_lines() {
        let text = "# Title\nWhy? Because it works. Yes\nand more.\nNext line.\n\nNew paragraph";
        assert_eq!(
            sentences(text),
            ["Title Why?", "Because it works.", "Yes and more.", "Next line.", "New paragraph"]
        );
    }

    #[test]
    fn a_long_single_line_is_split_in_linear_time() {
        // 6 MB of "a. a. ..." on one line: quadratic splitting took hours; this is milliseconds.
        let text = "a. ".repeat(2_000_000);
        let started = std::time::Instant::now();
        let n = sentences(&text).len();
        assert_eq!(n, 2_000_000);
        // Generous for a debug build on a busy 2-core machine; quadratic would be hours.
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
    }

    #[test]
    fn analysis_is_deterministic() {
        assert_eq!(analyse(TEXT, None), analyse(TEXT, None));
    }

    #[test]
    fn local_provider_does_not_offer_language_model_presets() {
        assert!(LocalProvider.supports(Preset::Summarize));
        assert!(LocalProvider.supports(Preset::KeyFacts));
        assert!(!LocalProvider.supports(Preset::Translate));
        assert!(!LocalProvider.supports(Preset::Explain));
    }
}
