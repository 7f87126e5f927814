//! Per-call settings: retry strategy, metadata, custom token, and deadline.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::fencing::Fencing;
use crate::model::retry::Retry;
use crate::observe::meter::Meter;
use crate::observe::{OnRetry, RetryEvent};

/// How long an operation may keep retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    Timeout(Duration),
    Deadline(Instant),
}

/// Settings for [`Client::obtain`](crate::Client::obtain) and
/// [`Lock::refresh`](crate::Lock::refresh).
///
/// See the guide: [retries and deadlines](crate::guide::retries).
///
/// `Options::default()` tries once ([`Retry::NoRetry`]), with a random token, no metadata,
/// and the default deadline. One `Options` can be shared by any number of calls and tasks:
/// each call builds its own retry state.
///
/// ```
/// use std::time::Duration;
/// use lockset::{Options, Retry};
///
/// let options = Options::default()
///     .retry(Retry::linear(Duration::from_millis(50)))
///     .metadata("worker-7")
///     .timeout(Duration::from_secs(2));
/// ```
#[derive(Clone, Default)]
pub struct Options {
    pub(crate) retry: Retry,
    /// `None` until set: a refresh then keeps the lock's metadata.
    pub(crate) metadata: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) fencing: Option<Fencing>,
    pub(crate) watchdog_interval: Option<Duration>,
    pub(crate) on_retry: Option<OnRetry>,
    /// Waiters take the lock as it comes free, past any queue (`fair(false)`).
    pub(crate) barging: bool,
    pub(crate) waiter_lease: Option<Duration>,
    /// The lock family metrics go to, when named (`metrics_label`).
    pub(crate) meter: Option<Meter>,
    limit: Option<Limit>,
}

/// How long a fair waiter's place in a queue lasts without renewal, by default, for a lock
/// with time to live `ttl`: one and a half times the TTL, so that a hand-off (which gives
/// the keys for no longer than what is left of the lease, at least two thirds of it between
/// renewals) gives the full TTL; at least 2 s, and at most 15 s, which is then all a waiter
/// that died can block a lock for.
pub(crate) fn default_waiter_lease(ttl: Duration) -> Duration {
    (ttl + ttl / 2).clamp(Duration::from_secs(2), Duration::from_secs(15))
}

impl Options {
    /// The retry strategy. Defaults to [`Retry::NoRetry`].
    ///
    /// See the guide: [retries and deadlines](crate::guide::retries).
    #[must_use]
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Metadata stored with the lock (after the token) and returned by
    /// [`Lock::metadata`](crate::Lock::metadata). Defaults to empty. At most
    /// [`MAX_METADATA`](crate::MAX_METADATA) bytes (64 KiB): more is refused before anything
    /// is sent ([`InvalidInput::MetadataTooLong`](crate::InvalidInput::MetadataTooLong)).
    ///
    /// Given to [`Lock::refresh`](crate::Lock::refresh), it replaces the metadata stored
    /// with the lock, in the same atomic step as the refresh (and only if the refresh
    /// succeeds). Not given, a refresh keeps the metadata, and sends nothing more than the
    /// lock's value.
    ///
    /// ```no_run
    /// # async fn demo(lock: lockset::Lock<lockset::redis::aio::ConnectionManager>) -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::Options;
    ///
    /// let progress = Options::default().metadata("worker-7: step 3 of 5");
    /// lock.refresh(Duration::from_secs(30), &progress).await?;
    /// assert_eq!(lock.metadata(), "worker-7: step 3 of 5");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn metadata(mut self, metadata: impl Into<String>) -> Self {
        self.metadata = Some(metadata.into());
        self
    }

    /// A custom token instead of a fresh random one.
    ///
    /// Obtaining with the token of a lock you hold re-obtains it: it succeeds when every
    /// requested key is free or already held by this token, overwrites the metadata and
    /// resets the TTL. Anyone who knows the token owns the lock, so keep it secret and
    /// unguessable. Defaults to 16 random bytes from a cryptographically secure RNG.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Give up retrying once `timeout` has passed since the call started.
    ///
    /// Without a timeout or deadline, **obtain gives up after the lock's TTL** (as
    /// bsm/redislock does); pass a longer timeout to wait longer. Replaces any deadline.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limit = Some(Limit::Timeout(timeout));
        self
    }

    /// Give up retrying at `deadline` (a `std::time::Instant` or `tokio::time::Instant`).
    /// Replaces any timeout.
    #[must_use]
    pub fn deadline(mut self, deadline: impl Into<Instant>) -> Self {
        self.limit = Some(Limit::Deadline(deadline.into()));
        self
    }

    /// Mint a fencing token with every successful obtain (see
    /// [`Lock::fencing_token`](crate::Lock::fencing_token)), from a counter key derived from
    /// the lock's first key by [`fencing_key_for`](crate::fencing_key_for). Off by default;
    /// locks without fencing pay nothing for it.
    ///
    /// See the guide: [fencing tokens](crate::guide::long_work).
    #[must_use]
    pub fn fencing(mut self) -> Self {
        self.fencing = Some(Fencing::Derived);
        self
    }

    /// Mint fencing tokens from this counter key. Share one counter among every lock that
    /// guards the same resource; on a cluster it must hash to the lock keys' slot.
    #[must_use]
    pub fn fencing_key(mut self, counter: impl Into<String>) -> Self {
        self.fencing = Some(Fencing::Key(counter.into()));
        self
    }

    /// How often [`Client::with_lock`](crate::Client::with_lock)'s watchdog refreshes the
    /// lock. Defaults to a third of the TTL; clamped to between 1 ms and half the TTL.
    #[must_use]
    pub fn watchdog_interval(mut self, interval: Duration) -> Self {
        self.watchdog_interval = Some(interval);
        self
    }

    /// Calls `callback` before each retry of an obtain or refresh, with the attempt that
    /// failed, what blocked it (the held key and its holder's remaining TTL, or the error),
    /// the holder's metadata when the server told it, and the longest the caller will wait: for metrics without `tracing`. It runs on the
    /// caller's task, so keep it short. The same is logged as a `lockset::retry` debug event.
    ///
    /// See the guide: [observing](crate::guide::observing).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use lockset::{Blocked, Options};
    ///
    /// let held = Arc::new(AtomicU64::new(0));
    /// let counter = held.clone();
    /// let options = Options::default().on_retry(move |event| {
    ///     if let Blocked::Held { .. } = event.blocked {
    ///         counter.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// });
    /// ```
    #[must_use]
    pub fn on_retry(mut self, callback: impl Fn(&RetryEvent<'_>) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(OnRetry::new(callback));
        self
    }

    /// Whether a waiting obtain queues for the lock (`true`, the default) or takes it as it
    /// comes free, racing every other waiter (`false`, "barging").
    ///
    /// See the guide: [waiting and fair hand-off](crate::guide::waiting#fair-waiting-a-queue-in-redis-and-a-direct-hand-off).
    ///
    /// A fair waiter that finds a key held takes a place in the key's queue in Redis, first
    /// come first served across every client and process, whatever mode it wants the key in.
    /// A release hands the lock straight to the first waiter in the queue (a shared key to
    /// every reader at the head at once, a counted key to as many permit waiters as permits
    /// came free), in the same atomic step, and tells each alone; nobody races for it. A
    /// waiter for several keys queues on each, and gets them all at once, never some. The
    /// waiter keeps its place by renewing a lease (see [`Options::waiter_lease`]) for as
    /// long as it waits. A waiter with its own token ([`Options::token`]) queues too; one
    /// that gives up only leaves its queues (the keys its token holds may be an outer
    /// lock's): what a release handed it just before stays with its token until it expires.
    ///
    /// Fair waiting needs release events (a client from [`Client::connect`] or
    /// `Client::connect_cluster`, feature `cluster`) and a single server or a cluster, and keys that have a
    /// queue ([`queue_key_for`](crate::queue_key_for): not a key without a hash tag that
    /// contains a brace); otherwise waiters barge as with `fair(false)`, as does a waiter
    /// whose queue the server cannot reach (a cluster slot that migrates). A Redlock
    /// quorum always barges: a queue per master could hand the lock to different waiters on
    /// different masters. Barging gives the most throughput to waiters of one client, and
    /// none of the order.
    ///
    /// [`Client::connect`]: crate::Client::connect
    #[must_use]
    pub fn fair(mut self, fair: bool) -> Self {
        self.barging = !fair;
        self
    }

    /// How long a fair waiter's place in a queue lasts unless renewed: a waiter that
    /// crashed, or was cut off from Redis, stops holding up the queue within this time.
    /// The waiter renews it every third of it while it waits.
    ///
    /// See the guide: [fair waiting](crate::guide::waiting#fair-waiting-a-queue-in-redis-and-a-direct-hand-off).
    ///
    /// A lock handed to a waiter is held for no longer than what is left of its lease, so
    /// a waiter that died blocks it no longer; the new holder takes it without a round trip
    /// when that is (nearly) its full TTL, and otherwise makes it its own for the full TTL
    /// by one more attempt. Defaults to one and a half times the lock's TTL (every hand-off
    /// gives the full TTL, and a dead waiter costs no more than a dead holder), but at least
    /// 2 s and at most 15 s. Rounded up to whole milliseconds.
    #[must_use]
    pub fn waiter_lease(mut self, lease: Duration) -> Self {
        self.waiter_lease = Some(lease);
        self
    }

    /// Names the lock family this call's metrics go to (feature `metrics`): every figure of
    /// the obtain, and of the lock it returns (its refreshes, release, loss and hold time),
    /// carries the label `lock="<name>"`. Without it, they carry no such label.
    ///
    /// See the guide: [metrics](crate::guide::observing#metrics).
    ///
    /// Name families, never single locks: each name is a series of its own in every metric
    /// (keep their number small, like a handful of job kinds), and a key or a token must
    /// never go here. Metrics of a family are registered with the recorder at its first
    /// figure: make one `Options` per family and reuse it.
    ///
    /// ```
    /// let options = lockset::Options::default().metrics_label("nightly-report");
    /// ```
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics_label(mut self, name: impl Into<String>) -> Self {
        self.meter = Some(Meter::labelled(name.into()));
        self
    }

    /// The metadata an obtain stores: empty unless set.
    pub(crate) fn metadata_to_store(&self) -> &str {
        self.metadata.as_deref().unwrap_or_default()
    }

    /// Checks the metadata for a lock of `keys` keys (at most
    /// [`MAX_METADATA`](crate::MAX_METADATA) bytes, and
    /// [`MAX_LOCK_METADATA`](crate::MAX_LOCK_METADATA) over all keys), before anything is
    /// sent.
    pub(crate) fn check_metadata(
        &self,
        keys: usize,
    ) -> Result<(), crate::model::invalid::InvalidInput> {
        crate::model::validate::metadata(self.metadata_to_store(), keys)
    }

    /// When a call that started at `start` must stop retrying; `None` when that lies
    /// beyond what `Instant` can represent.
    pub(crate) fn deadline_from(&self, start: Instant, ttl: Duration) -> Option<Instant> {
        match self.limit {
            Some(Limit::Deadline(deadline)) => Some(deadline),
            Some(Limit::Timeout(timeout)) => start.checked_add(timeout),
            None => start.checked_add(ttl),
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("retry", &self.retry)
            .field("metadata", &self.metadata)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("fencing", &self.fencing)
            .field("watchdog_interval", &self.watchdog_interval)
            .field("on_retry", &self.on_retry)
            .field("fair", &!self.barging)
            .field("waiter_lease", &self.waiter_lease)
            .field("metrics_label", &self.meter.as_ref().and_then(Meter::label))
            .field("limit", &self.limit)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_token() {
        let options = Options::default().token("very-secret").metadata("meta");
        let debug = format!("{options:?}");
        assert!(!debug.contains("very-secret"), "{debug}");
        assert!(
            debug.contains("<redacted>") && debug.contains("meta"),
            "{debug}"
        );
    }

    #[test]
    fn default_deadline_is_the_ttl() {
        let start = Instant::now();
        let ttl = Duration::from_secs(3);
        assert_eq!(
            Options::default().deadline_from(start, ttl),
            Some(start + ttl)
        );
    }

    #[test]
    fn the_last_limit_given_wins() {
        let start = Instant::now();
        let ttl = Duration::from_secs(3);
        let deadline = start + Duration::from_secs(10);
        let options = Options::default()
            .timeout(Duration::from_secs(1))
            .deadline(deadline);
        assert_eq!(options.deadline_from(start, ttl), Some(deadline));
        let options = options.timeout(Duration::from_secs(1));
        assert_eq!(
            options.deadline_from(start, ttl),
            Some(start + Duration::from_secs(1))
        );
    }

    #[test]
    fn an_unrepresentable_deadline_means_no_deadline() {
        let options = Options::default().timeout(Duration::MAX);
        assert_eq!(
            options.deadline_from(Instant::now(), Duration::from_secs(1)),
            None
        );
    }
}
