//! The command `run` starts: in a process group of its own, so that a lost lock stops the
//! command and everything it started, not only its first process.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

/// How often to look whether the command's process group has emptied after SIGTERM.
const GROUP_POLL: Duration = Duration::from_millis(50);

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

    /// Sends `signal` to the command's whole process group. A group that is gone already is
    /// no error.
    pub(crate) fn signal(&self, signal: Signal) {
        match killpg(self.group, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => tracing::warn!(%err, ?signal, "cannot signal the command"),
        }
    }

    /// Waits for the command to exit. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the command: SIGTERM to its process group now, SIGKILL to whatever of it is
    /// left after `kill_after`. Returns the command's exit status and whether SIGKILL was
    /// needed.
    pub(crate) async fn terminate(
        &mut self,
        kill_after: Duration,
    ) -> (io::Result<ExitStatus>, bool) {
        self.signal(Signal::SIGTERM);
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
