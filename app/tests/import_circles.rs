//! No import circles among a crate's modules: a module that uses another may not be used back,
//! directly or through others. Checked on the app, the server and the engine from their sources
//! (a `use crate::…`, `use super::…` or an inline `crate::a::b` path is an edge from its file's
//! module to the deepest module that path names; unit tests at a file's end are left out).
//! And the engine's whiteboard: which of its domains may use which.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path ("pages::jobs") → the file's source, without its unit tests.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src").with_extension("");
            let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            if parts.first().is_some_and(|p| p == "bin") {
                continue; // binaries are crates of their own
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            let code: String =
                code.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
            found.insert(parts.join("::"), code);
        }
    }
    found
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split_whitespace().next().unwrap_or_default().trim_end_matches("::").to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items.into_iter().filter(|i| !i.trim().is_empty()).flat_map(|i| expand(i)).map(|i| format!("{prefix}{i}")).collect()
}

/// The paths a file's code names inside its crate, made absolute (`super::x` from `a::b` is `a::x`).
fn named_paths(module: &str, code: &str) -> Vec<String> {
    let parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let parent = parent[..parent.len().saturating_sub(1)].join("::");
    let absolute = |path: &str| -> Option<String> {
        if let Some(rest) = path.strip_prefix("crate::") {
            Some(rest.to_string())
        } else {
            path.strip_prefix("super::")
                .map(|rest| if parent.is_empty() { rest.into() } else { format!("{parent}::{rest}") })
        }
    };
    let mut paths = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let tree = statement.strip_prefix("pub use ").or_else(|| statement.strip_prefix("use "));
        if let Some(tree) = tree.or_else(|| statement.strip_prefix("pub(crate) use ")) {
            paths.extend(expand(tree).iter().filter_map(|p| absolute(p)));
        }
    }
    let bytes = code.as_bytes();
    let inline = code.match_indices("crate::").chain(code.match_indices("super::"));
    for (at, _) in inline {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
            continue; // `other_crate::` or `super::super::`, not a path of its own
        }
        let end = code[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(code.len(), |e| at + e);
        paths.extend(absolute(&code[at..end]));
    }
    paths
}

/// The deepest module a path names.
fn module_of(path: &str, modules: &BTreeMap<String, String>) -> Option<String> {
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    (0..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains_key(m))
}

/// Each circle (a strongly connected group of more than one module), with its members' edges.
fn circles(src: &Path) -> Vec<String> {
    let modules = modules(src);
    let edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(module, code)| {
            let targets = named_paths(module, code)
                .iter()
                .filter_map(|p| module_of(p, &modules))
                .filter(|t| t != module && !module.starts_with(&format!("{t}::")) && !t.is_empty())
                .collect();
            (module.clone(), targets)
        })
        .collect();
    // Reachability by search from each module: tiny graphs, no need for anything cleverer.
    let reach = |from: &String| -> BTreeSet<String> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(m) = todo.pop() {
            for next in &edges[&m] {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|m| (m, reach(m))).collect();
    let mut reported = BTreeSet::new();
    let mut found = Vec::new();
    for (module, reached) in &reachable {
        if !reached.contains(*module) || reported.contains(*module) {
            continue;
        }
        let group: BTreeSet<&String> = reached.iter().filter(|other| reachable[other].contains(*module)).collect();
        let lines: Vec<String> = group
            .iter()
            .map(|m| {
                let inside: Vec<&String> = edges[*m].iter().filter(|t| group.contains(t)).collect();
                format!("  {m} uses {inside:?}")
            })
            .collect();
        reported.extend(group.iter().map(|m| (*m).clone()));
        found.push(lines.join("\n"));
    }
    found
}

fn assert_no_circles(krate: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src");
    let found = circles(&src);
    assert!(found.is_empty(), "import circles in {krate}:\n{}", found.join("\n\n"));
}

#[test]
fn the_app_has_no_import_circles() {
    assert_no_circles("app");
}

#[test]
fn the_server_has_no_import_circles() {
    assert_no_circles("server");
}

#[test]
fn the_engine_has_no_import_circles() {
    assert_no_circles("engine");
}

#[test]
fn the_checker_sees_a_circle_through_a_grouped_use_and_an_inline_path() {
    let folder = std::env::temp_dir().join(format!("import-circles-{}", std::process::id()));
    std::fs::create_dir_all(folder.join("pages")).unwrap();
    std::fs::write(folder.join("lib.rs"), "pub mod pages;\npub mod errors;\n").unwrap();
    std::fs::write(folder.join("pages/mod.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(folder.join("pages/a.rs"), "use crate::{errors::E, pages::{b::f}};\n").unwrap();
    std::fs::write(folder.join("pages/b.rs"), "pub fn f() { super::a::g() }\n").unwrap();
    std::fs::write(folder.join("errors.rs"), "fn h() { crate::pages::a::g() }\n// crate::pages::b\n").unwrap();
    let found = circles(&folder);
    std::fs::remove_dir_all(&folder).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("pages::a uses [\"errors\", \"pages::b\"]"), "{}", found[0]);
    assert!(found[0].contains("pages::b uses [\"pages::a\"]") && found[0].contains("errors uses [\"pages::a\"]"));
}

/// The engine's whiteboard (the architecture chapter draws it): each domain, and the domains
/// or modules it may use besides the shared ones (errors, the audit log, telemetry, periodic
/// turns). The queue knows no documents, accounts or mail; the accounts reach the documents
/// only through their one door, `documents::custody`.
const WHITEBOARD: [(&str, &[&str]); 6] = [
    ("queue", &[]),
    ("webhooks", &[]),
    ("mail", &["webhooks"]),
    ("accounts", &["queue", "mail", "hooks", "documents::custody"]),
    ("documents", &["queue", "accounts", "webhooks", "backup"]),
    ("alerts", &["queue", "accounts", "webhooks"]),
];
const SHARED: [&str; 5] = ["error", "audit", "telemetry", "periodic", "db"];

/// Every use of another domain or top-level module that the whiteboard does not allow.
fn off_the_whiteboard(src: &Path, whiteboard: &[(&str, &[&str])]) -> Vec<String> {
    let modules = modules(src);
    let mut found = Vec::new();
    for (module, code) in &modules {
        let domain = module.split("::").next().unwrap_or_default();
        let Some((_, allowed)) = whiteboard.iter().find(|(d, _)| *d == domain) else { continue };
        for target in named_paths(module, code).iter().filter_map(|p| module_of(p, &modules)) {
            let other = target.split("::").next().unwrap_or_default();
            let within = |door: &&str| target == *door || target.starts_with(&format!("{door}::"));
            if other.is_empty() || other == domain || SHARED.contains(&other) || allowed.iter().any(within) {
                continue;
            }
            found.push(format!("{module} uses {target}"));
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_engines_domains_use_only_what_the_whiteboard_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src");
    let found = off_the_whiteboard(&src, &WHITEBOARD);
    assert!(found.is_empty(), "uses the whiteboard does not allow:\n{}", found.join("\n"));
}

#[test]
fn the_whiteboard_check_sees_a_domain_going_around_a_door() {
    let folder = std::env::temp_dir().join(format!("whiteboard-{}", std::process::id()));
    std::fs::create_dir_all(folder.join("accounts")).unwrap();
    std::fs::create_dir_all(folder.join("documents")).unwrap();
    std::fs::write(folder.join("lib.rs"), "pub mod accounts;\npub mod documents;\npub mod error;\n").unwrap();
    std::fs::write(folder.join("error.rs"), "").unwrap();
    std::fs::write(folder.join("documents/mod.rs"), "pub mod custody;\npub mod sweep;\npub use sweep::Blobs;\n")
        .unwrap();
    std::fs::write(folder.join("documents/custody.rs"), "").unwrap();
    std::fs::write(folder.join("documents/sweep.rs"), "").unwrap();
    std::fs::write(folder.join("accounts/mod.rs"), "pub mod deletion;\n").unwrap();
    std::fs::write(
        folder.join("accounts/deletion.rs"),
        "use crate::error::E;\nuse crate::documents::custody::forget;\nfn f(b: &crate::documents::Blobs) { crate::documents::sweep::go() }\n",
    )
    .unwrap();
    let found = off_the_whiteboard(&folder, &[("accounts", &["documents::custody"]), ("documents", &[])]);
    std::fs::remove_dir_all(&folder).unwrap();
    assert_eq!(found, ["accounts::deletion uses documents", "accounts::deletion uses documents::sweep"]);
}
