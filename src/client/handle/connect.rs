//! Making a client for each topology: one server (plain or TLS), a Sentinel deployment and
//! a Redis Cluster. Every constructor here returns a [`Client`] (the default type), so that
//! the topology can be chosen at run time; a Redlock quorum is made of such clients
//! ([`Client::quorum`]), or connected from URLs ([`Client::connect_quorum`]).

use super::*;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;

#[cfg(feature = "cluster")]
impl Client {
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
        let store = Arc::new(Store::new(Link::Cluster(conn), Flavor::Cluster));
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
        Self::connect_cluster_with(redis::cluster::ClusterClient::builder(nodes.clone()), nodes)
            .await
    }

    /// As [`Client::connect_cluster`], with the settings of `builder` (timeouts, retries,
    /// certificates) for the seed nodes `nodes`.
    pub(crate) async fn connect_cluster_with(
        builder: redis::cluster::ClusterClientBuilder,
        nodes: Vec<redis::ConnectionInfo>,
    ) -> Result<Self> {
        let conn = builder.build()?.get_async_connection().await?;
        let client = Self::cluster(conn);
        let _ = client.inner.events.set(Box::new([Events::cluster(nodes)]));
        Ok(client)
    }
}

impl Client {
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
    /// [`Error::Redis`], within redis-rs's connection timeout (1 s): when nobody listens on
    /// the port ([`Error::is_unavailable`]: a server not started yet is not waited for);
    /// when the server refuses the login or the database the URL selects, or the TLS
    /// handshake fails (an untrusted certificate): settings to fix, not failures to wait
    /// out (a server that wants a password none was given lets the connection in, and
    /// refuses the first operation: `NOAUTH`); when a `rediss://` URL gets no TLS handshake
    /// in time (a timeout, whose text asks "is this a TLS port?"). Other failures (a
    /// timeout on a plain-text port, a reset, a server at its client limit) are tried again
    /// 6 times, 100 ms apart and doubling, as redis-rs's connection manager would: 9 s or
    /// more (16.5 s against a server that accepts and never answers, measured 2026-11-29),
    /// before [`Error::Redis`]. Tested in `tests/suite/connect.rs`.
    ///
    /// Once connected, the request that finds the connection broken fails (as with any
    /// connection manager), and the next ones wait while it is tried again 3 times (100, 200
    /// and 400 ms apart, up to twice that with jitter): a server back within that serves
    /// them; a call of a client whose server went away fails within about a second instead
    /// of waiting out the first connection's retries (9.5 s for every `ttl()` and
    /// `release()` before; the keys expire with their TTL):
    /// `faults::calls_against_a_server_gone_end_within_a_second`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_client(redis_client(url)?, Dial::default()).await
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
        Self::connect_client(tls.redis_client(url)?, Dial::default()).await
    }

    pub(crate) async fn connect_client(client: redis::Client, dial: Dial) -> Result<Self> {
        let conn = manager(&client, dial).await?;
        let connected = Self::new(conn)
            .with_release_events(client)?
            .connection_answers_within(dial.answer_bound())?;
        connected.ask_scripts().await;
        Ok(connected)
    }

    /// Connects to the Redlock masters at `urls`, each as [`Client::connect`] connects to
    /// one, and makes a [`Client::quorum`] of them: a minority of masters down or paused when
    /// a service starts costs it nothing.
    ///
    /// Every master is tried at once. Once a majority is connected, the others get 50 ms
    /// more to follow; a master down, paused or slow by then is connected when an
    /// operation next needs it (within the operation's per-node limit, as a master that went
    /// down later is), and joins the locks once it answers. Masters found down or not
    /// answering yet are logged (`tracing`, warn). What such a master says when it does
    /// answer (a refused login, say) is that master failing its part of an operation, as
    /// any master's failure is: the quorum goes on without it.
    ///
    /// See the guide: [Redlock](crate::guide::redlock).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockset::Error> {
    /// use lockset::{Client, QuorumConfig};
    ///
    /// let masters = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
    /// let redlock = Client::connect_quorum(masters, QuorumConfig::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Before anything is sent, the errors of [`Client::quorum`] for `config`, and
    /// [`Error::Redis`] for a URL that does not parse. Then [`Error::Redis`]: when a master
    /// refuses the login (`NOAUTH` too: it would fail its part of every operation), the
    /// database the URL selects or the certificate (settings to fix, as for
    /// [`Client::connect`]; logged with the master's address), as far as it says so before a
    /// majority connected and the grace passed; when so many masters are down that no
    /// majority can connect ([`Error::is_unavailable`], naming them: at once when they
    /// refuse connections or time out, a `rediss://` master that gives no TLS handshake
    /// in time counted as down, after the first connection's retries when they reset it).
    /// Tested in `tests/suite/connect.rs`.
    pub async fn connect_quorum<U: AsRef<str>>(
        urls: impl IntoIterator<Item = U>,
        config: QuorumConfig,
    ) -> Result<Self> {
        let clients = urls
            .into_iter()
            .map(|url| redis_client(url.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Self::connect_quorum_with(clients, Dial::default(), config).await
    }

    /// [`Client::connect_quorum`] for `clients`, connecting as `dial` says.
    pub(crate) async fn connect_quorum_with(
        clients: Vec<redis::Client>,
        dial: Dial,
        config: QuorumConfig,
    ) -> Result<Self> {
        config.check()?;
        let conns = connect_majority(&clients, dial).await?;
        let mut masters = Vec::with_capacity(clients.len());
        for (conn, client) in conns.into_iter().zip(clients) {
            let master = match conn {
                Some(conn) => {
                    let master = Self::new(conn).with_release_events(client)?;
                    master.ask_scripts().await;
                    master
                }
                // The first operation that needs it connects it, and asks about scripts.
                None => {
                    let conn = ConnectionManager::new_lazy_with_config(
                        client.clone(),
                        dial.manager_config(),
                    )?;
                    Self::new(conn).with_release_events(client)?
                }
            };
            masters.push(master);
        }
        Self::quorum(masters, config)
    }
}

/// How long the masters of a quorum not connected yet may still take once a majority is:
/// enough for one that refuses connections to say so (and be logged), short enough that a
/// paused one costs a starting service nothing it would notice.
const QUORUM_GRACE: Duration = Duration::from_millis(50);

/// The `tracing` target of what connecting to a Redlock quorum found (masters down, not
/// answering, refusing the settings): one a subscriber can show alone, as the command line
/// does.
const CONNECT_LOG: &str = "lockset::connect";

/// A redis-rs client for `url`: over TLS with the system's roots for `rediss://` (feature
/// `tls`).
fn redis_client(url: &str) -> Result<redis::Client> {
    #[cfg(feature = "tls")]
    return Ok(crate::topology::tls::Tls::new().redis_client(url)?);
    #[cfg(not(feature = "tls"))]
    Ok(redis::Client::open(url)?)
}

/// A connection to each of `clients` that connected before a majority did and
/// [`QUORUM_GRACE`] passed, `None` for the others (down, paused, slow).
async fn connect_majority(
    clients: &[redis::Client],
    dial: Dial,
) -> Result<Vec<Option<ConnectionManager>>> {
    let needed = QuorumConfig::majority(clients.len());
    let mut connecting: FuturesUnordered<_> = clients
        .iter()
        .enumerate()
        .map(|(index, client)| async move {
            let conn = match manager(client, dial).await {
                Ok(conn) => without_login_missing(conn).await,
                Err(err) => Err(err),
            };
            (index, conn)
        })
        .collect();
    let mut conns: Vec<Option<ConnectionManager>> = vec![None; clients.len()];
    let address = |index: usize| clients[index].get_connection_info().addr().to_string();
    // The masters found down (by index), and what each said.
    let mut down: Vec<(usize, String)> = Vec::new();
    let (mut up, mut grace) = (0, None);
    loop {
        let next = match grace {
            None => connecting.next().await,
            Some(until) => match tokio::time::timeout_at(until, connecting.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        let Some((index, connected)) = next else {
            break;
        };
        match connected {
            Ok(conn) => {
                conns[index] = Some(conn);
                up += 1;
            }
            Err(err) if is_down(&clients[index], &err) => {
                let address = address(index);
                tracing::warn!(target: CONNECT_LOG, %address, %err, "a Redlock master is unreachable; it joins once it answers");
                down.push((index, format!("{address}: {err}")));
            }
            Err(err) => {
                let address = address(index);
                tracing::warn!(target: CONNECT_LOG, %address, %err, "a Redlock master refuses this client's settings");
                return Err(err.into());
            }
        }
        if clients.len() - down.len() < needed {
            let said: Vec<&str> = down.iter().map(|(_, said)| said.as_str()).collect();
            return Err(no_majority(needed, clients.len(), &said).into());
        }
        if up >= needed && grace.is_none() {
            grace = Some(Instant::now() + QUORUM_GRACE);
        }
    }
    for (index, conn) in conns.iter().enumerate() {
        if conn.is_none() && !down.iter().any(|(down, _)| *down == index) {
            let address = address(index);
            tracing::warn!(target: CONNECT_LOG, %address, "a Redlock master has not answered yet; it joins once it answers");
        }
    }
    Ok(conns)
}

/// Whether a master's failure to connect is its being down (refusing connections, not
/// answering, cut off), rather than a setting to fix (see [`first_failure_is_final`]). A
/// timeout is down: a host powered off or cut off answers nothing, also on a `rediss://`
/// port (where one server alone is asked whether it is a TLS port).
fn is_down(client: &redis::Client, err: &redis::RedisError) -> bool {
    err.is_connection_refusal()
        || err.is_timeout()
        || first_failure_is_final(client, err.clone()).is_none()
}

/// The error of a quorum that cannot connect to a majority of its masters.
fn no_majority(needed: usize, masters: usize, down: &[&str]) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!(
            "cannot reach a majority of the Redlock masters ({needed} of {masters} needed): {}",
            down.join("; ")
        ),
    ))
}

/// How a client connects: redis-rs's defaults, or a [`Config`](crate::Config)'s timeouts and
/// retries.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Dial {
    /// How long one connection attempt may take (redis-rs's default: 1 s).
    pub(crate) connect_timeout: Option<Duration>,
    /// How long a reply may take (redis-rs's default: 500 ms).
    pub(crate) response_timeout: Option<Duration>,
    /// How often the first connection is tried again (redis-rs's default: 6).
    pub(crate) retries: Option<usize>,
}

impl Dial {
    fn manager_config(self) -> redis::aio::ConnectionManagerConfig {
        let mut config = redis::aio::ConnectionManagerConfig::new();
        if let Some(timeout) = self.connect_timeout {
            config = config.set_connection_timeout(Some(timeout));
        }
        if let Some(timeout) = self.response_timeout {
            config = config.set_response_timeout(Some(timeout));
        }
        // The first connection is tried `retries` times by `reach`, before the manager
        // exists; the manager's own retries are for connections lost later (and for a
        // Redlock master not connected yet), never more than the first one's.
        let retries = self.retries.unwrap_or(RECONNECT_RETRIES);
        config.set_number_of_retries(retries.min(RECONNECT_RETRIES))
    }

    /// The longest one request of a manager made by [`Dial::manager_config`] takes,
    /// answered or failed: its response timeout, after a wait for the reconnection (each
    /// of its tries within the connection and response timeouts, the pauses between them
    /// at most 200, 400 and 800 ms with redis-rs's jitter).
    pub(crate) fn answer_bound(self) -> Duration {
        let response = self.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT);
        let connect = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let retries = self
            .retries
            .unwrap_or(RECONNECT_RETRIES)
            .min(RECONNECT_RETRIES);
        let tries = u32::try_from(retries + 1).unwrap_or(u32::MAX);
        let pauses = RECONNECT_PAUSES.iter().take(retries).sum::<Duration>();
        response + (connect + response) * tries + pauses
    }

    fn plain_config(self) -> redis::AsyncConnectionConfig {
        let config = redis::AsyncConnectionConfig::new();
        match self.connect_timeout {
            Some(timeout) => config.set_connection_timeout(Some(timeout)),
            None => config,
        }
    }
}

/// A connection manager for `client`, once its server takes a connection (see [`reach`]).
/// The manager tries a lost connection again only [`RECONNECT_RETRIES`] times before a
/// request fails: with redis-rs's default (6 times, 9.5 s), every call of a client whose
/// server went away waited that long.
pub(super) async fn manager(
    client: &redis::Client,
    dial: Dial,
) -> redis::RedisResult<ConnectionManager> {
    reach(client, dial).await?;
    ConnectionManager::new_with_config(client.clone(), dial.manager_config()).await
}

/// How often a connection manager tries a lost connection again before a request fails
/// (100, 200 and 400 ms apart, each up to twice that with redis-rs's jitter), unless the
/// first connection's retries are set lower (a command line's one: then as often as
/// that). The request that finds the connection broken fails, as with any connection
/// manager; the next ones wait for the reconnection: a server restarting within about
/// 0.7 s serves them, one that went away fails each within 0.7–1.4 s when its port
/// refuses connections (each attempt within the connection timeout otherwise).
const RECONNECT_RETRIES: usize = 3;

/// The longest pauses between a manager's reconnection tries: redis-rs's backoff (100,
/// 200, 400 ms) doubled by its jitter.
const RECONNECT_PAUSES: [Duration; RECONNECT_RETRIES] = [
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// redis-rs's response timeout, unless a [`Config`](crate::Config) sets one.
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// redis-rs's connection timeout, unless a [`Config`](crate::Config) sets one.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a first connection is tried again by default (redis-rs's manager's default).
const FIRST_RETRIES: usize = 6;

/// The first pause between two tries of a connection, doubling after each (redis-rs's).
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// Waits until `client`'s server takes a connection, trying again as `dial` says (by
/// default [`FIRST_RETRIES`] times, 9 s or more), except after a failure no retry is likely
/// to change (see [`first_failure_is_final`]), which ends the wait at once.
async fn reach(client: &redis::Client, dial: Dial) -> redis::RedisResult<()> {
    use backon::Retryable as _;
    let attempt = || async {
        client
            .get_multiplexed_async_connection_with_config(&dial.plain_config())
            .await
            .map(drop)
    };
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(FIRST_PAUSE)
        .with_factor(2.0)
        .with_max_times(dial.retries.unwrap_or(FIRST_RETRIES))
        .with_jitter();
    attempt
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|err| first_failure_is_final(client, err.clone()).is_none())
        .await
        .map_err(|err| first_failure_is_final(client, err.clone()).unwrap_or(err))
}

/// `conn`, unless its server wants a password none was given: such a server accepts the
/// connection and refuses every command after it (`NOAUTH`), which would make a Redlock
/// master silently fail its part of every operation while the others lock. Asked once, so
/// that it fails the quorum's connect as a wrong password does. (A single server's client
/// is told at its first operation. `PING` only for that answer: a user refused `PING`
/// itself may still lock.)
async fn without_login_missing(
    mut conn: ConnectionManager,
) -> redis::RedisResult<ConnectionManager> {
    match redis::cmd("PING").query_async::<()>(&mut conn).await {
        Err(err) if err.code() == Some("NOAUTH") => Err(err),
        _ => Ok(conn),
    }
}

/// The first attempt's failure, when waiting out the manager's retries would only delay the
/// caller: nobody listens on the port (refused: [`Error::is_unavailable`] stays true), the
/// server refuses the login, the certificate or the database the URL selects (settings to
/// fix), or a `rediss://` handshake got no answer within the connection timeout, as from a
/// plain-text port (a timeout still, with the question in its text). Anything else (a reset,
/// a full server, a name that does not resolve, a timeout on a plain-text port) is left to
/// the manager's retries.
fn first_failure_is_final(
    client: &redis::Client,
    err: redis::RedisError,
) -> Option<redis::RedisError> {
    let tls = matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    if err.is_connection_refusal()
        || classify::is_access_refusal(&err)
        || classify::is_no_such_database(&err)
    {
        return Some(err);
    }
    if tls && err.is_timeout() {
        return Some(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no TLS handshake with {} within the connection timeout ({err}): is this a TLS \
                 port? (a plain-text port takes a redis:// URL)",
                client.get_connection_info().addr()
            ),
        )));
    }
    None
}

impl Client {
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
        let store = Store::following(Link::Sentinel(conn.clone()), Arc::new(conn.clone()));
        let backend = Backend::Single(Arc::new(store));
        let client = Self::with_backend(backend, false, Tasks::default());
        let _ = client.inner.address.set(conn.name());
        let _ = client.inner.events.set(Box::new([Events::sentinel(conn)]));
        client.ask_scripts().await;
        client.replicated(replication).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_managers_answer_bound_covers_its_reconnection_and_its_reply() {
        // redis-rs's timeouts: the reply (0.5 s) after four tries (1 s + 0.5 s each) and the
        // three pauses between them (0.2 + 0.4 + 0.8 s).
        assert_eq!(Dial::default().answer_bound(), Duration::from_millis(7_900));
        // A command line's one retry: two tries and one pause.
        let dial = Dial {
            connect_timeout: Some(Duration::from_millis(200)),
            response_timeout: Some(Duration::from_millis(100)),
            retries: Some(1),
        };
        assert_eq!(
            dial.answer_bound(),
            Duration::from_millis(100 + 2 * 300 + 200)
        );
    }
}
