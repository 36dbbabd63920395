//! Rendering a job's Markdown result as HTML that is safe to put in a page.
//!
//! The Markdown comes from an AI provider, so it is treated as hostile: raw HTML in it is shown
//! as text, the HTML that pulldown-cmark produces is then sanitised by ammonia, and the input
//! size and nesting depth are bounded so that a crafted result cannot make rendering slow.
//!
//! Choices: links keep only `http`, `https` and `mailto` URLs (relative URLs and every other
//! scheme, `javascript:` included, lose their `href`) and get `rel="noopener noreferrer"`.
//! Images are never embedded (a remote image would tell its host who reads the result and when):
//! a Markdown image becomes a link to the image, its alt text being the link text, and `img`
//! tags are removed by the sanitiser as well.

use std::collections::HashSet;

use pulldown_cmark::{html, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Longest Markdown input that is rendered; the rest is cut off (at a char boundary).
pub const MAX_MARKDOWN_BYTES: usize = 2 * 1024 * 1024;

/// Deepest nesting of Markdown elements (block quotes, lists, emphasis, links, ...) that is
/// rendered as elements; deeper elements are flattened into their text. This keeps the HTML
/// that the sanitiser parses (and the tree it builds) shallow whatever the input.
const MAX_DEPTH: usize = 32;

/// Appended when the input was longer than [`MAX_MARKDOWN_BYTES`].
const TRUNCATED_NOTE: &str = "\n\n---\n\n*The result is too long to show in full; only its beginning is shown.*\n";

/// Render Markdown (from an untrusted source) as sanitised HTML.
pub fn markdown_to_safe_html(markdown: &str) -> String {
    let (markdown, truncated) = bounded(markdown);
    let mut options = Options::empty();
    options.insert(Options::ENABLE_TABLES);
    options.insert(Options::ENABLE_STRIKETHROUGH);

    let mut depth = 0usize;
    let events = Parser::new_ext(markdown, options).filter_map(move |event| match event {
        // Raw HTML is shown as text (push_html escapes text), never passed through.
        Event::Html(raw) | Event::InlineHtml(raw) => Some(Event::Text(raw)),
        Event::Start(tag) => {
            depth += 1;
            (depth <= MAX_DEPTH).then(|| Event::Start(without_images(tag)))
        }
        Event::End(end) => {
            // Start and End events are balanced, so the End of a dropped Start is dropped too.
            let keep = depth <= MAX_DEPTH;
            depth = depth.saturating_sub(1);
            keep.then_some(Event::End(if end == TagEnd::Image { TagEnd::Link } else { end }))
        }
        other => Some(other),
    });
    let mut unsafe_html = String::with_capacity(markdown.len() + markdown.len() / 2);
    html::push_html(&mut unsafe_html, events);
    if truncated {
        html::push_html(&mut unsafe_html, Parser::new_ext(TRUNCATED_NOTE, options));
    }
    sanitizer().clean(&unsafe_html).to_string()
}

/// The input cut to at most [`MAX_MARKDOWN_BYTES`] at a char boundary, and whether it was cut.
fn bounded(markdown: &str) -> (&str, bool) {
    if markdown.len() <= MAX_MARKDOWN_BYTES {
        return (markdown, false);
    }
    let mut end = MAX_MARKDOWN_BYTES;
    while !markdown.is_char_boundary(end) {
        end -= 1;
    }
    (&markdown[..end], true)
}

/// An image becomes a link to the image, so that nothing is fetched from a remote host.
fn without_images(tag: Tag<'_>) -> Tag<'_> {
    match tag {
        Tag::Image { dest_url, title, id, .. } => Tag::Link { link_type: LinkType::Inline, dest_url, title, id },
        other => other,
    }
}

fn sanitizer() -> ammonia::Builder<'static> {
    let mut builder = ammonia::Builder::default();
    builder
        .url_schemes(HashSet::from(["http", "https", "mailto"]))
        .url_relative(ammonia::UrlRelative::Deny)
        .link_rel(Some("noopener noreferrer"))
        .rm_tags(["img"]);
    builder
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Generous for a debug build on a busy 2-core machine; the point is "not quadratic".
    const QUICK: Duration = Duration::from_secs(5);

    #[test]
    fn render_headings_lists_emphasis_and_tables() {
        let md = "# Title\n\n## Sub\n\n- one\n- **two**\n\n1. first\n\n*em* and ~~gone~~\n\n\
                  | a | b |\n|---|---|\n| 1 | 2 |\n";
        let html = markdown_to_safe_html(md);
        for part in [
            "<h1>Title</h1>",
            "<h2>Sub</h2>",
            "<ul>",
            "<li>one</li>",
            "<strong>two</strong>",
            "<ol>",
            "<em>em</em>",
            "<del>gone</del>",
            "<table>",
            "<th>a</th>",
            "<td>2</td>",
        ] {
            assert!(html.contains(part), "{part} missing in {html}");
        }
    }

    #[test]
    fn render_escapes_script_tags() {
        for md in ["<script>alert(1)</script>", "text <script>alert(1)</script> more", "<SCRIPT>alert(1)</SCRIPT>"] {
            let html = markdown_to_safe_html(md);
            assert!(!html.to_lowercase().contains("<script"), "{html}");
            assert!(html.to_lowercase().contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
        }
    }

    #[test]
    fn render_drops_javascript_links() {
        for md in [
            "[x](javascript:alert(1))",
            "[x](JaVaScRiPt:alert(1))",
            "[x](java\tscript:alert(1))",
            "<javascript:alert(1)>",
            "[x][r]\n\n[r]: javascript:alert(1)",
            "![x](javascript:alert(1))",
            "[x](data:text/html,<script>alert(1)</script>)",
        ] {
            let html = markdown_to_safe_html(md);
            let lower = html.to_lowercase();
            // The URL may remain as visible text, never as an href.
            assert!(hrefs(&lower).is_empty(), "{md}: {html}");
            assert!(!lower.contains("href=\"javascript"), "{md}: {html}");
            assert!(!lower.contains("<script"), "{md}: {html}");
        }
    }

    fn hrefs(html: &str) -> Vec<&str> {
        html.split("href=\"").skip(1).map(|rest| rest.split('"').next().unwrap_or_default()).collect()
    }

    #[test]
    fn render_keeps_safe_links_with_rel() {
        let html = markdown_to_safe_html("[site](https://example.com/a?b=1) and <mailto:x@example.com>");
        assert!(html.contains("href=\"https://example.com/a?b=1\""), "{html}");
        assert!(html.contains("href=\"mailto:x@example.com\""), "{html}");
        assert!(html.contains("rel=\"noopener noreferrer\""), "{html}");
        assert_eq!(hrefs(&html), ["https://example.com/a?b=1", "mailto:x@example.com"]);
        // Relative links lose their href.
        let html = markdown_to_safe_html("[out](/logout)");
        assert!(!html.contains("href"), "{html}");
    }

    #[test]
    fn render_strips_event_handlers_and_images() {
        let html = markdown_to_safe_html("<img src=x onerror=alert(1)>\n\ninline <img src=x onerror=alert(1)> too");
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains("onerror=\""), "{html}");
        assert!(html.contains("&lt;img"), "{html}");

        let html = markdown_to_safe_html("![a chart](https://tracker.example/pixel.png)");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("<a href=\"https://tracker.example/pixel.png\""), "{html}");
        assert!(html.contains("a chart"), "{html}");
    }

    #[test]
    fn render_deeply_nested_input_finishes_quickly() {
        let n = 100_000;
        let inputs = [
            ">".repeat(n) + " deep",
            "- ".repeat(n) + "deep",
            "[".repeat(n) + "x",
            "[x](".repeat(n),
            "*".repeat(n) + "x" + &"*".repeat(n),
            "_a ".repeat(n),
            "`".repeat(n),
            // Escaped raw HTML is entity-heavy, which html5ever tokenises slowly in debug builds
            // (linearly, though), so this one is smaller.
            "<a>".repeat(n / 5),
            (0..2_000).map(|i| ">".repeat(i) + " x\n").collect(),
        ];
        for md in inputs {
            let started = Instant::now();
            let html = markdown_to_safe_html(&md);
            assert!(started.elapsed() < QUICK, "{:?} for {:?}", started.elapsed(), &md[..20]);
            assert!(html.matches("<blockquote>").count() <= MAX_DEPTH);
            assert!(html.matches("<ul>").count() <= MAX_DEPTH);
        }
    }

    #[test]
    fn render_truncates_oversized_input() {
        // Multi-byte chars so that the cut has to find a char boundary.
        let md = "é".repeat(MAX_MARKDOWN_BYTES); // 2 bytes each: twice the limit
        let started = Instant::now();
        let html = markdown_to_safe_html(&md);
        assert!(started.elapsed() < QUICK, "{:?}", started.elapsed());
        assert!(html.contains("too long to show in full"));
        assert!(html.len() < MAX_MARKDOWN_BYTES + 1_000, "{}", html.len());
        assert_eq!(html.matches('é').count(), MAX_MARKDOWN_BYTES / 2);

        let (short, cut) = bounded("short");
        assert_eq!((short, cut), ("short", false));
        assert!(!markdown_to_safe_html("short").contains("too long"));
    }
}
