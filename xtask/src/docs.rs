//! `cargo xtask docs`: the book in `docs/` built with mdBook, warnings refused; and the tests
//! that keep the README and the book true (every relative link and anchor resolves, every
//! chapter is in the summary, every `cargo xtask` verb the README names exists).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, output_of, Result};

const MDBOOK_VERSION: &str = "0.5.4";

/// Where mdBook writes the book (`build-dir` in `docs/book.toml`).
pub const BOOK_OUT: &str = "target/book";

pub fn build_book() -> Result {
    let have = output_of(Command::new("mdbook").arg("--version")).unwrap_or_default();
    if !have.split_whitespace().any(|w| w.trim_start_matches('v') == MDBOOK_VERSION) {
        eprintln!("xtask: installing mdBook {MDBOOK_VERSION} (about two minutes, once)");
        crate::status(
            cargo().args([
                "install",
                "mdbook",
                "--version",
                MDBOOK_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "search",
            ]),
            "cargo install mdbook",
        )?;
    }
    let out =
        Command::new("mdbook").args(["build", "docs"]).output().map_err(|e| format!("mdbook: cannot start: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    eprint!("{log}");
    // mdBook goes on past a broken link or a missing file with a warning; the book does not.
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    if !out.status.success() || !warnings.is_empty() {
        return Err(format!("the book has {} warning(s) or errors: {warnings:?}", warnings.len()));
    }
    eprintln!("xtask: the book is at {BOOK_OUT}/index.html");
    Ok(())
}

/// The Markdown the links are checked in: the README and every chapter.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root.join("docs/src"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    pages.extend(chapters);
    pages
}

/// The text outside fenced code blocks and inline code, where Markdown links live.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code: every other backtick-delimited piece is code.
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(piece);
            }
        }
        out.push('\n');
    }
    out
}

/// Link targets written `[text](target)`.
fn links(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            found.push(rest[..end].trim().to_string());
        }
    }
    found
}

/// The anchors of a page's headings, as GitHub and mdBook make them: lower case, letters,
/// digits, `-` and `_` kept, spaces to `-`, the rest dropped; a repeated one gets `-1`, `-2`.
fn anchors(markdown: &str) -> Vec<String> {
    let mut made = Vec::new();
    let mut times: std::collections::HashMap<String, usize> = Default::default();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let title = line.trim_start_matches('#');
        if fenced || !line.starts_with('#') || !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let seen = times.entry(slug.clone()).or_default();
        made.push(if *seen == 0 { slug } else { format!("{slug}-{seen}") });
        *seen += 1;
    }
    made
}

/// Every relative link that does not resolve: a missing file, or an anchor no heading makes.
pub fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        let shown = page.strip_prefix(root).unwrap_or(&page).display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            if !target.exists() {
                broken.push(format!("{shown}: {link} (no such file)"));
                continue;
            }
            if !anchor.is_empty() {
                let known = std::fs::read_to_string(&target).map(|t| anchors(&t)).unwrap_or_default();
                if !known.iter().any(|a| a == anchor) {
                    broken.push(format!("{shown}: {link} (no such heading)"));
                }
            }
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        crate::workspace_root()
    }

    #[test]
    fn every_relative_link_and_anchor_in_the_readme_and_the_book_resolves() {
        let broken = broken_links(&root());
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }

    #[test]
    fn the_link_check_finds_a_missing_file_and_a_missing_heading() {
        let dir = std::env::temp_dir().join(format!("sluice-links-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("docs/src")).unwrap();
        std::fs::write(
            dir.join("README.md"),
            "# Top\n## Two words\n## Two words\n[a](#two-words-1) [b](#nowhere) [c](docs/src/x.md#fine) \
             [d](docs/src/gone.md) `[e](#in-code)`\n```\n[f](#in-a-block)\n```\n[g](https://example.com)\n",
        )
        .unwrap();
        std::fs::write(dir.join("docs/src/x.md"), "# Fine\n").unwrap();
        let broken = broken_links(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            broken,
            ["README.md: #nowhere (no such heading)", "README.md: docs/src/gone.md (no such file)"],
            "{broken:?}"
        );
    }

    #[test]
    fn anchors_follow_github_and_mdbook() {
        let page = "# Security: what strangers' input is bounded by\n## `--bind` and Ünïcode\n## A\n## A\n```\n# not a heading\n```\n";
        assert_eq!(anchors(page), ["security-what-strangers-input-is-bounded-by", "--bind-and-ünïcode", "a", "a-1"]);
    }

    #[test]
    fn every_chapter_is_in_the_summary() {
        let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
        let listed = links(&summary);
        for page in pages(&root()).into_iter().skip(1) {
            let name = page.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name == "SUMMARY.md" || listed.contains(&name), "{name} is not in docs/src/SUMMARY.md");
        }
    }

    #[test]
    fn every_cargo_xtask_verb_the_readme_names_exists() {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let mut named = 0;
        for (at, _) in readme.match_indices("cargo xtask ") {
            let verb: String =
                readme[at + "cargo xtask ".len()..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            if verb.is_empty() {
                continue;
            }
            named += 1;
            assert!(
                crate::VERBS.contains(&verb.as_str()),
                "the README names `cargo xtask {verb}`, which does not exist"
            );
        }
        assert!(named >= 5, "the README names {named} verbs");
    }

    #[test]
    fn every_benchmark_the_readme_names_exists() {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let line = readme.lines().find(|l| l.contains("**Benchmarks**")).expect("the README's benchmarks line");
        let block = readme.split(line).nth(1).unwrap().split("\n- ").next().unwrap();
        let names: Vec<&str> = format!("{line}{block}")
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| !w.contains(' '))
            .map(|w| crate::BENCHMARKS.iter().find(|b| **b == w).copied().ok_or(w))
            .collect::<std::result::Result<_, _>>()
            .unwrap_or_else(|unknown| panic!("the README names a benchmark `{unknown}` that does not exist"));
        assert!(names.len() >= crate::BENCHMARKS.len(), "{names:?}");
    }
}
