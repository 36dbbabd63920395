//! A saved web page's text: the body's words as Markdown-like paragraphs (headings with `#`,
//! list items with `- `), scripts, styles and everything else that is not text dropped. Read
//! only in the sandboxed reader, by html5ever's tokenizer: a stream of tags and text, no tree,
//! so no nesting depth costs memory or stack.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts};
use html5ever::TokenizerResult;

use super::office::{Block, BlockKind};

/// Elements whose start and end cut a paragraph.
const BLOCKS: [&str; 23] = [
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "main",
    "aside",
    "nav",
    "blockquote",
    "pre",
    "table",
    "tr",
    "td",
    "th",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "hr",
];

/// The page's text, or why it has none.
pub fn extract(html: &str) -> Result<String, String> {
    let sink = Sink::default();
    let tokenizer = Tokenizer::new(sink, TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    while let TokenizerResult::Script(()) = tokenizer.feed(&input) {}
    tokenizer.end();
    let mut walk = tokenizer.sink.walk.into_inner();
    walk.flush(BlockKind::Paragraph);
    let text = walk.done.iter().map(Block::markdown).collect::<Vec<_>>().join("\n\n");
    if text.trim().is_empty() {
        return Err("the page has no text".into());
    }
    Ok(text)
}

#[derive(Default)]
struct Sink {
    walk: RefCell<Walk>,
}

struct Walk {
    done: Vec<Block>,
    current: Block,
    /// The element whose content is not text (a script, a style), until it ends.
    skipping: Option<String>,
}

impl Default for Walk {
    fn default() -> Walk {
        Walk {
            done: Vec::new(),
            current: Block { kind: BlockKind::Paragraph, text: String::new(), looks: None },
            skipping: None,
        }
    }
}

impl Walk {
    /// End the paragraph being read; the next one is of `next` kind.
    fn flush(&mut self, next: BlockKind) {
        let finished = std::mem::replace(&mut self.current, Block { kind: next, text: String::new(), looks: None });
        let text = collapse_spaces(&finished.text);
        if !text.is_empty() {
            self.done.push(Block { text, ..finished });
        }
    }
}

impl TokenSink for Sink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut walk = self.walk.borrow_mut();
        match token {
            Token::TagToken(tag) => {
                let name: &str = &tag.name;
                if let Some(skipped) = &walk.skipping {
                    if tag.kind == TagKind::EndTag && name == skipped {
                        walk.skipping = None;
                    }
                    return TokenSinkResult::Continue;
                }
                let start = tag.kind == TagKind::StartTag && !tag.self_closing;
                let raw = match name {
                    "script" => Some(RawKind::ScriptData),
                    "style" | "xmp" | "iframe" | "noembed" | "noframes" => Some(RawKind::Rawtext),
                    "title" | "textarea" => Some(RawKind::Rcdata),
                    "template" => None,
                    _ => {
                        match name {
                            "br" => walk.current.text.push('\n'),
                            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" if start => {
                                walk.flush(BlockKind::Heading(name[1..].parse().unwrap_or(1)))
                            }
                            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => walk.flush(BlockKind::Paragraph),
                            "li" if start => walk.flush(BlockKind::ListItem),
                            _ if name == "li" || BLOCKS.contains(&name) => walk.flush(BlockKind::Paragraph),
                            _ => {}
                        }
                        return TokenSinkResult::Continue;
                    }
                };
                if start {
                    // Its content is not text: skipped to its end tag (read raw, so no markup in
                    // it can end it early).
                    walk.skipping = Some(name.to_string());
                    if let Some(kind) = raw {
                        return TokenSinkResult::RawData(kind);
                    }
                }
            }
            Token::CharacterTokens(text) if walk.skipping.is_none() => walk.current.text.push_str(&text),
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// Runs of spaces and newlines as a browser shows them: one space (a `<br>` stays a line break).
fn collapse_spaces(text: &str) -> String {
    text.split('\n')
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_text_comes_out_and_scripts_and_styles_do_not() {
        let page = r#"<!doctype html><html><head><title>t</title><style>p { color: red }</style>
            <script>alert("no")</script></head><body>
            <h1>Terms   of use</h1><p>Fish &amp; <b>chips</b><br>second line</p>
            <ul><li>one</li><li>two <i>more</i></li></ul><div><div>nested</div></div>
            <script>document.write("never")</script></body></html>"#;
        assert_eq!(
            extract(page).unwrap(),
            "# Terms of use\n\nFish & chips\nsecond line\n\n- one\n\n- two more\n\nnested"
        );
        assert!(extract("<html><body><script>x()</script></body></html>").unwrap_err().contains("no text"));
    }

    #[test]
    fn a_hundred_thousand_nested_elements_cost_nothing_but_their_bytes() {
        let page = format!("{}deep{}", "<div><span>".repeat(100_000), "</span></div>".repeat(100_000));
        assert_eq!(extract(&page).unwrap(), "deep");
    }
}
