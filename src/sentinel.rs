//! A connection that follows the primary of a Redis Sentinel deployment across failovers.
//!
//! [`SentinelConnection`] is a redis-rs connection like any other, so the single-server
//! store, release events and every policy work over it unchanged. It always sends to the
//! server the sentinels name as primary, found as the Sentinel client guidelines ask:
//!
//! - **Discovery.** Every sentinel is asked at once (`SENTINEL MASTER name`, each within the
//!   connection timeout), and the answers of a majority of them, or of all that answer, are
//!   compared: the primary with the highest configuration epoch that no answer marks down
//!   wins, and is connected to only after `ROLE` says it is a primary. A sentinel that is
//!   down or paused delays nobody: a majority is enough.
//! - **Following.** The primary is looked up again when its connection fails (dropped,
//!   refused, I/O), when it answers `READONLY` (it was demoted), when the sentinels announce
//!   `+switch-master` for it (a task listens to one sentinel at a time, and asks all of them
//!   again every few seconds and after each reconnect, in case an announcement was missed),
//!   and, in the background, when a request times out. Requests are never resent: a write
//!   whose reply was lost has an unknown outcome, which the layers above handle.
//! - **Failing fast.** While no primary can be found (a failover under way), requests fail
//!   at once with the last error, and the sentinels are asked again at most every 100 ms.
//! - **Epochs.** Each primary comes with the configuration epoch the sentinels agreed on
//!   when it was promoted: it only grows, which keeps fencing tokens growing across a
//!   failover (see `fencing.rs`).
//!
//! Release events follow too: they subscribe on the current primary, and every change of
//! primary replaces their connection, which wakes every waiter to subscribe again there (a
//! release may have gone unheard meanwhile).
//!
//! redis-rs's own `sentinel` module finds a primary, but with no time limit on a sentinel or
//! primary that does not answer (its lookups are taken in order, so a paused first sentinel
//! holds up every lookup) and without the configuration epoch; it does not follow a
//! failover.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisConnectionInfo, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{InvalidInput, Result};
use crate::replication::Replication;
use crate::waiting::events::lock;

/// The shortest time between two lookups of the primary while none can be found.
const LOOKUP_PAUSE: Duration = Duration::from_millis(100);
/// How often the sentinels are asked whether the primary changed, beside listening for
/// `+switch-master`.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Where a [`SentinelConnection`] finds its primary: the sentinels, the name they know the
/// primary by, how to log in to the data nodes, and how many replicas must acknowledge a
/// lock's writes (used by [`Client::connect_sentinel`](crate::Client::connect_sentinel)).
///
/// See the guide: [failover](crate::guide::failover).
///
/// ```
/// # fn demo() -> Result<(), lockset::Error> {
/// use std::time::Duration;
/// use lockset::{Replication, SentinelConfig};
///
/// // The sentinels' own password goes into their URLs; the data nodes' is set apart.
/// let config = SentinelConfig::new(
///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
///     "locks",
/// )?
/// .password("data-node-secret")
/// .replication(Replication::replicas(1).timeout(Duration::from_millis(100)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct SentinelConfig {
    sentinels: Vec<ConnectionInfo>,
    master: String,
    node: RedisConnectionInfo,
    replication: Replication,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// TLS for the data nodes, and the certificates for `rediss://` sentinels.
    #[cfg(feature = "tls")]
    tls: Option<crate::Tls>,
}

impl SentinelConfig {
    /// The sentinels at `sentinels` (`redis://[user:password@]host:port`, credentials for
    /// the sentinels themselves), watching the primary named `master`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::NoSentinels`] without sentinels; [`Error::Redis`](crate::Error::Redis)
    /// for a URL that does not parse.
    pub fn new<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master: impl Into<String>,
    ) -> Result<Self> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(InvalidInput::NoSentinels.into());
        }
        Ok(Self {
            sentinels,
            master: master.into(),
            node: RedisConnectionInfo::default(),
            replication: Replication::all(),
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(500),
            #[cfg(feature = "tls")]
            tls: None,
        })
    }

    /// The ACL user to log in to the primary as (the sentinels' own is in their URLs).
    #[must_use]
    pub fn username(self, username: impl AsRef<str>) -> Self {
        let node = self.node.clone().set_username(username);
        Self { node, ..self }
    }

    /// The password to log in to the primary with (the sentinels' own is in their URLs).
    #[must_use]
    pub fn password(self, password: impl AsRef<str>) -> Self {
        let node = self.node.clone().set_password(password);
        Self { node, ..self }
    }

    /// The database to lock in. Defaults to 0.
    #[must_use]
    pub fn db(self, db: i64) -> Self {
        let node = self.node.clone().set_db(db);
        Self { node, ..self }
    }

    /// How many replicas must acknowledge a lock's writes (see
    /// [`Client::replicated`](crate::Client::replicated)). Defaults to
    /// [`Replication::all`]: every replica the primary has in sync, within 250 ms, so that a
    /// promotion of any of them keeps the lock (also on purpose, or in a partition, when the
    /// old primary takes writes for a while). `Replication::none()` turns it off.
    #[must_use]
    pub fn replication(self, replication: Replication) -> Self {
        Self {
            replication,
            ..self
        }
    }

    /// How long connecting to a sentinel or the primary may take. Defaults to 1 s.
    #[must_use]
    pub fn connection_timeout(self, connection_timeout: Duration) -> Self {
        Self {
            connection_timeout,
            ..self
        }
    }

    /// How long a request (to a sentinel, or a lock's to the primary) may wait for its
    /// reply. Defaults to 500 ms; keep it above the replication timeout.
    #[must_use]
    pub fn response_timeout(self, response_timeout: Duration) -> Self {
        Self {
            response_timeout,
            ..self
        }
    }

    /// Reaches the data nodes over TLS with `tls`'s certificate authorities and client
    /// certificate (feature `tls`); sentinels given as `rediss://` use them too (the others
    /// stay plain). Without this, data nodes are reached over plain TCP.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), lockset::Error> {
    /// use lockset::{SentinelConfig, Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/redis/ca.pem")?;
    /// let config = SentinelConfig::new(["rediss://10.0.0.1:26379"], "locks")?.tls(tls);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(self, tls: crate::Tls) -> Self {
        Self {
            tls: Some(tls),
            ..self
        }
    }

    /// A redis-rs client for `info` (a sentinel or a data node), with the TLS settings.
    fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return tls.redis_client(info);
        }
        redis::Client::open(info)
    }

    /// The replication settings.
    pub(crate) fn replication_settings(&self) -> Replication {
        self.replication
    }

    fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// How to reach the data node at `host:port`: a client with its login, over TLS when
    /// set.
    fn node_client(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let addr = ConnectionAddr::Tcp(host.to_owned(), port);
        #[cfg(feature = "tls")]
        let addr = match self.tls {
            Some(_) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
            None => addr,
        };
        let info = addr.into_connection_info()?;
        self.client(info.set_redis_settings(self.node.clone()))
    }
}

/// A connection to the current primary of a Sentinel deployment, which follows it across
/// failovers (made by [`Client::connect_sentinel`](crate::Client::connect_sentinel)).
///
/// It sends each request to the primary the sentinels name, and looks the primary up again
/// when its connection fails, when it answers `READONLY`, or when the sentinels announce a
/// new one. A request is never sent twice: one whose connection failed returns its error.
/// Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    follower: Arc<Follower>,
}

/// What the clones of one [`SentinelConnection`] share.
struct Follower {
    config: SentinelConfig,
    current: Mutex<Option<Primary>>,
    /// One lookup at a time; the others wait for its result.
    lookup: tokio::sync::Mutex<()>,
    /// The last lookup that failed, and when: no other is tried for [`LOOKUP_PAUSE`].
    failed: Mutex<Option<(Instant, RedisError)>>,
    /// Bumped whenever the primary changed, or is about to (release events follow it).
    changes: watch::Sender<u64>,
    /// The last primary's address, to tell a change from a reconnect.
    last: Mutex<Option<(String, u16)>>,
    watching: AtomicBool,
    checking: AtomicBool,
}

/// The primary found by a lookup, and a connection to it.
#[derive(Clone)]
struct Primary {
    conn: MultiplexedConnection,
    host: String,
    port: u16,
    epoch: u64,
}

/// What one sentinel said of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sighting {
    host: String,
    port: u16,
    epoch: u64,
    /// Flagged down (`s_down`, `o_down`) by this sentinel.
    down: bool,
    /// This sentinel leads a failover of the master now (`failover_in_progress`): until the
    /// promotion is seen, it still names the old primary, at the old epoch.
    failing_over: bool,
}

impl SentinelConnection {
    /// Finds the primary now, and keeps following it.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownMaster`] when no sentinel that answered knows the master;
    /// [`Error::Redis`](crate::Error::Redis) when no sentinel answered, or no primary could
    /// be reached.
    pub async fn connect(config: SentinelConfig) -> Result<Self> {
        let master = config.master.clone();
        let connection = Self {
            follower: Arc::new(Follower {
                config,
                current: Mutex::new(None),
                lookup: tokio::sync::Mutex::new(()),
                failed: Mutex::new(None),
                changes: watch::Sender::new(0),
                last: Mutex::new(None),
                watching: AtomicBool::new(false),
                checking: AtomicBool::new(false),
            }),
        };
        match connection.follower.primary().await {
            Err(err) if err.kind() == ErrorKind::MasterNameNotFoundBySentinel => {
                Err(InvalidInput::UnknownMaster { name: master }.into())
            }
            other => other.map(|_| connection).map_err(Into::into),
        }
    }

    /// A redis-rs client for the current primary (looked up if none is known), with the
    /// data nodes' login: for the connection release events listen on.
    pub(crate) async fn primary_client(&self) -> RedisResult<redis::Client> {
        let primary = self.follower.primary().await?;
        self.follower
            .config
            .node_client(&primary.host, primary.port)
    }

    /// Changes of primary: the value moves whenever the primary changed, or the sentinels
    /// announced that it will.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.follower.changes.subscribe()
    }

    /// Whether the primary is still the one the sentinels name, up, at the same epoch
    /// (every sentinel that answers is asked), and none of the replicas `missing` (that the
    /// primary no longer has in sync) says it is a primary; forgets the primary when the
    /// sentinels name another, or a missing replica was promoted.
    pub(crate) async fn confirm_primary(&self, missing: Vec<crate::replication::Address>) -> bool {
        if !self.follower.confirm().await {
            return false;
        }
        for (host, port) in missing {
            if self.follower.is_primary_at(&host, port).await {
                tracing::info!(%host, port, "a replica the primary lost is a primary now");
                self.follower.switched();
                return false;
            }
        }
        true
    }

    /// The configuration epoch of the current primary, if one is known.
    pub(crate) fn epoch(&self) -> Option<u64> {
        lock(&self.follower.current)
            .as_ref()
            .map(|primary| primary.epoch)
    }

    /// The address of the current primary, if one is known.
    pub fn primary_address(&self) -> Option<(String, u16)> {
        lock(&self.follower.current)
            .as_ref()
            .map(|primary| (primary.host.clone(), primary.port))
    }

    /// How lock writes over this connection are replicated (see [`SentinelConfig::replication`]).
    pub(crate) fn replication_settings(&self) -> Replication {
        self.follower.config.replication
    }

    /// A name for the deployment, to tell two of them apart in a quorum.
    pub(crate) fn name(&self) -> String {
        let sentinels: Vec<String> = self
            .follower
            .config
            .sentinels
            .iter()
            .map(|info| info.addr().to_string())
            .collect();
        format!(
            "sentinel:{}@{}",
            self.follower.config.master,
            sentinels.join(",")
        )
    }
}

impl Follower {
    /// The current primary, looked up when none is known.
    async fn primary(self: &Arc<Self>) -> RedisResult<Primary> {
        if let Some(primary) = lock(&self.current).clone() {
            return Ok(primary);
        }
        let _one = self.lookup.lock().await;
        if let Some(primary) = lock(&self.current).clone() {
            return Ok(primary);
        }
        if let Some((at, err)) = lock(&self.failed).clone()
            && at.elapsed() < LOOKUP_PAUSE
        {
            return Err(err);
        }
        match self.look_up().await {
            Ok(primary) => {
                *lock(&self.failed) = None;
                *lock(&self.current) = Some(primary.clone());
                let address = Some((primary.host.clone(), primary.port));
                let moved = std::mem::replace(&mut *lock(&self.last), address.clone()) != address;
                if moved {
                    tracing::info!(host = %primary.host, port = primary.port, epoch = primary.epoch, "following the primary");
                    self.changes.send_modify(|n| *n += 1);
                }
                self.watch_switches();
                Ok(primary)
            }
            Err(err) => {
                *lock(&self.failed) = Some((Instant::now(), err.clone()));
                Err(err)
            }
        }
    }

    /// Asks the sentinels for the primary and connects to it (see the module's docs).
    async fn look_up(&self) -> RedisResult<Primary> {
        let sightings = self.ask_sentinels(false).await?;
        let mut last_err = None;
        for sighting in candidates(sightings) {
            match self.connect_primary(&sighting).await {
                Ok(Some(conn)) => {
                    return Ok(Primary {
                        conn,
                        host: sighting.host,
                        port: sighting.port,
                        epoch: sighting.epoch,
                    });
                }
                Ok(None) => {}
                Err(err) => last_err = Some(err),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            unavailable(format!(
                "no primary of {:?} found: the sentinels name none that is up",
                self.config.master
            ))
        }))
    }

    /// What a majority of the sentinels (or all that answer) say of the master; with
    /// `everyone`, what every sentinel that answers within its time limit says.
    async fn ask_sentinels(&self, everyone: bool) -> RedisResult<Vec<Sighting>> {
        let config = &self.config;
        let asked = config.sentinels.len();
        let mut answers: futures_util::stream::FuturesUnordered<_> = config
            .sentinels
            .iter()
            .map(|sentinel| self.ask_sentinel(sentinel))
            .collect();
        let (mut sightings, mut unknown, mut last_err) = (Vec::new(), 0, None);
        while let Some(answer) = answers.next().await {
            match answer {
                Ok(Some(sighting)) => sightings.push(sighting),
                Ok(None) => unknown += 1,
                Err(err) => last_err = Some(err),
            }
            if !everyone && sightings.len() + unknown > asked / 2 {
                break;
            }
        }
        if !sightings.is_empty() {
            return Ok(sightings);
        }
        if unknown > 0 {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel knows the master",
                config.master.clone(),
            )));
        }
        let why = last_err.map_or_else(String::new, |err| format!(": {err}"));
        Err(unavailable(format!(
            "none of {asked} sentinels answered{why}"
        )))
    }

    /// What one sentinel says of the master: `None` when it does not know it.
    async fn ask_sentinel(&self, sentinel: &ConnectionInfo) -> RedisResult<Option<Sighting>> {
        let config = &self.config;
        let asked = async {
            let mut conn = config
                .client(sentinel.clone())?
                .get_multiplexed_async_connection_with_config(&config.connection_config())
                .await?;
            // The address a client should use (during a failover, the replica being
            // promoted), and the master's epoch and state.
            let mut ask = redis::pipe();
            ask.cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&config.master)
                .cmd("SENTINEL")
                .arg("MASTER")
                .arg(&config.master)
                .ignore_errors();
            ask.query_async::<(Value, Value)>(&mut conn).await
        };
        let limit = config.connection_timeout + config.response_timeout;
        match tokio::time::timeout(limit, asked).await {
            Err(_) => Err(unavailable(format!(
                "sentinel {} did not answer in {limit:?}",
                sentinel.addr()
            ))),
            Ok(Err(err)) => Err(err),
            Ok(Ok((address, master))) => Ok(parse_sighting(&address, &master)),
        }
    }

    /// A connection to the server `sighting` names, if it is a primary.
    async fn connect_primary(
        &self,
        sighting: &Sighting,
    ) -> RedisResult<Option<MultiplexedConnection>> {
        let config = &self.config;
        let client = config.node_client(&sighting.host, sighting.port)?;
        let connected = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config.connection_config())
                .await?;
            let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
            RedisResult::Ok(is_primary(&role).then_some(conn))
        };
        let limit = config.connection_timeout + config.response_timeout;
        tokio::time::timeout(limit, connected)
            .await
            .unwrap_or_else(|_| {
                Err(unavailable(format!(
                    "{}:{} did not answer in {limit:?}",
                    sighting.host, sighting.port
                )))
            })
    }

    /// Whether the server at `host:port` answers that it is a primary (one that cannot be
    /// reached in time is not).
    async fn is_primary_at(&self, host: &str, port: u16) -> bool {
        let sighting = Sighting {
            host: host.to_owned(),
            port,
            epoch: 0,
            down: false,
            failing_over: false,
        };
        matches!(self.connect_primary(&sighting).await, Ok(Some(_)))
    }

    /// Forgets the primary: the next request looks it up again.
    fn forget(&self, host: &str, port: u16) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_some_and(|primary| primary.port == port && primary.host == host)
        {
            tracing::info!(%host, port, "the primary failed or was demoted; asking the sentinels again");
            *current = None;
        }
    }

    /// The sentinels announced a new primary: forget the old one, and tell release events.
    fn switched(&self) {
        lock(&self.current).take();
        self.changes.send_modify(|n| *n += 1);
    }

    /// After a request to `primary` failed with `err`, or answered `reply`: forgets the
    /// primary when it is gone or demoted, and checks with the sentinels in the background
    /// when it only timed out (a paused primary may have been replaced meanwhile).
    fn after(self: &Arc<Self>, primary: &Primary, failure: Option<&RedisError>, replies: &[Value]) {
        let demoted = replies.iter().any(is_read_only);
        match failure {
            Some(err) if err.is_timeout() => self.check_soon(),
            Some(err)
                if err.is_connection_dropped()
                    || err.is_connection_refusal()
                    || err.is_io_error() =>
            {
                self.forget(&primary.host, primary.port);
            }
            Some(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                self.forget(&primary.host, primary.port);
            }
            _ if demoted => self.forget(&primary.host, primary.port),
            _ => {}
        }
    }

    /// Asks the sentinels, in the background, whether the primary is still the one they
    /// name; forgets it when not.
    fn check_soon(self: &Arc<Self>) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = tokio::runtime::Handle::try_current().map(|runtime| {
            runtime.spawn(async move {
                if let Some(follower) = me.upgrade() {
                    follower.check().await;
                    follower.checking.store(false, Ordering::Release);
                }
            })
        });
        if spawned.is_err() {
            self.checking.store(false, Ordering::Release);
        }
    }

    /// Whether the sentinels still name the current primary; forgets it when they name
    /// another.
    async fn check(&self) {
        let Ok(sightings) = self.ask_sentinels(false).await else {
            return;
        };
        let named = candidates(sightings).into_iter().next();
        let current = lock(&self.current)
            .as_ref()
            .map(|primary| (primary.host.clone(), primary.port));
        if let (Some(named), Some((host, port))) = (named, current)
            && (named.host != host || named.port != port)
        {
            tracing::info!(%host, port, new_host = %named.host, new_port = named.port, "the sentinels name a new primary");
            self.switched();
        }
    }

    /// Whether every sentinel that answers names the current primary, up, at its epoch:
    /// then the primary is still the deployment's. When one names another primary or a
    /// higher epoch, a promotion is under way: the primary is forgotten (and the change
    /// announced), and the answer is no, as it is when nobody answers.
    async fn confirm(&self) -> bool {
        let Some((host, port, epoch)) = lock(&self.current)
            .as_ref()
            .map(|p| (p.host.clone(), p.port, p.epoch))
        else {
            return false;
        };
        let Ok(sightings) = self.ask_sentinels(true).await else {
            return false;
        };
        let moved = sightings
            .iter()
            .any(|s| s.host != host || s.port != port || s.epoch > epoch);
        if moved {
            tracing::info!(%host, port, "the sentinels name a new primary, or a newer epoch");
            self.switched();
            return false;
        }
        // A failover under way names the old primary until the promotion is seen.
        !sightings.iter().any(|s| s.down || s.failing_over)
    }

    /// Starts listening for `+switch-master` (once).
    fn watch_switches(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        if tokio::runtime::Handle::try_current()
            .map(|runtime| runtime.spawn(watch_switches(me)))
            .is_err()
        {
            self.watching.store(false, Ordering::Release);
        }
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next one when it fails), and
/// asks all sentinels every [`CHECK_EVERY`] and after each reconnect; ends with the last
/// clone of the connection.
async fn watch_switches(follower: Weak<Follower>) {
    let mut next = 0;
    loop {
        let Some((sentinel, config)) = follower.upgrade().map(|f| {
            let sentinels = &f.config.sentinels;
            (sentinels[next % sentinels.len()].clone(), f.config.clone())
        }) else {
            return;
        };
        next += 1;
        let limit = config.connection_timeout + config.response_timeout;
        let subscribed = tokio::time::timeout(limit, async {
            let mut pubsub = config.client(sentinel.clone())?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        })
        .await;
        let Ok(Ok(pubsub)) = subscribed else {
            tokio::time::sleep(LOOKUP_PAUSE * 5).await;
            continue;
        };
        let (mut sink, mut messages) = pubsub.split();
        let mut prefix = config.master.clone().into_bytes();
        prefix.push(b' ');
        loop {
            // An announcement may have been missed while not subscribed, or this sentinel
            // may be cut off: ask every sentinel now and then.
            match follower.upgrade() {
                Some(f) => f.check().await,
                None => return,
            }
            let until = Instant::now() + CHECK_EVERY;
            let heard = loop {
                tokio::select! {
                    message = messages.next() => match message {
                        Some(message) if message.get_payload_bytes().starts_with(&prefix) => {
                            break Some(true);
                        }
                        Some(_) => {}
                        None => break None,
                    },
                    () = tokio::time::sleep_until(until) => break Some(false),
                }
            };
            match heard {
                Some(true) => match follower.upgrade() {
                    Some(f) => {
                        tracing::info!(master = %config.master, "the sentinels switched the primary");
                        f.switched();
                    }
                    None => return,
                },
                // A sentinel that stopped answering is left for the next.
                Some(false) => {
                    let pinged = tokio::time::timeout(limit, sink.ping::<Value>()).await;
                    if !matches!(pinged, Ok(Ok(_))) {
                        break;
                    }
                }
                None => break,
            }
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let primary = self.follower.primary().await?;
            let reply = primary.conn.clone().req_packed_command(cmd).await;
            match &reply {
                Ok(value) => self
                    .follower
                    .after(&primary, None, std::slice::from_ref(value)),
                Err(err) => self.follower.after(&primary, Some(err), &[]),
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let primary = self.follower.primary().await?;
            let replies = primary
                .conn
                .clone()
                .req_packed_commands(cmd, offset, count)
                .await;
            match &replies {
                Ok(values) => self.follower.after(&primary, None, values),
                Err(err) => self.follower.after(&primary, Some(err), &[]),
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.follower.config.node.db()
    }
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master", &self.follower.config.master)
            .field("primary", &self.primary_address())
            .finish_non_exhaustive()
    }
}

/// The addresses to try, best first: the highest epoch among those no sentinel marks down,
/// then the ones marked down; each address once, with the highest epoch it was named with.
fn candidates(mut sightings: Vec<Sighting>) -> Vec<Sighting> {
    sightings.sort_by(|a, b| a.down.cmp(&b.down).then(b.epoch.cmp(&a.epoch)));
    let mut seen: HashMap<(String, u16), ()> = HashMap::new();
    sightings
        .into_iter()
        .filter(|s| seen.insert((s.host.clone(), s.port), ()).is_none())
        .collect()
}

/// Reads a sentinel's answers: `SENTINEL GET-MASTER-ADDR-BY-NAME` (`[ip, port]`, nil for
/// a master it does not monitor) and `SENTINEL MASTER` (field names and values, as a flat
/// array in RESP2 or a map in RESP3: the epoch, and whether the master it monitors is down,
/// which says something of the address only when it is that master's).
fn parse_sighting(address: &Value, master: &Value) -> Option<Sighting> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let Value::Array(address) = address else {
        return None;
    };
    let host = text(address.first()?)?;
    let port: u16 = text(address.get(1)?)?.parse().ok()?;
    let fields: HashMap<String, String> = match master {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => HashMap::new(),
    };
    let field = |name: &str| fields.get(name).map_or("", String::as_str);
    let same = field("ip") == host && field("port") == port.to_string();
    let flagged = |names: &[&str]| field("flags").split(',').any(|flag| names.contains(&flag));
    Some(Sighting {
        host,
        port,
        epoch: field("config-epoch").parse().unwrap_or(0),
        down: same && flagged(&["s_down", "o_down", "disconnected"]),
        failing_over: flagged(&["failover_in_progress"]),
    })
}

/// Whether a `ROLE` reply is a primary's.
fn is_primary(role: &Value) -> bool {
    matches!(role, Value::Array(items) if matches!(items.first(), Some(Value::BulkString(role)) if role == b"master"))
}

/// Whether a reply is the `READONLY` error of a server that is a replica now.
fn is_read_only(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::ReadOnly))
}

/// An error for "no primary can be reached now", which callers treat as Redis being
/// unavailable: worth retrying, and [`Error::is_unavailable`](crate::Error::is_unavailable).
fn unavailable(why: String) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        why,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn sighting(port: u16, epoch: u64, down: bool) -> Sighting {
        Sighting {
            host: "127.0.0.1".into(),
            port,
            epoch,
            down,
            failing_over: false,
        }
    }

    #[test]
    fn a_sentinel_answer_gives_address_epoch_and_state() {
        let flat = |fields: &[&str]| Value::Array(fields.iter().copied().map(bulk).collect());
        let address = flat(&["127.0.0.1", "7001"]);
        let master = flat(&[
            "name",
            "locks",
            "ip",
            "127.0.0.1",
            "port",
            "7001",
            "flags",
            "master,s_down",
            "config-epoch",
            "3",
        ]);
        assert_eq!(
            parse_sighting(&address, &master),
            Some(sighting(7001, 3, true))
        );
        // During a failover the address is the replica being promoted, while the master the
        // sentinel monitors (and marks down) is still the old one.
        let promoted = flat(&["127.0.0.1", "7002"]);
        assert_eq!(
            parse_sighting(&promoted, &master),
            Some(sighting(7002, 3, false))
        );
        let resp3 = Value::Map(vec![
            (bulk("ip"), bulk("127.0.0.1")),
            (bulk("port"), bulk("7002")),
            (bulk("flags"), bulk("master")),
            (bulk("config-epoch"), Value::Int(4)),
        ]);
        assert_eq!(
            parse_sighting(&promoted, &resp3),
            Some(sighting(7002, 4, false))
        );
        // A master this sentinel does not monitor.
        assert_eq!(parse_sighting(&Value::Nil, &Value::Nil), None);
    }

    #[test]
    fn the_newest_primary_that_is_up_comes_first() {
        let sightings = vec![
            sighting(7000, 1, true),
            sighting(7001, 2, false),
            sighting(7000, 1, false),
            sighting(7002, 3, true),
            sighting(7001, 2, false),
        ];
        let order: Vec<(u16, u64)> = candidates(sightings)
            .into_iter()
            .map(|s| (s.port, s.epoch))
            .collect();
        assert_eq!(order, [(7001, 2), (7000, 1), (7002, 3)]);
    }

    #[test]
    fn roles_and_demotions_are_recognised() {
        assert!(is_primary(&Value::Array(vec![
            bulk("master"),
            Value::Int(0)
        ])));
        assert!(!is_primary(&Value::Array(vec![bulk("slave")])));
    }
}
