//! The command `run` starts: in a process group of its own, so that a lost lock stops the
//! command and everything it started, not only its first process.
//!
//! Every signal meant to end the command is followed by SIGCONT, so that a stopped command
//! acts on it. A stopped process that does not catch SIGTERM dies of it as it is continued,
//! before any of its own code runs again.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

/// How often to look whether the command's process group has emptied after SIGTERM.
const GROUP_POLL: Duration = Duration::from_millis(50);
/// How often to look whether the command has stopped after SIGSTOP.
const STOP_POLL: Duration = Duration::from_millis(1);

/// A running command, leader of its own process group.
#[derive(Debug)]
pub(crate) struct Command {
    child: tokio::process::Child,
    group: Pid,
}

impl Command {
    /// Starts `argv` (program first) with `env` added to `lockset`'s environment, in a new
    /// process group whose id is the command's pid. Inherits stdin, stdout and stderr.
    pub(crate) fn spawn(argv: &[String], env: &[(&str, String)]) -> io::Result<Self> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
        let child = tokio::process::Command::new(program)
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .process_group(0)
            .spawn()?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| io::Error::other("the command has no process id"))?;
        Ok(Self {
            child,
            group: Pid::from_raw(pid),
        })
    }

    /// The command's process group id (its first process's pid).
    pub(crate) fn group(&self) -> Pid {
        self.group
    }

    /// Sends `signal` to the command's whole process group. A group that is gone already is
    /// no error.
    pub(crate) fn signal(&self, signal: Signal) {
        match killpg(self.group, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => {
                tracing::warn!(target: crate::ui::LOG, %err, ?signal, "cannot signal the command")
            }
        }
    }

    /// Forwards `signal` to the command's process group, followed by SIGCONT so that a
    /// stopped command acts on it (as coreutils' timeout does).
    pub(crate) fn forward(&self, signal: Signal) {
        self.signal(signal);
        self.signal(Signal::SIGCONT);
    }

    /// Stops the command's whole process group with SIGSTOP, which no process can catch or
    /// ignore (a command may ignore SIGTSTP, and must not run on while `lockset` is stopped).
    pub(crate) fn stop(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Waits (at most `within`) until the command's first process is seen stopped: a signal
    /// takes effect when its target next runs, which on a busy machine may come after
    /// `lockset` itself stopped. (It could not run its own code before, either.)
    pub(crate) async fn until_stopped(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.stopped_by().is_none() && Instant::now() < deadline {
            tokio::time::sleep(STOP_POLL).await;
        }
    }

    /// Continues the command's process group. Only while the lock is valid.
    pub(crate) fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// The signal that stopped the command's first process, while it is stopped; `None`
    /// while it runs or once it exited. Leaves its state to be waited for (tokio reaps it).
    pub(crate) fn stopped_by(&self) -> Option<Signal> {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};

        let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.group), flags) {
            Ok(WaitStatus::Stopped(_, signal)) => Some(signal),
            _ => None,
        }
    }

    /// Waits for the command to exit. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the command: SIGTERM (and SIGCONT) to its process group now, SIGKILL to
    /// whatever of it is left after `kill_after`. Returns the command's exit status and whether SIGKILL was
    /// needed.
    pub(crate) async fn terminate(
        &mut self,
        kill_after: Duration,
    ) -> (io::Result<ExitStatus>, bool) {
        self.forward(Signal::SIGTERM);
        let deadline = Instant::now() + kill_after;
        let status = tokio::select! {
            status = self.child.wait() => status,
            () = tokio::time::sleep_until(deadline) => {
                self.signal(Signal::SIGKILL);
                return (self.child.wait().await, true);
            }
        };
        // The command's first process is gone; what it started may still run (the process
        // group lives on while any member does, so its id cannot be reused meanwhile).
        while self.group_alive() {
            if Instant::now() >= deadline {
                self.signal(Signal::SIGKILL);
                return (status, true);
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
        (status, false)
    }

    /// True while any process of the command's group runs.
    fn group_alive(&self) -> bool {
        killpg(self.group, None::<Signal>).is_ok()
    }
}
