//! Release events: a pub/sub connection per client wakes its waiting obtains the moment a
//! lock they wait for is released, instead of leaving them to poll.
//!
//! **Who announces.** A waiter that finds a key held marks the holder's value (a leading `!`,
//! see `value.rs`), and the holder's release announces exactly the marked keys, each on its
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
    sweeper: AtomicBool,
    channels: Mutex<HashMap<String, Channel>>,
    /// How many channels have waiters, readable without the lock on every release.
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
    op: Arc<tokio::sync::Mutex<()>>,
    /// The generation of the listener that has the subscription, if any.
    subscribed: watch::Sender<Option<u64>>,
    /// A task is subscribing now.
    subscribing: AtomicBool,
}

impl Default for ChannelState {
    fn default() -> Self {
        Self {
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

/// One announcement: the channel it came on and its payload.
type Announcement = (String, Box<[u8]>);

/// What a quorum's listeners know of one release.
struct Release {
    first_heard: Instant,
    /// How many masters announced it so far.
    heard: u32,
    /// How many had when its waiter last learned of it.
    known: u32,
    /// Its waiter found the lock still held (the release had not reached a majority): the
    /// next master to announce it wakes one waiter again.
    owed: bool,
}

/// The releases heard lately (oldest first), and per channel the last one that woke a
/// waiter.
#[derive(Default)]
struct Recent {
    releases: HashMap<Announcement, Release>,
    order: VecDeque<Announcement>,
    woke: HashMap<String, Box<[u8]>>,
}

/// The releases that a quorum's listeners heard, so that each wakes one waiter: a release
/// is announced by every master that held the lock, at slightly different times.
#[derive(Default)]
pub(crate) struct Heard {
    recent: Mutex<Recent>,
}

impl Heard {
    /// Whether this announcement of `payload` on `channel` should wake a waiter: the first
    /// time the release is heard, and once more after its waiter came too early.
    fn wakes(&self, channel: &str, payload: &[u8]) -> bool {
        let mut recent = lock(&self.recent);
        recent.forget_stale();
        let key = (channel.to_owned(), Box::<[u8]>::from(payload));
        if let Some(release) = recent.releases.get_mut(&key) {
            release.heard += 1;
            return std::mem::take(&mut release.owed);
        }
        let release = Release {
            first_heard: Instant::now(),
            heard: 1,
            known: 1,
            owed: false,
        };
        recent.releases.insert(key.clone(), release);
        recent.woke.insert(key.0.clone(), key.1.clone());
        recent.order.push_back(key);
        true
    }

    /// A waiter woken by the last release on `channel` found the lock still held. True when
    /// more masters announced that release since: try again now. Otherwise the next master
    /// to announce it wakes a waiter.
    fn too_early(&self, channel: &str) -> bool {
        let mut recent = lock(&self.recent);
        let Recent { releases, woke, .. } = &mut *recent;
        let Some(release) = woke
            .get(channel)
            .and_then(|payload| releases.get_mut(&(channel.to_owned(), payload.clone())))
        else {
            return false;
        };
        if release.heard > release.known {
            release.known = release.heard;
            return true;
        }
        release.owed = true;
        false
    }
}

impl Recent {
    fn forget_stale(&mut self) {
        while let Some(oldest) = self.order.front() {
            let stale = self
                .releases
                .get(oldest)
                .is_none_or(|r| r.first_heard.elapsed() >= REMEMBER_FOR);
            if !stale && self.order.len() < REMEMBER_AT_MOST {
                break;
            }
            if let Some((channel, payload)) = self.order.pop_front() {
                if self.woke.get(&channel) == Some(&payload) {
                    self.woke.remove(&channel);
                }
                self.releases.remove(&(channel, payload));
            }
        }
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
                sweeper: AtomicBool::new(false),
                channels: Mutex::default(),
                watched: AtomicUsize::new(0),
                known: AtomicUsize::new(0),
                heard,
            }),
        }
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
        let mut channels = lock(&self.inner.channels);
        let entry = channels.entry(channel.to_owned()).or_insert_with(|| {
            self.inner.known.fetch_add(1, Ordering::Relaxed);
            Channel {
                waiters: 0,
                sharers: 0,
                wakes: Arc::default(),
                notify: Arc::new(Notify::new()),
                state: Arc::default(),
                idle_since: None,
                lapsed: false,
                expected: Vec::new(),
                grants: HashMap::new(),
            }
        });
        entry.waiters += 1;
        entry.sharers += usize::from(sharing);
        entry.idle_since = None;
        if entry.waiters == 1 {
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
        if self.inner.refused() {
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
                Err(err) => return self.inner.failed(&err),
            }
        }
    }
}

impl Inner {
    /// Whether `channel` still has waiters and this subscription `state` (the sweeper did
    /// not forget it).
    fn is_wanted(&self, channel: &str, state: &ChannelState) -> bool {
        lock(&self.channels).get(channel).is_some_and(|entry| {
            entry.waiters > 0 && std::ptr::eq(Arc::as_ptr(&entry.state), state)
        })
    }

    /// The generation of the listener now.
    fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Completes once the listener of `generation` has been replaced.
    async fn replaced(&self, generation: u64) {
        let mut generations = self.generation.subscribe();
        // The sender lives as long as `self`: the wait ends only by a replacement.
        let _ = generations.wait_for(|now| *now != generation).await;
    }

    /// Whether subscribing is paused after the server refused it.
    fn refused(&self) -> bool {
        lock(&self.refused_until).is_some_and(|until| Instant::now() < until)
    }

    /// A request on the pub/sub connection failed. A refusal by the server pauses
    /// subscribing; connection failures, a few in a row, replace the connection.
    fn failed(&self, err: &RedisError) {
        if matches!(err.kind(), redis::ErrorKind::Server(_)) {
            let mut until = lock(&self.refused_until);
            if until.is_none() {
                tracing::warn!(%err, "the server refuses release-event subscriptions; waiters poll");
            }
            *until = Some(Instant::now() + REFUSED_PAUSE);
            return;
        }
        tracing::debug!(%err, "release-event connection failed; waiters poll meanwhile");
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_BEFORE_RECONNECT {
            tracing::warn!("release-event connection keeps failing; opening a new one");
            self.replace_listener();
        }
    }

    /// Drops the connection (it may be half-open): every subscription is gone, and one
    /// waiter per channel is woken to subscribe again.
    fn replace_listener(&self) {
        self.failures.store(0, Ordering::Relaxed);
        // The generation moves before the slot is emptied: a connection opened meanwhile
        // sees the new generation when it is about to be stored, and is not (`listener`).
        self.generation.send_modify(|generation| *generation += 1);
        lock(&self.listener).take();
        self.lapse_all();
    }

    /// The server lost every subscription: mark them gone, wake one waiter per channel now,
    /// and another once its subscription is back.
    fn lapse_all(&self) {
        for entry in lock(&self.channels).values_mut() {
            entry.state.unsubscribed();
            entry.lapsed = true;
            if entry.waiters > 0 {
                entry.missed();
            }
        }
    }

    /// Opens the pub/sub connection of `generation`, with pushes handled by
    /// [`Inner::on_push`].
    async fn connect(&self, me: Weak<Self>, generation: u64) -> RedisResult<Conn> {
        let on_push = move |push: PushInfo| match me.upgrade() {
            Some(inner) => {
                inner.on_push(push, generation);
                Ok(())
            }
            None => Err(()),
        };
        match &self.source {
            Source::Server(client) => Self::connect_server(client, on_push),
            Source::Sentinel(sentinel) => {
                let client = sentinel.primary_client().await?;
                Self::connect_server(&client, on_push)
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(nodes) => {
                let conn = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(on_push)
                    .connection_timeout(REQUEST_TIMEOUT)
                    .response_timeout(REQUEST_TIMEOUT)
                    .build()?
                    .get_async_connection()
                    .await?;
                Ok(Conn::Cluster {
                    conn,
                    sharded: Arc::new(AtomicBool::new(true)),
                })
            }
        }
    }

    /// A connection to the server behind `client` that hands its pushes to `on_push`.
    fn connect_server(
        client: &redis::Client,
        on_push: impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static,
    ) -> RedisResult<Conn> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let config = ConnectionManagerConfig::new()
            .set_push_sender(on_push)
            .set_automatic_resubscription()
            .set_connection_timeout(Some(REQUEST_TIMEOUT))
            .set_response_timeout(Some(REQUEST_TIMEOUT))
            .set_max_delay(REQUEST_TIMEOUT);
        // Connects on the first request, within its caller's time limit.
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Conn::Server(conn))
    }

    /// Handles one push from the pub/sub connection of `generation`, without waiting for
    /// anything.
    fn on_push(&self, push: PushInfo, generation: u64) {
        let channel = push.data.first().and_then(bytes);
        // A replaced connection (it may linger a while) says nothing about today's
        // subscriptions; its messages are still releases.
        let current = generation == self.generation();
        match (push.kind, channel) {
            (PushKind::Message | PushKind::SMessage, Some(channel)) => {
                let payload = push.data.get(1).and_then(bytes).unwrap_or_default();
                self.announced(channel, payload);
            }
            _ if !current => {}
            (PushKind::Subscribe | PushKind::SSubscribe, Some(channel)) => {
                self.with_channel(channel, |_, entry| {
                    entry.state.subscribed.send_replace(Some(generation));
                    if std::mem::take(&mut entry.lapsed) && entry.waiters > 0 {
                        entry.missed();
                    }
                });
            }
            // Our own unsubscribes forget the subscription before they are sent; any other
            // comes from the server (a cluster slot moved away).
            (PushKind::Unsubscribe | PushKind::SUnsubscribe, Some(channel)) => {
                self.with_channel(channel, |_, entry| {
                    if entry.state.unsubscribed() && entry.waiters > 0 {
                        entry.lapsed = true;
                        entry.missed();
                    }
                });
            }
            (PushKind::Disconnection, _) => self.lapse_all(),
            _ => {}
        }
    }

    /// A release was announced on `channel`: wake one waiter, unless the release was handed
    /// over here already, or heard from another master of the quorum.
    fn announced(&self, channel: &[u8], payload: &[u8]) {
        self.with_channel(channel, |name, entry| {
            if entry.waiters == 0 {
                return;
            }
            // A hand-off: it wakes the waiter it names, if it is one of ours.
            if payload.starts_with(b"g") {
                if let Some(handed) = Handed::parse(payload)
                    && let Some(grant) = entry.grants.get(handed.id.as_bytes())
                {
                    *lock(&grant.handed) = Some(handed);
                    grant.notify.notify_one();
                }
                return;
            }
            entry
                .expected
                .retain(|(_, since)| since.elapsed() < REMEMBER_FOR);
            if let Some(handed_over) = entry.expected.iter().position(|(p, _)| &**p == payload) {
                entry.expected.swap_remove(handed_over);
                return;
            }
            let first = payload.is_empty()
                || self
                    .heard
                    .as_ref()
                    .is_none_or(|heard| heard.wakes(name, payload));
            if first {
                entry.wake();
            }
        });
    }

    fn with_channel(&self, channel: &[u8], f: impl FnOnce(&str, &mut Channel)) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(entry) = lock(&self.channels).get_mut(channel) {
            f(channel, entry);
        }
    }
}

impl Conn {
    async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Server(conn) => conn.clone().subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, sharded } => {
                let mut conn = conn.clone();
                if sharded.load(Ordering::Relaxed) {
                    match conn.ssubscribe(channel).await {
                        Err(err) if is_unknown_command(&err) => {
                            // Redis before 7.0: releases are announced with PUBLISH there.
                            sharded.store(false, Ordering::Relaxed);
                        }
                        other => return other,
                    }
                }
                conn.subscribe(channel).await
            }
        }
    }

    /// Unsubscribes `channels`, each attempted even when another fails.
    async fn unsubscribe(&self, channels: &[String]) -> RedisResult<()> {
        match self {
            Self::Server(conn) => conn.clone().unsubscribe(channels).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, sharded } => {
                let mut conn = conn.clone();
                if !sharded.load(Ordering::Relaxed) {
                    return conn.unsubscribe(channels).await;
                }
                // Sharded channels live on their slots' shards: one command each.
                let mut outcome = Ok(());
                for channel in channels {
                    if let Err(err) = conn.sunsubscribe(channel).await {
                        outcome = Err(err);
                    }
                }
                outcome
            }
        }
    }

    async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        match self {
            Self::Server(conn) => ping.exec_async(&mut conn.clone()).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, .. } => ping.exec_async(&mut conn.clone()).await,
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

    /// Starts subscribing in the background when the server lacks this subscription, as
    /// far as is known (without waiting for it).
    pub(crate) fn renew(&self) {
        if !self.is_live() {
            self.start_subscribing();
        }
    }

    /// Starts a task that subscribes, unless one is running.
    fn start_subscribing(&self) {
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
            inner.watched.fetch_sub(1, Ordering::Relaxed);
        } else if *self.woken.get_mut() {
            // Leaving without the lock: the next waiter gets the wake-up.
            entry.notify.notify_one();
        }
    }
}

/// Unsubscribes channels that nobody waited for during [`IDLE`], in batches, and pings the
/// connection while somebody waits, until the client is gone.
/// Replaces the pub/sub connection whenever the primary of a Sentinel deployment changes:
/// every subscription is made again on the new primary, and every waiter is woken (a release
/// may have gone unheard).
async fn follow_primary(inner: Weak<Inner>, mut changes: watch::Receiver<u64>) {
    while changes.changed().await.is_ok() {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        tracing::debug!("the primary changed; release events subscribe again there");
        inner.replace_listener();
    }
}

async fn sweeper(inner: Weak<Inner>) {
    let mut last_ping = Instant::now();
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        sweep(&inner).await;
        if last_ping.elapsed() >= PING_EVERY && inner.watched.load(Ordering::Relaxed) > 0 {
            last_ping = Instant::now();
            let listener = lock(&inner.listener).clone();
            if let Some(listener) = listener
                && let Err(err) = listener.conn.ping().await
            {
                inner.failed(&err);
            }
        }
    }
}

async fn sweep(inner: &Inner) {
    // Take each idle channel's operation lock (skipping busy ones), so that no SUBSCRIBE of
    // the same channel can overtake the UNSUBSCRIBE, and forget the subscription under the
    // channels' lock, so that no new waiter takes it for live in between.
    let idle: Vec<(String, tokio::sync::OwnedMutexGuard<()>)> = {
        let channels = lock(&inner.channels);
        channels
            .iter()
            .filter(|(_, c)| c.waiters == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= IDLE))
            .filter_map(|(name, c)| {
                let guard = c.state.op.clone().try_lock_owned().ok()?;
                // Also channels not known to be subscribed: a SUBSCRIBE whose confirmation
                // came too late for its waiter may still have reached the server.
                c.state.unsubscribed();
                Some((name.clone(), guard))
            })
            .collect()
    };
    if idle.is_empty() {
        return;
    }
    let listener = lock(&inner.listener).clone();
    if let Some(listener) = listener {
        let names: Vec<String> = idle.iter().map(|(name, _)| name.clone()).collect();
        // Bounded batches: one command and its confirmations never hold the server long.
        for batch in names.chunks(UNSUBSCRIBE_BATCH) {
            if let Err(err) = listener.conn.unsubscribe(batch).await {
                tracing::debug!(%err, "unsubscribing idle release channels failed");
            }
        }
    }
    let mut channels = lock(&inner.channels);
    for (name, _guard) in &idle {
        if channels.get(name).is_some_and(|c| c.waiters == 0) {
            channels.remove(name);
            inner.known.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A push's bulk string.
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        _ => None,
    }
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
