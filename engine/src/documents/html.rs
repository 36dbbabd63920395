//! A saved web page's text: the body's words as Markdown-like paragraphs (headings with `#`,
//! list items with `- `), scripts, styles and everything else that is not text dropped. Read
//! only in the sandboxed reader: the parse is html5ever's (through ammonia, which also drops
//! what is never text), the walk over its tree is iterative, so no nesting depth can exhaust
//! the stack.

use ammonia::rcdom::{Handle, NodeData};

use super::office::{Block, BlockKind};

/// Elements whose start and end cut a paragraph.
const BLOCKS: [&str; 22] = [
    "p", "div", "section", "article", "header", "footer", "main", "aside", "nav", "blockquote", "pre", "table",
    "tr", "td", "th", "ul", "ol", "dl", "dt", "dd", "figure", "figcaption",
];

/// The page's text, or why it has none.
pub fn extract(html: &str) -> Result<String, String> {
    let document = ammonia::Builder::default().clean(html).to_dom_node();
    let blocks = blocks(&document);
    let text = blocks.iter().map(Block::markdown).collect::<Vec<_>>().join("\n\n");
    if text.trim().is_empty() {
        return Err("the page has no text".into());
    }
    Ok(text)
}

/// What the walk does next: enter a node, or close the block an element opened.
enum Step {
    Enter(Handle),
    Leave,
}

fn blocks(root: &Handle) -> Vec<Block> {
    let mut done = Vec::new();
    let mut current = Block { kind: BlockKind::Paragraph, text: String::new() };
    let mut flush = |current: &mut Block, next: BlockKind, done: &mut Vec<Block>| {
        let finished = std::mem::replace(current, Block { kind: next, text: String::new() });
        if !finished.text.trim().is_empty() {
            done.push(Block { text: collapse_spaces(&finished.text), ..finished });
        }
    };
    let mut todo = vec![Step::Enter(root.clone())];
    while let Some(step) = todo.pop() {
        match step {
            Step::Leave => flush(&mut current, BlockKind::Paragraph, &mut done),
            Step::Enter(node) => {
                let kind = match &node.data {
                    NodeData::Text { contents } => {
                        current.text.push_str(&contents.borrow());
                        continue;
                    }
                    NodeData::Element { name, .. } => {
                        let tag: &str = &name.local;
                        match tag {
                            "br" => {
                                current.text.push('\n');
                                None
                            }
                            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                                Some(BlockKind::Heading(tag[1..].parse().unwrap_or(1)))
                            }
                            "li" => Some(BlockKind::ListItem),
                            _ if BLOCKS.contains(&tag) => Some(BlockKind::Paragraph),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let Some(kind) = kind {
                    flush(&mut current, kind, &mut done);
                    todo.push(Step::Leave);
                }
                for child in node.children.borrow().iter().rev() {
                    todo.push(Step::Enter(child.clone()));
                }
            }
        }
    }
    flush(&mut current, BlockKind::Paragraph, &mut done);
    done
}

/// Runs of spaces and newlines as HTML shows them: one space (a `<br>` stays a line break).
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
    fn a_hundred_thousand_nested_elements_are_walked_without_recursion() {
        let page = format!("{}deep{}", "<div><span>".repeat(100_000), "</span></div>".repeat(100_000));
        assert_eq!(extract(&page).unwrap(), "deep");
    }
}
