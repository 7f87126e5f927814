//! Obtaining a lock for `run` and `acquire`: waiting up to `--wait`, showing who holds it
//! meanwhile, giving up cleanly on a signal, and naming the holder on a conflict.

use std::convert::Infallible;
use std::pin::pin;
use std::sync::OnceLock;
use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::{Jitter, Lock, Mode, Options, Retry};

use crate::cli::ObtainArgs;
use crate::connect::Redis;
use crate::exit::{self, Failure};
use crate::holder;
use crate::signals::{Event, Signals};
use crate::ui::{Ui, Waiting};
use crate::{duration, identity};

/// The shortest and longest pause between two attempts while waiting. On a single server a
/// release event wakes a waiter at once and the holder's expiry is watched, so polling is
/// only the fallback; a Redlock quorum and a cluster rely on it.
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(500);

/// How often the waiting line looks at the holder.
const SHOW_EVERY: Duration = Duration::from_millis(500);
/// Nothing is shown for a lock obtained this quickly.
const SHOW_AFTER: Duration = Duration::from_millis(150);

/// When the command started: `--wait` counts from here, connecting to Redis included, so
/// that time spent reaching Redis comes off the wait for the lock (the first connection
/// attempt has its own limit, about 2 s, even with a shorter wait). `main` reads it first.
pub(crate) fn started() -> tokio::time::Instant {
    static STARTED: OnceLock<tokio::time::Instant> = OnceLock::new();
    *STARTED.get_or_init(tokio::time::Instant::now)
}

/// When a wait of `wait` (`--wait`) ends.
pub(crate) fn wait_ends(wait: Duration) -> tokio::time::Instant {
    started() + wait
}

/// The options for obtaining per the command line.
pub(crate) fn options(args: &ObtainArgs) -> Options {
    let metadata = args.metadata.clone().unwrap_or_else(identity::host_pid);
    let mut options = Options::default().metadata(metadata);
    if !args.wait.is_zero() {
        let poll = Retry::exponential(POLL_MIN, POLL_MAX).jitter(Jitter::Equal);
        options = options.retry(poll).deadline(wait_ends(args.wait));
    }
    if args.fencing {
        options = options.fencing();
    }
    options
}

/// Obtains `keys`, waiting up to `--wait`. SIGINT, SIGTERM or SIGHUP stops the wait:
/// `lockset` then exits 128 + the signal number, as if the signal had killed it, once any
/// half-made lock is cleaned up. A stop signal stops `lockset` meanwhile.
pub(crate) async fn obtain<C>(
    redis: &Redis<C>,
    keys: &[String],
    args: &ObtainArgs,
    ui: Ui,
    signals: &mut Signals,
) -> Result<Lock, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let options = options(args);
    let mode = args.mode.mode();
    let mut waiting = if args.wait.is_zero() {
        Waiting::Silent
    } else {
        ui.waiting()
    };
    let mut obtaining = pin!(redis.client.obtain_multi(
        keys.iter().map(|key| (key, mode)),
        args.ttl,
        &options
    ));
    let obtained = loop {
        tokio::select! {
            obtained = &mut obtaining => break obtained,
            never = show_waiting(redis, keys, mode, &mut waiting) => match never {},
            event = signals.next() => match event {
                Event::End(signal) => {
                    waiting.finish();
                    tracing::info!(target: crate::ui::LOG, ?signal, "stopped waiting");
                    return Err(Failure::silent(exit::of_signal(signal as i32)));
                }
                // Nothing runs yet: stop as the signal's default disposition would.
                Event::Stop(signal) => {
                    tracing::info!(target: crate::ui::LOG, ?signal, "stopping");
                    if let Err(err) = signals.stop_self().await {
                        tracing::warn!(target: crate::ui::LOG, %err, "cannot stop lockset");
                    }
                }
                Event::Continue | Event::Child => {}
            }
        }
    };
    waiting.finish();
    match obtained {
        Ok(lock) => {
            tracing::info!(target: crate::ui::LOG, keys = keys.len(), "obtained");
            Ok(lock)
        }
        Err(err) if exit::is_conflict(&err) => Err(conflict(redis, keys, args).await),
        Err(err) => Err(Failure::from_error(&err)),
    }
}

/// The failure for a lock held by someone else: one line naming the held key, its holder's
/// metadata and time left.
async fn conflict<C>(redis: &Redis<C>, keys: &[String], args: &ObtainArgs) -> Failure
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let within = match args.wait.is_zero() {
        true => String::new(),
        false => format!(" within {}", humantime::format_duration(args.wait)),
    };
    let holder = match holder::first_held(&redis.nodes, keys, args.mode.mode()).await {
        Ok(Some(key)) => key.describe(),
        Ok(None) => "held by another owner (free again now)".to_owned(),
        Err(err) => format!("held by another owner ({err})"),
    };
    Failure::new(
        args.conflict_exit_code,
        format!("lock not obtained{within}: {holder}"),
    )
}

/// Keeps the waiting line up to date; never returns.
async fn show_waiting<C>(
    redis: &Redis<C>,
    keys: &[String],
    mode: Mode,
    waiting: &mut Waiting,
) -> Infallible
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if waiting.is_silent() {
        return std::future::pending::<Infallible>().await;
    }
    tokio::time::sleep(SHOW_AFTER).await;
    loop {
        match holder::first_held(&redis.nodes, keys, mode).await {
            Ok(Some(key)) => {
                let by = key
                    .holders_in_brief()
                    .unwrap_or_else(|| "another owner".to_owned());
                let left = key
                    .ttl()
                    .map(|ttl| format!(", {} left)", duration::show(ttl)))
                    .unwrap_or_else(|| ")".to_owned());
                waiting.update(&format!("waiting for {:?} (held by {by}", key.name), &left);
            }
            Ok(None) => waiting.update("obtaining", ""),
            Err(err) => waiting.update(&format!("waiting: {err}"), ""),
        }
        tokio::time::sleep(SHOW_EVERY).await;
    }
}
