//! The built-in `local` processor: no network, deterministic, and useful. A title guess, an
//! extractive summary (the most central sentences by TextRank, in document order),
//! statistics, top terms, and key facts (dates, amounts, e-mail addresses).

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
            // CPU work on user text stays off the async runtime's threads, and at most cores − 1
            // analyses run at once, so the web always has a core ([`crate::documents::cpu`]).
            let (text, pages) = (task.text.clone(), task.pages);
            let (analysis, tokens) =
                crate::documents::cpu::run(move || (analyse(&text, pages), crate::documents::tokens::count(&text)))
                    .await
                    .map_err(|_| {
                        JobError::new(ErrorClass::InvalidInput, "the document's text could not be analysed")
                    })?;
            let text = match task.preset {
                Preset::KeyFacts => facts_markdown(&analysis),
                _ => summary_markdown(&analysis),
            };
            Ok(ProviderOutput {
                text,
                data: serde_json::to_value(&analysis).unwrap_or_default(),
                // No prompt goes anywhere: only the text counts.
                input_tokens: Some(tokens.min(i64::MAX as u64) as i64),
                output_tokens: Some(0),
                remaining: Default::default(),
                // An extract of a few sentences: never longer than an answer may be.
                cut: false,
                cached_input_tokens: None,
                reasoning_tokens: None,
                asked_tokens: None,
                ..Default::default()
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

/// A Markdown ATX heading ("# Title", "## Section"): its text, without the hashes.
fn heading(line: &str) -> Option<&str> {
    let line = line.trim();
    let level = line.bytes().take_while(|&b| b == b'#').count();
    let rest = &line[level..];
    ((1..=6).contains(&level) && (rest.is_empty() || rest.starts_with([' ', '\t']))).then(|| rest.trim())
}

/// Split text into sentences at ". ", "? " and "! " and at blank lines, in one pass: each byte
/// is looked at once, so a hostile single-line text costs linear time. Markdown headings end
/// the sentence before them and are not sentences themselves (they would otherwise be glued
/// to the sentence that follows them).
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
        let line = line.trim();
        if line.is_empty() || heading(line).is_some() {
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
        if is_content_word(w, &stop) {
            *freq.entry(w.as_str()).or_default() += 1;
        }
    }
    let mut top_terms: Vec<(String, usize)> = freq.iter().map(|(w, n)| (w.to_string(), *n)).collect();
    top_terms.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top_terms.truncate(8);

    let (title, body) = split_title(text);
    let sents = sentences(body);
    let summary = textrank_summary(&sents, summary_length(sents.len()), &stop)
        .into_iter()
        .map(|i| shorten(&sents[i], 400))
        .collect();

    Analysis {
        title,
        summary,
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

fn is_content_word(w: &str, stop: &HashSet<&str>) -> bool {
    w.len() > 2 && !stop.contains(w) && w.chars().any(char::is_alphabetic)
}

/// At most `max_chars` characters of `s`, cut at a word boundary when possible, with "…" when cut.
fn shorten(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_string(),
        Some((cut, _)) => {
            let head = &s[..cut];
            let head = match head.rfind(' ') {
                Some(space) if space > cut / 2 => &head[..space],
                _ => head,
            };
            format!("{}…", head.trim_end())
        }
    }
}

/// The title and the text after it. The title is the first line with letters in it when that
/// line looks like one: a Markdown heading, or a short line (at most 12 words and 120
/// characters) without closing punctuation that is not continued on the next line (the next
/// line is blank or does not start in lower case). That line is then left out of the body, so
/// it never ends up glued to the first sentence of the summary. Otherwise the title is a guess
/// from the first line and the body is the whole text.
fn split_title(text: &str) -> (String, &str) {
    // Each line with the byte offset just past it.
    let mut lines = text.split_inclusive('\n').scan(0usize, |end, line| {
        *end += line.len();
        Some((*end, line.trim()))
    });
    let Some((end, first)) = lines.by_ref().find(|(_, l)| l.chars().any(char::is_alphabetic)) else {
        return ("Untitled document".into(), text);
    };
    let next = lines.next().map(|(_, l)| l).unwrap_or_default();
    if let Some(h) = heading(first) {
        return (shorten(h, 120), &text[end..]);
    }
    let short = first.split_whitespace().count() <= 12 && first.chars().count() <= 120;
    let unpunctuated = !first.ends_with(['.', '!', '?', ',', ';', ':', '…']);
    let not_continued = !next.starts_with(char::is_lowercase);
    if short && unpunctuated && not_continued {
        (first.to_string(), &text[end..])
    } else {
        (shorten(first, 80), text)
    }
}

/// How many sentences a summary of `n` sentences has: three, or about half of a short text.
fn summary_length(n: usize) -> usize {
    n.div_ceil(2).min(3)
}

/// At most this many sentences enter the TextRank graph, sampled evenly over the document when
/// it has more, so the O(n²) similarity pass stays bounded (400² / 2 = 80,000 pairs) however
/// large the text is.
const MAX_GRAPH_SENTENCES: usize = 400;
/// Only a sentence's first this many bytes, and at most this many distinct content words of
/// them, take part in the similarity: a hostile multi-megabyte "sentence" costs no more than
/// a normal one.
const MAX_SENTENCE_BYTES: usize = 2_000;
const MAX_SENTENCE_TERMS: usize = 64;
const DAMPING: f64 = 0.85;
const MAX_ITERATIONS: usize = 100;
const EPSILON: f64 = 1e-6;

/// The indexes (into `sents`, in document order) of the `n` most central sentences by
/// TextRank: sentences are nodes, edges are weighted by the classic TextRank overlap
/// (shared content words / (ln(1 + |s1|) + ln(1 + |s2|)); the "1 +" keeps one-word sentences
/// from dividing by zero), and scores are computed by weighted PageRank with damping 0.85.
/// Deterministic: equal scores are ordered by position.
fn textrank_summary(sents: &[String], n: usize, stop: &HashSet<&str>) -> Vec<usize> {
    let candidates: Vec<usize> = if sents.len() <= MAX_GRAPH_SENTENCES {
        (0..sents.len()).collect()
    } else {
        (0..MAX_GRAPH_SENTENCES).map(|i| i * sents.len() / MAX_GRAPH_SENTENCES).collect()
    };

    // Each candidate as a sorted set of term ids.
    let mut ids: HashMap<String, u32> = HashMap::new();
    let terms: Vec<Vec<u32>> = candidates
        .iter()
        .map(|&i| {
            let s = &sents[i];
            let mut cut = s.len().min(MAX_SENTENCE_BYTES);
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut set: Vec<u32> = words(&s[..cut])
                .filter(|w| is_content_word(w, stop))
                .map(|w| {
                    let next = ids.len() as u32;
                    *ids.entry(stem(w)).or_insert(next)
                })
                .collect();
            set.sort_unstable();
            set.dedup();
            set.truncate(MAX_SENTENCE_TERMS);
            set
        })
        .collect();

    // Weighted, undirected graph as adjacency lists.
    let k = candidates.len();
    let mut edges: Vec<Vec<(usize, f64)>> = vec![Vec::new(); k];
    for a in 0..k {
        for b in a + 1..k {
            let shared = shared_count(&terms[a], &terms[b]);
            if shared > 0 {
                let norm = (1.0 + terms[a].len() as f64).ln() + (1.0 + terms[b].len() as f64).ln();
                let w = shared as f64 / norm;
                edges[a].push((b, w));
                edges[b].push((a, w));
            }
        }
    }
    let out_weight: Vec<f64> = edges.iter().map(|e| e.iter().map(|(_, w)| w).sum()).collect();

    let mut score = vec![1.0; k];
    for _ in 0..MAX_ITERATIONS {
        let next: Vec<f64> = (0..k)
            .map(|i| {
                let inflow: f64 = edges[i].iter().map(|&(j, w)| w / out_weight[j] * score[j]).sum();
                (1.0 - DAMPING) + DAMPING * inflow
            })
            .collect();
        let delta = next.iter().zip(&score).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        score = next;
        if delta < EPSILON {
            break;
        }
    }

    // Quantised scores give a total order in which near-equal scores tie and position decides.
    let mut ranked: Vec<(i64, usize)> = (0..k).map(|c| ((score[c] * 1e9).round() as i64, candidates[c])).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = ranked.into_iter().take(n).map(|(_, i)| i).collect();
    chosen.sort_unstable();
    chosen
}

/// A crude English stem for similarity only: "widgets" and "widget" are the same term.
fn stem(w: String) -> String {
    if w.len() > 4 && w.ends_with('s') && !w.ends_with("ss") {
        w[..w.len() - 1].to_string()
    } else {
        w
    }
}

/// How many elements two sorted, deduplicated slices share.
fn shared_count(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
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
        if t.starts_with(|c: char| c.is_ascii_digit()) {
            let parts: Vec<&str> = t.split(['-', '/', '.']).collect();
            let numeric =
                parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
            if numeric && (parts[0].len() == 4 || parts[2].len() == 4) {
                out.push(t.to_string());
            }
            continue;
        }
        // "12 March 2024" and "March 12, 2024"
        if MONTHS.iter().any(|m| m.eq_ignore_ascii_case(t)) {
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
        } else if ["usd", "eur", "gbp", "chf"].iter().any(|c| c.eq_ignore_ascii_case(t.trim_end_matches('.'))) {
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

/// "1 page", "2 pages", "0 pages".
fn counted(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

fn summary_markdown(a: &Analysis) -> String {
    let mut out = format!("# {}\n\n", a.title);
    for s in &a.summary {
        out.push_str(&format!("- {s}\n"));
    }
    out.push_str(&format!(
        "\n**{}**, {}{}, about {} to read.\n",
        counted(a.words, "word", "words"),
        counted(a.sentences, "sentence", "sentences"),
        a.pages.map(|p| format!(", {}", counted(p as usize, "page", "pages"))).unwrap_or_default(),
        counted(a.reading_minutes as usize, "minute", "minutes"),
    ));
    if !a.top_terms.is_empty() {
        let terms: Vec<String> = a.top_terms.iter().map(|(t, n)| format!("{t} ({n})")).collect();
        out.push_str(&format!("\nTop terms: {}\n", terms.join(", ")));
    }
    out
}

fn facts_markdown(a: &Analysis) -> String {
    let mut out = format!("# Key facts: {}\n", a.title);
    out.push_str(&format!(
        "\nFound {}, {} and {}.\n",
        counted(a.dates.len(), "date", "dates"),
        counted(a.amounts.len(), "amount", "amounts"),
        counted(a.emails.len(), "e-mail address", "e-mail addresses"),
    ));
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
        let text = "# Title\nWhy? Because it works. Yes\nand more.\nNext line.\n\nNew paragraph\n## Section\nLast";
        assert_eq!(
            sentences(text),
            ["Why?", "Because it works.", "Yes and more.", "Next line.", "New paragraph", "Last"]
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

    #[test]
    fn title_is_kept_apart_from_the_summary() {
        // A plain-text title without a full stop used to be glued to the first sentence.
        let text =
            "Quarterly report\nRevenue grew in every region this quarter. Costs of revenue fell in every region. \
                    Revenue per region is in the appendix.";
        let a = analyse(text, None);
        assert_eq!(a.title, "Quarterly report");
        assert_eq!(a.sentences, 3);
        assert!(a.summary.iter().all(|s| !s.contains("Quarterly")), "{:?}", a.summary);
        assert!(a.summary[0].starts_with("Revenue grew"), "{:?}", a.summary);

        // Markdown heading as title, and no full stop after it either.
        let a = analyse("# Supply agreement\nAcme delivers widgets.", None);
        assert_eq!(a.title, "Supply agreement");
        assert_eq!(a.summary, ["Acme delivers widgets."]);

        // A first line that is continued on the next line is not a title.
        let a = analyse("This agreement covers\nthe supply of widgets. Acme delivers them.", None);
        assert_eq!(a.sentences, 2);
        assert!(a.summary.iter().any(|s| s == "This agreement covers the supply of widgets."), "{:?}", a.summary);
        assert_eq!(a.title, "This agreement covers");
        // A long first sentence is a guess, shortened, and stays in the body.
        let long = format!("{} end.", "word ".repeat(40));
        let a = analyse(&long, None);
        assert!(a.title.ends_with('…') && a.title.chars().count() <= 81, "{}", a.title);
        assert_eq!(a.sentences, 1);
        assert_eq!(analyse("", None).title, "Untitled document");
    }

    #[test]
    fn markdown_counts_are_plural_only_when_needed() {
        let one = Analysis {
            title: "T".into(),
            words: 1,
            sentences: 1,
            pages: Some(1),
            reading_minutes: 1,
            dates: vec!["2024-03-31".into()],
            amounts: vec!["$1".into()],
            emails: vec!["a@b.example".into()],
            ..Analysis::default()
        };
        let md = summary_markdown(&one);
        assert!(md.contains("**1 word**, 1 sentence, 1 page, about 1 minute to read."), "{md}");
        let md = facts_markdown(&one);
        assert!(md.contains("Found 1 date, 1 amount and 1 e-mail address."), "{md}");

        let two = Analysis {
            words: 2,
            sentences: 2,
            pages: Some(2),
            reading_minutes: 2,
            dates: vec!["a".into(), "b".into()],
            amounts: vec!["a".into(), "b".into()],
            emails: vec!["a".into(), "b".into()],
            ..one.clone()
        };
        let md = summary_markdown(&two);
        assert!(md.contains("**2 words**, 2 sentences, 2 pages, about 2 minutes to read."), "{md}");
        let md = facts_markdown(&two);
        assert!(md.contains("Found 2 dates, 2 amounts and 2 e-mail addresses."), "{md}");

        let none = Analysis { pages: None, words: 0, sentences: 0, ..Analysis::default() };
        assert!(summary_markdown(&none).contains("**0 words**, 0 sentences, about 0 minutes to read."));
        assert!(facts_markdown(&none).contains("Found 0 dates, 0 amounts and 0 e-mail addresses."));
    }

    #[test]
    fn textrank_prefers_the_central_sentence() {
        let text = "Harbour report\n\
            Storms closed the harbour twice in March. \
            The harbour crane broke during the storms. \
            Bananas are yellow and rich in potassium. \
            Fishing boats stayed in the harbour for a week. \
            The storms, the broken crane and the idle fishing boats cost the harbour dearly.";
        let a = analyse(text, None);
        assert_eq!(a.sentences, 5);
        assert_eq!(a.summary.len(), 3);
        assert!(!a.summary.iter().any(|s| s.contains("Bananas")), "{:?}", a.summary);
        // The sentence that shares words with all the others is chosen.
        assert!(a.summary.iter().any(|s| s.contains("cost the harbour dearly")), "{:?}", a.summary);
        // And the chosen ones are in document order.
        let positions: Vec<usize> = a.summary.iter().map(|s| text.find(s.as_str()).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    }

    #[test]
    fn textrank_graph_is_bounded_and_deterministic() {
        // 200,000 sentences and a 5 MB one: the graph sees a bounded sample of bounded sentences.
        let mut sents: Vec<String> = (0..200_000).map(|i| format!("Item {} ships soon.", i % 97)).collect();
        sents.push("lorem ipsum dolor ".repeat(300_000));
        let stop: HashSet<&str> = STOPWORDS.iter().copied().collect();
        let started = std::time::Instant::now();
        let chosen = textrank_summary(&sents, 3, &stop);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(chosen.len(), 3);
        assert_eq!(chosen, textrank_summary(&sents, 3, &stop));
    }

    #[test]
    fn textrank_breaks_ties_by_position() {
        // No sentence shares a word with another: all scores are equal, so the lead is chosen.
        let sents: Vec<String> =
            ["Alpha beta gamma.", "Delta epsilon zeta.", "Kappa lambda omicron.", "Sigma tau upsilon."]
                .map(String::from)
                .into();
        let stop: HashSet<&str> = STOPWORDS.iter().copied().collect();
        assert_eq!(textrank_summary(&sents, 2, &stop), [0, 1]);
        assert_eq!(summary_length(0), 0);
        assert_eq!(summary_length(1), 1);
        assert_eq!(summary_length(4), 2);
        assert_eq!(summary_length(50), 3);
    }

    #[test]
    fn hostile_texts_are_summarised_quickly() {
        // Sizes keep this test near a second in a debug build, where the linear passes (word
        // counts, facts) dominate; the graph itself is bounded whatever the size.
        // 40,000 short sentences (100 times the graph's cap): only a sample enters the graph.
        let many: String = (0..40_000).map(|i| format!("Item {} ships soon. ", i % 97)).collect();
        // One line of about 1 MB with no sentence end: one huge "sentence".
        let line = "lorem ipsum dolor ".repeat(60_000);
        for text in [many, line] {
            let started = std::time::Instant::now();
            let a = analyse(&text, None);
            let md = summary_markdown(&a);
            // Generous for a debug build on a busy 2-core machine; unbounded would be minutes.
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
            assert!(!a.summary.is_empty() && a.summary.len() <= 3);
            assert!(a.summary.iter().all(|s| s.chars().count() <= 401));
            assert!(md.len() < 4_000, "{}", md.len());
        }
    }
}
