//! The signals `lockset` catches: those that end it (SIGINT, SIGTERM, SIGHUP), those of job
//! control (SIGTSTP, SIGTTIN, SIGTTOU, SIGCONT), and SIGCHLD, to forward them to the command,
//! stop it with `lockset`, or stop waiting cleanly.
//!
//! Invariant: a signal that was ignored when `lockset` started (nohup's SIGHUP, the SIGINT a
//! shell ignores for a background job) is never caught, so it stays ignored for `lockset`
//! and for the command, which inherits the ignored disposition. tokio installs a handler for
//! good once a signal is listened to, so this is decided before the first one is.
//!
//! Invariant: no thread that writes to the terminal lets SIGTTOU through (see
//! [`shield_writes`]), so `lockset`'s own messages never make the terminal raise it.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, Waker};

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

/// Every signal `lockset` would catch, in the order they are looked at.
const CAUGHT: [Signal; 8] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGCONT,
    Signal::SIGCHLD,
];

/// What a caught signal asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// SIGINT, SIGTERM or SIGHUP: end (forwarded to a running command).
    End(Signal),
    /// SIGTSTP, SIGTTIN or SIGTTOU: stop, as the default disposition would (after the
    /// command, when one runs).
    Stop(Signal),
    /// SIGCONT that no stop of ours waits for.
    Continue,
    /// SIGCHLD: a child stopped, continued or exited.
    Child,
}

impl Event {
    fn of(signal: Signal) -> Self {
        match signal {
            Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU => Self::Stop(signal),
            Signal::SIGCONT => Self::Continue,
            Signal::SIGCHLD => Self::Child,
            other => Self::End(other),
        }
    }
}

/// The caught signals, listened to from the start so that none of them kills or stops
/// `lockset` before it released what it holds.
#[derive(Debug)]
pub(crate) struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Starts listening to every signal of [`CAUGHT`] that was not ignored when `lockset`
    /// started. Needs a tokio runtime.
    pub(crate) fn listen() -> io::Result<Self> {
        let ignored = ignored_at_start();
        let mut streams = Vec::with_capacity(CAUGHT.len());
        for caught in CAUGHT {
            if ignored.contains(&caught) {
                tracing::debug!(target: crate::ui::LOG, signal = ?caught, "ignored when started: left ignored");
                continue;
            }
            streams.push((caught, signal(SignalKind::from_raw(caught as i32))?));
        }
        Ok(Self { streams })
    }

    /// The next signal received. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Event {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        for (caught, stream) in &mut self.streams {
            // A stream ends only with the runtime: it then stays pending.
            if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                return Poll::Ready(Event::of(*caught));
            }
        }
        Poll::Pending
    }

    /// Stops `lockset` itself, as the default disposition of a stop signal would, and
    /// returns once it was continued (by SIGCONT). Whoever holds the lock must have stopped
    /// the command first: while `lockset` is stopped, nothing refreshes the lock.
    ///
    /// SIGSTOP is used, whatever the stop signal was: a caught signal cannot be raised with
    /// its default disposition again (tokio's handler stays), and SIGSTOP cannot fail to
    /// stop. As the process with pid 1 cannot be stopped (the kernel ignores it), `lockset`
    /// running as pid 1 does not try.
    pub(crate) async fn stop_self(&mut self) -> io::Result<()> {
        let me = std::process::id();
        if me == 1 {
            return Ok(());
        }
        let continued = self
            .streams
            .iter_mut()
            .find(|(caught, _)| *caught == Signal::SIGCONT);
        // A SIGCONT from before the stop must not pass for the one that ends it.
        if let Some((_, stream)) = continued {
            let mut cx = Context::from_waker(Waker::noop());
            while let Poll::Ready(Some(())) = stream.poll_recv(&mut cx) {}
        }
        let pid = i32::try_from(me).map_err(io::Error::other)?;
        kill(Pid::from_raw(pid), Signal::SIGSTOP)?;
        // Stopped here; SIGCONT continues it. Waiting for its handler's report makes sure
        // nothing goes on before the stop really happened.
        let continued = self
            .streams
            .iter_mut()
            .find(|(caught, _)| *caught == Signal::SIGCONT);
        if let Some((_, stream)) = continued {
            stream.recv().await;
        }
        Ok(())
    }
}

/// Keeps `lockset`'s own writes to its terminal from raising SIGTTOU, while SIGTTOU sent to
/// `lockset` still stops it with the command. Call first thing, before any other thread is
/// started: threads inherit the calling thread's signal mask.
///
/// Under `stty tostop`, a background process writing to its terminal makes the terminal send
/// SIGTTOU, and its write restarts once the signal was handled. Caught by tokio, the signal
/// is only handled on the runtime's thread: the very thread stuck in that write, which would
/// raise it again for ever, and nothing would refresh the lock. A write from a thread that
/// blocks SIGTTOU goes through instead (as if it were ignored). So every thread of `lockset`
/// blocks it but one, started here, which writes nothing and takes the SIGTTOU that others
/// send. The command does not inherit the blocked signal: a child starts with an empty mask.
pub(crate) fn shield_writes() {
    let receiver = std::thread::Builder::new()
        .name("sigttou".to_owned())
        .spawn(|| {
            loop {
                std::thread::park();
            }
        });
    // Without the receiver, a blocked SIGTTOU sent to lockset would never arrive.
    if receiver.is_ok() {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTTOU);
        if let Err(err) = set.thread_block() {
            tracing::debug!(target: crate::ui::LOG, %err, "cannot block SIGTTOU");
        }
    }
}

/// The signals whose disposition was "ignore" when `lockset` started, read from
/// `/proc/self/status` (Linux); none elsewhere.
fn ignored_at_start() -> Vec<Signal> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    ignored_in(&status)
}

/// The signals of the `SigIgn:` mask of a `/proc/PID/status` text (bit N-1 for signal N).
fn ignored_in(status: &str) -> Vec<Signal> {
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0);
    CAUGHT
        .into_iter()
        .filter(|caught| {
            let bit = (*caught as i32) - 1;
            (0..64).contains(&bit) && mask & (1 << bit) != 0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ignored_mask_is_read_bit_by_bit() {
        // nohup: SIGHUP (1) ignored; a background job of sh: SIGINT (2) and SIGQUIT (3).
        let status = "Name:\tlockset\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000007\n";
        assert_eq!(ignored_in(status), [Signal::SIGINT, Signal::SIGHUP]);
        assert_eq!(ignored_in("SigIgn:\t0000000000000000\n"), []);
        assert_eq!(ignored_in("no such line"), []);
    }
}
