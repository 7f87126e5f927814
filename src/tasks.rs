//! Background tasks a client spawns (watchdogs, releases on drop, clean-up after a
//! cancelled obtain), counted so that none can silently outlive its purpose.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::task::JoinHandle;

/// The background tasks of one client and its clones.
#[derive(Clone, Default)]
pub(crate) struct Tasks(Arc<AtomicUsize>);

impl Tasks {
    /// How many are running now.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Spawns `task` on the current tokio runtime, or returns `None` outside one.
    pub(crate) fn spawn<F>(&self, task: F) -> Option<JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        self.0.fetch_add(1, Ordering::SeqCst);
        // Counted down when the task ends, however it ends (done, panicked or aborted).
        let running = Running(self.0.clone());
        Some(runtime.spawn(async move {
            let _running = running;
            task.await;
        }))
    }
}

struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
