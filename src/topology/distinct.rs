//! Telling a Redlock quorum's masters apart: one server under two names (two addresses, or a
//! proxy in front of it) would count twice towards a majority.
//!
//! A master is asked for its run id beside its first operation, never before one: `INFO` goes
//! out on the master's connection just ahead of the operation's own command, so its reply
//! comes first and costs no extra round trip, and a master that is down holds up nothing.
//! Until a master answered, it is asked again beside each operation.
//!
//! Invariants: a master's vote is counted only once its run id is recorded (or the master
//! answered without one, which tells nothing, or could not answer it, as before). The moment
//! a second master answers with a run id already seen, the pair is recorded for good: the
//! operation counting votes then is refused, and so is every later obtain, refresh and TTL
//! query, before anything is sent.

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::time::{error::Elapsed, timeout};

use crate::error::Error;
use crate::model::invalid::InvalidInput;
use crate::server::store::Store;

/// What is known of each master's identity, and the first pair found to be one server.
pub(crate) struct Identities {
    ids: Mutex<Vec<Identity>>,
    duplicate: OnceLock<(usize, usize)>,
}

/// What a master said about who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Identity {
    /// Nothing yet: it has not answered.
    Unknown,
    /// It answered without a run id (a proxy's `INFO`, or `INFO` refused): tells nothing.
    Anonymous,
    RunId(String),
}

impl Identities {
    pub(crate) fn new(masters: usize) -> Self {
        Self {
            ids: Mutex::new(vec![Identity::Unknown; masters]),
            duplicate: OnceLock::new(),
        }
    }

    /// The error for two masters found to be one server, if any were.
    pub(crate) fn duplicate(&self) -> Option<InvalidInput> {
        self.duplicate
            .get()
            .map(|&(first, second)| InvalidInput::DuplicateNode { first, second })
    }

    /// Runs `op` on `master` within `limit`, asking for the master's run id beside it if it
    /// never answered: the id is recorded before this returns, and the operation is sent no
    /// later than it would have been alone.
    pub(crate) async fn beside<C, T>(
        &self,
        master: usize,
        store: &Store<C>,
        limit: Duration,
        op: impl Future<Output = T>,
    ) -> Result<T, Elapsed>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        // Polled first, so `INFO` is queued on the connection ahead of the operation.
        let (_, answer) =
            futures_util::future::join(self.identify(master, store, limit), timeout(limit, op))
                .await;
        answer
    }

    async fn identify<C>(&self, master: usize, store: &Store<C>, limit: Duration)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        if self.is_known(master) {
            return;
        }
        let identity = match timeout(limit, store.run_id()).await {
            Ok(Ok(id)) if !id.is_empty() => Identity::RunId(id),
            Ok(Ok(_)) => Identity::Anonymous,
            // The server refused INFO: it will not say.
            Ok(Err(Error::Redis(err)))
                if matches!(
                    err.kind(),
                    redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                ) =>
            {
                Identity::Anonymous
            }
            // No answer: ask again beside its next operation.
            _ => return,
        };
        self.record(master, identity);
    }

    fn is_known(&self, master: usize) -> bool {
        self.ids().get(master) != Some(&Identity::Unknown)
    }

    /// Records `master`'s identity, and the pair if another master has the same run id.
    fn record(&self, master: usize, identity: Identity) {
        let mut ids = self.ids();
        if let Identity::RunId(id) = &identity
            && let Some(other) = ids
                .iter()
                .position(|known| matches!(known, Identity::RunId(k) if k == id))
            && other != master
        {
            let _ = self.duplicate.set((other.min(master), other.max(master)));
        }
        if let Some(slot) = ids.get_mut(master) {
            *slot = identity;
        }
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, Vec<Identity>> {
        // Plain values: a panic while holding the lock cannot corrupt them.
        crate::rt::lock(&self.ids)
    }
}

#[cfg(test)]
mod tests {
    use super::{Identities, Identity};

    #[test]
    fn the_second_master_with_a_known_run_id_is_a_duplicate() {
        let ids = Identities::new(4);
        ids.record(2, Identity::RunId("a".into()));
        ids.record(0, Identity::Anonymous);
        ids.record(3, Identity::Anonymous);
        assert!(ids.duplicate().is_none());
        // The same master answering twice is no duplicate.
        ids.record(2, Identity::RunId("a".into()));
        assert!(ids.duplicate().is_none());
        ids.record(1, Identity::RunId("a".into()));
        assert!(matches!(
            ids.duplicate(),
            Some(crate::model::invalid::InvalidInput::DuplicateNode {
                first: 1,
                second: 2
            })
        ));
    }
}
