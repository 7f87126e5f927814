//! A held lock: its keys and token, and the operations only its owner may perform.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::events::after_queueing;
use crate::guard::Guard;
use crate::options::Options;
use crate::policy::{self, Step, Waiter};
use crate::signal::LostSignal;
use crate::slots::release_channel;
use crate::validate;
use crate::value::Owner;

/// A lock on one or more keys, returned by [`Client::obtain`](crate::Client::obtain) and
/// [`Client::obtain_multi`](crate::Client::obtain_multi).
///
/// Dropping a `Lock` does not release it: the keys expire with their TTL. Call
/// [`Lock::release`] to free them early and to learn whether they were still ours, or turn
/// it into a [`Guard`] that releases on drop and can keep the lock alive.
/// `Debug` output never shows the token.
pub struct Lock<C> {
    client: Client<C>,
    keys: Vec<String>,
    owner: Owner,
    metadata: String,
    ttl: Duration,
    ttl_ms: u64,
    fence: Option<u64>,
    validity: Mutex<Validity>,
}

/// Until when the lock is known to be valid: when the last successful obtain or refresh was
/// sent, plus its TTL; "now" once the lock is known lost or released. The channel behind
/// [`LostSignal`]s is only made when the first signal is asked for: most locks never need
/// one, and it costs an allocation and wake-ups on every release.
struct Validity {
    until: Instant,
    signal: Option<watch::Sender<Instant>>,
}

impl Validity {
    /// Sets `until` when `update` says so, and tells any signal.
    fn update(&mut self, update: impl FnOnce(Instant) -> Option<Instant>) {
        if let Some(until) = update(self.until) {
            self.until = until;
            if let Some(signal) = &self.signal {
                signal.send_replace(until);
            }
        }
    }
}

/// What a successful obtain hands to [`Lock::new`].
pub(crate) struct Obtained {
    pub(crate) keys: Vec<String>,
    pub(crate) owner: Owner,
    pub(crate) metadata: String,
    pub(crate) ttl: Duration,
    pub(crate) ttl_ms: u64,
    pub(crate) fence: Option<u64>,
    /// When the successful attempt was sent, plus the TTL, less any drift allowance.
    pub(crate) valid_until: Instant,
}

impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(client: Client<C>, obtained: Obtained) -> Self {
        let valid_until = obtained.valid_until;
        Self {
            client,
            keys: obtained.keys,
            owner: obtained.owner,
            metadata: obtained.metadata,
            ttl: obtained.ttl,
            ttl_ms: obtained.ttl_ms,
            fence: obtained.fence,
            validity: Mutex::new(Validity {
                until: valid_until,
                signal: None,
            }),
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

    /// The fencing token minted when this lock was obtained, if
    /// [`Options::fencing`](crate::Options::fencing) asked for one.
    ///
    /// Tokens from one counter strictly increase with every successful obtain, including a
    /// re-obtain by the same token (which therefore supersedes the earlier one: use the
    /// highest you hold). Send it with every write to the protected resource, and have the
    /// resource reject a token lower than the highest it has seen. The counter is never
    /// reset by release or expiry, but it lives in Redis: a server restarted without
    /// persistence starts it over, so tokens can go backwards then.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// Until when the lock is known to be valid, by the local monotonic clock: the moment
    /// the last successful obtain or refresh was *sent*, plus its TTL (the keys expire no
    /// earlier on the server). Once the lock is known to be lost, or released, this is in
    /// the past.
    pub fn valid_until(&self) -> Instant {
        self.validity().until
    }

    /// A cheap, cloneable signal that fires when the lock is known lost: its validity ran
    /// out without a successful refresh, a refresh or TTL query found it gone, or it was
    /// released. See [`LostSignal`].
    pub fn lost_signal(&self) -> LostSignal {
        let mut validity = self.validity();
        let until = validity.until;
        let signal = validity
            .signal
            .get_or_insert_with(|| watch::Sender::new(until));
        LostSignal::new(signal.subscribe())
    }

    fn validity(&self) -> MutexGuard<'_, Validity> {
        // Validity is a plain value: a panic while holding the lock cannot corrupt it.
        self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The remaining time of the lock: the smallest remaining TTL across its keys.
    ///
    /// `Ok(None)` means the lock is not held any more (a key expired or now belongs to
    /// someone else). A lock whose keys someone made persistent reports `Duration::MAX`.
    /// A Redlock lock reports what is left of its validity, if a majority still holds it.
    pub async fn ttl(&self) -> Result<Option<Duration>> {
        let backend = self.client.backend();
        let mut left = backend.pttl(&self.keys, &self.owner, self.ttl).await?;
        if backend.is_quorum() {
            let validity = self.valid_until().saturating_duration_since(Instant::now());
            left = left
                .map(|left| left.min(validity))
                .filter(|left| !left.is_zero());
        }
        if left.is_none() {
            self.mark_lost();
        }
        Ok(left)
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
        policy::run(
            &options.retry,
            deadline,
            &mut Waiter::sleeping(),
            || async move {
                match self.refresh_once(ttl, ttl_ms).await {
                    Ok(true) => Step::Done(()),
                    Ok(false) => Step::Stop(Error::NotObtained),
                    Err(err) => Step::from_error(err),
                }
            },
        )
        .await
    }

    /// One refresh attempt; keeps the validity up to date.
    pub(crate) async fn refresh_once(&self, ttl: Duration, ttl_ms: u64) -> Result<bool> {
        let sent = Instant::now();
        let backend = self.client.backend();
        let refreshed = backend
            .refresh(&self.keys, &self.owner, &self.metadata, (ttl, ttl_ms))
            .await?;
        if refreshed {
            let valid_for = ttl.saturating_sub(backend.drift(ttl));
            let valid_until = sent.checked_add(valid_for).unwrap_or(sent);
            // Never move validity backwards (an older refresh finishing late).
            self.validity()
                .update(|current| (valid_until > current).then_some(valid_until));
        } else {
            self.mark_lost();
        }
        Ok(refreshed)
    }

    /// Releases the lock: deletes every key, only if every key is still ours.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock expired or was taken over (nothing is deleted then);
    /// [`Error::Redis`] when Redis could not be reached (the keys expire with their TTL).
    pub async fn release(self) -> Result<()> {
        self.release_keys().await
    }

    pub(crate) async fn release_keys(&self) -> Result<()> {
        self.mark_lost();
        let release = self
            .client
            .backend()
            .release(&self.keys, &self.owner, self.ttl);
        let released = match self.client.events() {
            // Waiters of this client: hand over as soon as the release is on its way.
            Some(events) if events.channels() > 0 => {
                let hand_over = || {
                    for key in &self.keys {
                        events.hand_over(release_channel(key));
                    }
                };
                after_queueing(release, hand_over).await?
            }
            _ => release.await?,
        };
        match released {
            true => Ok(()),
            false => Err(Error::NotHeld),
        }
    }

    /// Turns the lock into a [`Guard`] that releases it when dropped, without a watchdog.
    pub fn into_guard(self) -> Guard<C> {
        Guard::new(self, None)
    }

    /// Turns the lock into a [`Guard`] whose watchdog refreshes it every third of its TTL
    /// until the guard is released or dropped.
    pub fn keep_alive(self) -> Guard<C> {
        let every = self.ttl / 3;
        self.keep_alive_every(every)
    }

    /// Like [`Lock::keep_alive`], refreshing every `interval`, clamped to between 1 ms and
    /// half the TTL (so that a failed refresh can be retried before the lock expires).
    pub fn keep_alive_every(self, interval: Duration) -> Guard<C> {
        let interval = interval.min(self.ttl / 2).max(Duration::from_millis(1));
        Guard::new(self, Some(interval))
    }

    /// Refreshes once with the TTL the lock was obtained with (for the watchdog).
    pub(crate) async fn refresh_with_own_ttl(&self) -> Result<bool> {
        self.refresh_once(self.ttl, self.ttl_ms).await
    }

    /// The TTL the lock was obtained with.
    pub(crate) fn obtained_ttl(&self) -> Duration {
        self.ttl
    }

    pub(crate) fn client(&self) -> &Client<C> {
        &self.client
    }

    fn mark_lost(&self) {
        let now = Instant::now();
        self.validity()
            .update(|current| (now < current).then_some(now));
    }
}

impl<C> fmt::Debug for Lock<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("keys", &self.keys)
            .field("token", &"<redacted>")
            .field("metadata", &self.metadata)
            .field("ttl", &self.ttl)
            .field("fencing_token", &self.fence)
            .finish_non_exhaustive()
    }
}
