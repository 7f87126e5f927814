//! The command line's grammar: subcommands, options, and their `--help` texts.

use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::duration;

/// The text after every `--help`: exit codes and the environment, the same for every
/// subcommand so each help page is complete on its own.
const AFTER_HELP: &str = "\
Exit status:
  0      success (run: the command exited 0)
  1-125  run: the command's own exit status
  64     bad usage or input, --redis and --sentinel URLs included, an unknown --master
         (nothing was locked)
  65     a key holds a value that is not a string (a list, a hash, ...), or is held
         in another mode (shared, or permits with another N) than asked for
  69     Redis unreachable, or it failed; too few replicas connected or acknowledging;
         behind Sentinel, no majority of the sentinels names a primary, or a restarted
         primary grants no lock yet (with --wait, all of these are tried again until it
         ends)
  70     the lock was lost (run: while the command ran or was stopped; refresh/release:
         it is not ours)
  71     a local system error (cannot catch signals, wait for the command, or print;
         acquire/status: stdout is closed; man: cannot write DIR)
  75     the lock is held by someone else (change with --conflict-exit-code)
  77     the server refuses to run lockset's scripts (ACL without EVAL/EVALSHA, or
         renamed away); nothing was locked
  126    run: the command could not be executed
  127    run: the command was not found
  128+N  run: the command died by signal N (or lockset got signal N while waiting)

Environment:
  LOCKSET_REDIS     default for --redis (several URLs separated by commas)
  REDIS_URL         default for --redis when LOCKSET_REDIS is not set
  LOCKSET_SENTINEL  default for --sentinel (several URLs separated by commas)
  LOCKSET_MASTER    default for --master
  LOCKSET_TLS_CA_CERT, LOCKSET_TLS_CERT, LOCKSET_TLS_KEY
                    defaults for --tls-ca-cert, --tls-cert, --tls-key
  A variable set but empty counts as unset (but LOCKSET_RESTART_GRACE: exit 64).";

/// The help heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

/// A distributed flock(1): hold a set of Redis keys while a command runs, or acquire,
/// refresh and release them from a shell script.
#[derive(Debug, Parser)]
#[command(
    name = "lockset",
    version,
    about = "A distributed flock(1): run a command while holding a set of Redis keys",
    long_about = "A distributed flock(1): run a command while holding a set of Redis keys, \
        all or nothing, on one Redis server, a Redlock quorum of several, or a Redis Cluster.\n\n\
        Use `lockset run` for cron jobs, deploy steps and CI jobs that must not overlap; \
        use `acquire`, `refresh` and `release` to hold a lock across the steps of a shell script.",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// Where the locks live, and how much to say.
    #[command(flatten)]
    pub(crate) global: Global,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The variable that sets `--restart-grace`.
const RESTART_GRACE_VARIABLE: &str = "LOCKSET_RESTART_GRACE";

impl Cli {
    /// Parses the command line. A variable of the environment that an option reads and that
    /// is set but empty (or blank) counts as unset (a service file or a cron line that leaves
    /// `LOCKSET_SENTINEL=` behind): it neither gives the option an empty value nor turns on
    /// what the option turns on. Not `LOCKSET_RESTART_GRACE`: a safety setting left empty is
    /// bad usage, not a wish for the shorter default.
    pub(crate) fn parse_args() -> Result<Self, clap::Error> {
        let mut command = Self::command();
        let empty: Vec<clap::Id> = command
            .get_arguments()
            .filter(|arg| {
                arg.get_env()
                    .filter(|name| *name != RESTART_GRACE_VARIABLE)
                    .and_then(std::env::var_os)
                    .is_some_and(|value| value.to_string_lossy().trim().is_empty())
            })
            .map(|arg| arg.get_id().clone())
            .collect();
        for id in empty {
            command = command.mut_arg(id, |arg| arg.env(None::<&'static str>));
        }
        Self::from_arg_matches(&command.try_get_matches()?)
    }
}

impl Global {
    /// Splits each `--redis` and `--sentinel` value (and their variables) into its URLs:
    /// several may be given in one, separated by commas (see [`split_urls`]).
    pub(crate) fn split_urls(&mut self) {
        self.redis = split_urls(&self.redis);
        self.sentinel = split_urls(&self.sentinel);
    }
}

/// `values`, each split at the commas that begin another URL (a scheme follows them:
/// `redis://`, `rediss://` ...), so that a comma inside a password needs no escaping.
pub(crate) fn split_urls(values: &[String]) -> Vec<String> {
    let mut urls = Vec::new();
    for value in values {
        let mut start = 0;
        for (at, _) in value.match_indices(',') {
            if starts_with_scheme(&value[at + 1..]) {
                urls.push(value[start..at].to_owned());
                start = at + 1;
            }
        }
        urls.push(value[start..].to_owned());
    }
    urls
}

/// Whether `text` (leading blanks aside) begins with a URL scheme and `://`.
fn starts_with_scheme(text: &str) -> bool {
    let text = text.trim_start();
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Options every subcommand takes, before or after its name.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Redis server URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://... for TLS,
    /// or unix:///PATH.
    /// Repeat it for a Redlock quorum of independent masters (use 3 or 5); with
    /// --cluster, the URLs are seed nodes of one Redis Cluster. [default: $LOCKSET_REDIS,
    /// then $REDIS_URL, then redis://127.0.0.1/]
    #[arg(
        long = "redis",
        value_name = "URL",
        global = true,
        env = "LOCKSET_REDIS",
        hide_env = true,
        help_heading = GLOBAL
    )]
    pub(crate) redis: Vec<String>,

    /// The --redis URLs are seed nodes of one Redis Cluster. All keys of one lock must then
    /// hash to one slot: give them a common hash tag, like {deploy}:db and {deploy}:cache.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub(crate) cluster: bool,

    /// A Redis Sentinel to find the primary through, instead of --redis:
    /// redis://[[USER]:PASSWORD@]HOST[:PORT] (the sentinel's own login). Repeat it for each
    /// sentinel. The primary is followed across failovers, and each lock counts only once
    /// --replicas replicas have it. Needs --master. [default: $LOCKSET_SENTINEL]
    #[arg(
        long = "sentinel",
        value_name = "URL",
        global = true,
        env = "LOCKSET_SENTINEL",
        hide_env = true,
        help_heading = GLOBAL
    )]
    pub(crate) sentinel: Vec<String>,

    /// The name the sentinels know the primary by; or
    /// redis://[[USER]:PASSWORD@]NAME[/DB] to also log in to the primary and pick its
    /// database. [default: $LOCKSET_MASTER]
    #[arg(
        long = "master",
        value_name = "NAME",
        global = true,
        env = "LOCKSET_MASTER",
        hide_env = true,
        help_heading = GLOBAL
    )]
    pub(crate) master: Option<String>,

    /// How many replicas must acknowledge each obtain and refresh before it counts (Redis
    /// WAIT, within 250 ms): then a failover to one of them keeps the lock. Fewer connected
    /// is "unavailable" (69), tried again within --wait. [default: with --sentinel, every
    /// replica the primary lists and every one the sentinels could promote; else 0]
    #[arg(long, value_name = "N", global = true, help_heading = GLOBAL)]
    pub(crate) replicas: Option<u32>,

    /// With --sentinel: the longest TTL any client of the deployment uses. A primary that
    /// restarted without its data grants no lock until this long after its start (a lock it
    /// forgot may be valid that long). [default: $LOCKSET_RESTART_GRACE, else each lock's
    /// own --ttl]
    #[arg(long, value_name = "DURATION", env = "LOCKSET_RESTART_GRACE", hide_env = true, value_parser = duration::non_negative, global = true, help_heading = GLOBAL)]
    pub(crate) restart_grace: Option<std::time::Duration>,

    /// The certificate authorities (a PEM file) to trust for rediss:// servers and sentinels,
    /// instead of the system's roots. [default: $LOCKSET_TLS_CA_CERT]
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "LOCKSET_TLS_CA_CERT",
        hide_env = true,
        help_heading = GLOBAL
    )]
    pub(crate) tls_ca_cert: Option<std::path::PathBuf>,

    /// A client certificate (a PEM file) for rediss:// servers that ask for one (mutual
    /// TLS); needs --tls-key. [default: $LOCKSET_TLS_CERT]
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "LOCKSET_TLS_CERT",
        hide_env = true,
        requires = "tls_key",
        help_heading = GLOBAL
    )]
    pub(crate) tls_cert: Option<std::path::PathBuf>,

    /// The private key (a PEM file) of --tls-cert. [default: $LOCKSET_TLS_KEY]
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "LOCKSET_TLS_KEY",
        hide_env = true,
        requires = "tls_cert",
        help_heading = GLOBAL
    )]
    pub(crate) tls_key: Option<std::path::PathBuf>,

    /// Say nothing on stderr but usage errors; the exit status still tells what happened.
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = GLOBAL)]
    pub(crate) quiet: bool,

    /// Say more: the waiting line even when stderr is not a terminal, and logs (-vv debug,
    /// -vvv trace).
    #[arg(short, long, global = true, action = ArgAction::Count, help_heading = GLOBAL)]
    pub(crate) verbose: u8,
}

/// The subcommands: those that work on locks, and those that write `lockset`'s own manual
/// and completions.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The subcommands that work on locks in Redis.
    #[command(flatten)]
    Lock(LockCommand),

    /// Write the man pages, lockset.1 and lockset-SUBCOMMAND.1 for each subcommand, into DIR.
    #[command(
        long_about = "Write the man pages, lockset.1 and lockset-SUBCOMMAND.1 for each \
            subcommand, into DIR (created if missing). They say what `--help` says: both \
            come from the same definitions. Nothing is sent to Redis.",
        after_help = INSTALL_HELP
    )]
    Man(ManArgs),

    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell) on stdout.
    #[command(
        long_about = "Print the completion script for SHELL (bash, zsh, fish, elvish, \
            powershell) on stdout: subcommands, options and their values complete on TAB. \
            Nothing is sent to Redis.",
        after_help = INSTALL_HELP
    )]
    Completions(CompletionsArgs),
}

/// The text after `man --help` and `completions --help`: where the files go.
const INSTALL_HELP: &str = "\
Installing them (as root, where man and the shells look by default):
  lockset man /usr/local/share/man/man1
  lockset completions bash > /usr/local/share/bash-completion/completions/lockset
  lockset completions zsh > /usr/local/share/zsh/site-functions/_lockset
  lockset completions fish > /usr/local/share/fish/vendor_completions.d/lockset.fish

Exit status:
  0   success
  64  bad usage
  71  man: cannot write DIR; completions: cannot print";

/// The subcommands that work on locks in Redis.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Run a command while holding every KEY; release them when it exits.
    #[command(
        long_about = "Run a command while holding every KEY; release them when it exits.\n\n\
            Obtains all keys at once (all or nothing), waiting up to --wait for a holder to \
            let go. The command runs in its own process group with LOCKSET_KEYS (the keys, \
            space-separated), LOCKSET_KEYS_JSON (the keys as a JSON array, unambiguous for \
            keys with spaces) and, with --fencing, LOCKSET_FENCING_TOKEN in its environment. \
            A watchdog refreshes the lock every third of --ttl while the command runs. When \
            the command exits, the lock is released and lockset exits with the command's \
            status (128+N when it died by signal N).\n\n\
            If the lock is lost while the command runs (it expired because Redis was \
            unreachable, or someone deleted or took it over), the command's process group \
            gets SIGTERM at once and SIGKILL after --kill-after, and lockset exits 70 saying \
            why.\n\n\
            SIGINT, SIGTERM and SIGHUP sent to lockset are forwarded to the command's process \
            group, followed by SIGCONT so that a stopped command acts on them; the lock is \
            released once the command has exited. A signal ignored when lockset starts \
            (SIGHUP under nohup, SIGINT in a background job) stays ignored, for the command \
            too.\n\n\
            Job control: SIGTSTP (Ctrl-Z), SIGTTIN and SIGTTOU stop the command's process \
            group, then lockset (nothing refreshes the lock while it is stopped). On SIGCONT \
            (fg, bg) lockset refreshes the lock before the command goes on; if the lock was \
            lost meanwhile, the command gets SIGTERM (and SIGCONT to act on it), SIGKILL \
            after --kill-after, and lockset exits 70. A command that stops by itself (say, \
            reading the terminal) is reported on stderr; it keeps the lock while stopped.\n\n\
            `kill -9` and `kill -STOP` of lockset cannot be caught: the command keeps \
            running, and the lock expires with its TTL (no later than --ttl after the last \
            refresh); a lockset continued after SIGSTOP ends the command at once if the lock \
            expired meanwhile. Use --fencing where that matters.\n\n\
            The command is not in the terminal's foreground process group: it cannot read \
            from the terminal (run interactive programs some other way).",
        after_help = AFTER_HELP
    )]
    #[command(override_usage = "lockset run [OPTIONS] <KEY>... -- <COMMAND>...")]
    Run(RunArgs),

    /// Obtain every KEY and print the lock's token on stdout; the lock stays held until
    /// released or its TTL runs out.
    #[command(
        long_about = "Obtain every KEY and print the lock's token on stdout (one line; with \
            --fencing a second line with the fencing token).\n\n\
            The lock stays held until `lockset release --token` or until its TTL runs out: \
            nothing keeps it alive, so call `lockset refresh --token` before the TTL ends \
            when the work takes longer. Keep the token secret: whoever has it owns the lock.",
        after_help = AFTER_HELP
    )]
    #[command(override_usage = "lockset acquire [OPTIONS] <KEY>...")]
    Acquire(AcquireArgs),

    /// Extend a lock obtained with `acquire` to --ttl, if it is still held by TOKEN.
    #[command(
        long_about = "Extend a lock obtained with `acquire` to --ttl, if every KEY is still \
            held by TOKEN.\n\n\
            Exits 70 when the lock is not held by TOKEN any more (it expired or was taken \
            over): the work it protects should stop. The holder's metadata is kept unless \
            --metadata is given.",
        after_help = AFTER_HELP
    )]
    #[command(override_usage = "lockset refresh [OPTIONS] --token <TOKEN> <KEY>...")]
    Refresh(RefreshArgs),

    /// Release a lock obtained with `acquire`, if it is still held by TOKEN.
    #[command(
        long_about = "Release a lock obtained with `acquire`: delete every KEY, only if every \
            KEY is still held by TOKEN, and wake whoever waits for it.\n\n\
            Exits 70 when the lock was not held by TOKEN any more (it expired or was taken \
            over): nothing is deleted then.",
        after_help = AFTER_HELP
    )]
    #[command(override_usage = "lockset release [OPTIONS] --token <TOKEN> <KEY>...")]
    Release(ReleaseArgs),

    /// Show whether each KEY is free or held: the holder's metadata and remaining TTL (every
    /// holder of a shared or counted key), never a token.
    #[command(
        long_about = "Show whether each KEY is free or held: the holder's metadata and \
            remaining TTL (every holder of a key held shared or as counted permits), never \
            a token. Exits 0 whatever the keys' state.\n\n\
            Below each key, the waiters queued for it (fair waiting), first come first: each \
            with its metadata, how long it has waited and what is left of its lease; on a \
            Redlock quorum, per master. Reading only: nothing is written, no queue joined.\n\n\
            With --json, prints one JSON object: {\"keys\": [{\"key\", \"state\" (\"free\", \
            \"held\" or \"foreign\" for a value lockset did not write, \"wrong_type\"), \
            \"mode\" (\"exclusive\", \"shared\", \"permits\" or null), \"limit\" (permits), \
            \"metadata\" (an exclusive holder's), \"ttl_ms\" (the longest left; null \
            without expiry), \"held_on\", \"nodes\", \"holders\": [{\"metadata\", \
            \"ttl_ms\", \"node\"}], \"waiters\": [{\"metadata\", \"waited_ms\", \
            \"lease_ms\" (null: gone, about to be dropped), \"keys\", \"node\"}], \
            \"writer_waiting_ms\" (what is left of a writer's mark that keeps new shared and \
            counted holders out; null: none), \"queue_readable\" (false: the ACL covers the \
            key, not its queue's names; waiters unknown)}]}; held_on counts the Redlock masters holding the \
            key (1 of 1 otherwise), node is the master a holder holds or a waiter queues on (0 \
            otherwise).",
        after_help = AFTER_HELP
    )]
    #[command(override_usage = "lockset status [OPTIONS] <KEY>...")]
    Status(StatusArgs),
}

impl LockCommand {
    /// The subcommand's name, as typed.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Run(_) => "run",
            Self::Acquire(_) => "acquire",
            Self::Refresh(_) => "refresh",
            Self::Release(_) => "release",
            Self::Status(_) => "status",
        }
    }

    /// Puts `run --key` values before the KEY arguments: from then on, `keys` holds them all.
    pub(crate) fn gather_keys(&mut self) {
        if let Self::Run(run) = self {
            let mut keys = std::mem::take(&mut run.key);
            keys.append(&mut run.keys);
            run.keys = keys;
        }
    }
}

/// Options of `run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// How to obtain the lock.
    #[command(flatten)]
    pub(crate) obtain: ObtainArgs,

    /// Send SIGKILL to the command's process group this long after SIGTERM, when the lock
    /// was lost and the command has not exited.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::non_negative, allow_hyphen_values = true)]
    pub(crate) kill_after: Duration,

    /// A key to hold, also one that starts with '-' (`--key -k` or `--key=-k`); these come
    /// before the KEY arguments. Repeat it for more.
    #[arg(long = "key", value_name = "KEY", allow_hyphen_values = true)]
    pub(crate) key: Vec<String>,

    /// The keys to hold: all of them, or none.
    #[arg(value_name = "KEY", required_unless_present = "key")]
    pub(crate) keys: Vec<String>,

    /// The command to run and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    pub(crate) command: Vec<String>,
}

/// Options of `acquire`.
#[derive(Debug, Args)]
pub(crate) struct AcquireArgs {
    /// How to obtain the lock.
    #[command(flatten)]
    pub(crate) obtain: ObtainArgs,

    /// The keys to hold: all of them, or none.
    #[arg(value_name = "KEY", required = true)]
    pub(crate) keys: Vec<String>,
}

/// How `run` and `acquire` obtain a lock.
#[derive(Debug, Args)]
pub(crate) struct ObtainArgs {
    /// How long the lock lives without a refresh: 500ms, 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::ttl, allow_hyphen_values = true)]
    pub(crate) ttl: Duration,

    /// How long to wait for a held lock; 0 fails at once, like flock -n. Waiters wake as
    /// soon as the holder releases (on a single server).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = duration::non_negative, allow_hyphen_values = true)]
    pub(crate) wait: Duration,

    /// Text stored with the lock for humans and `lockset status`. [default: HOST:PID]
    #[arg(long, value_name = "TEXT")]
    pub(crate) metadata: Option<String>,

    /// Mint a fencing token (a number that grows with every obtain) from a counter next to
    /// the first key: `run` passes it as LOCKSET_FENCING_TOKEN, `acquire` prints it on a
    /// second line. Not available with a Redlock quorum, nor with --shared or --permits
    /// (tokens order holders that hold a key alone).
    #[arg(long, conflicts_with_all = ["shared", "permits"])]
    pub(crate) fencing: bool,

    /// Exit with this status when the lock is held by someone else after --wait.
    #[arg(long, value_name = "N", default_value_t = 75, value_parser = exit_status, allow_hyphen_values = true)]
    pub(crate) conflict_exit_code: u8,

    /// How the keys are held: alone (the default), shared, or as one of N permits.
    #[command(flatten)]
    pub(crate) mode: ModeArgs,
}

/// How `run` and `acquire` hold their keys: alone by default, like `flock -x`.
#[derive(Debug, Args)]
pub(crate) struct ModeArgs {
    /// Hold the keys shared, like flock -s: any number of shared holders at once, none while
    /// a holder without --shared has them (and once one waits for them, no new shared
    /// holder until it had its turn, or gave up: on a cluster or a Redlock quorum, until
    /// its --ttl ran out). `refresh` and `release` find the mode by the token: they take
    /// neither option.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,

    /// Hold one of N permits on each key: at most N holders at once, say
    /// `--permits 3` for "no more than 3 deploys". Every holder of a key must give the same
    /// N: a key held shared, or as permits under another N, exits 65. On a Redlock quorum
    /// a permit counts only where more masters agree than a majority (all of 3 for N = 2;
    /// see the library's guide, "shared and counted locks").
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) permits: Option<u32>,
}

impl ModeArgs {
    /// The library's mode for these options.
    pub(crate) fn mode(&self) -> lockset::Mode {
        match (self.shared, self.permits) {
            (_, Some(limit)) => lockset::Mode::Permit { limit },
            (true, None) => lockset::Mode::Shared,
            (false, None) => lockset::Mode::Exclusive,
        }
    }
}

/// Options of `refresh`.
#[derive(Debug, Args)]
pub(crate) struct RefreshArgs {
    /// The token `lockset acquire` printed.
    #[arg(long, value_name = "TOKEN", required = true, allow_hyphen_values = true, value_parser = non_empty_token)]
    pub(crate) token: String,

    /// The new time to live, from now: 500ms, 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::ttl, allow_hyphen_values = true)]
    pub(crate) ttl: Duration,

    /// Replace the metadata stored with the lock. [default: keep the holder's]
    #[arg(long, value_name = "TEXT")]
    pub(crate) metadata: Option<String>,

    /// The lock's keys, as given to `acquire`.
    #[arg(value_name = "KEY", required = true)]
    pub(crate) keys: Vec<String>,
}

/// Options of `release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// The token `lockset acquire` printed.
    #[arg(long, value_name = "TOKEN", required = true, allow_hyphen_values = true, value_parser = non_empty_token)]
    pub(crate) token: String,

    /// The lock's keys, as given to `acquire`.
    #[arg(value_name = "KEY", required = true)]
    pub(crate) keys: Vec<String>,
}

/// Options of `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print one JSON object instead of a line per key.
    #[arg(long)]
    pub(crate) json: bool,

    /// Show the status again every INTERVAL (--watch=2s; default 1s) until interrupted: redrawn on a
    /// terminal, else a line log (each round's lines after a time stamp; with --json, a
    /// JSON object per line, its time in "time").
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        default_missing_value = "1s",
        value_parser = duration::positive,
        require_equals = true
    )]
    pub(crate) watch: Option<Duration>,

    /// The keys to look at.
    #[arg(value_name = "KEY", required = true)]
    pub(crate) keys: Vec<String>,
}

/// Options of `man`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// The directory to write the man pages into, such as /usr/local/share/man/man1.
    #[arg(value_name = "DIR")]
    pub(crate) dir: std::path::PathBuf,
}

/// Options of `completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    pub(crate) shell: clap_complete::Shell,
}

/// An exit status: 0 to 255.
fn exit_status(text: &str) -> Result<u8, String> {
    text.trim()
        .parse()
        .map_err(|_| "an exit status is a whole number from 0 to 255".to_owned())
}

/// A token must have at least one character.
fn non_empty_token(token: &str) -> Result<String, String> {
    if token.is_empty() {
        return Err("the token is empty".to_owned());
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn options_go_before_or_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "lockset",
            "--redis",
            "redis://a/",
            "run",
            "-v",
            "--ttl",
            "5s",
            "k",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(cli.global.redis, ["redis://a/"]);
        assert_eq!(cli.global.verbose, 1);
        let Command::Lock(LockCommand::Run(run)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.obtain.ttl, Duration::from_secs(5));
        assert_eq!(run.keys, ["k"]);
        assert_eq!(run.command, ["true"]);
    }

    #[test]
    fn urls_split_at_the_commas_that_begin_another_url() {
        let given = [
            "redis://a/,rediss://b:6380/, redis://c/".to_owned(),
            "redis://:p,w@d/".to_owned(),
        ];
        assert_eq!(
            split_urls(&given),
            [
                "redis://a/",
                "rediss://b:6380/",
                " redis://c/",
                "redis://:p,w@d/"
            ]
        );
        // What is not a URL is left whole, for the URL check to refuse.
        assert_eq!(split_urls(&["a,,b".to_owned()]), ["a,,b"]);
    }

    #[test]
    fn the_command_keeps_its_own_options() {
        let cli =
            Cli::try_parse_from(["lockset", "run", "k", "--", "ls", "-l", "--", "-v"]).unwrap();
        let Command::Lock(LockCommand::Run(run)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.command, ["ls", "-l", "--", "-v"]);
        assert_eq!(cli.global.verbose, 0);
    }
}
