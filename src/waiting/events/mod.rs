//! Release events: a pub/sub connection per client wakes its waiting obtains the moment a
//! lock they wait for is released, instead of leaving them to poll.
//!
//! **Who announces.** A waiter that finds a key held marks the holder's value (a leading `!`,
//! see `model/value.rs`), and the holder's release announces exactly the marked keys, each on its
//! release channel. An uncontended release announces nothing and costs nothing.
//!
//! **Listening.** A waiter registers interest in the channel of the key it waits for, then
//! makes sure the server has the subscription, for no longer than it would have slept anyway:
//! a stuck connection degrades waiters to polling, never to hanging. Subscribing runs in a
//! task of its own per channel, so one slow channel holds up no other, and a waiter that
//! stops waiting leaves it to finish for the next. Channels nobody waits for are unsubscribed
//! in batches after a short idle time, so that a lock handed from waiter to waiter does not
//! subscribe and unsubscribe on every hand-over.
//!
//! **Dispatch.** Messages arrive through redis-rs's RESP3 push sender and are handled inline,
//! in constant time, without awaiting anything: a message for a channel nobody waits on is
//! dropped, any other wakes **one** waiter of this client (`Notify::notify_one`), since the
//! lock can go to only one of them; or **every** waiter of this client while one of them
//! would share the key (shared, or a permit: one release may let them all in), and such a
//! waiter that was not asleep yet when woken does not go to sleep. A woken waiter that does not take the lock because it
//! leaves (another key of its set is held, its deadline passed, it was cancelled) passes the
//! wake-up on to the next waiter. (redis-rs's connection manager forwards pushes through an
//! internal channel and a task that does nothing else, before they reach the dispatcher.)
//!
//! **Hand-over.** A release by this very client wakes one local waiter as soon as the release
//! is queued on the connection (its obtain then runs right behind the release), and names
//! the release in its announcement's payload: the announcement of exactly that release is
//! then skipped, so one release wakes one waiter. A release that deleted nothing announces
//! nothing, and its record is withdrawn; records never matched expire.
//!
//! **Hand-offs.** A release that hands a key to a fair waiter tells it on its client's own
//! hand-off channel for the key (named with the client's random tag, see `model/names.rs`),
//! so that only that client hears it; and on the key's release channel, which every client
//! with a waiter for the key hears, only for a waiter whose own channel was not live (see
//! `waiting/waiter.rs`), or when the releasing user may not publish on it (`lua/handoff.lua`). A server that refuses those channels (an ACL that lists channels
//! by exact name) is asked for them again only after a pause, and its waiters hear their
//! hand-offs on the key's channel meanwhile: the refusal pauses no other subscription.
//!
//! **A quorum** listens on every master with listeners of its own (one per master), which
//! share a record of the releases they heard: the same release announced by several masters
//! wakes one waiter, not one per master.
//!
//! **Faults.** redis-rs reconnects and resubscribes by itself. A disconnection marks every
//! channel unsubscribed and wakes one waiter per channel; waiters then subscribe again (which
//! also reconnects a connection redis-rs gave up on), and each resubscription wakes one more
//! waiter per channel: a release may have been announced while nobody listened. A channel the
//! server drops (its cluster slot moved) is handled the same way. A connection that fails
//! subscriptions or pings repeatedly is replaced; a server that refuses subscriptions (a user
//! without channel rights) is asked again only after a pause.

mod heard;
mod listener;
mod subscription;

use heard::Heard;
use listener::{follow_primary, sweeper};

#[cfg(feature = "cluster")]
use crate::error::classify::is_unknown_command;
use crate::rt::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::model::request::Handed;
use crate::topology::sentinel::SentinelConnection;

/// Channels nobody waits for stay subscribed this long, for the next waiter.
const IDLE: Duration = Duration::from_secs(1);
/// How often idle channels are looked for.
const SWEEP: Duration = Duration::from_millis(500);
/// How often the connection is pinged while somebody waits (a half-open connection shows).
const PING_EVERY: Duration = Duration::from_secs(5);
/// How long a release's payload is remembered (local hand-overs, a quorum's dedupe).
const REMEMBER_FOR: Duration = Duration::from_secs(10);
/// Most payloads a quorum's listeners remember.
const REMEMBER_AT_MOST: usize = 4096;
/// Connection failures in a row after which the connection is replaced.
const FAILURES_BEFORE_RECONNECT: u32 = 2;
/// A server that refused a subscription is asked again after this pause.
const REFUSED_PAUSE: Duration = Duration::from_secs(30);
/// A waiter whose subscription failed tries again after this pause (within its bound).
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Most channels unsubscribed by one command.
const UNSUBSCRIBE_BATCH: usize = 256;
/// Time limits of the pub/sub connection's own requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A payload naming one release, unique within this process and across processes (a random
/// prefix per process).
pub(crate) fn release_payload() -> String {
    static PREFIX: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| rand::rng().next_u64());
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}{n:x}", *PREFIX)
}

/// The release events of one client (shared by its clones), from one server.
#[derive(Clone)]
pub(crate) struct Events {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    listener: Mutex<Option<Listener>>,
    /// Bumped whenever the listener is replaced: confirmations from an older one are void,
    /// and requests still waiting on it are abandoned.
    generation: watch::Sender<u64>,
    /// Connection failures in a row.
    failures: AtomicU32,
    /// Until when subscribing is not tried again, after the server refused it.
    refused_until: Mutex<Option<Instant>>,
    /// Until when hand-off channels are not subscribed again, after the server refused one.
    own_refused_until: Mutex<Option<Instant>>,
    /// This client's hand-off tag (see [`Events::handoff_tag`]).
    tag: Arc<str>,
    sweeper: AtomicBool,
    channels: Mutex<HashMap<String, Channel>>,
    /// How many release channels have waiters (hand-off channels not counted), readable
    /// without the lock on every release.
    watched: AtomicUsize,
    /// How many channels `channels` holds (with waiters, or idle and maybe still
    /// subscribed), readable without the lock on every obtain.
    known: AtomicUsize,
    /// Releases already heard by a sibling listener (the masters of one quorum).
    heard: Option<Arc<Heard>>,
}

/// Where to open the pub/sub connection.
#[derive(Clone)]
enum Source {
    /// Boxed: with redis-rs's TLS support on (a dependency may turn it on), a client is
    /// ten times the size of the other variants.
    Server(Box<redis::Client>),
    /// The current primary of a Sentinel deployment: each change of primary replaces the
    /// connection.
    Sentinel(SentinelConnection),
    #[cfg(feature = "cluster")]
    Cluster(Vec<redis::ConnectionInfo>),
}

/// The pub/sub connection, and the generation it belongs to.
#[derive(Clone)]
struct Listener {
    conn: Conn,
    generation: u64,
}

#[derive(Clone)]
enum Conn {
    Server(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        /// Sharded pub/sub (Redis 7); plain pub/sub before.
        sharded: Arc<AtomicBool>,
    },
}

/// One release channel with waiters, or recently with waiters.
struct Channel {
    waiters: usize,
    /// Waiters that would share the key (shared, or a permit): one release may let all of
    /// them in, so then a release wakes every waiter instead of one.
    sharers: usize,
    /// How many times waiters were woken: a sharing waiter that was between an attempt and
    /// its sleep when it happened (a `Notify` keeps one wake-up, not one per waiter) sees it
    /// changed and does not sleep.
    wakes: Arc<AtomicU64>,
    notify: Arc<Notify>,
    state: Arc<ChannelState>,
    /// When the last waiter left.
    idle_since: Option<Instant>,
    /// The subscription was lost: wake a waiter when it is confirmed again.
    lapsed: bool,
    /// Payloads of this client's releases handed over locally, still to be announced.
    expected: Vec<(Box<[u8]>, Instant)>,
    /// Fair waiters, by id: a release that hands one the lock tells it by name.
    grants: HashMap<Box<[u8]>, Arc<Grant>>,
}

/// Where a release's hand-off to one fair waiter lands, whichever of its channels it comes
/// on: what it was handed, and its wake-up.
#[derive(Default)]
pub(crate) struct Grant {
    handed: Mutex<Option<Handed>>,
    notify: Notify,
}

impl Grant {
    /// The hand-off told of, if any (once).
    pub(crate) fn take(&self) -> Option<Handed> {
        lock(&self.handed).take()
    }

    /// Completes when a hand-off is told of, or one may have been missed (a subscription
    /// lapsed, or is back); also for one that came before this was called.
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Channel {
    /// The subscription lapsed, or came back: a release may have gone unheard. Wakes a
    /// waiter as for a release, and every fair waiter: each may have missed its own
    /// hand-off notice (its attempt finds the keys its own, or renews its place).
    fn missed(&self) {
        self.wake();
        for grant in self.grants.values() {
            grant.notify.notify_one();
        }
    }

    /// Wakes a waiter for a release: one, since the key can go to one; or, while some
    /// waiter would share it, every waiter (each sees for itself whether it may go in, and
    /// a waiting writer must not sleep through the release a reader could not use).
    fn wake(&self) {
        self.wakes.fetch_add(1, Ordering::AcqRel);
        let wakes = if self.sharers > 0 { self.waiters } else { 1 };
        for _ in 0..wakes.max(1) {
            self.notify.notify_one();
        }
    }
}

/// Whether the server has a channel's subscription; `op` serialises changing it.
struct ChannelState {
    /// A client's own hand-off channel (see [`Events::subscribe_own`]).
    own: bool,
    op: Arc<tokio::sync::Mutex<()>>,
    /// The generation of the listener that has the subscription, if any.
    subscribed: watch::Sender<Option<u64>>,
    /// A task is subscribing now.
    subscribing: AtomicBool,
}

impl ChannelState {
    fn new(own: bool) -> Self {
        Self {
            own,
            op: Arc::default(),
            subscribed: watch::Sender::new(None),
            subscribing: AtomicBool::new(false),
        }
    }
}

impl ChannelState {
    fn is_subscribed(&self) -> bool {
        self.subscribed.borrow().is_some()
    }

    /// Forgets the subscription; true when it was there.
    fn unsubscribed(&self) -> bool {
        self.subscribed.send_replace(None).is_some()
    }
}

impl Events {
    /// Release events over a pub/sub connection to the server behind `client` (RESP3),
    /// opened when the first waiter listens.
    pub(crate) fn new(client: redis::Client) -> Self {
        Self::with_source(Source::Server(Box::new(client)), None)
    }

    /// Release events over a pub/sub connection to the current primary behind `sentinel`
    /// (RESP3), replaced whenever the primary changes.
    pub(crate) fn sentinel(sentinel: SentinelConnection) -> Self {
        Self::with_source(Source::Sentinel(sentinel), None)
    }

    /// Release events over sharded pub/sub on the cluster behind `nodes` (RESP3).
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(nodes: Vec<redis::ConnectionInfo>) -> Self {
        Self::with_source(Source::Cluster(nodes), None)
    }

    /// Listeners of their own for a quorum, one per master like these, that count a release
    /// announced by several masters once.
    pub(crate) fn for_quorum(masters: &[Self]) -> Vec<Self> {
        let heard = Arc::new(Heard::default());
        masters
            .iter()
            .map(|master| Self::with_source(master.inner.source.clone(), Some(heard.clone())))
            .collect()
    }

    fn with_source(source: Source, heard: Option<Arc<Heard>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                listener: Mutex::new(None),
                generation: watch::Sender::new(0),
                failures: AtomicU32::new(0),
                refused_until: Mutex::new(None),
                own_refused_until: Mutex::new(None),
                tag: format!("{:016x}", rand::rng().next_u64()).into(),
                sweeper: AtomicBool::new(false),
                channels: Mutex::default(),
                watched: AtomicUsize::new(0),
                known: AtomicUsize::new(0),
                heard,
            }),
        }
    }

    /// This client's hand-off tag: random, so that each client's fair waiters hear their
    /// hand-offs on channels of its own (see `model/names.rs`, `handoff_channel`).
    pub(crate) fn handoff_tag(&self) -> Arc<str> {
        self.inner.tag.clone()
    }

    /// Registers a waiter of `channel`, `sharing` its key (shared, or as a permit) or not,
    /// and for a fair waiter, the id by which a hand-off names it and where the hand-off
    /// lands. It listens once [`Subscription::confirm`] says so.
    pub(crate) fn subscribe(
        &self,
        channel: &str,
        sharing: bool,
        grant: Option<(&str, &Arc<Grant>)>,
    ) -> Subscription {
        self.register(channel, sharing, grant, false)
    }

    /// Registers a fair waiter on its client's own hand-off `channel` for one of its keys,
    /// under the id by which a hand-off names it and where the hand-off lands; see
    /// [`Subscription::settle`].
    pub(crate) fn subscribe_own(&self, channel: &str, grant: (&str, &Arc<Grant>)) -> Subscription {
        self.register(channel, false, Some(grant), true)
    }

    fn register(
        &self,
        channel: &str,
        sharing: bool,
        grant: Option<(&str, &Arc<Grant>)>,
        own: bool,
    ) -> Subscription {
        let mut channels = lock(&self.inner.channels);
        let entry = channels.entry(channel.to_owned()).or_insert_with(|| {
            self.inner.known.fetch_add(1, Ordering::Relaxed);
            Channel {
                waiters: 0,
                sharers: 0,
                wakes: Arc::default(),
                notify: Arc::new(Notify::new()),
                state: Arc::new(ChannelState::new(own)),
                idle_since: None,
                lapsed: false,
                expected: Vec::new(),
                grants: HashMap::new(),
            }
        });
        entry.waiters += 1;
        entry.sharers += usize::from(sharing);
        entry.idle_since = None;
        // A hand-off channel goes with a release channel: only those are counted.
        if entry.waiters == 1 && !own {
            self.inner.watched.fetch_add(1, Ordering::Relaxed);
        }
        let grant = grant.map(|(id, grant)| {
            let id: Box<[u8]> = id.as_bytes().into();
            entry.grants.insert(id.clone(), grant.clone());
            (id, grant.clone())
        });
        Subscription {
            events: self.clone(),
            channel: channel.to_owned(),
            notify: entry.notify.clone(),
            state: entry.state.clone(),
            woken: AtomicBool::new(false),
            sharing,
            seen: AtomicU64::new(entry.wakes.load(Ordering::Acquire)),
            wakes: entry.wakes.clone(),
            grant,
        }
    }

    /// Whether the server has this client's subscription to `channel` now (other waiters
    /// keep it), as far as is known.
    pub(crate) fn is_live(&self, channel: &str) -> bool {
        // Most obtains find none: no lock to take.
        if self.inner.known.load(Ordering::Relaxed) == 0 {
            return false;
        }
        lock(&self.inner.channels)
            .get(channel)
            .is_some_and(|entry| entry.state.is_subscribed())
    }

    /// How many channels have waiters now.
    pub(crate) fn channels(&self) -> usize {
        self.inner.watched.load(Ordering::Relaxed)
    }

    /// Wakes one local waiter of `channel` for a release by this client that will be
    /// announced with `payload`, whose announcement is then skipped; false when nobody here
    /// waits.
    pub(crate) fn hand_over(&self, channel: &str, payload: &str) -> bool {
        let mut channels = lock(&self.inner.channels);
        // Fair waiters are handed the lock by the release itself.
        let Some(entry) = channels
            .get_mut(channel)
            .filter(|e| e.waiters > 0 && e.grants.is_empty())
        else {
            return false;
        };
        entry
            .expected
            .retain(|(_, since)| since.elapsed() < REMEMBER_FOR);
        entry
            .expected
            .push((payload.as_bytes().into(), Instant::now()));
        entry.wake();
        true
    }

    /// Wakes one local waiter of `channel` once more, for a release that was handed over
    /// but ran only later (after a NOSCRIPT reply, behind the attempt of the waiter it woke).
    /// Its announcement, if it comes, is still skipped: this is the one wake-up it is owed.
    pub(crate) fn wake_again(&self, channel: &str) {
        if let Some(entry) = lock(&self.inner.channels)
            .get(channel)
            .filter(|e| e.waiters > 0 && e.grants.is_empty())
        {
            entry.wake();
        }
    }

    /// Forgets a hand-over whose release announced nothing (it deleted nothing).
    pub(crate) fn withdraw(&self, channel: &str, payload: &str) {
        if let Some(entry) = lock(&self.inner.channels).get_mut(channel) {
            entry.expected.retain(|(p, _)| &**p != payload.as_bytes());
        }
    }

    /// The pub/sub connection, opened (and the sweeper started) on first use.
    async fn listener(&self) -> RedisResult<Listener> {
        if let Some(listener) = lock(&self.inner.listener).clone() {
            return Ok(listener);
        }
        let listener = loop {
            let generation = self.inner.generation();
            let conn = self
                .inner
                .connect(Arc::downgrade(&self.inner), generation)
                .await?;
            let mut slot = lock(&self.inner.listener);
            match &*slot {
                // Another waiter was faster; use its connection.
                Some(other) => break other.clone(),
                // Replaced while connecting: this connection's pushes count for nothing
                // (see `on_push`), so it must not become the listener. Connect again.
                None if generation != self.inner.generation() => {}
                None => break slot.insert(Listener { conn, generation }).clone(),
            }
        };
        if !self.inner.sweeper.swap(true, Ordering::AcqRel) {
            tokio::spawn(sweeper(Arc::downgrade(&self.inner)));
            if let Source::Sentinel(sentinel) = &self.inner.source {
                tokio::spawn(follow_primary(
                    Arc::downgrade(&self.inner),
                    sentinel.changes(),
                ));
            }
        }
        Ok(listener)
    }

    /// Subscribes to `channel` unless the server has it, within the connection's own time
    /// limits. A request on a connection that is replaced meanwhile (the primary changed, the
    /// connection kept failing) counts for nothing, and is made again on the new one at once
    /// (not after the old one's time limits: it may go on trying a server that is gone for
    /// seconds, and while this task runs no other subscribes the channel).
    async fn subscribe_now(&self, channel: &str, state: &ChannelState) {
        if self.inner.refused(state.own) {
            return;
        }
        loop {
            let subscribed = async {
                let listener = self.listener().await?;
                let _op = state.op.lock().await;
                // Swept while this task waited (nobody listens): a subscription now would be
                // one that nothing ever drops.
                if state.is_subscribed() || !self.inner.is_wanted(channel, state) {
                    return Ok(true);
                }
                let subscribed = tokio::select! {
                    biased;
                    () = self.inner.replaced(listener.generation) => return Ok(false),
                    subscribed = listener.conn.subscribe(channel) => subscribed,
                };
                if self.inner.generation() != listener.generation {
                    return Ok(false);
                }
                subscribed?;
                state.subscribed.send_replace(Some(listener.generation));
                RedisResult::Ok(true)
            };
            match subscribed.await {
                Ok(true) => return self.inner.failures.store(0, Ordering::Relaxed),
                Ok(false) => {}
                Err(err) => return self.inner.failed(&err, state.own),
            }
        }
    }
}

/// A waiter's interest in one release channel; leaving it idle when the last is dropped.
pub(crate) struct Subscription {
    events: Events,
    channel: String,
    notify: Arc<Notify>,
    state: Arc<ChannelState>,
    /// This waiter was woken and has not used the wake-up yet.
    woken: AtomicBool,
    /// It would share the key (see [`Channel::sharers`]).
    sharing: bool,
    /// The channel's wake-ups (see [`Channel::wakes`]), and their number when this waiter
    /// last made an attempt.
    wakes: Arc<AtomicU64>,
    seen: AtomicU64,
    /// A fair waiter's id, and where a hand-off to it lands.
    grant: Option<(Box<[u8]>, Arc<Grant>)>,
}

/// Runs `future` up to its first pending point (for a Redis command: queued on the
/// connection), then `then`, then the rest of `future`. The future is pinned by the caller
/// (moving it would copy it whole).
pub(crate) async fn after_queueing<F: std::future::Future>(
    mut future: std::pin::Pin<&mut F>,
    then: impl FnOnce(),
) -> F::Output {
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
    then();
    match first {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => future.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that accepts connections and never answers; counts the connections.
    fn black_hole() -> (u16, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for stream in listener.incoming() {
                count.fetch_add(1, Ordering::SeqCst);
                open.push(stream);
            }
        });
        (port, accepted)
    }

    async fn until(accepted: &AtomicUsize, n: usize) {
        while accepted.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A Sentinel failover replaces the listener while a SUBSCRIBE waits on the old primary's
    /// connection (it may keep trying a server that is gone for seconds): the subscription
    /// is made on the new connection at once, not after the old one's time limits (2 s).
    #[tokio::test]
    async fn a_subscription_waiting_on_a_replaced_connection_is_made_again_at_once() {
        let (port, accepted) = black_hole();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let events = Events::new(client);
        let subscription = events.subscribe("channel", false, None);
        subscription.renew();
        tokio::time::timeout(Duration::from_secs(10), until(&accepted, 1))
            .await
            .unwrap();
        let replaced = Instant::now();
        events.inner.replace_listener();
        tokio::time::timeout(Duration::from_secs(10), until(&accepted, 2))
            .await
            .unwrap();
        assert!(
            replaced.elapsed() < Duration::from_millis(1_000),
            "subscribed again only after {:?}",
            replaced.elapsed()
        );
    }
}
