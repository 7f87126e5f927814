//! A lock that releases itself when dropped, and can keep itself alive (the watchdog).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::lock::Lock;
use crate::client::options::Options;
use crate::error::Result;
use crate::observe::meter::Lost;

/// A [`Lock`] that is released when dropped, optionally kept alive by a watchdog.
///
/// See the guide: [long work and validity](crate::guide::long_work).
///
/// Made by [`Lock::into_guard`], [`Lock::keep_alive`] or [`Lock::keep_alive_every`]; used by
/// [`Client::with_lock`](crate::Client::with_lock). Derefs to the [`Lock`] for its keys,
/// token, TTL and [`lost_signal`](Lock::lost_signal).
///
/// - **Watchdog.** Refreshes the lock every interval (default a third of the TTL). A refresh
///   that finds the lock gone fires the lost signal and stops the watchdog; transient errors
///   are retried until the lock's validity runs out, and then the signal fires by itself.
/// - **Release.** [`Guard::release`] stops the watchdog, waits for a refresh in flight to
///   finish, and only then releases: no refresh can outlive the release.
/// - **Drop.** Without an explicit release, dropping the guard stops the watchdog and releases
///   the lock in a background task on the current tokio runtime (best effort; its outcome is
///   logged with `tracing`). Outside a tokio runtime nothing can be sent: the keys then
///   expire with their TTL. Use [`Guard::release`] to learn whether release succeeded.
pub struct Guard<C = ConnectionManager>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    lock: Arc<Lock<C>>,
    watchdog: Option<Watchdog>,
    armed: bool,
}

/// A running watchdog: dropping `stop` asks it to end after any refresh in flight.
struct Watchdog {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl<C> Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(lock: Lock<C>, refresh_every: Option<Duration>) -> Self {
        let lock = Arc::new(lock);
        let watchdog = refresh_every.and_then(|every| {
            let (stop, stopped) = oneshot::channel();
            let tasks = lock.shared().tasks();
            let task = tasks.spawn(keep_alive(lock.clone(), every, stopped))?;
            Some(Watchdog { stop, task })
        });
        if refresh_every.is_some() && watchdog.is_none() {
            tracing::warn!("no tokio runtime: the lock is not kept alive");
        }
        Self {
            lock,
            watchdog,
            armed: true,
        }
    }

    /// Stops the watchdog (after any refresh in flight) and releases the lock.
    ///
    /// # Errors
    ///
    /// As [`Lock::release`]: [`Error::NotHeld`](crate::Error::NotHeld) when the lock was lost.
    pub async fn release(mut self) -> Result<()> {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop().await;
        }
        let released = self.lock.release_keys().await;
        // Only now: if this future is dropped before, the guard's drop still releases.
        self.armed = false;
        released
    }
}

impl Watchdog {
    async fn stop(self) {
        drop(self.stop);
        // A watchdog that panicked has nothing left to stop.
        let _ = self.task.await;
    }
}

impl<C> Deref for Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Target = Lock<C>;

    fn deref(&self) -> &Lock<C> {
        &self.lock
    }
}

impl<C> Drop for Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (lock, watchdog) = (self.lock.clone(), self.watchdog.take());
        let tasks = lock.shared().tasks().clone();
        let released = tasks.spawn(async move {
            if let Some(watchdog) = watchdog {
                watchdog.stop().await;
            }
            match lock.release_keys().await {
                Ok(()) => tracing::debug!(keys = lock.keys().len(), "released a dropped lock"),
                Err(err) => tracing::warn!(%err, "release of a dropped lock failed"),
            }
        });
        if released.is_none() {
            tracing::warn!("lock dropped outside a tokio runtime: its keys expire with their TTL");
        }
    }
}

impl<C> fmt::Debug for Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("lock", &self.lock)
            .field("watchdog", &self.watchdog.is_some())
            .finish()
    }
}

// Turning a lock into a guard belongs with the guard: the lock knows nothing of guards.
impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Turns the lock into a [`Guard`] that releases it when dropped, without a watchdog.
    pub fn into_guard(self) -> Guard<C> {
        Guard::new(self, None)
    }

    /// Turns the lock into a [`Guard`] whose watchdog refreshes it every third of its TTL
    /// until the guard is released or dropped.
    pub fn keep_alive(self) -> Guard<C> {
        let every = self.obtained_ttl() / 3;
        self.keep_alive_every(every)
    }

    /// Like [`Lock::keep_alive`], refreshing every `interval`, clamped to between 1 ms and
    /// half the TTL (so that a failed refresh can be retried before the lock expires).
    pub fn keep_alive_every(self, interval: Duration) -> Guard<C> {
        let interval = interval
            .min(self.obtained_ttl() / 2)
            .max(Duration::from_millis(1));
        Guard::new(self, Some(interval))
    }
}

impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Turns the lock into a [`Guard`] whose watchdog refreshes it as `options` say
    /// ([`Options::watchdog_interval`], else every third of its TTL): what
    /// [`Client::with_lock`](crate::Client::with_lock) holds its lock with.
    pub(crate) fn watched(self, options: &Options) -> Guard<C> {
        match options.watchdog_interval {
            Some(every) => self.keep_alive_every(every),
            None => self.keep_alive(),
        }
    }
}

/// Logs a release after `with_lock`'s work that failed: by then the work is done, and the
/// lost signal told it if the lock was lost meanwhile. A lock that was not ours any more
/// was already warned about when it was found lost (or expired with its TTL): only a
/// debug line then.
pub(crate) fn released_after_work(released: Result<()>) {
    match released {
        Ok(()) => {}
        Err(err) if err.is_not_held() => {
            tracing::debug!(%err, "with_lock's lock was no longer held at its release");
        }
        Err(err) => tracing::warn!(%err, "release after with_lock's work failed"),
    }
}

/// The watchdog: refreshes `lock` every `every` until stopped, lost, or out of validity.
async fn keep_alive<C>(lock: Arc<Lock<C>>, every: Duration, mut stop: oneshot::Receiver<()>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let ttl = lock.obtained_ttl();
    // After a failed refresh, try again sooner than the regular interval.
    let retry_after = (every / 4).max(Duration::from_millis(1));
    let mut next = refresh_due(lock.valid_until(), ttl, every);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let valid_until = lock.valid_until();
        if valid_until <= Instant::now() {
            // Released (no warning then), or lost: the signal has fired.
            lock.found_lost(Lost::Expired);
            return;
        }
        // A refresh still unanswered when the validity runs out cannot help any more.
        match tokio::time::timeout_at(valid_until, lock.refresh_with_own_ttl()).await {
            Ok(Ok(true)) => next = refresh_due(lock.valid_until(), ttl, every),
            Ok(Ok(false)) => return,
            Ok(Err(err)) => {
                tracing::warn!(
                    %err,
                    keys = lock.keys().len(),
                    key = %lock.key(),
                    "watchdog refresh failed; retrying while the lock is valid"
                );
                next = Instant::now() + retry_after;
            }
            Err(_) => {
                lock.found_lost(Lost::Expired);
                return;
            }
        }
    }
}

/// When the next refresh is due: `every` after the last successful one was sent.
fn refresh_due(valid_until: Instant, ttl: Duration, every: Duration) -> Instant {
    let sent = valid_until.checked_sub(ttl).unwrap_or(valid_until);
    sent + every
}
