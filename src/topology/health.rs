//! Whether a Redlock master answers, and the releases owed to one that stopped answering.
//!
//! On one multiplexed connection, a request that waits behind a full socket (the server is
//! paused or stalled) and whose caller stops waiting is dropped unsent by redis-rs, while
//! requests already in the kernel's buffers run when the server reads them again. A release
//! sent after its obtain timed out there would then be lost while the obtain runs: the
//! resumed master keeps a lock released everywhere else, until its TTL.
//!
//! So, per master:
//!
//! - Once an operation there misses its per-node deadline, the master is **down**: every
//!   further operation on it fails at once ([`NodeFailure::Unresponsive`]), counted against
//!   the majority as a timeout is, and nothing more is queued to it.
//! - A **probe** (one task, one `PING` at a time, each awaited at most [`PROBE_LIMIT`]) finds
//!   out when it answers again. The connection answers in order: the `PING`'s reply comes
//!   after every request sent before it, so whatever the master was to run has run.
//! - Every release or clean-up of a lock that may be on the master (a write of it was sent
//!   there) is **owed** when it could not be sent there (down) or got no answer in time:
//!   remembered by its keys and owner tag (not its metadata: the release script matches a
//!   key by tag), and sent by the probe once the master answers, before the master is up
//!   again (before anything else of this client). A debt is not dropped when its TTL has
//!   passed: a stalled master runs the writes in its backlog when it resumes, and their TTL
//!   counts from then. Debts can only come from writes sent before the master missed its
//!   deadline (later ones fail at once), so they are bounded by the rate of locks times the
//!   per-node limit; and at most [`MAX_OWED_BYTES`] are kept per master: beyond, the oldest
//!   are dropped (with a warning), and those keys expire with their TTL.
//!
//! The probe is not one of the client's counted background tasks (it lasts as long as the
//! master does not answer, which may be for good); it ends when the client is dropped.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::aio::ConnectionLike;
use tokio::time::{error::Elapsed, timeout};

use crate::error::classify::is_unreachable;
use crate::error::{Error, NodeFailure};
use crate::model::request::OwnedClaim;
use crate::rt::tasks::Tasks;
use crate::server::store::Store;

/// How long the probe waits for one `PING`'s answer before it sends the next.
pub(crate) const PROBE_LIMIT: Duration = Duration::from_millis(200);

/// How long the probe waits after a `PING` failed at once (connection refused).
const PROBE_PAUSE: Duration = Duration::from_millis(100);

/// How long one owed release may take once the master answers again.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// How many owed releases are sent at a time once the master answers again.
const SETTLE_AT_ONCE: usize = 64;

/// The most memory (bytes, estimated) the releases owed to one Redlock master may take while
/// it does not answer; beyond, the oldest are dropped, and their keys there expire with their
/// TTL. About 50,000 single-key locks.
pub const MAX_OWED_BYTES: usize = 16 << 20;

/// One master's state: up or down, and what is owed to it.
pub(crate) struct Health {
    down: AtomicBool,
    owed: Mutex<Owed>,
    tasks: Tasks,
}

#[derive(Default)]
struct Owed {
    /// The locks whose release is owed, oldest first: keys and owner tag (see
    /// [`OwnedClaim::to_release`]).
    debts: VecDeque<Arc<OwnedClaim>>,
    /// Their size, estimated ([`OwnedClaim::size`]).
    bytes: usize,
}

impl Health {
    /// A master taken to be up; its probe, when needed, is spawned through `tasks`.
    pub(crate) fn new(tasks: Tasks) -> Arc<Self> {
        Arc::new(Self {
            down: AtomicBool::new(false),
            owed: Mutex::default(),
            tasks,
        })
    }

    /// Whether the master missed a deadline and has not answered a probe since.
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Runs an operation on the master within `limit` (by `bounded`, which adds the limit),
    /// unless it is down: then nothing is sent. A missed deadline (the limit, or redis-rs's
    /// own response timeout) takes it down and starts its probe.
    pub(crate) async fn ask<C, T>(
        self: &Arc<Self>,
        store: &Arc<Store<C>>,
        limit: Duration,
        bounded: impl Future<Output = Result<crate::error::Result<T>, Elapsed>>,
    ) -> Result<T, NodeFailure>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        if self.is_down() {
            return Err(NodeFailure::Unresponsive);
        }
        match bounded.await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(Error::Redis(err) | Error::UnknownOutcome(err))) if err.is_timeout() => {
                self.missed(store);
                Err(NodeFailure::TimedOut(limit))
            }
            Ok(Err(err)) => Err(NodeFailure::from(err)),
            Err(_) => {
                self.missed(store);
                Err(NodeFailure::TimedOut(limit))
            }
        }
    }

    /// As [`Health::ask`], for a release or clean-up of `claim`: one that could not be
    /// sent, or got no answer (in time, or over the connection), is owed.
    pub(crate) async fn release<C, T>(
        self: &Arc<Self>,
        store: &Arc<Store<C>>,
        claim: &OwnedClaim,
        limit: Duration,
        bounded: impl Future<Output = Result<crate::error::Result<T>, Elapsed>>,
    ) -> Result<T, NodeFailure>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let answer = self.ask(store, limit, bounded).await;
        let unanswered = match &answer {
            Ok(_) => false,
            Err(NodeFailure::Redis(err)) => is_unreachable(err),
            Err(_) => true,
        };
        if unanswered {
            self.owe(claim);
        }
        answer
    }

    /// Takes the master down after a missed deadline, and starts its probe if it was up.
    fn missed<C>(self: &Arc<Self>, store: &Arc<Store<C>>)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        if self.down.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            "a Redlock master missed its deadline: nothing more is sent until it answers"
        );
        let probe = probe(Arc::downgrade(self), Arc::downgrade(store));
        if self.tasks.spawn_uncounted(probe).is_none() {
            // Outside a runtime nothing runs at all: no probe, so do not stay down.
            self.down.store(false, Ordering::Release);
        }
    }

    /// Remembers a release owed to the master, dropping the oldest beyond
    /// [`MAX_OWED_BYTES`].
    fn owe(&self, claim: &OwnedClaim) {
        let claim = Arc::new(claim.to_release());
        let mut owed = self.owed();
        owed.bytes += claim.size();
        owed.debts.push_back(claim);
        let mut dropped = 0;
        while owed.bytes > MAX_OWED_BYTES && owed.debts.len() > 1 {
            if let Some(debt) = owed.debts.pop_front() {
                owed.bytes -= debt.size();
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "too many releases owed to a Redlock master: the oldest are dropped, their keys expire with their TTL"
            );
        }
    }

    /// Sends every release owed to the master, then takes it up again: `false` when one of
    /// them got no answer in time (it is owed again, and the master stays down).
    async fn settle<C>(&self, store: &Store<C>) -> bool
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        loop {
            let debts = {
                let mut owed = self.owed();
                if owed.debts.is_empty() {
                    self.down.store(false, Ordering::Release);
                    return true;
                }
                owed.bytes = 0;
                std::mem::take(&mut owed.debts)
            };
            let unanswered: Vec<Arc<OwnedClaim>> = futures_util::stream::iter(debts)
                .map(|debt| async move {
                    let claim = debt.claim();
                    let sent = timeout(SETTLE_LIMIT, store.release_owed(&claim)).await;
                    match sent {
                        Ok(Ok(_)) => None,
                        Ok(Err(Error::Redis(err))) if !is_unreachable(&err) => {
                            tracing::warn!(error = %err, "an owed release was refused");
                            None
                        }
                        Ok(Err(_)) | Err(_) => Some(debt),
                    }
                })
                .buffer_unordered(SETTLE_AT_ONCE)
                .filter_map(std::future::ready)
                .collect()
                .await;
            if !unanswered.is_empty() {
                let mut owed = self.owed();
                owed.bytes += unanswered.iter().map(|debt| debt.size()).sum::<usize>();
                for debt in unanswered.into_iter().rev() {
                    owed.debts.push_front(debt);
                }
                return false;
            }
        }
    }

    fn owed(&self) -> MutexGuard<'_, Owed> {
        // Plain values: a panic while holding the lock cannot corrupt them.
        crate::rt::lock(&self.owed)
    }
}

/// Asks the master whether it answers, one `PING` at a time, until it does; then sends what
/// is owed to it and takes it up again. Ends when the client is dropped.
async fn probe<C>(health: Weak<Health>, store: Weak<Store<C>>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    loop {
        let (Some(health), Some(store)) = (health.upgrade(), store.upgrade()) else {
            return;
        };
        let answered = match timeout(PROBE_LIMIT, store.ping()).await {
            Ok(Ok(())) => Some(true),
            // An error the server answered with (a refused login): it answers. What it
            // refuses, the operations report.
            Ok(Err(Error::Redis(err))) => Some(!is_unreachable(&err)),
            Ok(Err(_)) => Some(false),
            // No answer in time: the next PING goes out at once.
            Err(_) => None,
        };
        if answered == Some(true) && health.settle(&store).await {
            tracing::info!("a Redlock master answers again");
            return;
        }
        if answered == Some(false) {
            drop((health, store));
            tokio::time::sleep(PROBE_PAUSE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Health, MAX_OWED_BYTES};
    use crate::model::request::{Claim, Ttl};
    use crate::model::value::Owner;
    use crate::rt::tasks::Tasks;

    /// Debts keep the keys and the owner tag, not the metadata, and stay under the bound:
    /// the oldest go first.
    #[test]
    fn debts_drop_the_metadata_and_the_oldest_beyond_the_bound() {
        let health = Health::new(Tasks::default());
        let ttl = Ttl::new(Duration::from_secs(10)).expect("a valid TTL");
        let keys: Vec<Vec<String>> = (0..100_000).map(|i| vec![format!("k{i}")]).collect();
        let owner = Owner::random();
        let value = owner.value(&"m".repeat(1_000)).into_owned();
        for keys in &keys {
            let claim = Claim {
                keys,
                owner: &owner,
                value: &value,
                ttl,
                counter: None,
                modes: None,
                ticket: None,
            };
            health.owe(&claim.to_shared());
        }
        let owed = health.owed();
        assert!(owed.bytes <= MAX_OWED_BYTES, "{}", owed.bytes);
        assert!(owed.debts.len() > 10_000, "{}", owed.debts.len());
        let newest = owed.debts.back().expect("debts");
        assert_eq!(newest.claim().keys, ["k99999"]);
        assert_eq!(newest.claim().value, owner.value(""));
    }
}
