//! The library's layers, checked: every `crate::…` path in `src/` (imports and paths in
//! code; comments, and so doc links, are skipped) names its own layer or one below it. The
//! layers, bottom to top, are the folders that `src/lib.rs` lists and each `mod.rs`
//! describes; an edge that points up fails here, with the file and the line.

use std::path::{Path, PathBuf};

/// Bottom to top. A module may use its own layer and those before it.
const LAYERS: [&str; 10] = [
    "rt", "model", "error", "observe", "server", "topology", "waiting", "client", "blocking", "lib",
];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|known| *known == layer)
}

/// Every `.rs` file under `dir`, but the command line's (a crate of its own) and the guide's
/// (documentation only).
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            if !path.ends_with("bin") && !path.ends_with("guide") {
                sources(&path, found);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The layer of a file: its folder under `src/`, or its name for a file at the top.
fn layer_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src");
    let first = relative.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_owned()
}

/// `text` without its comments and string literals (each replaced by a space, line breaks
/// kept): a URL's `//` in a string does not start a comment, and a path named in a comment or
/// a string is not a use.
fn code_only(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '/' if chars.peek() == Some(&'/') => {
                for skipped in chars.by_ref() {
                    if skipped == '\n' {
                        code.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for skipped in chars.by_ref() {
                    match skipped {
                        '\n' => code.push('\n'),
                        '\\' if !escaped => {
                            escaped = true;
                            continue;
                        }
                        '"' if !escaped => break,
                        _ => {}
                    }
                    escaped = false;
                }
                code.push(' ');
            }
            // A char literal such as '"' (a lifetime has no closing quote soon after).
            '\'' => {
                let ahead: String = chars.clone().take(3).collect();
                let close = if ahead.starts_with('\\') { 2 } else { 1 };
                if ahead.chars().nth(close) == Some('\'') {
                    for _ in 0..=close {
                        chars.next();
                    }
                    code.push(' ');
                } else {
                    code.push(ch);
                }
            }
            _ => code.push(ch),
        }
    }
    code
}

/// The first path segments after each `crate::` in `code`: `crate::a::b` gives `a`, and
/// `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.push(word_at(rest));
            continue;
        };
        // The first word of each top-level item of the group.
        let mut depth = 1;
        let mut item_start = true;
        for (i, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => item_start = true,
                c if item_start && (c.is_alphanumeric() || c == '_') => {
                    found.push(word_at(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    found
}

/// The identifier `text` starts with.
fn word_at(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Ways around the paths this test reads: `super::super::` (a path out of a folder) and
/// another name for the crate root.
fn evasions(code: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    if code.contains("super::super") {
        found.push("super::super:: (name the path from crate::)");
    }
    if code.contains("crate as ") {
        found.push("crate as (name the path from crate::)");
    }
    found
}

#[test]
fn no_import_points_up_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut upward = Vec::new();
    for file in &files {
        let layer = layer_of(&src, file);
        let own = rank(&layer).unwrap_or_else(|| panic!("{file:?}: no layer {layer:?}"));
        let code = code_only(&std::fs::read_to_string(file).expect("read"));
        for evasion in evasions(&code) {
            upward.push(format!("{}: {evasion}", file.display()));
        }
        for target in crate_paths(&code) {
            if target == "guide" || target == layer {
                continue;
            }
            match rank(&target) {
                Some(theirs) if theirs <= own => {}
                Some(_) => upward.push(format!("{}: {layer} uses {target}", file.display())),
                // A root re-export hides its layer; a new folder needs a place in LAYERS.
                None => upward.push(format!(
                    "{}: uses crate::{target}, which is no layer: name a re-exported item by \
                     its layer's path, or add a new folder to LAYERS",
                    file.display()
                )),
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn grouped_paths_are_read() {
    assert_eq!(
        crate_paths("use crate::{error::{Error, Result}, model::mode::Mode};"),
        ["error", "model"]
    );
    assert_eq!(
        crate_paths("use crate::{error, model, waiting::policy::Step};"),
        ["error", "model", "waiting"]
    );
    assert_eq!(crate_paths("crate::rt::lock(&m)"), ["rt"]);
}

#[test]
fn comments_and_strings_hide_no_code() {
    let code = code_only("let u = \"redis://x\"; let _ = crate::client::x; // crate::waiting\n");
    assert_eq!(crate_paths(&code), ["client"]);
    assert_eq!(
        crate_paths(&code_only("let c = '\"'; crate::rt::x")),
        ["rt"]
    );
    assert!(!evasions(&code_only("use super::super::client;")).is_empty());
    assert!(!evasions(&code_only("use crate as root;")).is_empty());
}
