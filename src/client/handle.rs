//! The public entry point: a cheap, cloneable handle that obtains locks.

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

#[cfg(feature = "cluster")]
impl Client<redis::cluster_async::ClusterConnection> {
    /// A client for a Redis Cluster (feature `cluster`).
    ///
    /// See the guide: [Redis Cluster](crate::guide::cluster).
    ///
    /// Before anything is sent, every key of a lock, and its fencing counter, must hash to
    /// one slot, else [`InvalidInput::CrossSlot`] names the keys and their slots: give them a
    /// common hash tag (`{user42}:cart`, `{user42}:wallet`). A script the node serving the
    /// slot lacks (NOSCRIPT) is sent there whole by EVAL, and MOVED/ASK redirections
    /// during a resharding are followed by the cluster connection. Releases are announced with
    /// sharded pub/sub (SPUBLISH); waiters of a client made here poll, those of
    /// [`Client::connect_cluster`] are woken by release events.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// let nodes = ["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"];
    /// let conn = lockset::redis::cluster::ClusterClient::new(nodes.to_vec())?
    ///     .get_async_connection()
    ///     .await?;
    /// let client = lockset::Client::cluster(conn);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster(conn: redis::cluster_async::ClusterConnection) -> Self {
        let store = Arc::new(Store::new_cluster(conn));
        Self::with_backend(Backend::Single(store), true, Tasks::default())
    }

    /// Connects to a Redis Cluster through the seed nodes `nodes` (feature `cluster`), with
    /// release events on: waiters listen with sharded pub/sub (SSUBSCRIBE, or SUBSCRIBE
    /// before Redis 7) on the shard that owns the key, following slot moves.
    ///
    /// See the guide: [Redis Cluster](crate::guide::cluster).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// let client = lockset::Client::connect_cluster(["redis://127.0.0.1:7000/"]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_cluster<T>(nodes: impl IntoIterator<Item = T>) -> Result<Self>
    where
        T: redis::IntoConnectionInfo,
    {
        let nodes = nodes
            .into_iter()
            .map(redis::IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let conn = redis::cluster::ClusterClient::new(nodes.clone())?
            .get_async_connection()
            .await?;
        let client = Self::cluster(conn);
        let _ = client.inner.events.set(Box::new([Events::cluster(nodes)]));
        Ok(client)
    }
}

impl Client<ConnectionManager> {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/`, or `redis://USER:PASSWORD@HOST/`)
    /// with a [`ConnectionManager`] and redis-rs's default timeouts, with release events on
    /// (see [`Client::with_release_events`]). With the `tls` feature, a `rediss://` URL
    /// connects over TLS, trusting the system's roots (see `Client::connect_with_tls`, feature `tls`, for
    /// others).
    ///
    /// See the guide: [getting started](crate::guide::getting_started).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the server cannot be reached (after redis-rs's connection
    /// retries, about 6 s), and at once when it refuses the login or the TLS handshake
    /// fails (an untrusted certificate): a setting to fix, not a failure to wait out.
    pub async fn connect(url: &str) -> Result<Self> {
        #[cfg(feature = "tls")]
        let client = crate::topology::tls::Tls::new().redis_client(url)?;
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(url)?;
        Self::connect_client(client).await
    }

    /// Connects to `url` as [`Client::connect`] does, over TLS with the certificate
    /// authorities and client certificate of `tls` when the URL is `rediss://` (feature
    /// `tls`). Release events connect the same way.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// let tls = lockset::Tls::new().ca_file("/etc/redis/ca.pem")?;
    /// let client = lockset::Client::connect_with_tls("rediss://:secret@redis.internal:6380/", &tls).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::connect`]; a server whose certificate `tls` does not trust is refused at
    /// once.
    #[cfg(feature = "tls")]
    pub async fn connect_with_tls(url: &str, tls: &crate::topology::tls::Tls) -> Result<Self> {
        Self::connect_client(tls.redis_client(url)?).await
    }

    async fn connect_client(client: redis::Client) -> Result<Self> {
        let conn = manager(&client).await?;
        Self::new(conn).with_release_events(client)
    }
}

/// A connection manager for `client`. redis-rs's manager tries a first connection 6 times
/// over about 6 s, whatever failed; beside it, one plain attempt tells at once when the server
/// refuses the login or the certificate, which no retry would change.
async fn manager(client: &redis::Client) -> redis::RedisResult<ConnectionManager> {
    let refused = async {
        let attempt = client.get_multiplexed_async_connection().await;
        if let Err(err) = attempt
            && classify::is_access_refusal(&err)
        {
            return err;
        }
        std::future::pending().await
    };
    tokio::select! {
        conn = ConnectionManager::new(client.clone()) => conn,
        err = refused => Err(err),
    }
}

impl Client<SentinelConnection> {
    /// Connects to the primary that the sentinels of `config` name, and follows it across
    /// failovers (see [`SentinelConnection`]), with release events on (they follow the
    /// primary too) and lock writes replicated as `config` says (by default: every replica
    /// the primary has in sync acknowledges each obtain and refresh; see
    /// [`Client::replicated`] and [`Replication::all`]).
    ///
    /// See the guide: [failover](crate::guide::failover).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::{Client, Options, SentinelConfig};
    ///
    /// let sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"];
    /// let client = Client::connect_sentinel(SentinelConfig::new(sentinels, "locks")?).await?;
    /// let lock = client.obtain("report", Duration::from_secs(10), &Options::default()).await?;
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownMaster`] when a majority of the sentinels does not know the
    /// master's name; [`Error::Redis`] when the sentinels refuse the login, when no majority
    /// of them answers or names one primary, or when it cannot be reached; the errors of
    /// [`Client::replicated`] (for example [`Error::NotReplicated`] when the primary has
    /// fewer replicas connected than the sentinels could promote, or than asked for: worth
    /// retrying, as every [`Error::is_unavailable`] error is). Nothing is written.
    pub async fn connect_sentinel(config: SentinelConfig) -> Result<Self> {
        config.replication_settings().check()?;
        Self::sentinel(SentinelConnection::connect(config).await?).await
    }

    /// A client over `conn`, a connection that follows the primary of a Sentinel
    /// deployment, with release events that follow it too and lock writes replicated as its
    /// [`SentinelConfig`] says: what [`Client::connect_sentinel`] makes, for a caller that
    /// keeps the connection for commands of its own.
    ///
    /// # Errors
    ///
    /// The errors of [`Client::replicated`].
    pub async fn sentinel(conn: SentinelConnection) -> Result<Self> {
        let replication = conn.replication_settings();
        let client = Self::new(conn.clone());
        for store in client.backend().stores() {
            store.follow(Arc::new(conn.clone()));
        }
        let _ = client.inner.address.set(conn.name());
        let _ = client.inner.events.set(Box::new([Events::sentinel(conn)]));
        client.replicated(replication).await
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

/// One obtain call's inputs, computed once.
struct Attempt<'a, C> {
    client: &'a Client<C>,
    keys: &'a [String],
    /// The caller's token; `None` for a fresh random token per attempt.
    custom: Option<&'a Owner>,
    metadata: &'a str,
    ttl: Ttl,
    counter: Option<&'a str>,
    modes: Option<&'a Modes>,
    /// The obtain's place in the queues, when it waits fairly.
    fair: Option<&'a Fair>,
}

/// A successful attempt.
struct Won {
    owner: Owner,
    ttl: Ttl,
    fence: Option<u64>,
    valid_until: Instant,
    /// A quorum's writes of the lock still under way.
    stragglers: Option<Arc<Stragglers>>,
}

impl<C> Attempt<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One attempt.
    ///
    /// Without a custom token every attempt gets a fresh random one, so a late clean-up of
    /// a failed attempt can never delete a later attempt's lock (on a slow Redlock master,
    /// say). A reply that never came (client-side timeout) leaves the outcome unknown: the
    /// script may have locked the keys. So does dropping this future mid-flight (at the
    /// deadline, or cancelled). For a random token, release by token then, in the
    /// background: on the same connection, after the obtain. A custom token may already
    /// have held these keys before this call, so they are left to expire with the TTL (a
    /// fair waiter's queue entry is left, by the same clean-up).
    ///
    /// `sent`: a moment before the attempt is sent, where its validity counts from.
    async fn run(&self, how: Try, sent: Instant) -> Step<Won> {
        // A fair obtain keeps its token while it queues (see `waiting/fair.rs`).
        let stint = self.fair.map(Fair::stint);
        if let Some(won) = self.take_handed(stint.as_ref()) {
            return Step::Done(won);
        }
        let ticket = stint.as_ref().map(|stint| stint.sending(how.listen));
        let owner = match (self.custom, &stint) {
            (Some(owner), _) => Cow::Borrowed(owner),
            (None, Some(stint)) => Cow::Borrowed(&stint.owner),
            (None, None) => Cow::Owned(Owner::random()),
        };
        let value = owner.value(self.metadata);
        let claim = Claim {
            keys: self.keys,
            owner: &owner,
            value: &value,
            ttl: self.ttl,
            counter: self.counter,
            modes: self.modes,
            ticket: ticket.as_ref(),
        };
        let random = self.custom.is_none();
        // A custom token's keys may be an outer lock's: only its queue entry is left.
        let mut cleanup = CleanupOnDrop {
            attempt: (random || claim.ticket.is_some()).then_some((self.client, &claim)),
        };
        let (outcome, stragglers) = self.client.backend().obtain(&claim, random, how).await;
        // No intact reply: the script may or may not have run. The clean-up goes on in the
        // background, so that a server that does not answer delays nobody's deadline.
        if !matches!(&outcome, Err(Error::Redis(err)) if is_outcome_unknown(err)) {
            cleanup.attempt = None;
        } else if let (Some(fair), Some(stint)) = (self.fair, &stint) {
            fair.start_over(stint);
        }
        drop(cleanup);
        if let (Some(fair), Ok(Obtain::Held { queued: true, .. })) = (self.fair, &outcome) {
            fair.queued(&claim);
        }
        match outcome {
            Ok(Obtain::Obtained { fence, .. }) => {
                let ttl = self.ttl.duration;
                let valid_for = ttl.saturating_sub(self.client.backend().drift(ttl));
                let valid_until = sent.checked_add(valid_for).unwrap_or(sent);
                Step::Done(Won {
                    owner: owner.into_owned(),
                    ttl: self.ttl,
                    fence,
                    valid_until,
                    stragglers,
                })
            }
            Ok(Obtain::Held { ttl, key, queued }) => Step::Held(Held { ttl, key, queued }),
            Err(Error::Redis(err)) if is_outcome_unknown(&err) => {
                Step::from_error(Error::UnknownOutcome(err))
            }
            Err(err) => Step::from_error(err),
        }
    }
}

impl<C> Attempt<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The lock a release handed to `stint` and told it of, taken as it is, with nothing
    /// sent: its keys hold the stint's value for the time the hand-off gave, counted from
    /// when the attempt it names was sent (see [`Stint::handed_until`]).
    ///
    /// Only when that leaves nearly the full TTL (7/8 of it: the waiter was handed the
    /// lock soon after it last renewed, and its lease covered the TTL); otherwise, for
    /// an obtain that mints a fencing token, and when writes wait for replicas, `None`: an attempt then makes the keys its own
    /// for the full TTL, if they still are (one more round trip, where a hand-off came long
    /// after the last renewal, or a short lease cut it).
    fn take_handed(&self, stint: Option<&Arc<Stint>>) -> Option<Won> {
        let (fair, stint) = (self.fair?, stint?);
        let handed = fair.take_handed()?;
        let drift = self.client.backend().drift(handed.ttl);
        let until = stint.handed_until(&handed)?.checked_sub(drift)?;
        let ttl = self.ttl.duration;
        let left = until.saturating_duration_since(Instant::now());
        // A hand-off the replicas may not have yet is confirmed by an attempt that waits
        // for them: they apply the release's hand-off before that attempt's write.
        if self.counter.is_some() || left < ttl - ttl / 8 || self.client.backend().is_replicated() {
            return None;
        }
        Some(Won {
            owner: stint.owner.clone(),
            ttl: self.ttl,
            fence: None,
            valid_until: until,
            stragglers: None,
        })
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

/// The first pause before a clean-up that could not reach Redis is tried again.
const CLEAN_UP_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between tries of a clean-up.
const CLEAN_UP_PAUSE_AT_MOST: Duration = Duration::from_secs(1);

/// Releases by token in the background when an attempt is dropped mid-flight, or ends
/// without an intact reply (random tokens only).
struct CleanupOnDrop<'a, 'b, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    attempt: Option<(&'a Client<C>, &'a Claim<'b>)>,
}

impl<C> Drop for CleanupOnDrop<'_, '_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some((client, claim)) = self.attempt {
            clean_up_later(client, claim.to_shared());
        }
    }
}

/// Leaves the queues of a fair obtain that ends without the lock (see [`Fair::to_leave`]).
struct LeaveOnDrop<'a, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    client: &'a Client<C>,
    fair: Option<&'a Fair>,
}

impl<C> Drop for LeaveOnDrop<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(claim) = self.fair.and_then(Fair::to_leave) {
            clean_up_later(self.client, claim);
        }
    }
}

/// Releases `claim` by token in the background, leaving its queues too: sent on the same
/// connection after the obtain's last attempt, so it runs after it.
///
/// A clean-up that cannot reach the server (a failover under way, a restart) is tried
/// again, with growing pauses, until what it removes would have expired anyway: the keys'
/// TTL, and a fair waiter's lease. Its queue entry would otherwise stay behind, and a
/// release hand the lock to a waiter that started over under another token, which nobody
/// then holds or releases until it expires.
fn clean_up_later<C>(client: &Client<C>, claim: Arc<OwnedClaim>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let client = client.clone();
    let tasks = client.tasks().clone();
    let spawned = tasks.spawn(async move {
        let claim = claim.claim();
        let lease = claim.ticket.map_or(Duration::ZERO, |ticket| ticket.lease.duration);
        let expired = Instant::now() + claim.ttl.duration.max(lease);
        let mut pause = CLEAN_UP_PAUSE;
        loop {
            match client.backend().clean_up(&claim).await {
                Err(err) if err.is_unavailable() && Instant::now() + pause < expired => {
                    tracing::debug!(%err, "clean-up could not reach Redis; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CLEAN_UP_PAUSE_AT_MOST);
                }
                Err(err) => {
                    tracing::warn!(%err, "clean-up after an obtain that was cancelled or got no reply failed; the keys expire with their TTL");
                    return;
                }
                Ok(()) => return,
            }
        }
    });
    if spawned.is_none() {
        tracing::warn!("obtain cancelled outside a tokio runtime: its keys expire with their TTL");
    }
}

impl<C> fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}
