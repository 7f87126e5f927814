//! The signals `lockset` catches (SIGINT, SIGTERM, SIGHUP), to forward them to the command
//! or to stop waiting cleanly.

use std::io;

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// The catchable signals that end a `lockset`, listened to from the start so that none of
/// them kills it before it released what it holds.
#[derive(Debug)]
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts listening. Needs a tokio runtime.
    pub(crate) fn listen() -> io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::SIGINT,
            Some(()) = self.terminate.recv() => Signal::SIGTERM,
            Some(()) = self.hangup.recv() => Signal::SIGHUP,
            // The streams end only with the runtime.
            else => std::future::pending().await,
        }
    }
}
