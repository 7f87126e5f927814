//! The public entry point: a cheap, cloneable handle that obtains locks.

mod attempt;
mod cleanup;
mod connect;

pub(crate) use connect::Dial;
mod obtain;

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

use crate::client::link::Link;
use crate::client::lock::{Lock, Obtained};
use crate::client::options::Options;
use crate::client::options::default_waiter_lease;
use crate::client::state::ClientState;
use crate::error::classify::{self, is_outcome_unknown};
use crate::error::{Error, Result};
use crate::model::invalid::InvalidInput;
use crate::model::key::IntoKey;
use crate::model::mode::{self, Mode, Modes};
use crate::model::request::{Claim, Held, IfHeld, OwnedClaim, Ttl};
use crate::model::retry::Retry;
use crate::model::validate;
use crate::model::value::Owner;
use crate::observe::{Op, Progress, finished, in_span, op_span};
use crate::rt::signal::LostSignal;
use crate::rt::tasks::Tasks;
use crate::server::replication::{Replicas, Replication};
use crate::server::store::{Flavor, Obtain, Store};
use crate::topology::backend::Backend;
use crate::topology::quorum::{Quorum, QuorumConfig};
use crate::topology::sentinel::{SentinelConfig, SentinelConnection};
use crate::topology::stragglers::Stragglers;
use crate::waiting::events::Events;
use crate::waiting::fair::{Fair, Stint};
use crate::waiting::policy::{self, Limit, Step, Waiter, Watch};

/// Obtains locks: on one Redis server ([`Client::connect`]), behind Sentinel
/// ([`Client::connect_sentinel`]), on a Redlock quorum of independent masters
/// ([`Client::quorum`]) or on a Redis Cluster (`Client::connect_cluster`, feature `cluster`),
/// with the same operations on each.
///
/// See the guide: [getting started](crate::guide::getting_started).
///
/// **One type for every topology.** Every constructor returns a `Client` (the default type
/// parameter), so the topology can be chosen at run time, from configuration, and a
/// service's functions take a `Client` and return a [`Lock`] or [`Guard`](crate::Guard)
/// without naming a connection type (`tests/suite/one_client.rs`):
///
/// ```no_run
/// # async fn demo(sentinel: bool) -> Result<(), lockset::Error> {
/// use lockset::{Client, SentinelConfig};
///
/// let client: Client = if sentinel {
///     Client::connect_sentinel(SentinelConfig::new(["redis://10.0.0.1:26379"], "locks")?).await?
/// } else {
///     Client::connect("redis://127.0.0.1/").await?
/// };
/// # Ok(())
/// # }
/// ```
///
/// **Your own connection.** [`Client::new`] wraps any redis-rs async connection `C`, a
/// `Client<C>`: a [`ConnectionManager`] (it reconnects after the connection drops) or a
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection) (which never heals once the
/// server drops it), or a connection of your own. The type parameter only names that
/// connection: the default, `Client<ConnectionManager>`, is what every constructor above
/// returns, whatever it connects to.
///
/// A client is cheap to clone and can be shared by any number of tasks; clones share the
/// connection.
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
pub struct Client<C = ConnectionManager> {
    // One allocation shared by every clone and every lock: cloning a client (each lock
    // holds one) costs a single reference-count increment.
    inner: Arc<ClientState<C>>,
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
        let store = Arc::new(Store::new(Link::Own(conn), Flavor::Standalone));
        Self::with_backend(Backend::Single(store), false, Tasks::default())
    }

    fn with_backend(backend: Backend<Link<C>>, cluster: bool, tasks: Tasks) -> Self {
        Self {
            inner: Arc::new(ClientState::new(backend, cluster, tasks)),
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

    /// Tells the client that every request on its connection ends, answered or failed,
    /// within `bound`, a wait for a reconnection included: for a redis-rs
    /// `MultiplexedConnection`, its response timeout (500 ms unless set otherwise). For this
    /// client and all its clones.
    ///
    /// An attempt then arms no timer of its own while its deadline is further away than
    /// `bound`: the connection wakes it first. That saves every obtain and refresh a timer's
    /// registration and removal (about a third of lockset's own work per uncontended cycle
    /// under 64 tasks; see the guide: [performance](crate::guide::performance)).
    /// [`Client::connect`] and [`Config`](crate::Config) set it from their own timeouts.
    ///
    /// A bound that is too short costs nothing but the promise of the deadline: an
    /// operation may then end as late as its connection lets it, past its deadline. A
    /// lock's validity never depends on it (it counts from when the attempt was sent).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use lockset::Client;
    ///
    /// let redis = lockset::redis::Client::open("redis://127.0.0.1/")?;
    /// let conn = redis.get_multiplexed_async_connection().await?;
    /// // redis-rs's default response timeout for this connection.
    /// let client = Client::new(conn).connection_answers_within(Duration::from_millis(500))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::ZeroAnswerBound`] for a zero bound;
    /// [`InvalidInput::AnswerBoundNeedsOneConnection`] on a Redlock quorum, a cluster or a
    /// Sentinel client (their requests wait for more than one connection).
    pub fn connection_answers_within(self, bound: Duration) -> Result<Self> {
        if bound.is_zero() {
            return Err(InvalidInput::ZeroAnswerBound.into());
        }
        if !self.backend().is_direct() {
            return Err(InvalidInput::AnswerBoundNeedsOneConnection.into());
        }
        let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        self.inner.answer_bound.store(nanos, Ordering::Relaxed);
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

    /// Asks each server whether it runs this client's scripts, so that the first obtain
    /// need not (a Redlock master's part of an obtain runs within its per-node time limit,
    /// and every `lockset` run makes a new client). Whatever fails here, that obtain asks
    /// again; a refusal is only logged here (a client may connect to read queues only).
    async fn ask_scripts(&self) {
        if self.inner.cluster {
            // Which node to ask depends on the key (see `Store::check_scripts`).
            return;
        }
        for store in self.backend().stores() {
            if let Err(err) = store.check_scripts(None).await {
                tracing::debug!(%err, "could not ask whether scripts run; the first obtain asks");
            }
        }
    }

    pub(crate) fn backend(&self) -> &Backend<Link<C>> {
        self.inner.backend()
    }

    pub(crate) fn tasks(&self) -> &Tasks {
        self.inner.tasks()
    }

    pub(crate) fn events(&self) -> &[Events] {
        self.inner.events()
    }
}

/// Says where the locks live: `Client { topology: "single", address: Some("127.0.0.1:6379"),
/// .. }`, `"redlock"` with its masters' count, `"cluster"`; a Sentinel client's address
/// names its sentinels and primary.
impl<C> fmt::Debug for Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = self.inner.backend();
        let mut debug = f.debug_struct("Client");
        if backend.is_quorum() {
            debug
                .field("topology", &"redlock")
                .field("masters", &backend.stores().len());
        } else {
            let topology = if self.inner.cluster {
                "cluster"
            } else {
                "single"
            };
            debug
                .field("topology", &topology)
                .field("address", &self.inner.address.get());
        }
        debug
            .field("replicated", &backend.is_replicated())
            .finish_non_exhaustive()
    }
}
