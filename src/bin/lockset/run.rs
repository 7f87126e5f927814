//! `lockset run`: hold the keys while a command runs.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::{Guard, LostSignal};

use crate::child::Command;
use crate::cli::RunArgs;
use crate::connect::Redis;
use crate::exit::{self, Failure, LOST};
use crate::holder::{self, State};
use crate::obtain;
use crate::signals::Signals;
use crate::ui::Ui;

/// How long to spend finding out why a lock was lost.
const EXPLAIN_WITHIN: Duration = Duration::from_secs(2);

/// How the command ended.
enum Ended {
    /// It exited by itself (perhaps after a forwarded signal).
    Exited(io::Result<ExitStatus>),
    /// The lock was lost while the command ran.
    Lost,
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
    let mut env = vec![("LOCKSET_KEYS", args.keys.join(" "))];
    if let Some(fence) = lock.fencing_token() {
        env.push(("LOCKSET_FENCING_TOKEN", fence.to_string()));
    }
    let guard = lock.keep_alive();
    let mut command = match Command::spawn(&args.command, &env) {
        Ok(command) => command,
        Err(err) => {
            release(guard, ui).await;
            let program = args.command.first().map_or("", String::as_str);
            return Err(Failure::cannot_run(program, &err));
        }
    };
    tracing::info!(command = ?args.command, "started");
    let lost = guard.lost_signal();
    match supervise(&mut command, &lost, signals).await {
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
        Ended::Lost => {
            tracing::info!("lock lost: stopping the command");
            // Look at the keys while the command stops, before anyone else changes them.
            let ((_, killed), why) = tokio::join!(
                command.terminate(args.kill_after),
                explain_loss(redis, &args.keys, guard.token())
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
            Err(Failure::new(
                LOST,
                format!("lock lost while the command ran: {why}; stopped the command with {how}"),
            ))
        }
    }
}

/// Waits for the command to exit or the lock to be lost, forwarding signals to the command.
async fn supervise(command: &mut Command, lost: &LostSignal, signals: &mut Signals) -> Ended {
    loop {
        tokio::select! {
            // A command that exited as the lock was lost has finished its work: report its
            // status, not the loss.
            biased;
            status = command.wait() => return Ended::Exited(status),
            () = lost.lost() => return Ended::Lost,
            signal = signals.next() => {
                tracing::info!(?signal, "forwarding to the command");
                command.signal(signal);
            }
        }
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
async fn explain_loss<C>(redis: &Redis<C>, keys: &[String], token: &str) -> String
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let seen = tokio::time::timeout(EXPLAIN_WITHIN, holder::inspect_all(&redis.nodes, keys)).await;
    let keys = match seen {
        Ok(Ok(keys)) => keys,
        Ok(Err(err)) => return format!("Redis unreachable ({err}), the lock's validity ran out"),
        Err(_) => return "Redis did not answer, the lock's validity ran out".to_owned(),
    };
    let needed = redis.nodes.len() / 2 + 1;
    let not_ours = keys.iter().find(|key| key.held_by(token) < needed);
    match not_ours {
        Some(key) if key.state() == State::Free => {
            format!("{:?} expired or was deleted", key.name)
        }
        Some(key) => format!("taken over: {}", key.describe()),
        None => "Redis did not confirm a refresh before the lock's validity ran out".to_owned(),
    }
}
