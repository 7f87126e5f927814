//! Release events: a pub/sub connection per client wakes its waiting obtains the moment a
//! lock they wait for is released, instead of leaving them to poll.
//!
//! **Who announces.** A waiter that finds a key held marks the holder's value (a leading `!`,
//! see `value.rs`), and the holder's release announces exactly the marked keys, each on its
//! release channel, with a payload naming the release. An uncontended release announces
//! nothing and costs nothing.
//!
//! **Listening.** A waiter registers interest in the channel of the key it waits for, then
//! makes sure the server has the subscription, for no longer than it would have slept anyway:
//! a stuck connection degrades waiters to polling, never to hanging. Each channel serialises
//! its own SUBSCRIBE/UNSUBSCRIBE, so one slow channel holds up no other. Channels nobody
//! waits for are unsubscribed in batches after a short idle time, so that a lock handed from
//! waiter to waiter does not subscribe and unsubscribe on every hand-over.
//!
//! **Dispatch.** Messages arrive through redis-rs's RESP3 push sender and are handled inline,
//! in constant time, without awaiting anything: a message for a channel nobody waits on is
//! dropped, any other wakes **one** waiter of this client (`Notify::notify_one`), since the
//! lock can go to only one of them. There is no queue of ours that could back up.
//!
//! **Hand-over.** A release by this very client wakes one local waiter as soon as the release
//! is queued on the connection (its obtain then runs right behind the release), and records
//! the release's payload: the announcement that then arrives for exactly that release is
//! skipped, so one release wakes one waiter. A release that deleted nothing announces
//! nothing and its record is withdrawn; records that are never matched expire.
//!
//! **Faults.** redis-rs reconnects and resubscribes by itself. A disconnection wakes one
//! waiter per channel at once, and so does the confirmation of each resubscription: a
//! release may have been announced while nobody listened. A channel the server drops (its
//! cluster slot moved) is marked unsubscribed and a waiter woken, which subscribes again.
//! After repeated failures the connection is replaced.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rand::Rng as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Channels nobody waits for stay subscribed this long, for the next waiter.
const IDLE: Duration = Duration::from_secs(1);
/// How often idle channels are looked for.
const SWEEP: Duration = Duration::from_millis(500);
/// How long a local hand-over waits for its announcement before forgetting it.
const EXPECTED_FOR: Duration = Duration::from_secs(10);
/// Failed subscriptions in a row after which the connection is replaced.
const FAILURES_BEFORE_RECONNECT: u32 = 2;
/// Most channels unsubscribed by one command.
const UNSUBSCRIBE_BATCH: usize = 256;
/// Time limits of the pub/sub connection's own requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The release events of one client (shared by its clones).
#[derive(Clone)]
pub(crate) struct Events {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    listener: Mutex<Option<Arc<Listener>>>,
    /// Subscriptions that failed in a row.
    failures: AtomicU32,
    channels: Mutex<HashMap<String, Channel>>,
    /// How many channels have waiters, readable without the lock on every release.
    watched: AtomicUsize,
    /// Payloads of this client's announcements: a random prefix and a counter.
    id: u64,
    next: AtomicU64,
}

/// Where to open the pub/sub connection.
enum Source {
    Server(redis::Client),
    #[cfg(feature = "cluster")]
    Cluster(Vec<redis::ConnectionInfo>),
}

/// The pub/sub connection.
enum Listener {
    Server(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        /// Sharded pub/sub (Redis 7); plain pub/sub before.
        sharded: AtomicBool,
    },
}

/// One release channel with waiters, or recently with waiters.
struct Channel {
    waiters: usize,
    notify: Arc<Notify>,
    state: Arc<ChannelState>,
    /// When the last waiter left.
    idle_since: Option<Instant>,
    /// The subscription was lost: wake a waiter when it is confirmed again.
    lapsed: bool,
    /// Payloads of this client's releases handed over locally, still to be announced.
    expected: Vec<(Box<[u8]>, Instant)>,
}

/// Whether the server has a channel's subscription; `op` serialises changing it.
struct ChannelState {
    op: Arc<tokio::sync::Mutex<()>>,
    subscribed: watch::Sender<bool>,
    /// A task is subscribing now.
    subscribing: AtomicBool,
}

impl Default for ChannelState {
    fn default() -> Self {
        Self {
            op: Arc::default(),
            subscribed: watch::Sender::new(false),
            subscribing: AtomicBool::new(false),
        }
    }
}

impl ChannelState {
    fn is_subscribed(&self) -> bool {
        *self.subscribed.borrow()
    }

    /// Records whether the server has the subscription; returns what it was before.
    fn set_subscribed(&self, subscribed: bool) -> bool {
        self.subscribed.send_replace(subscribed)
    }
}

impl Events {
    /// Release events over a pub/sub connection to the server behind `client` (RESP3),
    /// opened when the first waiter listens.
    pub(crate) fn new(client: redis::Client) -> Self {
        Self::with_source(Source::Server(client))
    }

    /// Release events over sharded pub/sub on the cluster behind `nodes` (RESP3).
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(nodes: Vec<redis::ConnectionInfo>) -> Self {
        Self::with_source(Source::Cluster(nodes))
    }

    fn with_source(source: Source) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                listener: Mutex::new(None),
                failures: AtomicU32::new(0),
                channels: Mutex::default(),
                watched: AtomicUsize::new(0),
                id: rand::rng().next_u64(),
                next: AtomicU64::new(0),
            }),
        }
    }

    /// Registers a waiter of `channel`. It listens once [`Subscription::confirm`] says so.
    pub(crate) fn subscribe(&self, channel: &str) -> Subscription {
        let mut channels = lock(&self.inner.channels);
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                waiters: 0,
                notify: Arc::new(Notify::new()),
                state: Arc::default(),
                idle_since: None,
                lapsed: false,
                expected: Vec::new(),
            });
        entry.waiters += 1;
        entry.idle_since = None;
        let subscription = Subscription {
            events: self.clone(),
            channel: channel.to_owned(),
            notify: entry.notify.clone(),
            state: entry.state.clone(),
        };
        self.inner.update_watched(&channels);
        subscription
    }

    /// How many channels have waiters now.
    pub(crate) fn channels(&self) -> usize {
        self.inner.watched.load(Ordering::Relaxed)
    }

    /// A payload naming one release by this client.
    pub(crate) fn payload(&self) -> String {
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:x}", self.inner.id)
    }

    /// Wakes one local waiter of `channel` for a release by this client that will be
    /// announced with `payload`, whose announcement is then skipped; false when nobody here
    /// waits.
    pub(crate) fn hand_over(&self, channel: &str, payload: &str) -> bool {
        let mut channels = lock(&self.inner.channels);
        let Some(entry) = channels.get_mut(channel).filter(|e| e.waiters > 0) else {
            return false;
        };
        entry
            .expected
            .push((payload.as_bytes().into(), Instant::now()));
        entry.notify.notify_one();
        true
    }

    /// Forgets a hand-over whose release announced nothing (it deleted nothing).
    pub(crate) fn withdraw(&self, channel: &str, payload: &str) {
        if let Some(entry) = lock(&self.inner.channels).get_mut(channel) {
            entry.expected.retain(|(p, _)| &**p != payload.as_bytes());
        }
    }

    /// The pub/sub connection, opened (and the sweeper started) on first use.
    async fn listener(&self) -> RedisResult<Arc<Listener>> {
        if let Some(listener) = lock(&self.inner.listener).clone() {
            return Ok(listener);
        }
        let listener = Arc::new(self.inner.connect(Arc::downgrade(&self.inner)).await?);
        let mut slot = lock(&self.inner.listener);
        if let Some(other) = slot.clone() {
            // Another waiter was faster; use its connection.
            return Ok(other);
        }
        *slot = Some(listener.clone());
        tokio::spawn(sweeper(Arc::downgrade(&self.inner)));
        Ok(listener)
    }

    /// Subscribes to `channel` unless the server has it, within the connection's own time
    /// limits; counts failures.
    async fn subscribe_now(&self, channel: &str, state: &ChannelState) {
        let subscribed = async {
            let listener = self.listener().await?;
            let _op = state.op.lock().await;
            if !state.is_subscribed() {
                listener.subscribe(channel).await?;
                state.set_subscribed(true);
            }
            RedisResult::Ok(())
        };
        match subscribed.await {
            Ok(()) => self.inner.failures.store(0, Ordering::Relaxed),
            Err(err) => {
                tracing::debug!(%err, "release-event subscription failed; waiters poll meanwhile");
                self.failed();
            }
        }
    }

    /// A subscription failed: after a few in a row, replace the connection (it may be
    /// half-open) and forget every subscription it had.
    fn failed(&self) {
        let failures = self.inner.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < FAILURES_BEFORE_RECONNECT {
            return;
        }
        tracing::warn!("release-event connection keeps failing; opening a new one");
        self.inner.failures.store(0, Ordering::Relaxed);
        lock(&self.inner.listener).take();
        for entry in lock(&self.inner.channels).values_mut() {
            entry.state.set_subscribed(false);
        }
    }
}

impl Inner {
    fn update_watched(&self, channels: &HashMap<String, Channel>) {
        let watched = channels.values().filter(|c| c.waiters > 0).count();
        self.watched.store(watched, Ordering::Relaxed);
    }

    /// Opens the pub/sub connection, with pushes handled by [`Inner::on_push`].
    async fn connect(&self, me: Weak<Self>) -> RedisResult<Listener> {
        let on_push = move |push: PushInfo| match me.upgrade() {
            Some(inner) => {
                inner.on_push(push);
                Ok(())
            }
            None => Err(()),
        };
        match &self.source {
            Source::Server(client) => {
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
                Ok(Listener::Server(conn))
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
                Ok(Listener::Cluster {
                    conn,
                    sharded: AtomicBool::new(true),
                })
            }
        }
    }

    /// Handles one push from the pub/sub connection, without waiting for anything.
    fn on_push(&self, push: PushInfo) {
        let channel = push.data.first().and_then(bytes);
        match (push.kind, channel) {
            (PushKind::Message | PushKind::SMessage, Some(channel)) => {
                let payload = push.data.get(1).and_then(bytes).unwrap_or_default();
                self.announced(channel, payload);
            }
            (PushKind::Subscribe | PushKind::SSubscribe, Some(channel)) => {
                self.with_channel(channel, |entry| {
                    if std::mem::take(&mut entry.lapsed) {
                        entry.notify.notify_one();
                    }
                });
            }
            // Our own unsubscribes clear `subscribed` before they are sent; any other comes
            // from the server (a cluster slot moved away).
            (PushKind::Unsubscribe | PushKind::SUnsubscribe, Some(channel)) => {
                self.with_channel(channel, |entry| {
                    if entry.state.set_subscribed(false) {
                        entry.notify.notify_one();
                    }
                });
            }
            (PushKind::Disconnection, _) => {
                for entry in lock(&self.channels).values_mut() {
                    entry.lapsed = true;
                    if entry.waiters > 0 {
                        entry.notify.notify_one();
                    }
                }
            }
            _ => {}
        }
    }

    /// A release was announced on `channel`: wake one waiter, unless the release was handed
    /// over here already.
    fn announced(&self, channel: &[u8], payload: &[u8]) {
        self.with_channel(channel, |entry| {
            if entry.waiters == 0 {
                return;
            }
            entry
                .expected
                .retain(|(_, since)| since.elapsed() < EXPECTED_FOR);
            match entry.expected.iter().position(|(p, _)| &**p == payload) {
                Some(handed_over) => {
                    entry.expected.swap_remove(handed_over);
                }
                None => entry.notify.notify_one(),
            }
        });
    }

    fn with_channel(&self, channel: &[u8], f: impl FnOnce(&mut Channel)) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(entry) = lock(&self.channels).get_mut(channel) {
            f(entry);
        }
    }
}

impl Listener {
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

    async fn unsubscribe(&self, channels: &[String]) -> RedisResult<()> {
        match self {
            Self::Server(conn) => conn.clone().unsubscribe(channels).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, sharded } => {
                let mut conn = conn.clone();
                if sharded.load(Ordering::Relaxed) {
                    // Sharded channels live on their slots' shards: one command each.
                    for channel in channels {
                        conn.sunsubscribe(channel).await?;
                    }
                    Ok(())
                } else {
                    conn.unsubscribe(channels).await
                }
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
}

impl Subscription {
    /// Completes when a release was announced on this channel (one waiter per announcement),
    /// or when a lost subscription may have missed one.
    pub(crate) async fn released(&self) {
        self.notify.notified().await;
    }

    /// The channel this subscription listens on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether the server has the subscription, as far as is known.
    pub(crate) fn is_live(&self) -> bool {
        self.state.is_subscribed()
    }

    /// Makes sure the server gets the subscription, and waits for it no later than `until`
    /// (without `until`, as long as the connection's own time limits allow); true once it
    /// has it. The subscribing itself runs in a task of its own, so a waiter that stops
    /// waiting leaves it to finish for the next one.
    pub(crate) async fn confirm(&self, until: Option<Instant>) -> bool {
        if self.is_live() {
            return true;
        }
        if !self.state.subscribing.swap(true, Ordering::AcqRel) {
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
        let mut subscribed = self.state.subscribed.subscribe();
        let confirmed = subscribed.wait_for(|subscribed| *subscribed);
        match until {
            Some(until) => matches!(tokio::time::timeout_at(until, confirmed).await, Ok(Ok(_))),
            None => confirmed.await.is_ok(),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.events.inner.channels);
        if let Some(entry) = channels.get_mut(&self.channel) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                entry.idle_since = Some(Instant::now());
                entry.expected.clear();
            }
        }
        self.events.inner.update_watched(&channels);
    }
}

/// Unsubscribes channels that nobody waited for during [`IDLE`], in batches, until the
/// client is gone.
async fn sweeper(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        sweep(&inner).await;
    }
}

async fn sweep(inner: &Inner) {
    // Take each idle channel's operation lock (skipping busy ones), so that no SUBSCRIBE of
    // the same channel can overtake the UNSUBSCRIBE.
    let idle: Vec<(String, tokio::sync::OwnedMutexGuard<()>, Arc<ChannelState>)> = {
        let channels = lock(&inner.channels);
        channels
            .iter()
            .filter(|(_, c)| c.waiters == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= IDLE))
            .filter_map(|(name, c)| {
                let guard = c.state.op.clone().try_lock_owned().ok()?;
                Some((name.clone(), guard, c.state.clone()))
            })
            .collect()
    };
    if idle.is_empty() {
        return;
    }
    // Also channels not known to be subscribed: a SUBSCRIBE whose confirmation came too late
    // for its waiter may still have reached the server.
    let subscribed: Vec<String> = idle
        .iter()
        .map(|(name, _, state)| {
            state.set_subscribed(false);
            name.clone()
        })
        .collect();
    let listener = lock(&inner.listener).clone();
    if let Some(listener) = listener {
        // Bounded batches: one command and its confirmations never hold the server long.
        for batch in subscribed.chunks(UNSUBSCRIBE_BATCH) {
            if let Err(err) = listener.unsubscribe(batch).await {
                tracing::debug!(%err, "unsubscribing idle release channels failed");
            }
        }
    }
    let mut channels = lock(&inner.channels);
    for (name, _guard, _) in &idle {
        if channels.get(name).is_some_and(|c| c.waiters == 0) {
            channels.remove(name);
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

#[cfg(feature = "cluster")]
fn is_unknown_command(err: &redis::RedisError) -> bool {
    err.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

/// Locks a mutex; a panic elsewhere while holding it leaves the map consistent enough.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `future` up to its first pending point (for a Redis command: queued on the
/// connection), then `then`, then the rest of `future`.
pub(crate) async fn after_queueing<F: std::future::Future>(
    future: F,
    then: impl FnOnce(),
) -> F::Output {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
    then();
    match first {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => future.await,
    }
}
