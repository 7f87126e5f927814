//! A connection that follows the primary of a Redis Sentinel deployment across failovers.
//!
//! [`SentinelConnection`] is a redis-rs connection like any other, so the single-server
//! store, release events and every policy work over it unchanged. It always sends to the
//! server the sentinels name as primary, found as the Sentinel client guidelines ask:
//!
//! - **Discovery.** Every sentinel is asked at once (its address for the master, the master's
//!   state and epoch, its replicas, and its own uptime, in one request within the connection
//!   timeout). The primary is the address more than half of the *configured* sentinels name
//!   (see `census.rs`); sentinels that name another are reported in a warning, never
//!   followed. It is connected to only after `ROLE` says it is a primary (see `primary.rs`
//!   for what else it is asked). A sentinel that is down or paused delays nobody once a
//!   majority agreed.
//! - **Replicas to wait for.** With every lookup (and every check, every few seconds) comes
//!   the number of replicas the sentinels could promote: lock writes wait for each of them
//!   (see `server/replication/`), so that a write the old primary takes during a planned failover,
//!   acknowledged only by the replicas not being promoted, does not count.
//! - **A restarted primary.** A primary that came back empty grants no lock until the longest
//!   TTL in use passed since its start (see `primary.rs` and [`SentinelConfig::restart_grace`]).
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

use crate::error::{Result, unavailable};
use crate::model::invalid::InvalidInput;
use crate::rt::lock;
use crate::server::replication::{Address, Promotable, Replication};
use crate::server::store::Deployment;

mod census;
mod follower;
mod primary;

use census::{Answer, Census, Elected, Witness};
use primary::Facts;

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
    restart_grace: Duration,
    /// TLS for the data nodes, and the certificates for `rediss://` sentinels.
    #[cfg(feature = "tls")]
    tls: Option<crate::topology::tls::Tls>,
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
            restart_grace: Duration::ZERO,
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

    /// How long a primary that restarted without its data grants no lock, counted from its
    /// start: the longest TTL any client of the deployment uses. Defaults to each obtain's
    /// own TTL (safe when every client locks with the same TTL, or a shorter one).
    ///
    /// A primary without persistence that keeps every write (`appendonly yes` with
    /// `appendfsync always`), killed and started again before the sentinels notice, comes
    /// back empty, and its replicas drop their copies: the locks it held are gone while
    /// their holders still believe in them, until their next refresh fails. So, as Redlock's
    /// *delayed restart* asks, such a primary grants no lock until the longest TTL in use
    /// has passed since its start; obtains meanwhile fail as Redis unavailable
    /// ([`Error::is_unavailable`](crate::Error::is_unavailable)), and are retried until
    /// their deadline. See the guide: [failover](crate::guide::failover).
    #[must_use]
    pub fn restart_grace(self, restart_grace: Duration) -> Self {
        Self {
            restart_grace,
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
    pub fn tls(self, tls: crate::topology::tls::Tls) -> Self {
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
    /// How many lookups succeeded (see [`Primary::generation`]).
    lookups: AtomicU64,
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
    /// Counts lookups: a new primary, or the same one connected again (after a restart,
    /// say), has a new one.
    generation: u64,
    /// How many replicas the sentinels could promote (see `census.rs`): lock writes wait for
    /// each of them.
    replicas: Arc<[Address]>,
    /// When it started, if it restarted without the locks it had (see `primary.rs`).
    restarted_empty: Option<Instant>,
}

impl SentinelConnection {
    /// Finds the primary now, and keeps following it.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::UnknownMaster`] when a majority of the sentinels does not know the
    /// master; [`Error::Redis`](crate::Error::Redis) when the sentinels refuse the login,
    /// when no majority of them answers or names one primary, or when that primary cannot be
    /// reached ([`Error::is_unavailable`](crate::Error::is_unavailable): worth retrying).
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
                lookups: AtomicU64::new(0),
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

    /// Whether the primary is still the one a majority of the sentinels names, up, at the
    /// same epoch, with no failover under way (every sentinel that answers is asked), and
    /// none of the replicas `missing` (that the primary no longer has in sync) says it is a
    /// primary; forgets the primary when the sentinels name another, or a missing replica
    /// was promoted.
    pub(crate) async fn confirm_primary(&self, missing: Vec<Address>) -> bool {
        if !self.follower.confirm().await {
            return false;
        }
        let current = self.primary_address();
        for (host, port) in missing {
            if current.as_ref() == Some(&(host.clone(), port)) {
                continue;
            }
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

    /// The current primary's lookup and the replicas the sentinels could promote, if a
    /// primary is known.
    pub(crate) fn promotable(&self) -> Option<Promotable> {
        lock(&self.follower.current)
            .as_ref()
            .map(|primary| Promotable {
                generation: primary.generation,
                replicas: primary.replicas.clone(),
            })
    }

    /// Finds the primary (looked up when none is known), and whether it may grant a lock of
    /// `ttl` now: not while a primary that restarted empty may have forgotten a lock that is
    /// still valid (see `primary.rs`). Its lookup's generation when it may.
    pub(crate) async fn admits(&self, ttl: Duration) -> RedisResult<u64> {
        let primary = self.follower.primary().await?;
        let Some(started) = primary.restarted_empty else {
            return Ok(primary.generation);
        };
        let grace = self.follower.config.restart_grace.max(ttl);
        let up = started.elapsed();
        if up >= grace {
            return Ok(primary.generation);
        }
        let (host, port) = (primary.host, primary.port);
        // Its start is known to the second (`uptime_in_seconds`).
        let ago = match up.as_secs() {
            0 => "less than a second".to_owned(),
            secs => format!("{secs} s"),
        };
        Err(unavailable(format!(
            "the primary {host}:{port} restarted {ago} ago without its data (no persistence that keeps every write); it grants no lock until {grace:?} after its start, the longest TTL a lock it forgot may have (SentinelConfig::restart_grace)"
        )))
    }

    /// The address of the current primary, if one is known.
    pub fn primary_address(&self) -> Option<(String, u16)> {
        lock(&self.follower.current)
            .as_ref()
            .map(|primary| (primary.host.clone(), primary.port))
    }

    /// What each sentinel names as the primary now, one line each (for `lockset status`
    /// and for people): its address, epoch and state, or why it did not answer.
    pub async fn sentinels_say(&self) -> Vec<String> {
        self.follower.ask_sentinels(true).await.describe()
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

impl Deployment for SentinelConnection {
    fn epoch(&self) -> Option<u64> {
        Self::epoch(self)
    }

    fn promotable(&self) -> Option<Promotable> {
        Self::promotable(self)
    }

    fn admits(
        &self,
        ttl: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = RedisResult<u64>> + Send + '_>> {
        Box::pin(Self::admits(self, ttl))
    }

    fn confirm(
        &self,
        missing: Vec<Address>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(self.confirm_primary(missing))
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
            .field(
                "restarted_empty_ago",
                &lock(&self.follower.current)
                    .as_ref()
                    .and_then(|p| p.restarted_empty)
                    .map(|started| started.elapsed()),
            )
            .finish_non_exhaustive()
    }
}

/// Whether a reply is the `READONLY` error of a server that is a replica now.
fn is_read_only(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.kind() == Some(ServerErrorKind::ReadOnly))
}
