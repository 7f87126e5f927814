//! `lockset man` and `lockset completions`: the man pages and shell completion scripts, made
//! from the same clap definitions as `--help` so that they cannot say something else.
//!
//! Neither touches Redis. Both render completely before writing, so that a failure to write
//! is reported as such (clap_complete would panic on one).

use std::io::{self, Write as _};
use std::path::Path;

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::exit::{self, Failure};

/// The program's name in completion scripts and man pages.
const NAME: &str = "lockset";

/// Writes `lockset.1` and one `lockset-SUBCOMMAND.1` per subcommand into `dir`, creating it
/// if missing.
pub(crate) fn man(dir: &Path) -> Result<u8, Failure> {
    let cannot = |err: io::Error| {
        Failure::new(
            exit::SYSTEM,
            format!("cannot write the man pages to {}: {err}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(cannot)?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    write_pages(&mut cmd, dir).map_err(cannot)?;
    Ok(0)
}

/// Writes the page of `cmd` and of each of its subcommands: clap_mangen's pages, with the
/// synopsis of `--help` (clap_mangen's lists options without their values, and no `--`).
fn write_pages(cmd: &mut clap::Command, dir: &Path) -> io::Result<()> {
    for sub in cmd.get_subcommands_mut().filter(|sub| !sub.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render(&mut page)?;
    let page = String::from_utf8_lossy(&page);
    let usage = cmd.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage:").trim();
    std::fs::write(
        dir.join(man.get_filename()),
        with_synopsis(&page, cmd, usage),
    )
}

/// `page` with its synopsis line replaced by `usage` (`lockset run [OPTIONS] <KEY>... --
/// <COMMAND>...`), the program's name in bold.
fn with_synopsis(page: &str, cmd: &clap::Command, usage: &str) -> String {
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let rest = usage.strip_prefix(name).unwrap_or(usage);
    let line = format!("\\fB{}\\fR{}", roff(name), roff(rest));
    let mut lines: Vec<&str> = page.lines().collect();
    if let Some(at) = lines.iter().position(|line| *line == ".SH SYNOPSIS")
        && at + 1 < lines.len()
    {
        lines[at + 1] = &line;
    }
    lines.join("\n") + "\n"
}

/// `text` safe in a roff line: backslashes and hyphens escaped.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// Prints the completion script for `shell` on stdout.
pub(crate) fn completions(shell: Shell) -> Result<u8, Failure> {
    let script = completion_script(shell);
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .map_err(|err| {
            Failure::new(exit::SYSTEM, format!("cannot print the completions: {err}"))
        })?;
    Ok(0)
}

/// The completion script for `shell`, rendered in memory.
fn completion_script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), NAME, &mut script);
    script
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    /// Every subcommand's name, from the grammar itself (`help` is clap's own).
    fn subcommands() -> Vec<String> {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|sub| sub.get_name().to_owned())
            .collect();
        assert!(names.len() >= 7, "{names:?}");
        names
    }

    #[test]
    fn every_shell_completes_every_subcommand() {
        for shell in Shell::value_variants() {
            let script = String::from_utf8(completion_script(*shell)).unwrap();
            for sub in subcommands() {
                assert!(script.contains(&sub), "{shell}: {sub}");
            }
        }
    }

    #[test]
    fn man_writes_a_page_for_the_command_and_each_subcommand() {
        let dir = std::env::temp_dir().join(format!("lockset-man-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(man(&dir.join("man1")).unwrap(), 0);
        let page = |name: &str| std::fs::read_to_string(dir.join("man1").join(name)).unwrap();
        let top = page("lockset.1");
        for sub in subcommands() {
            assert!(top.contains(&sub), "{sub} in lockset.1");
            let own = page(&format!("lockset-{sub}.1"));
            assert!(own.contains(&format!("lockset-{sub}")), "{own}");
            // The synopsis is `--help`'s: options and value names, not a bare flag list.
            let synopsis = own
                .lines()
                .skip_while(|l| *l != ".SH SYNOPSIS")
                .nth(1)
                .unwrap();
            assert!(
                synopsis.starts_with(&format!("\\fBlockset {sub}\\fR")),
                "{synopsis}"
            );
            assert!(!synopsis.contains("[\\fB"), "{synopsis}");
        }
        let run = page("lockset-run.1");
        assert!(
            run.contains("\\fBlockset run\\fR [OPTIONS] <KEY>... \\-\\- <COMMAND>..."),
            "{run}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
