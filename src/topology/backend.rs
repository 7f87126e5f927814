//! Where locks live: one Redis server, or a Redlock quorum of N masters. The policy layer
//! (retries, deadlines, waiting, watchdog, clean-up) is written once over this enum.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::model::request::{Claim, IfHeld};
use crate::server::store::{Obtain, Store};
use crate::topology::quorum::Quorum;
use crate::topology::stragglers::Stragglers;

/// One server, or a quorum of masters.
///
/// A quorum's futures (one per master, plus their bookkeeping) are much larger than a single
/// server's, so they are boxed: every single-server operation would otherwise carry, and
/// move, a future sized for a quorum.
pub(crate) enum Backend<C> {
    Single(Arc<Store<C>>),
    Quorum(Quorum<C>),
}

impl<C> Backend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Tries once to lock the claim's keys; see [`Store::obtain`] and [`Quorum::obtain`].
    /// `random`: the claim's token was made for this attempt (no earlier lock can have it).
    /// A quorum hands back the lock's writes still under way.
    pub(crate) async fn obtain(
        &self,
        claim: &Claim<'_>,
        random: bool,
        how: IfHeld,
    ) -> (Result<Obtain>, Option<Arc<Stragglers>>) {
        match self {
            Self::Single(store) => (store.obtain(claim, how).await, None),
            Self::Quorum(quorum) => Box::pin(quorum.obtain(claim, random, how)).await,
        }
    }

    /// Where a quorum lock made without an obtain (adopted) keeps its writes under way.
    pub(crate) fn stragglers(&self) -> Option<Arc<Stragglers>> {
        match self {
            Self::Single(_) => None,
            Self::Quorum(quorum) => Some(quorum.stragglers()),
        }
    }

    /// The lock's remaining TTL, `None` when not held. `stragglers`: the lock's writes
    /// still under way (a quorum's).
    pub(crate) async fn pttl(
        &self,
        claim: &Claim<'_>,
        stragglers: Option<&Arc<Stragglers>>,
    ) -> Result<Option<Duration>> {
        match self {
            Self::Single(store) => Ok(store.pttl(claim).await?.ours()),
            Self::Quorum(quorum) => {
                let stragglers = quorum.or_fresh(stragglers);
                Box::pin(quorum.pttl(claim, &stragglers)).await
            }
        }
    }

    /// Tries once to extend the lock; false when it is not held. With `rewrite`, the keys
    /// are given the claim's value (its metadata changed).
    pub(crate) async fn refresh(
        &self,
        claim: &Claim<'_>,
        rewrite: bool,
        stragglers: Option<&Arc<Stragglers>>,
    ) -> Result<bool> {
        match self {
            Self::Single(store) => Ok(store.refresh(claim, false, rewrite).await?.ours().is_some()),
            Self::Quorum(quorum) => {
                let stragglers = quorum.or_fresh(stragglers);
                Box::pin(quorum.refresh(claim, rewrite, &stragglers)).await
            }
        }
    }

    /// Releases the lock, announcing it with `payload` when given; false when it was not
    /// held.
    pub(crate) async fn release(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
        stragglers: Option<&Arc<Stragglers>>,
    ) -> Result<bool> {
        match self {
            Self::Single(store) => Ok(store.release(claim, payload).await?.ours().is_some()),
            Self::Quorum(quorum) => {
                let stragglers = quorum.or_fresh(stragglers);
                Box::pin(quorum.release(claim, payload, &stragglers)).await
            }
        }
    }

    /// How many commands ran only after loading their script (NOSCRIPT), so far.
    pub(crate) fn script_reloads(&self) -> u64 {
        match self {
            Self::Single(store) => store.script_reloads(),
            Self::Quorum(quorum) => quorum.script_reloads(),
        }
    }

    /// Best-effort release after an obtain whose caller went away or got no reply.
    pub(crate) async fn clean_up(&self, claim: &Claim<'_>) -> Result<()> {
        match self {
            Self::Single(store) => store.clean_up(claim).await,
            Self::Quorum(quorum) => {
                Box::pin(quorum.release_everywhere(claim)).await;
                Ok(())
            }
        }
    }

    /// How much earlier than `ttl` the lock must be considered gone (Redlock's clock drift).
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        match self {
            Self::Single(_) => Duration::ZERO,
            Self::Quorum(quorum) => quorum.drift(ttl),
        }
    }

    /// Every server behind this backend: the one, or each master of the quorum.
    pub(crate) fn stores(&self) -> &[Arc<Store<C>>] {
        match self {
            Self::Single(store) => std::slice::from_ref(store),
            Self::Quorum(quorum) => quorum.nodes(),
        }
    }

    /// Whether lock writes wait for replicas somewhere: then a fair waiter does not take a
    /// hand-off notice as the lock, but makes an attempt that waits for them (see
    /// `server/replication/`).
    pub(crate) fn is_replicated(&self) -> bool {
        self.stores()
            .iter()
            .any(|store| store.replication().is_some())
    }

    pub(crate) fn is_quorum(&self) -> bool {
        matches!(self, Self::Quorum(_))
    }

    /// Whether every request goes straight to one server's connection (see
    /// [`Store::is_direct`]).
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self, Self::Single(store) if store.is_direct())
    }
}
