//! A waiter's interest in one release channel: waiting for a wake-up, and leaving the
//! channel idle when the last waiter is gone.

use super::*;

impl Subscription {
    /// Completes when a release was announced on this channel (one waiter per announcement),
    /// or when a lost subscription may have missed one.
    pub(crate) async fn released(&self) {
        self.notify.notified().await;
        self.woken.store(true, Ordering::Relaxed);
    }

    /// The waiter listens elsewhere now: a wake-up it did not use goes to the next waiter
    /// of this channel.
    pub(crate) fn pass_on(&self) {
        if self.woken.swap(false, Ordering::Relaxed) {
            self.notify.notify_one();
        }
    }

    /// The fair waiter started over under a new id (`None`: it no longer queues): a
    /// hand-off names that id now.
    pub(crate) fn regrant(&mut self, id: Option<&str>) {
        let Some((old, grant)) = self.grant.take() else {
            return;
        };
        let mut channels = lock(&self.events.inner.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.grants.remove(&old);
        if let Some(id) = id {
            let id: Box<[u8]> = id.as_bytes().into();
            entry.grants.insert(id.clone(), grant.clone());
            self.grant = Some((id, grant));
        }
    }

    /// The waiter is about to make an attempt: wake-ups until now are for releases it sees.
    pub(crate) fn attempting(&self) {
        self.seen
            .store(self.wakes.load(Ordering::Acquire), Ordering::Relaxed);
    }

    /// A sharing waiter was woken since its last attempt, maybe while it was not asleep yet
    /// (its wake-up then went to another waiter): it should not sleep.
    pub(crate) fn missed_a_wake_up(&self) -> bool {
        self.sharing && self.wakes.load(Ordering::Acquire) != self.seen.load(Ordering::Relaxed)
    }

    /// The waiter used its wake-up: it obtained the lock, or found it taken and waits again.
    pub(crate) fn used(&self) {
        self.woken.store(false, Ordering::Relaxed);
    }

    /// The release that woke this waiter came too early: the lock was still held (on a
    /// quorum, the release had not reached a majority yet). True when the waiter should try
    /// again at once; otherwise the release's next announcement wakes a waiter.
    pub(crate) fn too_early(&self) -> bool {
        self.events
            .inner
            .heard
            .as_ref()
            .is_some_and(|heard| heard.too_early(&self.channel))
    }

    /// Whether the server has the subscription, as far as is known.
    pub(crate) fn is_live(&self) -> bool {
        self.state.is_subscribed()
    }

    /// Makes sure the server gets the subscription, and waits for it no later than `until`
    /// (without `until`, for as long as a subscription takes); true once it has it. The
    /// subscribing runs in a task of its own, so a waiter that stops waiting leaves it to
    /// finish for the next one; one that failed is tried again while time remains.
    pub(crate) async fn confirm(&self, until: Option<Instant>) -> bool {
        let confirmed = async {
            let mut subscribed = self.state.subscribed.subscribe();
            loop {
                if subscribed.borrow_and_update().is_some() {
                    return;
                }
                self.start_subscribing();
                tokio::select! {
                    _ = subscribed.changed() => {}
                    () = tokio::time::sleep(RETRY_PAUSE) => {}
                }
            }
        };
        match until {
            Some(until) => tokio::time::timeout_at(until, confirmed).await.is_ok(),
            None => tokio::time::timeout(REQUEST_TIMEOUT * 2, confirmed)
                .await
                .is_ok(),
        }
    }

    /// For a client's own hand-off channel: makes sure the server gets the subscription, and
    /// waits for it no later than `until` (without `until`, for as long as a subscription
    /// takes); true once it has it, false as soon as a try ends without it (refused, or the
    /// connection failed). The waiter then hears its hand-off on the key's channel, so it
    /// does not wait on for this one.
    pub(crate) async fn settle(&self, until: Option<Instant>) -> bool {
        let mut subscribed = self.state.subscribed.subscribe();
        self.renew();
        let settled = async {
            loop {
                if subscribed.borrow_and_update().is_some() {
                    return true;
                }
                // A try ended (the task tells when, see `start_subscribing`) without it.
                if !self.state.subscribing.load(Ordering::Acquire) {
                    return false;
                }
                if subscribed.changed().await.is_err() {
                    return false;
                }
            }
        };
        let until = until.unwrap_or_else(|| Instant::now() + REQUEST_TIMEOUT * 2);
        tokio::time::timeout_at(until, settled)
            .await
            .unwrap_or(false)
    }

    /// Starts subscribing in the background when the server lacks this subscription, as
    /// far as is known (without waiting for it).
    pub(crate) fn renew(&self) {
        if !self.is_live() {
            self.start_subscribing();
        }
    }

    /// Starts a task that subscribes, unless one is running.
    pub(super) fn start_subscribing(&self) {
        if self.state.subscribing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (events, channel, state) = (
            self.events.clone(),
            self.channel.clone(),
            self.state.clone(),
        );
        tokio::spawn(async move {
            events.subscribe_now(&channel, &state).await;
            state.subscribing.store(false, Ordering::Release);
            if state.own {
                // Tells `settle` that the try ended, also without the subscription.
                state.subscribed.send_modify(|_| {});
            }
        });
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let inner = &self.events.inner;
        let mut channels = lock(&inner.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        entry.sharers -= usize::from(self.sharing);
        if let Some((id, _)) = &self.grant {
            entry.grants.remove(id);
        }
        if entry.waiters == 0 {
            entry.idle_since = Some(Instant::now());
            entry.expected.clear();
            if !self.state.own {
                inner.watched.fetch_sub(1, Ordering::Relaxed);
            }
        } else if *self.woken.get_mut() {
            // Leaving without the lock: the next waiter gets the wake-up.
            entry.notify.notify_one();
        }
    }
}
