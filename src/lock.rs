//! A held lock: its keys and token, and the operations only its owner may perform.

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::options::Options;
use crate::policy::{self, Step};
use crate::store::Store;
use crate::validate;
use crate::value::Owner;

/// A lock on one or more keys, returned by [`Client::obtain`](crate::Client::obtain) and
/// [`Client::obtain_multi`](crate::Client::obtain_multi).
///
/// Dropping a `Lock` does not release it: the keys expire with their TTL. Call
/// [`Lock::release`] to free them early and to learn whether they were still ours.
/// `Debug` output never shows the token.
pub struct Lock<C> {
    store: Store<C>,
    keys: Vec<String>,
    owner: Owner,
    metadata: String,
}

impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(store: Store<C>, keys: Vec<String>, owner: Owner, metadata: String) -> Self {
        Self {
            store,
            keys,
            owner,
            metadata,
        }
    }

    /// The first key of the lock.
    pub fn key(&self) -> &str {
        // A lock is only built from a validated, non-empty key set.
        self.keys.first().map_or("", String::as_str)
    }

    /// Every key of the lock, in the order given to obtain.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The lock's token: whoever knows it owns the lock. Keep it secret.
    pub fn token(&self) -> &str {
        self.owner.token()
    }

    /// The metadata stored with the lock.
    pub fn metadata(&self) -> &str {
        &self.metadata
    }

    /// The remaining time of the lock: the smallest remaining TTL across its keys.
    ///
    /// `Ok(None)` means the lock is not held any more (a key expired or now belongs to
    /// someone else). A lock whose keys someone made persistent reports `Duration::MAX`.
    pub async fn ttl(&self) -> Result<Option<Duration>> {
        self.store.pttl(&self.keys, &self.owner).await
    }

    /// Extends every key of the lock to `ttl`, only if every key is still ours.
    ///
    /// # Errors
    ///
    /// [`Error::NotObtained`] at once when the lock was lost (as bsm/redislock);
    /// transient Redis errors are retried per `options`' retry strategy and deadline
    /// (by default the new TTL); [`Error::InvalidInput`] for a bad TTL.
    pub async fn refresh(&self, ttl: Duration, options: &Options) -> Result<()> {
        let start = Instant::now();
        let ttl_ms = validate::ttl_millis(ttl)?;
        let deadline = options.deadline_from(start, ttl);
        policy::run(&options.retry, deadline, || async move {
            match self.store.refresh(&self.keys, &self.owner, ttl_ms).await {
                Ok(true) => Step::Done(()),
                Ok(false) => Step::Stop(Error::NotObtained),
                Err(err) => Step::from_error(err),
            }
        })
        .await
    }

    /// Releases the lock: deletes every key, only if every key is still ours.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock expired or was taken over (nothing is deleted then);
    /// [`Error::Redis`] when Redis could not be reached (the keys expire with their TTL).
    pub async fn release(self) -> Result<()> {
        match self.store.release(&self.keys, &self.owner).await? {
            true => Ok(()),
            false => Err(Error::NotHeld),
        }
    }
}

impl<C> fmt::Debug for Lock<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("keys", &self.keys)
            .field("token", &"<redacted>")
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}
