//! Where locks live: one Redis server, or a Redlock quorum of N masters. The policy layer
//! (retries, deadlines, waiting, watchdog, clean-up) is written once over this enum.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::quorum::Quorum;
use crate::store::{Obtain, Store};
use crate::value::Owner;

/// One server, or a quorum of masters.
///
/// A quorum's futures (one per master, plus their bookkeeping) are much larger than a single
/// server's, so they are boxed: every single-server operation would otherwise carry, and
/// move, a future sized for a quorum.
pub(crate) enum Backend<C> {
    Single(Store<C>),
    Quorum(Quorum<C>),
}

impl<C> Backend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Tries once to lock `keys`; see [`Store::obtain`] and [`Quorum::obtain`].
    pub(crate) async fn obtain(
        &self,
        keys: &[String],
        owner: &Owner,
        value: &str,
        (ttl, ttl_ms): (Duration, u64),
        counter: Option<&str>,
    ) -> Result<Obtain> {
        match self {
            Self::Single(store) => store.obtain(keys, owner, value, ttl_ms, counter).await,
            Self::Quorum(quorum) => Box::pin(quorum.obtain(keys, owner, value, ttl, ttl_ms)).await,
        }
    }

    /// The lock's remaining TTL, `None` when not held.
    pub(crate) async fn pttl(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl: Duration,
    ) -> Result<Option<Duration>> {
        match self {
            Self::Single(store) => store.pttl(keys, owner).await,
            Self::Quorum(quorum) => Box::pin(quorum.pttl(keys, owner, ttl)).await,
        }
    }

    /// Tries once to extend the lock; false when it is not held.
    pub(crate) async fn refresh(
        &self,
        keys: &[String],
        owner: &Owner,
        metadata: &str,
        (ttl, ttl_ms): (Duration, u64),
    ) -> Result<bool> {
        match self {
            Self::Single(store) => store.refresh(keys, owner, ttl_ms, None).await,
            Self::Quorum(quorum) => {
                Box::pin(quorum.refresh(keys, owner, metadata, ttl, ttl_ms)).await
            }
        }
    }

    /// Releases the lock; false when it was not held.
    pub(crate) async fn release(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool> {
        match self {
            Self::Single(store) => store.release(keys, owner).await,
            Self::Quorum(quorum) => Box::pin(quorum.release(keys, owner, ttl)).await,
        }
    }

    /// Best-effort release after an obtain with an unknown outcome.
    pub(crate) async fn clean_up(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl: Duration,
    ) -> Result<()> {
        match self {
            Self::Single(store) => store.release_by_eval(keys, owner).await.map(drop),
            Self::Quorum(quorum) => {
                Box::pin(quorum.release_everywhere(keys, owner, ttl)).await;
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

    pub(crate) fn is_quorum(&self) -> bool {
        matches!(self, Self::Quorum(_))
    }
}
