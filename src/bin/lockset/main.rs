//! `lockset`: a distributed flock(1) on Redis, built on the `lockset` library.
//!
//! `lockset run KEY... -- COMMAND` holds every key while the command runs; `acquire`,
//! `refresh` and `release` hold a lock across the steps of a shell script; `status` shows
//! who holds what; `man` and `completions` write its man pages and shell completions. See
//! `lockset --help` and the guide's command-line page (`lockset::guide::command_line`).

mod child;
mod cli;
mod connect;
mod duration;
mod exit;
mod holder;
mod identity;
mod manual;
mod obtain;
mod run;
mod signals;
mod status;
mod stdio;
mod token;
mod ui;
mod validate;

use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory as _;
use clap::error::ErrorKind;
use lockset::redis::aio::ConnectionLike;

use crate::cli::{Cli, Command, Global, LockCommand};
use crate::connect::{Redis, Target};
use crate::exit::{Failure, USAGE};
use crate::signals::Signals;
use crate::ui::Ui;
use crate::validate::Use;

/// The pause between two connections to a Sentinel deployment that is not ready.
const CONNECT_PAUSE: Duration = Duration::from_millis(200);

/// How long a finishing `lockset` waits for the library's background work.
const SETTLE: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    obtain::started();
    signals::shield_writes();
    let mut cli = match Cli::parse_args() {
        Ok(cli) => cli,
        Err(err) => return ExitCode::from(usage(&err)),
    };
    cli.global.split_urls();
    let ui = Ui::new(cli.global.quiet, cli.global.verbose);
    let code = match cli.command {
        Command::Lock(mut command) => {
            command.gather_keys();
            ui.init_logs();
            let outcome = lock(&cli.global, &command, ui);
            exit_code(outcome, command.name(), ui)
        }
        Command::Man(args) => exit_code(manual::man(&args.dir), "man", ui),
        Command::Completions(args) => exit_code(manual::completions(args.shell), "completions", ui),
    };
    ExitCode::from(code)
}

/// Runs a subcommand that works on locks, on a runtime of its own.
fn lock(global: &Global, command: &LockCommand, ui: Ui) -> Result<u8, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(execute(global, command, ui)),
        Err(err) => Err(Failure::new(exit::SYSTEM, format!("cannot start: {err}"))),
    }
}

/// The exit status of the subcommand `name`, after saying why it failed.
fn exit_code(outcome: Result<u8, Failure>, name: &str, ui: Ui) -> u8 {
    match outcome {
        Ok(code) => code,
        Err(Failure::Usage(message)) => usage_in(name, &message),
        Err(Failure::Exit { code, message, .. }) => {
            if let Some(message) = message {
                ui.say(&message);
            }
            code
        }
    }
}

/// Checks the input, connects, and runs the subcommand.
async fn execute(global: &Global, command: &LockCommand, ui: Ui) -> Result<u8, Failure> {
    if matches!(command, LockCommand::Acquire(_) | LockCommand::Status(_))
        && stdio::stdout_was_closed()
    {
        return Err(Failure::new(
            exit::SYSTEM,
            "stdout is closed: nobody could read what this prints (nothing was sent to Redis)",
        ));
    }
    let sentinel = !global.sentinel.is_empty();
    if !sentinel && global.master.is_some() {
        return Err(Failure::Usage(
            "--master names the primary the --sentinel URLs watch: give them too".to_owned(),
        ));
    }
    if sentinel && (global.cluster || given_on_command_line(&global.redis)) {
        return Err(Failure::Usage(
            "--sentinel finds the primary itself: give it without --redis and --cluster".to_owned(),
        ));
    }
    let urls = connect::urls(&global.redis).map_err(Failure::Usage)?;
    let target = validate::Target {
        urls: if sentinel { 1 } else { urls.len() },
        cluster: global.cluster,
    };
    check(command, target).map_err(Failure::Usage)?;
    let tls_urls = match sentinel {
        true => global
            .sentinel
            .iter()
            .chain(&global.master)
            .any(|url| connect::is_tls_url(url)),
        false => urls.iter().any(|url| connect::is_tls_url(url)),
    };
    let client_cert = global.tls_cert.as_deref().zip(global.tls_key.as_deref());
    let tls = connect::tls(global.tls_ca_cert.as_deref(), client_cert, tls_urls)?;
    let plan = match sentinel {
        true => connect::sentinel_plan(
            &global.sentinel,
            global.master.as_deref(),
            global.replicas,
            global.restart_grace,
            tls.map(|(tls, _)| tls),
        )?,
        false => connect::plan(&urls, global.cluster, global.replicas, tls)?,
    };
    match connect_within(&plan, wait_of(command)).await? {
        Target::Single(redis) => dispatch(&redis, command, ui, None).await,
        Target::Cluster(redis) => dispatch(&redis, command, ui, None).await,
        Target::Sentinel(redis) => {
            let sentinels = redis.nodes.first().cloned();
            dispatch(&redis, command, ui, sentinels.as_ref()).await
        }
    }
}

/// How long the command may wait for its lock (`--wait`), zero for the others.
fn wait_of(command: &LockCommand) -> Duration {
    match command {
        LockCommand::Run(args) => args.obtain.wait,
        LockCommand::Acquire(args) => args.obtain.wait,
        _ => Duration::ZERO,
    }
}

/// Connects per `plan`. A failure that may pass (a server not up yet or unreachable for now;
/// behind Sentinel also no majority of the sentinels agreeing yet, the primary being
/// replaced, too few replicas for now; not a login or certificate refused) is tried again
/// every [`CONNECT_PAUSE`] within `wait`: `--wait` covers reaching Redis too. The first try
/// takes as long as it takes (its own limits bound it); a later one ends with the wait, with
/// the last failure.
async fn connect_within(plan: &connect::Plan, wait: Duration) -> Result<Target, Failure> {
    let deadline = obtain::wait_ends(wait);
    let mut failed = match connect::connect(plan.clone()).await {
        Err(failure) if failure.may_pass() => failure,
        outcome => return outcome,
    };
    while tokio::time::Instant::now() + CONNECT_PAUSE < deadline {
        tracing::info!(target: crate::ui::LOG, failure = ?failed, "Redis is not ready; trying again");
        tokio::time::sleep(CONNECT_PAUSE).await;
        match tokio::time::timeout_at(deadline, connect::connect(plan.clone())).await {
            Ok(Err(failure)) if failure.may_pass() => failed = failure,
            Ok(outcome) => return outcome,
            Err(_) => break,
        }
    }
    Err(failed)
}

/// Whether `redis` came from the command line rather than `LOCKSET_REDIS` (a default that
/// `--sentinel` overrides).
fn given_on_command_line(redis: &[String]) -> bool {
    let from_env = std::env::var("LOCKSET_REDIS").unwrap_or_default();
    !redis.is_empty() && redis != cli::split_urls(&[from_env])
}

/// Everything about the input that can be checked without Redis.
fn check(command: &LockCommand, target: validate::Target) -> Result<(), String> {
    match command {
        LockCommand::Run(args) => {
            validate::keys(&args.keys, target, Use::Lock)?;
            validate::command(&args.command)?;
            if args.obtain.fencing {
                validate::fencing(&args.keys, target)?;
            }
            Ok(())
        }
        LockCommand::Acquire(args) => {
            validate::keys(&args.keys, target, Use::Lock)?;
            if args.obtain.fencing {
                validate::fencing(&args.keys, target)?;
            }
            Ok(())
        }
        LockCommand::Refresh(args) => validate::keys(&args.keys, target, Use::Lock),
        LockCommand::Release(args) => validate::keys(&args.keys, target, Use::Lock),
        LockCommand::Status(args) => {
            // `--watch 2s KEY` would look at a key named "2s".
            if let (Some(_), Some(first)) = (args.watch, args.keys.first())
                && duration::positive(first).is_ok()
            {
                return Err(format!(
                    "{first:?} reads as an interval, not a key: write --watch={first}"
                ));
            }
            validate::keys(&args.keys, target, Use::Look)
        }
    }
}

/// Runs the subcommand on a connected backend.
async fn dispatch<C>(
    redis: &Redis<C>,
    command: &LockCommand,
    ui: Ui,
    sentinels: status::Sentinels<'_>,
) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let outcome = match command {
        LockCommand::Run(args) => run::run(redis, args, ui, &mut listen()?).await,
        LockCommand::Acquire(args) => token::acquire(redis, args, ui, &mut listen()?).await,
        LockCommand::Refresh(args) => token::refresh(redis, args).await,
        LockCommand::Release(args) => token::release(redis, args).await,
        LockCommand::Status(args) => status::status(redis, args, sentinels).await,
    };
    settle(redis).await;
    outcome
}

/// Lets the library's background work finish before the process exits, for at most
/// [`SETTLE`]: the clean-up of an obtain a signal cancelled, and on a quorum the slower
/// masters' share of an obtain, refresh or release that returned once a majority answered.
async fn settle<C>(redis: &Redis<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let idle = redis.client.background_idle();
    if tokio::time::timeout(SETTLE, idle).await.is_err() {
        tracing::warn!(target: crate::ui::LOG,
            tasks = redis.client.background_tasks(),
            "exiting with background work unfinished"
        );
    }
}

/// Catches SIGINT, SIGTERM, SIGHUP and the job-control signals from here on, those not
/// ignored when `lockset` started (before, they end or stop `lockset` as usual: it holds
/// nothing yet).
fn listen() -> Result<Signals, Failure> {
    Signals::listen()
        .map_err(|err| Failure::new(exit::SYSTEM, format!("cannot catch signals: {err}")))
}

/// Prints clap's message; help and version exit 0, errors exit 64 (EX_USAGE, not clap's 2).
fn usage(err: &clap::Error) -> u8 {
    let _ = err.print();
    if missing_command(err) {
        // `lockset run job echo hi` reads every word as a key.
        eprintln!("\ntip: put the command after `--`: lockset run KEY... -- COMMAND [ARG]...");
    }
    match err.use_stderr() {
        true => USAGE,
        false => 0,
    }
}

/// Whether `err` says that `run` was given no command.
fn missing_command(err: &clap::Error) -> bool {
    err.kind() == ErrorKind::MissingRequiredArgument && err.to_string().contains("<COMMAND>")
}

/// Prints `message` as clap does, with the usage of the subcommand `name`, and returns 64.
fn usage_in(name: &str, message: &str) -> u8 {
    let mut cli = Cli::command();
    cli.build();
    let err = match cli.find_subcommand_mut(name) {
        Some(sub) => sub.error(ErrorKind::ValueValidation, message),
        None => cli.error(ErrorKind::ValueValidation, message),
    };
    usage(&err)
}
