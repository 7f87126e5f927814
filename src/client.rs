//! The public entry point: a cheap, cloneable handle that obtains locks.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::options::Options;
use crate::policy::{self, Step};
use crate::store::{Obtain, Store};
use crate::validate;
use crate::value::Owner;

/// Obtains locks over one Redis server.
///
/// `Client` wraps any redis-rs async connection: a
/// [`ConnectionManager`] (recommended: it reconnects after
/// the connection drops) or a [`MultiplexedConnection`](redis::aio::MultiplexedConnection)
/// (which never heals once the server drops it). It is cheap to clone and can be shared by
/// any number of tasks; clones share the connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockset::Error> {
/// use std::time::Duration;
/// use lockset::{Client, Options};
///
/// let client = Client::connect("redis://127.0.0.1/").await?;
/// let lock = client.obtain("report:2026-11", Duration::from_secs(10), &Options::default()).await?;
/// // ... exclusive work ...
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client<C> {
    store: Store<C>,
}

impl Client<ConnectionManager> {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/`) with a
    /// [`ConnectionManager`] and redis-rs's default timeouts.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        Ok(Self::new(conn))
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Wraps a redis-rs async connection. Sends nothing; never fails.
    pub fn new(conn: C) -> Self {
        Self {
            store: Store::new(conn),
        }
    }

    /// Locks one key for `ttl`.
    ///
    /// Tries once, then retries per `options`' [`Retry`](crate::Retry) strategy until the
    /// deadline: an explicit [`Options::timeout`] or [`Options::deadline`], or else **the
    /// TTL itself**. The TTL is rounded up to whole milliseconds and must be at least 1 ms.
    ///
    /// # Errors
    ///
    /// [`Error::NotObtained`] or [`Error::DeadlineExceeded`] when someone else holds the key
    /// ([`Error::is_not_obtained`] covers both); [`Error::InvalidInput`] for an empty key,
    /// a bad TTL or an empty token (nothing is sent); [`Error::WrongType`] when the key holds
    /// a non-string value; [`Error::UnknownOutcome`] when Redis did not answer in time;
    /// [`Error::Redis`] for other Redis failures.
    pub async fn obtain(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        self.obtain_keys(vec![key.into()], ttl, options).await
    }

    /// Locks every key of `keys` for `ttl`, all or nothing: either every key is locked or
    /// none is touched.
    ///
    /// Retries and errors as [`Client::obtain`]; additionally rejects an empty set,
    /// duplicate keys and more than [`MAX_KEYS`](crate::MAX_KEYS) keys before sending.
    pub async fn obtain_multi<I>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let keys = keys.into_iter().map(Into::into).collect();
        self.obtain_keys(keys, ttl, options).await
    }

    async fn obtain_keys(
        &self,
        keys: Vec<String>,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        let start = Instant::now();
        validate::keys(&keys)?;
        let ttl_ms = validate::ttl_millis(ttl)?;
        let owner = match &options.token {
            Some(token) => Owner::custom(token)?,
            None => Owner::random(),
        };
        let value = owner.value(&options.metadata);
        let deadline = options.deadline_from(start, ttl);
        let attempt = || self.obtain_once(&keys, &owner, &value, ttl_ms, options.token.is_none());
        policy::run(&options.retry, deadline, attempt).await?;
        Ok(Lock::new(
            self.store.clone(),
            keys,
            owner,
            options.metadata.clone(),
        ))
    }

    /// One attempt. A reply that never came (client-side timeout) leaves the outcome
    /// unknown: the script may have locked the keys. For a random token, nobody else can own
    /// keys holding it, so release them by token before retrying or giving up. A custom
    /// token may already have held these keys before this call, so they are left to expire.
    async fn obtain_once(
        &self,
        keys: &[String],
        owner: &Owner,
        value: &str,
        ttl_ms: u64,
        random_token: bool,
    ) -> Step<()> {
        match self.store.obtain(keys, owner, value, ttl_ms).await {
            Ok(Obtain::Obtained) => Step::Done(()),
            Ok(Obtain::Held { .. }) => Step::Again(Error::NotObtained),
            Err(Error::Redis(err)) if err.is_timeout() => {
                if random_token {
                    self.release_unknown(keys, owner).await;
                }
                Step::from_error(Error::UnknownOutcome(err))
            }
            Err(err) => Step::from_error(err),
        }
    }

    /// Best-effort release after an obtain whose outcome is unknown.
    async fn release_unknown(&self, keys: &[String], owner: &Owner) {
        match self.store.release_by_eval(keys, owner).await {
            Ok(released) => tracing::debug!(released, "cleaned up after an obtain timed out"),
            Err(err) => {
                tracing::warn!(%err, "clean-up after an obtain timed out failed; the keys expire with their TTL")
            }
        }
    }
}

impl<C> fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}
