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

/// The first path segments after each `crate::` in `code`: `crate::a::b` gives `a`, and
/// `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut segment_start = true;
            let mut word = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 1 => break,
                    '}' => depth -= 1,
                    ',' if depth == 1 => segment_start = true,
                    c if c.is_alphanumeric() || c == '_' => {
                        if segment_start {
                            word.push(c);
                        }
                    }
                    _ => {
                        if !word.is_empty() {
                            found.push(std::mem::take(&mut word));
                            segment_start = false;
                        }
                    }
                }
            }
            if !word.is_empty() {
                found.push(word);
            }
        } else {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(word);
        }
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
        let text = std::fs::read_to_string(file).expect("read");
        // Statements span lines (grouped imports): the code without comments, as one text,
        // with each line's start remembered for the message.
        let mut code = String::new();
        let mut starts = Vec::new();
        for line in text.lines() {
            starts.push(code.len());
            let line = line.split("//").next().unwrap_or("");
            code.push_str(line);
            code.push('\n');
        }
        for target in crate_paths(&code) {
            if target == "guide" || target == layer {
                continue;
            }
            if target.starts_with(char::is_uppercase) {
                // A root re-export hides its layer: name the path inside.
                upward.push(format!(
                    "{}: uses crate::{target}: name it by its layer's path",
                    file.display()
                ));
                continue;
            }
            match rank(&target) {
                Some(theirs) if theirs <= own => {}
                Some(_) => upward.push(format!("{}: {layer} uses {target}", file.display())),
                None => upward.push(format!(
                    "{}: uses crate::{target}, which is in no layer (add it to LAYERS)",
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
    assert_eq!(crate_paths("crate::rt::lock(&m)"), ["rt"]);
}
