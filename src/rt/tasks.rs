//! Background tasks a client spawns (watchdogs, releases on drop, clean-up after a
//! cancelled obtain, a quorum's calls to its slower masters), counted so that none can
//! silently outlive its purpose, and so that a program can wait for them before it exits.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The background tasks of one client and its clones.
#[derive(Clone, Default)]
pub(crate) struct Tasks(Arc<Count>);

#[derive(Default)]
struct Count {
    running: AtomicUsize,
    /// Notified whenever the count drops to zero.
    idle: Notify,
    /// The runtime every task goes to, when the client has one of its own (the blocking
    /// API's): also from a thread outside any runtime, such as a guard dropped there.
    runtime: OnceLock<Handle>,
}

impl Tasks {
    /// How many are running now.
    pub(crate) fn count(&self) -> usize {
        self.0.running.load(Ordering::SeqCst)
    }

    /// Returns once none is running (at once if none is).
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read, so a drop to zero in between is not missed.
            idle.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Spawns every task on `runtime` from now on (set once).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn run_on(&self, runtime: Handle) {
        let _ = self.0.runtime.set(runtime);
    }

    /// Spawns `task` on the client's own runtime, if it has one, else on the current tokio
    /// runtime; returns `None` outside one.
    pub(crate) fn spawn<F>(&self, task: F) -> Option<JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = self.runtime()?;
        self.0.running.fetch_add(1, Ordering::SeqCst);
        // Counted down when the task ends, however it ends (done, panicked or aborted).
        let running = Running(self.0.clone());
        Some(runtime.spawn(async move {
            let _running = running;
            task.await;
        }))
    }

    /// Spawns `task` where [`Tasks::spawn`] would, without counting it: a task that may
    /// last as long as the client (a Redlock master's probe, see `health.rs`).
    pub(crate) fn spawn_uncounted<F>(&self, task: F) -> Option<JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Some(self.runtime()?.spawn(task))
    }

    /// The client's own runtime, if it has one, else the current tokio runtime.
    fn runtime(&self) -> Option<Handle> {
        match self.0.runtime.get() {
            Some(runtime) => Some(runtime.clone()),
            None => Handle::try_current().ok(),
        }
    }
}

struct Running(Arc<Count>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
