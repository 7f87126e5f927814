//! What `lockset` tells people on stderr: its own lines, logs, and the waiting line.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The target of the command's own log lines (the library's are `lockset::...`).
pub(crate) const LOG: &str = "lockset_cli";

/// How much to say, from `-q` and `-v`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ui {
    quiet: bool,
    verbose: u8,
    terminal: bool,
}

impl Ui {
    /// From the command line's flags and whether stderr is a terminal.
    pub(crate) fn new(quiet: bool, verbose: u8) -> Self {
        Self {
            quiet,
            verbose,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Sends `tracing` logs to stderr: the command's own warnings (a Redlock master down,
    /// background work unfinished at exit) and the library's errors by default; the
    /// library's warnings and info with `-v` (a failed watchdog refresh, a sentinel that
    /// disagrees: what happened to the lock is said by `lockset`'s own lines, and a log
    /// line with a timestamp beside them only repeated it), debug with `-vv`, trace with
    /// `-vvv`; errors only with `-q`. Other crates' logs stay at warnings until `-vvv`.
    pub(crate) fn init_logs(self) {
        let own = match (self.quiet, self.verbose) {
            (true, _) => LevelFilter::ERROR,
            (false, 0) => LevelFilter::WARN,
            (false, 1) => LevelFilter::INFO,
            (false, 2) => LevelFilter::DEBUG,
            (false, _) => LevelFilter::TRACE,
        };
        let level = match (self.quiet, self.verbose) {
            (true, _) | (false, 0) => LevelFilter::ERROR,
            (false, 1) => LevelFilter::INFO,
            (false, 2) => LevelFilter::DEBUG,
            (false, _) => LevelFilter::TRACE,
        };
        let others = if self.verbose >= 3 {
            LevelFilter::TRACE
        } else {
            level.min(LevelFilter::WARN)
        };
        // What connecting to a Redlock quorum found (masters down, not answering, refusing
        // the login) is the library's to say, and said as `lockset`'s own lines are.
        let filter = Targets::new()
            .with_target("lockset", level)
            .with_target("lockset::connect", own)
            .with_target(LOG, own)
            .with_default(others);
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(self.terminal)
            .with_target(self.verbose >= 2);
        // A second subscriber cannot happen: this runs once, first thing.
        let _ = tracing_subscriber::registry()
            .with(logs)
            .with(filter)
            .try_init();
    }

    /// Says `message` on stderr, prefixed with `lockset: `, unless quiet.
    pub(crate) fn say(self, message: &str) {
        if !self.quiet {
            eprintln!("lockset: {message}");
        }
    }

    /// How to show waiting for a held lock: a spinner on a terminal, log lines with `-v`,
    /// else nothing.
    pub(crate) fn waiting(self) -> Waiting {
        if self.quiet {
            Waiting::Silent
        } else if self.terminal {
            Waiting::Spinner(None)
        } else if self.verbose > 0 {
            Waiting::Log(None)
        } else {
            Waiting::Silent
        }
    }
}

/// The waiting line: "waiting for KEY (held by METADATA, 12s left)".
#[derive(Debug)]
pub(crate) enum Waiting {
    /// Nothing to show.
    Silent,
    /// An indicatif spinner on stderr, made on the first update.
    Spinner(Option<ProgressBar>),
    /// A log line whenever the text changes (the time left aside).
    Log(Option<String>),
}

impl Waiting {
    /// True when nothing will be shown: no need to look at the holder.
    pub(crate) fn is_silent(&self) -> bool {
        matches!(self, Self::Silent)
    }

    /// Shows that `what` is waited for; `left` is the holder's remaining time.
    pub(crate) fn update(&mut self, what: &str, left: &str) {
        match self {
            Self::Silent => {}
            Self::Spinner(spinner) => {
                let spinner = spinner.get_or_insert_with(new_spinner);
                spinner.set_message(format!("{what}{left}"));
            }
            Self::Log(last) => {
                if last.as_deref() != Some(what) {
                    tracing::info!(target: crate::ui::LOG, "{what}{left}");
                    *last = Some(what.to_owned());
                }
            }
        }
    }

    /// Removes the spinner line, if any.
    pub(crate) fn finish(&mut self) {
        if let Self::Spinner(Some(spinner)) = self {
            spinner.finish_and_clear();
        }
    }
}

fn new_spinner() -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(100));
    spinner
}
