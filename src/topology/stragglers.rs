//! A Redlock lock's writes still under way on slow masters after an operation was decided,
//! and how its release and TTL queries keep clear of them, without waiting for them.
//!
//! A quorum operation returns once the masters it needs agreed; each master's part runs in a
//! task of its own that finishes within the per-node limit (see `topology/quorum/`). On one
//! connection, commands run in the order they are sent, and a command that timed out was
//! sent before anything sent after it. So:
//!
//! - Every write of the lock (the obtain, a refresh, a restore) registers here, for its
//!   master, before it is sent; it is done when its last command answered or timed out.
//! - The release refuses new writes (a write registers, or the release starts: never both
//!   at once), and sends each master's delete once that master's writes are done: the delete
//!   then runs after every write of the lock there, so no late write outlives the release,
//!   and the caller does not wait for it (the masters without writes under way decide).
//!   Nothing but this lock's own token is deleted late: a random token belongs to this lock
//!   alone, so a late delete can never take a later lock.
//! - A lock with the caller's own token cannot have that: a later lock of the same token (a
//!   re-obtain after the release) would lose its key to a delete sent late. Its release waits
//!   for its writes everywhere, then for every master's delete (each within the per-node
//!   limit), as it always did.
//! - A TTL query asks each master once the lock's writes there are done: a refresh still on
//!   its way there would otherwise be answered with the old TTL.
//! - Whether any write of the lock was ever sent to a master: a master that stopped
//!   answering is owed the release of a lock only if it may hold it (see `health.rs`).

use std::sync::Arc;

use tokio::sync::watch;

/// The writes of one lock still under way on each master, and whether its release started.
pub(crate) struct Stragglers {
    state: watch::Sender<State>,
}

struct State {
    /// Per master, the writes under way there.
    writes: Box<[usize]>,
    /// Per master, whether a write of the lock may have reached it.
    sent: Box<[bool]>,
    released: bool,
}

/// A write of the lock under way on one master; done when dropped.
pub(crate) struct Writing {
    stragglers: Arc<Stragglers>,
    master: usize,
}

impl Stragglers {
    /// For a lock whose writes are not known (adopted): any master may hold it.
    pub(crate) fn new(masters: usize) -> Arc<Self> {
        Self::with_sent(masters, true)
    }

    /// For a lock about to be obtained: no master holds it yet.
    pub(crate) fn unsent(masters: usize) -> Arc<Self> {
        Self::with_sent(masters, false)
    }

    fn with_sent(masters: usize, sent: bool) -> Arc<Self> {
        let state = State {
            writes: vec![0; masters].into_boxed_slice(),
            sent: vec![sent; masters].into_boxed_slice(),
            released: false,
        };
        Arc::new(Self {
            state: watch::Sender::new(state),
        })
    }

    /// Registers a write on `master`, about to be sent; `None` once the release started
    /// (then nothing may be sent).
    pub(crate) fn writing(self: &Arc<Self>, master: usize) -> Option<Writing> {
        let registered = self.state.send_if_modified(|state| {
            match state.writes.get_mut(master) {
                Some(writes) if !state.released => *writes += 1,
                _ => return false,
            }
            true
        });
        registered.then(|| Writing {
            stragglers: self.clone(),
            master,
        })
    }

    /// Whether a write of the lock may have reached `master`.
    pub(crate) fn ever_sent(&self, master: usize) -> bool {
        self.state
            .borrow()
            .sent
            .get(master)
            .is_none_or(|sent| *sent)
    }

    /// The release starts: no write registers from now on.
    pub(crate) fn release(&self) {
        self.state.send_modify(|state| state.released = true);
    }

    /// Returns once the lock's writes on `master` are done.
    pub(crate) async fn written(&self, master: usize) {
        let mut state = self.state.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = state
            .wait_for(|state| state.writes.get(master).is_none_or(|n| *n == 0))
            .await;
    }

    /// Returns once the lock's writes on every master are done.
    pub(crate) async fn settled(&self) {
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|state| state.writes.iter().all(|n| *n == 0))
            .await;
    }
}

impl Writing {
    /// The write went out (or may have): the master may hold the lock.
    pub(crate) fn sent(&self) {
        let master = self.master;
        // Nobody waits for this: no need to wake the watchers.
        self.stragglers.state.send_if_modified(|state| {
            if let Some(sent) = state.sent.get_mut(master) {
                *sent = true;
            }
            false
        });
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        let master = self.master;
        self.stragglers.state.send_modify(|state| {
            if let Some(writes) = state.writes.get_mut(master) {
                *writes = writes.saturating_sub(1);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Stragglers;

    #[tokio::test]
    async fn a_release_waits_only_for_writes_registered_before_it() {
        let stragglers = Stragglers::new(2);
        let write = stragglers.writing(1).expect("not released yet");
        // Master 0 has nothing under way.
        stragglers.written(0).await;
        stragglers.release();
        assert!(
            stragglers.writing(0).is_none(),
            "released: nothing more is sent"
        );
        let waiting = tokio::time::timeout(Duration::from_millis(20), stragglers.written(1));
        assert!(waiting.await.is_err(), "the write on master 1 is under way");
        drop(write);
        stragglers.written(1).await;
        stragglers.settled().await;
    }
}
