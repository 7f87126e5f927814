//! A waiter's ears: which release channels an obtain listens on between its attempts, and
//! when an attempt that found the lock held must be followed at once by another.
//!
//! **The invariant: no notice where nobody listens.** Every notice a waiter can be sent
//! reaches it, or one more attempt closes the gap.
//! - A release announces a key on the key's channel when some waiter marked its holder, and
//!   tells a fair waiter of a hand-off on the channel its queue record names: key `l`'s
//!   release channel, or its client's own hand-off channel for that key (`c`), which only
//!   that client hears.
//! - A fair waiter's record names only a channel whose subscription was live (confirmed by
//!   the server) when the attempt that wrote it was sent, and the waiter stays registered on
//!   every channel it listened on (and on its client's own channel for each of those keys),
//!   hearing its hand-off on each, until its obtain ends: a hand-off notice is published
//!   where the waiter listens. A record written by an older client names no own channel,
//!   and an older client's release tells on the key's channel: both still reach it.
//! - An attempt that finds key `k` held marks `k`'s holder. When `k`'s channel was live when
//!   the attempt was sent, every later announcement reaches the waiter. When it was not (the
//!   first attempt, a new blocking key, a subscription that lapsed), the waiter subscribes
//!   and, once the server confirmed it, tries once more: a release between the attempt and
//!   the subscription has then freed the key, or handed it to this waiter.
//! - A subscription that lapses (the connection dropped or was replaced: a reconnect, a
//!   Sentinel failover; the server dropped the channel: a cluster slot moved) wakes its
//!   waiters when it lapses and again once it is back (see `events.rs`): each attempts then,
//!   and takes what was handed to it meanwhile.
//!
//! **No spin.** A waiter keeps every channel it listened on until its obtain ends, so each
//! of its keys costs it at most one unslept recheck (and one more per lapse of that
//! subscription): a waiter whose blocking key keeps changing sleeps between its attempts
//! once it listens on every key that blocks it.
//!
//! **One wake-up per release.** A waiter awaits announcements only on the channel of the key
//! that blocked its last attempt (and its own hand-off on any), so that a release never
//! spends its one wake-up on a waiter blocked elsewhere; a waiter whose blocking key changes
//! passes a wake-up it did not use on.

use std::sync::Arc;

use tokio::time::Instant;

use crate::model::mode::{Mode, Modes};
use crate::model::names::{handoff_channel, release_channel};
use crate::model::request::Held;
use crate::waiting::events::{Events, Grant, Subscription};
use crate::waiting::fair::Fair;

/// One channel a waiter listens on: the release channel of `keys[key]`, on every server;
/// and for a fair waiter, its client's own hand-off channel for that key.
struct Ear {
    key: usize,
    subscriptions: Vec<Subscription>,
    own: Vec<Subscription>,
}

impl Ear {
    /// Whether some server confirmed the subscription.
    fn is_live(&self) -> bool {
        self.subscriptions.iter().any(Subscription::is_live)
    }

    /// Whether some server confirmed the subscription to the client's own hand-off channel.
    fn own_is_live(&self) -> bool {
        self.own.iter().any(Subscription::is_live)
    }

    /// Every subscription of this ear.
    fn all_mut(&mut self) -> impl Iterator<Item = &mut Subscription> {
        self.subscriptions.iter_mut().chain(&mut self.own)
    }
}

/// Waits between attempts: sleeps, and when release events are on, listens to the release
/// channels of the keys that were held (on every server that has events: one, or each
/// master of a quorum).
pub(crate) struct Waiter<'a> {
    pub(crate) events: &'a [Events],
    keys: &'a [String],
    /// Each key's mode, for a lock with shared or counted keys.
    modes: Option<&'a Modes>,
    /// The obtain's place in the key queues, when it waits fairly.
    fair: Option<&'a Fair>,
    /// Every channel listened on so far, in the order first listened on.
    ears: Vec<Ear>,
    /// The ear of the key that blocked the last attempt: the one whose announcements wake.
    active: Option<usize>,
    /// An attempt queued: every attempt from now on queues, or renews the place.
    queued: bool,
    /// Where a hand-off to this (fair) waiter lands, on whichever channel it comes.
    grant: Option<Arc<Grant>>,
    /// The id under which the subscriptions expect a hand-off (see [`Fair::id`]).
    granted_as: Option<String>,
    /// The keys whose channels were live when the last attempt was sent.
    live_at_send: Vec<usize>,
    /// The key whose channel this (fair) waiter's queue record names.
    named: Option<usize>,
    /// The record names its client's own hand-off channel for that key (live when the
    /// attempt was sent).
    named_own: bool,
}

impl<'a> Waiter<'a> {
    /// A waiter that only sleeps.
    pub(crate) fn sleeping() -> Self {
        Self::for_keys(&[], &[], None, None)
    }

    /// A waiter for an obtain of `keys` (in `modes`), woken by the release events of
    /// `events`; queued for the keys when `fair`.
    pub(crate) fn for_keys(
        events: &'a [Events],
        keys: &'a [String],
        modes: Option<&'a Modes>,
        fair: Option<&'a Fair>,
    ) -> Self {
        Self {
            events,
            keys,
            modes,
            fair,
            ears: Vec::new(),
            active: None,
            queued: false,
            grant: fair.map(|_| Arc::default()),
            granted_as: fair.map(Fair::id),
            live_at_send: Vec::new(),
            named: None,
            named_own: false,
        }
    }

    /// Before the first attempt of a single-key obtain: when this client already listens on
    /// the key's release channel (for other waiters), joins them, so that the first attempt
    /// marks the holder (and queues), and a failed one needs no unslept recheck: the
    /// subscription was live before the attempt was sent.
    pub(crate) fn join_live(&mut self) {
        let [key] = self.keys else {
            return;
        };
        let channel = release_channel(key);
        if self.events.iter().any(|events| events.is_live(channel)) {
            let ear = self.listen(0);
            self.active = Some(ear);
        }
    }

    /// An attempt is about to be sent: notes which channels are live now (the attempt's
    /// marks and queue record can count on them), re-keys this waiter's hand-off after it
    /// started over under a new id, and takes a hand-off it was told of.
    pub(crate) fn attempting(&mut self) {
        let id = self.fair.map(Fair::id);
        if id != self.granted_as {
            for subscription in self.ears.iter_mut().flat_map(Ear::all_mut) {
                subscription.regrant(id.as_deref());
            }
            self.granted_as = id;
        }
        self.live_at_send = self
            .ears
            .iter()
            .filter(|ear| ear.is_live())
            .map(|ear| ear.key)
            .collect();
        for subscription in self.ears.iter().flat_map(|e| &e.subscriptions) {
            subscription.attempting();
        }
        // The waiter's own channel is named only beside a key's channel live at send: a
        // release of an older version tells the key's channel alone.
        let renamed = self.queueing() && !self.live_at_send.is_empty();
        if renamed {
            self.named = self.named_channel();
        }
        self.named_own = renamed && self.named_ear().is_some_and(Ear::own_is_live);
        if let (Some(fair), Some(handed)) = (self.fair, self.grant.as_ref().and_then(|g| g.take()))
        {
            fair.handed(handed);
        }
    }

    /// The key whose channel the next queue record names: one live now, the same as before
    /// when it still is (the record changes least), else the blocking key's.
    fn named_channel(&self) -> Option<usize> {
        let live = |key: &usize| self.live_at_send.contains(key);
        self.named
            .filter(live)
            .or_else(|| self.active.map(|a| self.ears[a].key).filter(live))
            .or_else(|| self.live_at_send.first().copied())
    }

    /// The ear of the key whose channel the queue record names.
    fn named_ear(&self) -> Option<&Ear> {
        self.ears.iter().find(|ear| Some(ear.key) == self.named)
    }

    /// The index of the key whose channel the attempt about to be sent names in its queue
    /// record, when it queues.
    pub(crate) fn listen_key(&self) -> usize {
        self.named.unwrap_or(0)
    }

    /// Whether the attempt about to be sent names its client's own hand-off channel for
    /// that key, when it queues: only this client is told of the hand-off.
    pub(crate) fn names_own_channel(&self) -> bool {
        self.named_own
    }

    /// Whether this obtain waits fairly (queues for its keys).
    pub(crate) fn is_fair(&self) -> bool {
        self.fair.is_some()
    }

    /// Whether the next attempt should mark the holder so that its release announces
    /// itself: only while this waiter listens for that announcement.
    pub(crate) fn marking(&self) -> bool {
        !self.ears.is_empty()
    }

    /// Whether the next attempt queues (or renews its place): a fair waiter queued already,
    /// or one with a live channel for its record to name.
    pub(crate) fn queueing(&self) -> bool {
        self.fair.is_some() && (self.queued || !self.live_at_send.is_empty())
    }

    /// An attempt found the lock held, and queued when `held.queued`.
    pub(crate) fn held(&mut self, held: &Held) {
        self.queued |= held.queued;
    }

    /// How long a queued waiter's lease lasts without renewal, when it is queued and hears
    /// its hand-off (the channel its record names is live).
    pub(crate) fn queued_lease(&self) -> Option<std::time::Duration> {
        let fair = self.fair.filter(|_| self.queued)?;
        let ear = self.named_ear()?;
        let live = match self.named_own {
            true => ear.own_is_live(),
            false => ear.is_live(),
        };
        live.then(|| fair.lease())
    }

    /// Whether something can wake this waiter: the blocking key's channel is live, or the
    /// channel its queue record names.
    pub(crate) fn hears(&self) -> bool {
        self.active.is_some_and(|a| self.ears[a].is_live()) || self.queued_lease().is_some()
    }

    /// Whether this waiter would share `keys[key]` (shared, or as a permit).
    fn sharing(&self, key: usize) -> bool {
        self.modes
            .and_then(|modes| modes.list().get(key))
            .is_some_and(|mode| *mode != Mode::Exclusive)
    }

    /// Registers this waiter on the release channel of `keys[key]` on every server (and a
    /// fair one on its client's own hand-off channel for the key, subscribed at once), and
    /// returns its ear.
    fn listen(&mut self, key: usize) -> usize {
        let channel = release_channel(&self.keys[key]);
        let sharing = self.sharing(key);
        let grant = self.granted_as.as_deref().zip(self.grant.as_ref());
        // Subscribed first: its confirmation then mostly comes with the key channel's.
        let own_channel = self
            .fair
            .and_then(|fair| handoff_channel(&self.keys[key], fair.tag()));
        let own = own_channel
            .zip(grant)
            .map(|(own, grant)| {
                let subscribe = |events: &Events| events.subscribe_own(&own, grant);
                let own: Vec<_> = self.events.iter().map(subscribe).collect();
                own.iter().for_each(Subscription::renew);
                own
            })
            .unwrap_or_default();
        let subscriptions = self
            .events
            .iter()
            .map(|events| events.subscribe(channel, sharing, grant))
            .collect();
        self.ears.push(Ear {
            key,
            subscriptions,
            own,
        });
        self.ears.len() - 1
    }

    /// Makes `ear` the one whose announcements wake this waiter. The one before passes on a
    /// wake-up it did not use (the release it announced may let another waiter in).
    fn activate(&mut self, ear: usize) {
        if let Some(before) = self.active.filter(|before| *before != ear) {
            for subscription in &self.ears[before].subscriptions {
                subscription.pass_on();
            }
        }
        self.active = Some(ear);
    }

    /// The last attempt found `keys[key]` held: listen to its channel from now on. True
    /// when the caller should try again at once: the channel was not live when that attempt
    /// was sent (a release may have come before the subscription), and now is (confirmed
    /// no later than `until`), or a hand-off came meanwhile.
    pub(crate) async fn listen_to(&mut self, key: usize, until: Option<Instant>) -> bool {
        if self.events.is_empty() || key >= self.keys.len() {
            return false;
        }
        let ear = match self.ears.iter().position(|ear| ear.key == key) {
            Some(ear) => ear,
            None => self.listen(key),
        };
        self.activate(ear);
        if self.live_at_send.contains(&key) {
            // Live on one server is enough to be woken, but not for good: where the
            // subscription lapsed (a quorum master's connection was replaced), subscribe
            // again in the background; while another master stays live, nobody else would.
            // So is the client's own hand-off channel, replaced with the connection (a
            // Sentinel failover) and subscribed again by nobody else while this obtain
            // waits: its hand-offs would go on the key's channel, heard by every client.
            let ear = &self.ears[ear];
            for subscription in ear.subscriptions.iter().chain(&ear.own) {
                subscription.renew();
            }
            return false;
        }
        self.confirm(ear, until).await
    }

    /// Waits until some server confirms `ear`'s subscription (the others keep subscribing
    /// in the background: a master that is down must not hold up the waiter), no later
    /// than `until`, or until a hand-off comes; true for either. A fair waiter also lets its
    /// own hand-off channel's subscription settle first (the server has it, or refused it),
    /// so that the attempt right after can name it.
    async fn confirm(&self, ear: usize, until: Option<Instant>) -> bool {
        let ear = &self.ears[ear];
        let confirmed = async {
            let mut confirmations: futures_util::stream::FuturesUnordered<_> =
                ear.subscriptions.iter().map(|s| s.confirm(until)).collect();
            while let Some(confirmed) = futures_util::StreamExt::next(&mut confirmations).await {
                if confirmed {
                    return true;
                }
            }
            false
        };
        let own = futures_util::future::join_all(ear.own.iter().map(|s| s.settle(until)));
        let confirmed = async { futures_util::future::join(confirmed, own).await.0 };
        tokio::select! {
            confirmed = confirmed => confirmed,
            () = self.granted() => true,
        }
    }

    /// Completes when a release hands this (fair) waiter the lock, or one may have been
    /// missed; never for a waiter that does not queue.
    async fn granted(&self) {
        match &self.grant {
            Some(grant) => grant.notified().await,
            None => std::future::pending().await,
        }
    }

    /// The subscriptions whose announcements wake this waiter.
    fn awake(&self) -> &[Subscription] {
        self.active
            .map_or(&[], |active| self.ears[active].subscriptions.as_slice())
    }

    /// A release event woke this waiter, but its attempt found the lock still held. True
    /// when it should try again at once (the release has since reached more masters).
    pub(crate) fn too_early(&self) -> bool {
        self.awake().first().is_some_and(Subscription::too_early)
    }

    /// The waiter used its wake-ups: it obtained the lock, or waits on.
    pub(crate) fn used(&self) {
        for subscription in self.ears.iter().flat_map(|e| &e.subscriptions) {
            subscription.used();
        }
    }

    /// Waits until `until` (forever when `None`), a release event on the blocking key's
    /// channel (also one that came since the last attempt, for a waiter that would share the
    /// key), or a hand-off; true when woken by an event.
    pub(crate) async fn wait(&self, until: Option<Instant>) -> bool {
        let awake = self.awake();
        if awake.iter().any(Subscription::missed_a_wake_up) {
            return true;
        }
        let sleep = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        let released = async {
            match awake {
                [] => std::future::pending().await,
                [one] => one.released().await,
                many => {
                    let each = many.iter().map(|s| Box::pin(s.released()));
                    futures_util::future::select_all(each).await;
                }
            }
        };
        tokio::select! {
            () = released => true,
            () = self.granted() => true,
            () = sleep => false,
        }
    }
}
