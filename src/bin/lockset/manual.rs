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
    clap_mangen::generate_to(Cli::command(), dir).map_err(cannot)?;
    Ok(0)
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
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
