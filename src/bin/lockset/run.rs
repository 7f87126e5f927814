//! `lockset run`: hold the keys while a command runs.
//!
//! Invariant: the command runs only while the lock is valid. It starts only after a check
//! of the lock's validity; a lost lock ends it (SIGTERM, then SIGKILL); and job control stops
//! it before `lockset` itself stops (nothing refreshes the lock then), and continues it only
//! after the lock was checked again on the way back: when that finds the lock lost, the
//! command is continued only to act on SIGTERM.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::{Guard, LostSignal, Mode, Options};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::child::Command;
use crate::cli::RunArgs;
use crate::connect::Redis;
use crate::exit::{self, Failure, LOST};
use crate::holder::{self, Loss};
use crate::obtain;
use crate::signals::{Event, Signals};
use crate::ui::Ui;

/// How long to spend finding out why a lock was lost.
const EXPLAIN_WITHIN: Duration = Duration::from_secs(2);
/// How long to wait for the command to be seen stopped before `lockset` stops itself.
const STOP_WITHIN: Duration = Duration::from_millis(500);

/// How the command ended.
enum Ended {
    /// It exited by itself (perhaps after a forwarded signal).
    Exited(io::Result<ExitStatus>),
    /// The lock was lost: while the command ran, or while it was stopped with `lockset`.
    Lost(Phase),
}

/// When the lock was found lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// While the command ran (or was stopped on its own).
    Running,
    /// While `lockset` and the command were stopped (job control), on the way back.
    Stopped,
}

/// Obtains the lock, runs the command under the watchdog, releases, and returns the exit
/// status.
pub(crate) async fn run<C>(
    redis: &Redis<C>,
    args: &RunArgs,
    ui: Ui,
    signals: &mut Signals,
) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let lock = obtain::obtain(redis, &args.keys, &args.obtain, ui, signals).await?;
    // The space-separated list is ambiguous for keys with spaces; the JSON array is not.
    let mut env = vec![
        ("LOCKSET_KEYS", args.keys.join(" ")),
        (
            "LOCKSET_KEYS_JSON",
            serde_json::json!(args.keys).to_string(),
        ),
    ];
    if let Some(fence) = lock.fencing_token() {
        env.push(("LOCKSET_FENCING_TOKEN", fence.to_string()));
    }
    let guard = lock.keep_alive();
    // `lockset` may have been stopped (SIGSTOP cannot be caught) since the lock was obtained.
    if guard.valid_until() <= Instant::now() {
        release(guard, ui).await;
        return Err(Failure::new(
            LOST,
            "the lock's validity ran out before the command started; it was not started",
        ));
    }
    let mut command = match Command::spawn(&args.command, &env) {
        Ok(command) => command,
        Err(err) => {
            release(guard, ui).await;
            let program = args.command.first().map_or("", String::as_str);
            return Err(Failure::cannot_run(program, &err));
        }
    };
    tracing::info!(target: crate::ui::LOG, command = ?args.command, "started");
    let lost = guard.lost_signal();
    let supervisor = Supervisor {
        guard: &guard,
        lost: &lost,
        ttl: args.obtain.ttl,
        ui,
    };
    match supervisor.supervise(&mut command, signals).await {
        Ended::Exited(status) => {
            let code = match status {
                Ok(status) => exit::of_status(status),
                Err(err) => {
                    release(guard, ui).await;
                    return Err(Failure::new(
                        exit::SYSTEM,
                        format!("cannot wait for the command: {err}"),
                    ));
                }
            };
            finish(guard, code, ui).await
        }
        Ended::Lost(phase) => {
            tracing::info!(target: crate::ui::LOG, ?phase, "lock lost: stopping the command");
            // Look at the keys while the command stops, before anyone else changes them.
            let ((_, killed), why) = tokio::join!(
                command.terminate(args.kill_after),
                explain_loss(redis, &args.keys, guard.token(), args.obtain.mode.mode())
            );
            let how = match killed {
                true => format!(
                    "SIGTERM, then SIGKILL after {}",
                    humantime::format_duration(args.kill_after)
                ),
                false => "SIGTERM".to_owned(),
            };
            // Only to stop the watchdog: nothing of ours is left to release, and Redis may
            // be out of reach.
            let _ = tokio::time::timeout(EXPLAIN_WITHIN, guard.release()).await;
            let when = match phase {
                Phase::Running => "while the command ran",
                Phase::Stopped => "while lockset and the command were stopped",
            };
            Err(Failure::new(
                LOST,
                format!("lock lost {when}: {why}; stopped the command with {how}"),
            ))
        }
    }
}

/// What watches the command: the lock, its lost signal, and how to talk to people.
struct Supervisor<'a, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    guard: &'a Guard<C>,
    lost: &'a LostSignal,
    /// The lock's TTL, for the refresh on the way back from a stop.
    ttl: Duration,
    ui: Ui,
}

impl<C> Supervisor<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Waits for the command to exit or the lock to be lost; forwards signals to the
    /// command, and stops and continues it with `lockset` (job control).
    async fn supervise(&self, command: &mut Command, signals: &mut Signals) -> Ended {
        // The signal that stopped the command, once said.
        let mut told_stopped = None;
        loop {
            tokio::select! {
                // A command that exited as the lock was lost has finished its work: report
                // its status, not the loss.
                biased;
                status = command.wait() => return Ended::Exited(status),
                () = self.lost.lost() => return Ended::Lost(Phase::Running),
                event = signals.next() => match event {
                    Event::End(signal) => {
                        tracing::info!(target: crate::ui::LOG, ?signal, "forwarding to the command");
                        command.forward(signal);
                    }
                    Event::Stop(signal) => {
                        if !self.stop_and_resume(command, signals, signal).await {
                            return Ended::Lost(Phase::Stopped);
                        }
                    }
                    // Continued after an uncatchable SIGSTOP, or sent by hand: the command
                    // may go on too, if the lock is still valid.
                    Event::Continue if self.lost.is_lost() => return Ended::Lost(Phase::Running),
                    Event::Continue => command.resume(),
                    Event::Child => told_stopped = self.tell_stopped(command, told_stopped),
                }
            }
        }
    }

    /// Stops the command's group, then `lockset`; once continued, checks the lock before
    /// the command may run again. False when the lock was lost meanwhile: the command is
    /// still stopped then.
    async fn stop_and_resume(
        &self,
        command: &Command,
        signals: &mut Signals,
        signal: Signal,
    ) -> bool {
        tracing::info!(target: crate::ui::LOG, ?signal, "stopping the command, then lockset");
        command.stop();
        command.until_stopped(STOP_WITHIN).await;
        if let Err(err) = signals.stop_self().await {
            tracing::warn!(target: crate::ui::LOG, %err, "cannot stop lockset");
        }
        tracing::info!(target: crate::ui::LOG, "continued: checking the lock before the command goes on");
        if !self.still_held().await {
            return false;
        }
        command.resume();
        true
    }

    /// Whether the lock may be used on: refreshed at once, or at least still valid when
    /// Redis does not answer (the watchdog keeps trying, and the lost signal fires when the
    /// validity runs out).
    async fn still_held(&self) -> bool {
        let Some(left) = self
            .guard
            .valid_until()
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
        else {
            return false;
        };
        let refreshed =
            tokio::time::timeout(left, self.guard.refresh(self.ttl, &Options::default())).await;
        match refreshed {
            Ok(Ok(())) => {}
            Ok(Err(err)) if err.is_not_held() => return false,
            Ok(Err(err)) => {
                tracing::warn!(target: crate::ui::LOG, %err, "refresh after a stop failed")
            }
            Err(_) => {
                tracing::warn!(target: crate::ui::LOG, "refresh after a stop did not finish in time")
            }
        }
        self.guard.valid_until() > Instant::now()
    }

    /// Says on stderr, once per stop, that the command stopped by itself (or was stopped by
    /// the terminal): it goes on holding the lock. Returns what was said.
    fn tell_stopped(&self, command: &Command, told: Option<Signal>) -> Option<Signal> {
        let stopped = command.stopped_by();
        if let Some(signal) = stopped
            && told != Some(signal)
        {
            let why = match signal {
                Signal::SIGTTIN => " (it read from the terminal, which it cannot)",
                Signal::SIGTTOU => " (it wrote to the terminal or changed its settings)",
                _ => "",
            };
            self.ui.say(&format!(
                "the command is stopped by {}{why} and keeps the lock while stopped: \
                 `kill -CONT -{group}` continues it; `kill {me}` (or Ctrl-C) ends it",
                signal.as_str(),
                group = command.group(),
                me = std::process::id(),
            ));
        }
        stopped
    }
}

/// Releases after the command exited by itself, and returns its status. A lock that turns
/// out not to be ours any more may have been lost while the command ran: that is exit 70,
/// whatever the command said.
async fn finish<C>(guard: Guard<C>, code: u8, ui: Ui) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    match guard.release().await {
        Ok(()) => Ok(code),
        Err(err) if err.is_not_held() => Err(Failure::new(
            LOST,
            format!(
                "the command exited with status {code}, but the lock was not held any more \
                 at release: it was lost while the command ran"
            ),
        )),
        Err(err) => {
            ui.say(&format!(
                "release failed ({err}); the keys expire with their TTL"
            ));
            Ok(code)
        }
    }
}

/// Releases when the command never started.
async fn release<C>(guard: Guard<C>, ui: Ui)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if let Err(err) = guard.release().await {
        ui.say(&format!(
            "release failed ({err}); the keys expire with their TTL"
        ));
    }
}

/// Why a lock was lost, as far as Redis tells within [`EXPLAIN_WITHIN`].
async fn explain_loss<C>(redis: &Redis<C>, keys: &[String], token: &str, mode: Mode) -> String
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let seen = tokio::time::timeout(
        EXPLAIN_WITHIN,
        holder::inspect_all(&redis.nodes, keys, Some(token)),
    )
    .await;
    let keys = match seen {
        Ok(Ok(keys)) => keys,
        Ok(Err(err)) => return format!("Redis unreachable ({err}), the lock's validity ran out"),
        Err(_) => return "Redis did not answer, the lock's validity ran out".to_owned(),
    };
    let Some(loss) = Loss::find(&keys) else {
        return "Redis did not confirm a refresh before the lock's validity ran out".to_owned();
    };
    // Fellow shared or permit holders did not take the lock: they would have let it be.
    let taken = loss.is_taken() && loss.others.holders_keep_out(mode);
    match (taken, redis.nodes.len()) {
        (true, _) => format!("taken over: {}", loss.describe()),
        (false, 1) => format!("{:?} expired or was deleted", loss.others.name),
        (false, _) => format!("lost on a majority: {}", loss.describe()),
    }
}
