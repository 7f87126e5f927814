//! The bundled Lua scripts, each hashed once and run by EVALSHA (sent whole by EVAL
//! when the server answers NOSCRIPT), and the codes they reply with.
//!
//! Each script is a body (`lua/<script>.lua`) with the fragments it needs spliced in, in the
//! order listed here, at its line `-- (fragments go here)`: after the fast paths of
//! `obtain.lua` and `release.lua`, so that an uncontended obtain or release defines none of
//! their functions. Every rule has one fragment:
//!
//! | fragment | what it says |
//! |---|---|
//! | `clock.lua` | the server's clock, read once per script |
//! | `owner.lua` | the owner tag, and the waiter's mark (`!`) a value may carry |
//! | `mark.lua` | marking a holder for a waiter; a re-obtain keeps the mark and the longer TTL |
//! | `admit.lua` | the admission rule: may a key be taken in a mode now (writers first, permits) |
//! | `queue.lua` | a fair waiter's queues and records: queue, leave, who came first |
//! | `handoff.lua` | a release hands a freed key down its queue (by `admit.lua`) |
//! | `fence.lua` | fencing tokens |
//! | `modes_args.lua`, `sets.lua` | the arguments of a lock with modes; its keys as sets |
//!
//! A fragment may define more than one script calls: what a script never calls is left out
//! of it when it is bundled (a top-level `local function` named nowhere else goes, with its
//! comment, until none is left), so each script defines only what it may run. Each fragment
//! begins with a line `-- lua/<fragment>.lua`, so an error's line number in a script (the
//! server names it `user_script:<line>`) leads to its fragment; [`Lua::origin`] says which.

use std::sync::LazyLock;

/// A bundled script: its source, and the SHA1 hash EVALSHA names it by.
pub(crate) struct Lua {
    /// The script itself, for EVAL.
    pub(crate) source: String,
    /// Its hash, for EVALSHA.
    pub(crate) hash: String,
    /// For each line of `source`, the file it comes from and its line there (from 1).
    lines: Vec<(&'static str, usize)>,
}

impl Lua {
    /// The file and line in it that line `line` (from 1) of the script comes from.
    pub(crate) fn origin(&self, line: usize) -> Option<(&'static str, usize)> {
        self.lines.get(line.checked_sub(1)?).copied()
    }

    /// Logs which fragment an error of this script names by its line (`user_script:<line>`,
    /// a line of the bundled script): only the file and line, nothing of the error's text,
    /// which may quote values.
    pub(crate) fn note_origin(&self, err: &redis::RedisError) {
        let said = err.to_string();
        let Some(rest) = said.split("user_script:").nth(1) else {
            return;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Some((file, line)) = digits.parse().ok().and_then(|at| self.origin(at)) {
            tracing::warn!("a lockset script failed at lua/{file}.lua:{line}");
        }
    }
}

/// The line of a script's body where its fragments go.
const FRAGMENTS_GO_HERE: &str = "-- (fragments go here)";

/// Every fragment, by name.
const FRAGMENTS: &[(&str, &str)] = &[
    ("clock", include_str!("../../lua/clock.lua")),
    ("owner", include_str!("../../lua/owner.lua")),
    ("mark", include_str!("../../lua/mark.lua")),
    ("admit", include_str!("../../lua/admit.lua")),
    ("queue", include_str!("../../lua/queue.lua")),
    ("handoff", include_str!("../../lua/handoff.lua")),
    ("fence", include_str!("../../lua/fence.lua")),
    ("modes_args", include_str!("../../lua/modes_args.lua")),
    ("sets", include_str!("../../lua/sets.lua")),
];

/// One line of a script being bundled.
struct Line {
    text: &'static str,
    /// The file it comes from (`lua/<name>.lua`) and its line there.
    file: &'static str,
    at: usize,
    /// The line that names the fragment that follows.
    header: bool,
}

/// The script `name` (`lua/<name>.lua`, its text `body`) with the fragments of `splices`
/// in place of its lines [`FRAGMENTS_GO_HERE`] (the first list at the first such line, and
/// so on), in that order, less the functions it never calls.
fn bundle(name: &'static str, body: &'static str, splices: &[&[&'static str]]) -> Lua {
    let mut lines = Vec::new();
    let mut splices = splices.iter();
    for (at, text) in body.lines().enumerate() {
        if text != FRAGMENTS_GO_HERE {
            lines.push(Line {
                text,
                file: name,
                at: at + 1,
                header: false,
            });
            continue;
        }
        for fragment in splices.next().copied().unwrap_or_default() {
            let Some((file, source)) = FRAGMENTS.iter().find(|(file, _)| file == fragment) else {
                // A name missing from FRAGMENTS: the tests load every script.
                continue;
            };
            lines.push(Line {
                text: "",
                file,
                at: 0,
                header: true,
            });
            for (at, text) in source.lines().enumerate() {
                lines.push(Line {
                    text,
                    file,
                    at: at + 1,
                    header: false,
                });
            }
        }
    }
    let lines = without_uncalled(lines);
    let mut source = String::new();
    for line in &lines {
        if line.header {
            source.push_str("-- lua/");
            source.push_str(line.file);
            source.push_str(".lua");
        } else {
            source.push_str(line.text);
        }
        source.push('\n');
    }
    let hash = redis::Script::new(&source).get_hash().to_owned();
    let lines = lines.iter().map(|line| (line.file, line.at)).collect();
    Lua {
        source,
        hash,
        lines,
    }
}

/// The code of a Lua line, without its comment (from a `--` outside a string) and without
/// the text of its strings.
fn code(line: &str) -> String {
    let mut code = String::new();
    let mut quote = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) if c == '\\' => {
                chars.next();
            }
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '-' && chars.peek() == Some(&'-') => break,
            None => code.push(c),
        }
    }
    code
}

/// Whether `name` is a word of the code of `line`.
fn names(line: &str, name: &str) -> bool {
    code(line)
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word == name)
}

/// The name of the top-level function `line` defines, if it defines one.
fn defines(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("local function ")?;
    rest.split('(').next()
}

/// `lines` without the top-level functions no other line names (each with its comment),
/// until every one left is named.
fn without_uncalled(mut lines: Vec<Line>) -> Vec<Line> {
    'again: loop {
        for start in 0..lines.len() {
            let Some(name) = defines(lines[start].text) else {
                continue;
            };
            // A top-level function ends at the first line that is `end` alone.
            let end = (start..lines.len())
                .find(|&i| lines[i].text == "end")
                .unwrap_or(start);
            let called = lines
                .iter()
                .enumerate()
                .any(|(i, line)| (i < start || i > end) && names(line.text, name));
            if called {
                continue;
            }
            let mut first = start;
            while first > 0 && !lines[first - 1].header && lines[first - 1].text.starts_with("--") {
                first -= 1;
            }
            // The blank line after it goes too.
            let last = if lines
                .get(end + 1)
                .is_some_and(|l| l.text.is_empty() && !l.header)
            {
                end + 1
            } else {
                end
            };
            lines.drain(first..=last);
            continue 'again;
        }
        return lines;
    }
}

/// Locks every key or none; re-entrant by owner tag; queues a fair waiter.
pub(crate) static OBTAIN: LazyLock<Lua> = LazyLock::new(|| {
    // The queue's functions once all keys are free (a fair waiter's first attempt may have
    // queued); the rest only where some key was not free, or a counter is to be minted.
    let fragments: [&[_]; 2] = [&["clock", "queue"], &["owner", "mark", "fence"]];
    bundle("obtain", include_str!("../../lua/obtain.lua"), &fragments)
});

/// The smallest remaining TTL of a held lock.
pub(crate) static PTTL: LazyLock<Lua> =
    LazyLock::new(|| bundle("pttl", include_str!("../../lua/pttl.lua"), &[&["owner"]]));

/// Extends every key of a held lock.
pub(crate) static REFRESH: LazyLock<Lua> = LazyLock::new(|| {
    bundle(
        "refresh",
        include_str!("../../lua/refresh.lua"),
        &[&["owner", "mark"]],
    )
});

/// Deletes every key of a held lock, handing each to its queue's first waiter; a fair
/// waiter that gives up leaves its queues through it too.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    let fragments = ["owner", "mark", "clock", "admit", "queue", "handoff"];
    bundle(
        "release",
        include_str!("../../lua/release.lua"),
        &[&fragments],
    )
});

/// An obtain of a lock that holds some key shared or as a permit.
pub(crate) static MODES_OBTAIN: LazyLock<Lua> = LazyLock::new(|| {
    let fragments = [
        "clock",
        "modes_args",
        "owner",
        "mark",
        "admit",
        "sets",
        "queue",
        "fence",
    ];
    bundle(
        "modes_obtain",
        include_str!("../../lua/modes_obtain.lua"),
        &[&fragments],
    )
});

/// The smallest remaining TTL of a lock with modes.
pub(crate) static MODES_PTTL: LazyLock<Lua> = LazyLock::new(|| {
    let fragments = ["clock", "modes_args", "owner", "admit", "sets"];
    bundle(
        "modes_pttl",
        include_str!("../../lua/modes_pttl.lua"),
        &[&fragments],
    )
});

/// Extends every key of a lock with modes.
pub(crate) static MODES_REFRESH: LazyLock<Lua> = LazyLock::new(|| {
    let fragments = ["clock", "modes_args", "owner", "mark", "admit", "sets"];
    bundle(
        "modes_refresh",
        include_str!("../../lua/modes_refresh.lua"),
        &[&fragments],
    )
});

/// Deletes every key of a lock with modes, handing each on; a fair waiter that gives up
/// leaves its queues through it too.
pub(crate) static MODES_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    let fragments = [
        "clock",
        "modes_args",
        "owner",
        "mark",
        "admit",
        "sets",
        "queue",
        "handoff",
    ];
    bundle(
        "modes_release",
        include_str!("../../lua/modes_release.lua"),
        &[&fragments],
    )
});

/// Every bundled script, by name (for the tests, which load and check them all).
#[allow(dead_code)] // The library names each script where it runs it.
pub(crate) fn all() -> [(&'static str, &'static Lua); 8] {
    [
        ("obtain", &OBTAIN),
        ("pttl", &PTTL),
        ("refresh", &REFRESH),
        ("release", &RELEASE),
        ("modes_obtain", &MODES_OBTAIN),
        ("modes_pttl", &MODES_PTTL),
        ("modes_refresh", &MODES_REFRESH),
        ("modes_release", &MODES_RELEASE),
    ]
}

/// How releases are announced on a single server, and what `release.lua` assumes when not
/// told otherwise.
pub(crate) const PUBLISH: &str = "PUBLISH";

/// Reply of `obtain.lua` for success: `{OBTAINED, fence}`.
pub(crate) const OBTAINED: i64 = 1;
/// Reply of `obtain.lua` when another owner holds a key: `{HELD, pttl, index}`, then
/// 1 when the waiter queued (0 when not), then the holder's metadata when it has any.
pub(crate) const HELD: i64 = 0;
/// Reply of `obtain.lua` when a key holds a non-string value: `{WRONG_TYPE, key}`.
pub(crate) const WRONG_TYPE: i64 = 2;
/// Reply of `modes_obtain.lua` when a key is held in a mode that cannot go with the one
/// asked for: `{MODE_MISMATCH, index, stored mode}`.
pub(crate) const MODE_MISMATCH: i64 = 3;
/// Reply of `pttl.lua` when some key is another owner's.
pub(crate) const PTTL_NOT_HELD: i64 = -2;
/// Reply of `pttl.lua` when some keys are missing and none is another owner's.
pub(crate) const PTTL_MISSING: i64 = -3;
/// Reply of `pttl.lua` when every key is held without expiry.
pub(crate) const PTTL_PERSISTENT: i64 = -1;
/// Reply of `refresh.lua` and `release.lua` when every key was ours (and was extended, or
/// deleted).
pub(crate) const DONE: i64 = 1;
/// Reply of `refresh.lua` and `release.lua` when some keys are missing and none is another
/// owner's (nothing changed).
pub(crate) const MISSING: i64 = 2;

#[cfg(test)]
mod tests {
    use super::{FRAGMENTS_GO_HERE, all, defines, names};

    /// Every function a script defines is defined before any line names it (a Lua local
    /// named before its definition is a global: nil when called), and called somewhere.
    #[test]
    fn every_function_is_defined_before_use_and_called() {
        for (script, lua) in all() {
            let lines: Vec<&str> = lua.source.lines().collect();
            assert!(!lua.source.contains(FRAGMENTS_GO_HERE), "{script}");
            for (at, line) in lines.iter().enumerate() {
                let Some(name) = defines(line) else { continue };
                let early = lines[..at].iter().position(|l| names(l, name));
                let before = early.map(|i| lines[i]);
                assert_eq!(
                    before,
                    None,
                    "{script}: {name} named before line {}",
                    at + 1
                );
                let called = lines[at + 1..].iter().filter(|l| names(l, name)).count();
                assert!(called > 0, "{script}: {name} never called");
                // Nor is it shadowed by a local of the same name later on.
                let shadow = lines[at + 1..].iter().find(|l| {
                    let declared = l.trim_start().strip_prefix("local ").unwrap_or("");
                    let declared = declared.split('=').next().unwrap_or("");
                    names(declared, name)
                });
                assert_eq!(shadow, None, "{script}: {name} shadowed");
            }
        }
    }

    /// Writes every bundled script to the directory `LOCKSET_SCRIPTS_TO`, for reading it
    /// whole: `LOCKSET_SCRIPTS_TO=/tmp/s cargo test --lib scripts -- --ignored`.
    #[test]
    #[ignore = "writes files; run by hand"]
    fn write_scripts() {
        let Some(dir) = std::env::var_os("LOCKSET_SCRIPTS_TO") else {
            return;
        };
        for (script, lua) in all() {
            let path = std::path::Path::new(&dir).join(format!("{script}.lua"));
            std::fs::write(path, &lua.source).unwrap();
        }
    }

    /// Each line of a script leads back to its file.
    #[test]
    fn a_line_leads_to_its_fragment() {
        let lua = &*super::MODES_OBTAIN;
        let at = lua
            .source
            .lines()
            .position(|l| l.starts_with("local function admit("));
        let (file, line) = lua.origin(at.unwrap_or(0) + 1).unwrap_or(("?", 0));
        assert_eq!(file, "admit");
        let admit = include_str!("../../lua/admit.lua");
        assert_eq!(
            admit.lines().nth(line - 1),
            Some("local function admit(key, stored, mode, writes)")
        );
        // An uncontended obtain and release define nothing before they are done.
        for script in [&*super::OBTAIN, &*super::RELEASE] {
            let first = script
                .source
                .lines()
                .position(|l| l.starts_with("local function "));
            let fast = script.source.lines().position(|l| l.starts_with("-- lua/"));
            assert!(first > fast, "a function before the fast path");
        }
    }
}
