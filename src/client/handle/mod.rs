//! The public entry point: a cheap, cloneable handle that obtains locks.

mod attempt;
mod cleanup;
mod connect;

use attempt::{Attempt, Won};
use cleanup::LeaveOnDrop;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::client::lock::{Lock, Obtained};
use crate::client::options::Options;
use crate::client::options::default_waiter_lease;
use crate::client::shared::Shared;
use crate::error::classify::{self, is_outcome_unknown};
use crate::error::{Error, Result};
use crate::model::invalid::InvalidInput;
use crate::model::key::IntoKey;
use crate::model::mode::{self, Mode, Modes};
use crate::model::request::{Claim, OwnedClaim, Try, Ttl};
use crate::model::retry::Retry;
use crate::model::validate;
use crate::model::value::Owner;
use crate::observe::{Op, Progress, finished, op_span};
use crate::rt::signal::LostSignal;
use crate::rt::tasks::Tasks;
use crate::server::replication::{Replicas, Replication};
use crate::server::store::{Obtain, Store};
use crate::topology::backend::Backend;
use crate::topology::quorum::{Quorum, QuorumConfig};
use crate::topology::sentinel::{SentinelConfig, SentinelConnection};
use crate::topology::stragglers::Stragglers;
use crate::waiting::events::Events;
use crate::waiting::fair::{Fair, Stint};
use crate::waiting::policy::{self, Held, Limit, Step, Waiter, Watch};

/// Obtains locks: on one Redis server ([`Client::new`], [`Client::connect`]), on a Redis
/// Cluster (`Client::cluster`, feature `cluster`), or on a Redlock quorum of independent
/// masters ([`Client::quorum`]), with the same operations on each.
///
/// See the guide: [getting started](crate::guide::getting_started).
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
pub struct Client<C> {
    // One allocation shared by every clone and every lock: cloning a client (each lock
    // holds one) costs a single reference-count increment.
    inner: Arc<Shared<C>>,
}

impl<C> Clone for Client<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Wraps a redis-rs async connection. Sends nothing; never fails.
    pub fn new(conn: C) -> Self {
        let store = Arc::new(Store::new(conn));
        Self::with_backend(Backend::Single(store), false, Tasks::default())
    }

    fn with_backend(backend: Backend<C>, cluster: bool, tasks: Tasks) -> Self {
        Self {
            inner: Arc::new(Shared::new(backend, cluster, tasks)),
        }
    }

    /// Wakes waiting obtains the moment a lock they wait for is released, over one shared
    /// pub/sub connection opened from `client` (on first use) for this client and its clones.
    ///
    /// Every release announces itself on the key's [`release_channel`](crate::release_channel)
    /// (whether or not anyone listens). A waiting obtain subscribes to the channel of the key
    /// that was held, tries once more (the release may have come before the subscription),
    /// then waits for whichever comes first: a release event, its retry strategy's next
    /// delay, or the holder's expiry (expiry announces nothing). A release wakes one waiter
    /// of this client per key, not all of them. If the pub/sub connection drops, it
    /// reconnects; meanwhile waiters keep polling per their strategy. The retry strategy
    /// still decides whether and how long to wait: with [`Retry::NoRetry`](crate::Retry)
    /// nobody waits.
    ///
    /// [`Client::connect`] turns this on; with [`Client::new`] it is off (a generic
    /// connection cannot open a second one). It applies to this client and all its clones;
    /// once on, later calls change nothing.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::ReleaseEventsNeedOneServer`] on a Redlock quorum (its waiters listen
    /// through each master's own client) or a cluster client.
    pub fn with_release_events(self, client: redis::Client) -> Result<Self> {
        if self.inner.cluster || self.backend().is_quorum() {
            return Err(InvalidInput::ReleaseEventsNeedOneServer.into());
        }
        let _ = self
            .inner
            .address
            .set(client.get_connection_info().addr().to_string());
        let _ = self.inner.events.set(Box::new([Events::new(client)]));
        Ok(self)
    }

    /// Turns release events off for this client and all its clones: its releases announce
    /// nothing, and its waiters only poll per their retry strategy.
    ///
    /// See the guide: [waiting](crate::guide::waiting).
    ///
    /// Use it for a Redis user without channel rights (Redis 7's default
    /// `acl-pubsub-default resetchannels` forbids every channel; releases still delete every
    /// key, only the announcement is skipped), or to spare a busy server the pub/sub
    /// traffic: one message per released key that somebody waits for. Waiters in other
    /// clients then learn of this client's releases only by polling.
    #[must_use]
    pub fn without_release_events(self) -> Self {
        self.inner.listen.store(false, Ordering::Relaxed);
        self.inner.announce.store(false, Ordering::Relaxed);
        self
    }

    /// Makes every lock of this client (and its clones) count as obtained, refreshed or
    /// handed on only once `replication` is met: enough replicas of the primary acknowledged
    /// the write, so that a failover to one of them keeps it (`WAIT`, sent with the write in
    /// one request; see [`Replication`]). Releases do not wait: a release a failover loses
    /// leaves the keys to expire with their TTL, which misleads nobody.
    ///
    /// Before anything is written, the primary is asked how many replicas it has in sync
    /// (on a cluster, every shard; on a Redlock quorum, every master).
    ///
    /// - An obtain too few replicas acknowledged in time removes its keys again (best effort;
    ///   not with a custom token, whose keys may be an outer lock's) and is retried per the
    ///   retry strategy until the deadline; it then fails with [`Error::NotReplicated`]
    ///   ([`Error::is_unavailable`]). A lock is never returned while under-replicated.
    /// - A refresh that is not acknowledged in time fails the same way. It may have extended
    ///   the keys on the primary, but the lock's validity stays where the last replicated
    ///   write put it: the holder never believes longer than a failover would keep.
    /// - A fair waiter handed a lock by a release makes one more attempt, which waits for
    ///   the replicas, before its obtain returns.
    /// - Fencing counters are written by the obtain, and wait with it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// use lockset::{Client, Replication};
    ///
    /// let client = Client::connect("redis://primary.internal/")
    ///     .await?
    ///     .replicated(Replication::replicas(1))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::ZeroReplicationTimeout`] for a zero timeout (nothing is sent);
    /// [`Error::NotReplicated`] ([`Error::is_not_replicated`], [`Error::is_unavailable`]: a
    /// state that passes, worth retrying) when a primary has fewer replicas connected than
    /// the writes would wait for (with [`Replication::all`], at least one, and behind
    /// Sentinel every replica the sentinels could promote); [`InvalidInput::NoWaitAof`] for [`Replication::append_only`] on a server
    /// without `WAITAOF`; [`InvalidInput::ReplicationAlreadySet`] when this client already
    /// has other settings; [`Error::Redis`] when a server cannot be asked.
    pub async fn replicated(self, replication: Replication) -> Result<Self> {
        replication.check()?;
        let stores = self.backend().stores();
        if stores.iter().any(|store| {
            store
                .replication_set()
                .is_some_and(|set| *set != replication)
        }) {
            return Err(InvalidInput::ReplicationAlreadySet.into());
        }
        let mut planned = Vec::with_capacity(stores.len());
        for store in stores {
            let replicas = match replication.is_on() {
                true => {
                    if replication.uses_aof() && !store.knows("WAITAOF").await? {
                        return Err(InvalidInput::NoWaitAof.into());
                    }
                    store.replicas().await?
                }
                false => Replicas::default(),
            };
            let replicated = store.plan_replication(replication, &replicas);
            // Too few replicas connected now is a state of the deployment that passes (a
            // replica restarting, a failover), not bad input: reported as the writes would
            // report it, and worth retrying.
            let needed = replicated.needed();
            if replication.is_on() && replicas.connected() < needed {
                return Err(Error::NotReplicated {
                    acknowledged: replicas.connected(),
                    required: needed,
                });
            }
            planned.push(replicated);
        }
        for (store, replicated) in stores.iter().zip(planned) {
            if !store.replicate(replicated) && store.replication_set() != Some(&replication) {
                return Err(InvalidInput::ReplicationAlreadySet.into());
            }
        }
        Ok(self)
    }

    /// How many release channels this client's waiters listen on right now (zero when
    /// nobody waits).
    pub fn release_channels_watched(&self) -> usize {
        self.events()
            .iter()
            .map(Events::channels)
            .max()
            .unwrap_or(0)
    }

    /// A Redlock client: one lock over the independent masters behind `nodes` (single-server
    /// clients, typically 3 or 5), with the same operations as a single-server client.
    ///
    /// See the guide: [Redlock](crate::guide::redlock).
    ///
    /// Every operation goes to all masters at once and counts when a majority (N/2 + 1)
    /// agrees. An obtain succeeds only if a majority locked the whole key set and the validity
    /// `ttl − elapsed − drift` is positive (elapsed from before the first send to the
    /// decision, drift = ttl × drift factor + 2 ms); otherwise it releases on every master and
    /// retries per the retry strategy. Every operation returns as soon as its outcome is
    /// decided, never waiting for a master the decision does not need (slow, paused or
    /// down); the slower masters' share finishes in background tasks. [`Lock::valid_until`]
    /// is the end of the validity, and [`Lock::ttl`] reports what is left of it (at most
    /// what a majority of masters still holds); refresh needs a majority too (re-creating
    /// keys on a master that restarted empty), and release deletes on every master,
    /// returning once a majority did.
    ///
    /// **When to use it.** A single master with replicas can lose a lock on failover:
    /// replication is asynchronous. Redlock survives the loss of a minority of masters. If an
    /// occasional double holder after a failover is acceptable (efficiency locks), one master
    /// is simpler and faster. Redlock's safety assumes bounded clock drift between the
    /// masters and this process, and that a master which restarts without `appendfsync
    /// always` stays down longer than the longest TTL (antirez's delayed restart): otherwise
    /// it forgets locks a majority still counts on. It gives no fencing guarantee on its own,
    /// and [`Options::fencing`] is refused; release events are off (waiters poll).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::NoNodes`] without masters, [`InvalidInput::DriftFactor`] for a drift
    /// factor outside [0, 1), [`InvalidInput::ZeroNodeTimeout`] for a zero per-node time
    /// limit, [`InvalidInput::NestedQuorum`] when a node is itself a quorum, and
    /// [`InvalidInput::NestedQuorum`] also for a cluster client, and
    /// [`InvalidInput::DuplicateNode`] when two nodes are one server: the same client (or a
    /// clone of it), or clients for the same address (from [`Client::connect`] or
    /// [`Client::with_release_events`]). Servers known under different names are told apart
    /// by their run ids, asked for beside each master's first operations: the obtain that
    /// finds two names of one server fails with that error (unless distinct masters had
    /// decided it already), and so does every later obtain, refresh and TTL query, before
    /// anything is sent.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::{Client, Options, QuorumConfig};
    ///
    /// let mut masters = Vec::new();
    /// for url in ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"] {
    ///     masters.push(Client::connect(url).await?);
    /// }
    /// let redlock = Client::quorum(masters, QuorumConfig::default())?;
    /// let lock = redlock.obtain("report", Duration::from_secs(10), &Options::default()).await?;
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn quorum(nodes: impl IntoIterator<Item = Self>, config: QuorumConfig) -> Result<Self> {
        let nodes: Vec<Self> = nodes.into_iter().collect();
        let mut stores = Vec::with_capacity(nodes.len());
        for (second, node) in nodes.iter().enumerate() {
            let Backend::Single(store) = node.backend() else {
                return Err(InvalidInput::NestedQuorum.into());
            };
            if node.inner.cluster {
                return Err(InvalidInput::NestedQuorum.into());
            }
            if let Some(first) = nodes[..second]
                .iter()
                .position(|other| node.same_server(other))
            {
                return Err(InvalidInput::DuplicateNode { first, second }.into());
            }
            stores.push(store.clone());
        }
        let tasks = Tasks::default();
        let quorum = Quorum::new(stores, config, tasks.clone())?;
        let client = Self::with_backend(Backend::Quorum(quorum), false, tasks);
        // Waiters listen on every master that has release events, with listeners of the
        // quorum's own that hear each release once.
        let masters: Vec<Events> = nodes
            .iter()
            .flat_map(|node| node.events().iter().cloned())
            .collect();
        let _ = client
            .inner
            .events
            .set(Events::for_quorum(&masters).into_boxed_slice());
        Ok(client)
    }

    /// Whether two single-server clients talk to the same server, as far as is known.
    fn same_server(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || self
                .address()
                .is_some_and(|mine| other.address() == Some(mine))
    }

    /// The server's address, when known.
    fn address(&self) -> Option<&str> {
        self.inner.address.get().map(String::as_str)
    }

    /// How many background tasks this client and its clones are running now: watchdogs,
    /// releases of dropped [`Guard`](crate::Guard)s, clean-ups after obtains that were cancelled
    /// or got no reply; a Redlock operation's part on each master.
    /// Zero once every lock is released and every clean-up is done. (A Redlock master that
    /// stopped answering is probed by a task not counted here: it lasts as long as the master
    /// does not answer; see the guide: [Redlock](crate::guide::redlock).)
    pub fn background_tasks(&self) -> usize {
        self.inner.tasks.count()
    }

    /// Waits until [`background_tasks`](Self::background_tasks) is zero.
    ///
    /// A short-lived program awaits this (under a timeout) before it exits: the runtime's
    /// shutdown would otherwise cut off a release on drop, the clean-up of a cancelled
    /// obtain, or the slower masters' share of a quorum obtain, which returns as soon as a
    /// majority has the lock. A running watchdog is a background task too: release or drop
    /// its lock first.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::{Client, Options};
    ///
    /// let client = Client::connect("redis://127.0.0.1/").await?;
    /// let lock = client.obtain("nightly-report", Duration::from_secs(60), &Options::default()).await?;
    /// drop(lock.into_guard()); // released in the background
    /// let _ = tokio::time::timeout(Duration::from_secs(2), client.background_idle()).await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn background_idle(&self) {
        self.inner.tasks.idle().await;
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
        key: impl IntoKey,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        let (keys, modes) = mode::split(std::iter::once(key));
        self.obtain_keys(keys, modes, ttl, options).await
    }

    /// Locks every key of `keys` for `ttl`, all or nothing: either every key is locked or
    /// none is touched.
    ///
    /// `keys` may be any collection or iterator of string-like keys (see [`IntoKey`]):
    /// `["a", "b"]`, `&["a", "b"]`, `&vec_of_strings`, `vec_of_strings`, `&[String]`, an
    /// iterator of `&str` or `String`.
    ///
    /// Retries and errors as [`Client::obtain`]; additionally rejects an empty set,
    /// duplicate keys, more than [`MAX_KEYS`](crate::MAX_KEYS) keys, and a fencing counter
    /// that is one of the keys, before sending.
    pub async fn obtain_multi<I>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let (keys, modes) = mode::split(keys);
        self.obtain_keys(keys, modes, ttl, options).await
    }

    /// A handle on the lock that `options`' token holds on `keys` now, made elsewhere: by
    /// another process that passed the token on, or before a restart. One TTL query checks
    /// that every key is held by the token, and the handle's validity counts from when it
    /// was sent, for the smallest remaining TTL. Nothing is written, except on a client with
    /// [replicated writes](crate::Replication): there the primary's TTL may be ahead of
    /// what its replicas acknowledged (a refresh applied and not acknowledged), so the
    /// remaining TTL is set again and waited for, and the validity counts from that write,
    /// as a refresh's does (too few acknowledgements: [`Error::NotReplicated`]). `ttl` is what its
    /// refreshes (and a guard's watchdog) extend to; its metadata is `options`' metadata.
    /// The handle has no fencing token.
    ///
    /// See the guide: [the command line](crate::guide::command_line).
    ///
    /// Unlike a re-obtain by the same token, this never takes keys that are free: a lock
    /// that expired stays lost.
    ///
    /// ```no_run
    /// # async fn demo(client: lockset::Client<lockset::redis::aio::ConnectionManager>, token: String) -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::Options;
    ///
    /// let options = Options::default().token(token);
    /// let lock = client.adopt(["db", "cache"], Duration::from_secs(30), &options).await?;
    /// lock.refresh(Duration::from_secs(30), &Options::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when some key is missing or held by someone else;
    /// [`InvalidInput::TokenRequired`] without a token in `options`; other invalid input as
    /// for [`Client::obtain_multi`]; [`Error::Redis`] or [`Error::Quorum`] when Redis could
    /// not answer.
    pub async fn adopt<I>(&self, keys: I, ttl: Duration, options: &Options) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let (keys, modes) = mode::split(keys);
        let modes = checked_modes(&keys, modes)?;
        let ttl = Ttl::new(ttl)?;
        options.check_metadata()?;
        let token = options
            .token
            .as_deref()
            .ok_or(InvalidInput::TokenRequired)?;
        let owner = Owner::custom(token)?;
        #[cfg(feature = "cluster")]
        if self.inner.cluster {
            crate::model::names::check_one_slot(&keys, None)?;
        }
        let value = owner.value(options.metadata_to_store());
        let claim = Claim {
            keys: &keys,
            owner: &owner,
            value: &value,
            ttl,
            counter: None,
            modes: modes.as_ref(),
            ticket: None,
        };
        let sent = Instant::now();
        let Some(left) = self.backend().pttl(&claim, None).await? else {
            return Err(Error::NotHeld);
        };
        // Keys without expiry are held until released: count on the TTL to come.
        let left = if left == Duration::MAX {
            ttl.duration
        } else {
            left
        };
        let valid_for = left.saturating_sub(self.backend().drift(left));
        let obtained = Obtained {
            keys,
            modes,
            owner,
            metadata: options.metadata_to_store().to_owned(),
            ttl,
            fence: None,
            valid_until: sent.checked_add(valid_for).unwrap_or(sent),
            stragglers: None,
            meter: options
                .meter
                .clone()
                .unwrap_or_else(|| self.inner.meter.clone()),
        };
        let lock = Lock::new(self.inner.clone(), obtained);
        if self.backend().is_replicated() {
            // The primary's TTL may be ahead of its replicas' (a refresh applied there and not
            // acknowledged), and the lock is nobody's belief yet: set the TTL again and wait
            // for the replicas, which then hold it at least as long as the validity the
            // refresh confirms. Not acknowledged: the handle is dropped with the error.
            let Ok(again) = Ttl::new(left) else {
                return Err(Error::NotHeld);
            };
            if !lock.refresh_once(again, None).await? {
                return Err(Error::NotHeld);
            }
        }
        Ok(lock)
    }

    /// Obtains `keys`, runs `work` while a watchdog keeps the lock alive, then releases the
    /// lock and returns `work`'s output.
    ///
    /// See the guide: [long work and validity](crate::guide::long_work).
    ///
    /// `work` receives the lock's [`LostSignal`]; select on it to stop when the lock is lost.
    /// The lock is released when `work` finishes, whatever it returns, and also when it
    /// panics or this future is dropped (then in the background, see
    /// [`Guard`](crate::Guard)). A failed release is logged, not returned: by then the work is
    /// done, and the signal told it if the lock was lost meanwhile. The watchdog refreshes
    /// every [`Options::watchdog_interval`] (default a third of the TTL).
    ///
    /// ```no_run
    /// # async fn demo(client: lockset::Client<lockset::redis::aio::ConnectionManager>) -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::Options;
    ///
    /// let outcome = client
    ///     .with_lock(["invoice:42"], Duration::from_secs(5), &Options::default(), |lost| async move {
    ///         tokio::select! {
    ///             _ = lost.lost() => Err("lock lost; stopped early"),
    ///             _ = tokio::time::sleep(Duration::from_secs(30)) => Ok("done"),
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The errors of [`Client::obtain_multi`]; `work` does not run then.
    pub async fn with_lock<I, F, Fut, T>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
        work: F,
    ) -> Result<T>
    where
        I: IntoIterator,
        I::Item: IntoKey,
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self
            .obtain_multi(keys, ttl, options)
            .await?
            .watched(options);
        let output = work(guard.lost_signal()).await;
        crate::client::guard::released_after_work(guard.release().await);
        Ok(output)
    }

    async fn obtain_keys(
        &self,
        keys: Vec<String>,
        modes: Vec<Mode>,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        let start = Instant::now();
        let span = op_span!("lockset.obtain", &keys);
        let meter = options.meter.as_ref().unwrap_or(&self.inner.meter);
        let (won, modes) = {
            // Counted among the waiters (when it waits) until it ends.
            let mut watch = Watch::new(&keys, options.on_retry.as_ref());
            watch.progress = Progress::of(meter);
            let obtained = self
                .try_obtain(&keys, modes, ttl, options, start, &mut watch)
                .instrument(span.clone())
                .await;
            let op = Op::Obtain(meter, &watch.progress);
            finished(&span, op, watch.attempts, start, &obtained);
            obtained?
        };
        let obtained = Obtained {
            keys,
            modes,
            owner: won.owner,
            metadata: options.metadata_to_store().to_owned(),
            ttl: won.ttl,
            fence: won.fence,
            valid_until: won.valid_until,
            stragglers: won.stragglers,
            meter: meter.clone(),
        };
        Ok(Lock::new(self.inner.clone(), obtained))
    }

    /// Validates the request, then attempts per `options` until the lock is won.
    async fn try_obtain(
        &self,
        keys: &[String],
        modes: Vec<Mode>,
        ttl: Duration,
        options: &Options,
        start: Instant,
        watch: &mut Watch<'_>,
    ) -> Result<(Won, Option<Modes>)> {
        let modes = checked_modes(keys, modes)?;
        let ttl = Ttl::new(ttl)?;
        options.check_metadata()?;
        let custom = options.token.as_deref().map(Owner::custom).transpose()?;
        let counter = self.fencing_counter(keys, options)?;
        #[cfg(feature = "cluster")]
        if self.inner.cluster {
            crate::model::names::check_one_slot(keys, counter.as_deref())?;
        }
        let fair = self.fair(keys, custom.as_ref(), ttl, options)?;
        let attempt = Attempt {
            client: self,
            keys,
            custom: custom.as_ref(),
            metadata: options.metadata_to_store(),
            ttl,
            counter: counter.as_deref(),
            modes: modes.as_ref(),
            fair: fair.as_ref(),
        };
        let deadline = options.deadline_from(start, ttl.duration);
        let mut waiter = Waiter::for_keys(self.events(), keys, modes.as_ref(), fair.as_ref());
        // Ending without the lock (an error, or cancelled) leaves the queues.
        let leave = LeaveOnDrop {
            client: self,
            fair: fair.as_ref(),
        };
        let limit = Limit { start, deadline };
        let won = policy::run(&options.retry, limit, &mut waiter, watch, |how, sent| {
            attempt.run(how, sent)
        })
        .await;
        if won.is_ok()
            && let Some(fair) = &fair
        {
            fair.won();
        }
        drop(leave);
        Ok((won?, modes))
    }

    /// The fair-waiting state of an obtain of `keys` (by the caller's token `custom`, if
    /// any), when it waits fairly (see [`Options::fair`]): a strategy that waits at all,
    /// release events to hear its hand-off, one server or a cluster, and a queue for every
    /// key.
    fn fair(
        &self,
        keys: &[String],
        custom: Option<&Owner>,
        ttl: Ttl,
        options: &Options,
    ) -> Result<Option<Fair>> {
        // A lease given is checked also where it does not apply.
        let given = options.waiter_lease.map(Ttl::new).transpose()?;
        let fair = !options.barging
            && !matches!(options.retry, Retry::NoRetry)
            && !self.backend().is_quorum()
            && !self.events().is_empty()
            && keys.iter().all(|key| crate::model::names::has_queue(key));
        if !fair {
            return Ok(None);
        }
        let lease = match given {
            Some(lease) => lease,
            None => Ttl::new(default_waiter_lease(ttl.duration))?,
        };
        Ok(Some(Fair::new(lease, custom.cloned())))
    }

    /// The fencing counter key, when `options` ask for fencing tokens.
    fn fencing_counter(&self, keys: &[String], options: &Options) -> Result<Option<String>> {
        let Some(fencing) = &options.fencing else {
            return Ok(None);
        };
        if self.backend().is_quorum() {
            return Err(InvalidInput::FencingWithQuorum.into());
        }
        let first = &keys[0];
        let counter = fencing
            .counter_key(first)
            .ok_or_else(|| InvalidInput::NoFencingKey { key: first.clone() })?;
        // The lock would overwrite its own counter, and its release delete it.
        if keys.contains(&counter) {
            return Err(InvalidInput::FencingKeyIsLocked { key: counter }.into());
        }
        Ok(Some(counter))
    }

    pub(crate) fn backend(&self) -> &Backend<C> {
        self.inner.backend()
    }

    pub(crate) fn tasks(&self) -> &Tasks {
        self.inner.tasks()
    }

    pub(crate) fn events(&self) -> &[Events] {
        self.inner.events()
    }
}

/// Checks a key set and its modes (see [`mode::split`]): a plain lock's modes are `None`.
fn checked_modes(keys: &[String], modes: Vec<Mode>) -> Result<Option<Modes>> {
    if !modes.is_empty() {
        mode::check_repeats(keys, &modes)?;
    }
    validate::keys(keys)?;
    Ok(Modes::new(keys, modes)?)
}

impl<C> fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}
