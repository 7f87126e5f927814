//! A client's settings as data: where the locks live, TLS, logins, timeouts, replication and
//! the locks' default options, read from a configuration file (serde: TOML, JSON, YAML ...)
//! or written in code, in the style of deadpool-redis's `Config`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::handle::{Client, Dial};
use crate::client::options::Options;
use crate::error::Result;
use crate::model::invalid::InvalidInput;
use crate::model::retry::Retry;
use crate::model::retry_flat;
use crate::server::replication::Replication;
use crate::topology::quorum::QuorumConfig;
use crate::topology::sentinel::SentinelConfig;

/// Everything needed to make a [`Client`], as one value that (de)serializes with serde.
///
/// Exactly one of `url` (one server), `redlock` (a quorum of independent masters),
/// `cluster` (seed nodes of a Redis Cluster, feature `cluster`) or `sentinel` says where the
/// locks live. Every other field is optional; durations are written in
/// [humantime](https://docs.rs/humantime) form (`"250ms"`, `"2s"`). Unknown fields are
/// refused, so that a misspelt setting is not silently ignored. Round trips through TOML and
/// JSON are tested field by field (`tests/suite/config.rs`).
///
/// ```toml
/// url = "redis://redis.internal:6379/"
/// connect_timeout = "1s"
/// response_timeout = "500ms"
/// replicas = 1
///
/// [lock]
/// ttl = "30s"
/// timeout = "5s"
/// metadata = "billing-worker"
/// retry = { backoff = "exponential", min = "10ms", max = "1s", jitter = "full", retries = 5 }
/// ```
///
/// ```no_run
/// # async fn demo(text: &str) -> Result<(), Box<dyn std::error::Error>> {
/// # let parse = |_: &str| -> Result<lockset::Config, Box<dyn std::error::Error>> { Ok(lockset::Config::default()) };
/// let config: lockset::Config = parse(text)?; // toml::from_str(text)?, say
/// let client = config.connect().await?;
/// let lock = client.obtain("nightly-report", config.lock.ttl, &config.options()).await?;
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// Or in code, with struct update syntax:
///
/// ```
/// use std::time::Duration;
/// let config = lockset::Config {
///     connect_timeout: Some(Duration::from_millis(500)),
///     ..lockset::Config::url("redis://127.0.0.1/")
/// };
/// ```
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// One server: its URL (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`, or `rediss://`
    /// with the `tls` feature).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A Redlock quorum: each master's URL (see [`Client::quorum`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redlock: Vec<String>,
    /// A Redis Cluster: seed nodes' URLs (feature `cluster`; see `Client::connect_cluster`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster: Vec<String>,
    /// How long one connection attempt may take (default 1 s, redis-rs's).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// How long a reply may take before the command fails (default 500 ms, redis-rs's; a
    /// reply that does not come in time leaves an obtain's outcome unknown,
    /// [`Error::UnknownOutcome`](crate::Error::UnknownOutcome), and is retried within its
    /// deadline).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub response_timeout: Option<Duration>,
    /// With `url` or `redlock`: how often a first connection that failed in a way worth
    /// retrying is tried again (default 6, redis-rs's; a refused port or login fails at once
    /// whatever this says). A cluster's and the sentinels' connections retry by their own
    /// rules, so it is refused with `cluster` and `sentinel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_retries: Option<usize>,
    /// Release events wake waiters at once (default true; see
    /// [`Client::with_release_events`] and [`Client::without_release_events`]).
    pub release_events: bool,
    /// Every lock write waits until this many replicas acknowledged it (see
    /// [`Client::replicated`]); behind Sentinel the default is every replica in sync
    /// ([`Replication::all`]), elsewhere none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// How long a write waits for the replicas (default 250 ms,
    /// [`Replication::DEFAULT_TIMEOUT`]; see [`Replication::timeout`]). Needs `replicas`,
    /// or `sentinel`, where it times the default (every replica in sync).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub replication_timeout: Option<Duration>,
    /// With `redlock` only: a master's time limit per operation (see
    /// [`QuorumConfig::node_timeout`]).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub node_timeout: Option<Duration>,
    /// With `redlock` only: the quorum's clock drift factor, in [0, 1) (see
    /// [`QuorumConfig::drift_factor`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_factor: Option<f64>,
    /// A Sentinel deployment: the sentinels and the primary's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelSettings>,
    /// Certificate files for `rediss://` URLs (feature `tls`; without, the system's roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// The locks' default options: [`Config::options`] makes them.
    pub lock: LockSettings,
}

/// Where a Sentinel deployment's sentinels are, and the primary they watch.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentinelSettings {
    /// The sentinels' URLs.
    pub urls: Vec<String>,
    /// The name the sentinels know the primary by.
    pub master: String,
    /// The data nodes' ACL user, when not the default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The data nodes' password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The data nodes' database (default 0).
    pub db: i64,
}

/// Certificate files for TLS (feature `tls`; see `Tls`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    /// A PEM file of the certificate authorities to trust instead of the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A PEM file of this client's certificate (with `key_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// A PEM file of this client's private key (with `cert_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// The default options of the locks a configured service takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockSettings {
    /// The time to live to obtain locks with (default 10 s); the obtain calls take it as
    /// an argument: `client.obtain(key, config.lock.ttl, &config.options())`.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// The retry strategy, in the flat form: `{ backoff = "none" | "linear" |
    /// "exponential" | "intervals", interval, min, max, intervals, jitter = "full" | "equal"
    /// | "plus_minus_half", retries }` (default: no retry). See [`Options::retry`]. A
    /// strategy made in code with its jitter outside its limit
    /// (`.limit(3).jitter(Jitter::Full)`) behaves as, and is written as, the limit outside
    /// the jitter; a custom strategy has no flat form (serializing it fails).
    #[serde(with = "retry_flat")]
    pub retry: Retry,
    /// How long an obtain may wait at most (default: the lock's TTL). See
    /// [`Options::timeout`].
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// Waiters queue first come first served (default true). See [`Options::fair`].
    pub fair: bool,
    /// Metadata stored with each lock, for humans and tools. See [`Options::metadata`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// How long a fair waiter's place lasts without renewal. See [`Options::waiter_lease`].
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub waiter_lease: Option<Duration>,
    /// How often a watchdog refreshes. See [`Options::watchdog_interval`].
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub watchdog_interval: Option<Duration>,
}

/// Every field, with the passwords in URLs and the Sentinel login shown as `<redacted>`.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls = |urls: &[String]| urls.iter().map(|url| redact_url(url)).collect::<Vec<_>>();
        f.debug_struct("Config")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("redlock", &urls(&self.redlock))
            .field("cluster", &urls(&self.cluster))
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("connect_retries", &self.connect_retries)
            .field("release_events", &self.release_events)
            .field("replicas", &self.replicas)
            .field("replication_timeout", &self.replication_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("sentinel", &self.sentinel)
            .field("tls", &self.tls)
            .field("lock", &self.lock)
            .finish()
    }
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| redact_url(url)).collect();
        f.debug_struct("SentinelSettings")
            .field("urls", &urls)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

/// `url` with the password of its login, if any, as `<redacted>`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((login, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match login.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:<redacted>@{host}"),
        None => url.to_owned(),
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            url: None,
            redlock: Vec::new(),
            cluster: Vec::new(),
            connect_timeout: None,
            response_timeout: None,
            connect_retries: None,
            release_events: true,
            replicas: None,
            replication_timeout: None,
            node_timeout: None,
            drift_factor: None,
            sentinel: None,
            tls: None,
            lock: LockSettings::default(),
        }
    }
}

impl Default for LockSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            retry: Retry::NoRetry,
            timeout: None,
            fair: true,
            metadata: None,
            waiter_lease: None,
            watchdog_interval: None,
        }
    }
}

impl LockSettings {
    /// These settings as the options of an obtain.
    pub fn options(&self) -> Options {
        let mut options = Options::default().retry(self.retry.clone()).fair(self.fair);
        if let Some(timeout) = self.timeout {
            options = options.timeout(timeout);
        }
        if let Some(metadata) = &self.metadata {
            options = options.metadata(metadata.clone());
        }
        if let Some(lease) = self.waiter_lease {
            options = options.waiter_lease(lease);
        }
        if let Some(interval) = self.watchdog_interval {
            options = options.watchdog_interval(interval);
        }
        options
    }
}

impl Config {
    /// One server at `url`, every other setting at its default.
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::default()
        }
    }

    /// The locks' default options ([`LockSettings::options`]).
    pub fn options(&self) -> Options {
        self.lock.options()
    }

    /// Connects as configured: a client for the one topology the configuration names.
    ///
    /// Everything that can be checked without a server is checked first, and nothing is
    /// sent when it fails: one topology named; the settings given are ones it uses
    /// (`node_timeout` and `drift_factor` only with `redlock`, `connect_retries` only with
    /// `url` or `redlock`, `replication_timeout` only with `replicas` or `sentinel`); no
    /// zero connect or response timeout (every request would fail at random); the
    /// TLS files read and the crate's features present; the replication and quorum
    /// settings' own rules.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Config`] for a topology named twice or not at all, a setting its
    /// topology does not use, a zero timeout, or one that needs a feature the crate was
    /// built without;
    /// [`InvalidInput::Tls`](InvalidInput) for a TLS file that cannot be read;
    /// [`InvalidInput::ZeroReplicationTimeout`], [`InvalidInput::DriftFactor`],
    /// [`InvalidInput::ZeroNodeTimeout`]: all before anything is sent. Then the errors of
    /// the constructor used ([`Client::connect`], [`Client::connect_sentinel`],
    /// [`Client::quorum`], `Client::connect_cluster`) and of [`Client::replicated`].
    pub async fn connect(&self) -> Result<Client> {
        let plan = self.check()?;
        let dial = Dial {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            retries: self.connect_retries,
        };
        let client = match plan.topology {
            Topology::Single(url) => {
                let client = Client::connect_client(self.redis_client(url, &plan)?, dial).await?;
                replicated(client, plan.replication).await?
            }
            Topology::Redlock(urls) => {
                replicated(self.redlock(urls, dial, &plan).await?, plan.replication).await?
            }
            Topology::Cluster(urls) => {
                replicated(self.cluster(urls, &plan).await?, plan.replication).await?
            }
            // Its replication is part of the Sentinel configuration, applied on connecting.
            Topology::Sentinel(settings) => self.sentinel(settings, plan).await?,
        };
        Ok(match self.release_events {
            true => client,
            false => client.without_release_events(),
        })
    }

    /// Everything that can be checked before anything is sent (see [`Config::connect`]).
    fn check(&self) -> Result<Plan<'_>> {
        let topology = self.topology()?;
        let redlock = matches!(topology, Topology::Redlock(_));
        let sentinel = matches!(topology, Topology::Sentinel(_));
        let misplaced = [
            (
                "node_timeout",
                self.node_timeout.is_some() && !redlock,
                "a Redlock setting (with `redlock`)",
            ),
            (
                "drift_factor",
                self.drift_factor.is_some() && !redlock,
                "a Redlock setting (with `redlock`)",
            ),
            (
                "connect_retries",
                self.connect_retries.is_some()
                    && matches!(topology, Topology::Cluster(_) | Topology::Sentinel(_)),
                "for `url` and `redlock` (a cluster's and the sentinels' connections retry by their own rules)",
            ),
        ];
        if let Some((name, _, why)) = misplaced.iter().find(|(_, wrong, _)| *wrong) {
            return Err(config_error(format!("`{name}` is {why}")).into());
        }
        // A zero timeout fails every request at random (redis-rs's timer races the reply).
        let zero = [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, t)| *t == Some(Duration::ZERO)) {
            return Err(config_error(format!("`{name}` must not be zero")).into());
        }
        if redlock {
            self.quorum().check()?;
        }
        #[cfg(not(feature = "tls"))]
        self.tls_settings()?;
        Ok(Plan {
            replication: self.replication(sentinel)?,
            #[cfg(feature = "tls")]
            tls: self.tls_settings()?,
            topology,
        })
    }

    /// The one topology named, or why there is not one.
    fn topology(&self) -> Result<Topology<'_>, InvalidInput> {
        let mut named = Vec::new();
        if let Some(url) = &self.url {
            named.push(("url", Topology::Single(url)));
        }
        if !self.redlock.is_empty() {
            named.push(("redlock", Topology::Redlock(&self.redlock)));
        }
        if !self.cluster.is_empty() {
            named.push(("cluster", Topology::Cluster(&self.cluster)));
        }
        if let Some(sentinel) = &self.sentinel {
            named.push(("sentinel", Topology::Sentinel(sentinel)));
        }
        if named.len() > 1 {
            let names: Vec<&str> = named.iter().map(|(name, _)| *name).collect();
            return Err(config_error(format!(
                "name one of url, redlock, cluster or sentinel, not {}",
                names.join(" and ")
            )));
        }
        named.pop().map(|(_, topology)| topology).ok_or_else(|| {
            config_error("name where the locks live: url, redlock, cluster or sentinel".into())
        })
    }

    /// How lock writes wait for replicas: as `replicas` says, timed by
    /// `replication_timeout`; behind Sentinel by default every replica in sync (which
    /// `replication_timeout` alone times).
    fn replication(&self, sentinel: bool) -> Result<Option<Replication>, InvalidInput> {
        let replication = match (self.replicas, sentinel) {
            (Some(replicas), _) => Replication::replicas(replicas),
            (None, true) => Replication::all(),
            (None, false) if self.replication_timeout.is_some() => {
                return Err(config_error(
                    "`replication_timeout` needs `replicas` (or `sentinel`, where it times the default: every replica)".into(),
                ));
            }
            (None, false) => return Ok(None),
        };
        let replication = match self.replication_timeout {
            Some(timeout) => replication.timeout(timeout),
            None => replication,
        };
        replication.check()?;
        Ok(Some(replication))
    }

    fn quorum(&self) -> QuorumConfig {
        let mut quorum = QuorumConfig::default();
        if let Some(timeout) = self.node_timeout {
            quorum = quorum.node_timeout(timeout);
        }
        if let Some(factor) = self.drift_factor {
            quorum = quorum.drift_factor(factor);
        }
        quorum
    }

    /// A redis-rs client for `url`, over TLS with the configured files for `rediss://`.
    fn redis_client(&self, url: &str, plan: &Plan<'_>) -> Result<redis::Client> {
        #[cfg(feature = "tls")]
        return Ok(plan.tls.clone().unwrap_or_default().redis_client(url)?);
        #[cfg(not(feature = "tls"))]
        {
            let _ = plan;
            Ok(redis::Client::open(url)?)
        }
    }

    async fn redlock(&self, urls: &[String], dial: Dial, plan: &Plan<'_>) -> Result<Client> {
        let clients = urls
            .iter()
            .map(|url| self.redis_client(url, plan))
            .collect::<Result<Vec<_>>>()?;
        Client::connect_quorum_with(clients, dial, self.quorum()).await
    }

    #[cfg(feature = "cluster")]
    async fn cluster(&self, urls: &[String], plan: &Plan<'_>) -> Result<Client> {
        use redis::IntoConnectionInfo as _;
        let nodes = urls
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut builder = redis::cluster::ClusterClient::builder(nodes.clone());
        if let Some(timeout) = self.connect_timeout {
            builder = builder.connection_timeout(timeout);
        }
        if let Some(timeout) = self.response_timeout {
            builder = builder.response_timeout(timeout);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &plan.tls {
            builder = builder.certs(tls.certificates());
        }
        #[cfg(not(feature = "tls"))]
        let _ = plan;
        Client::connect_cluster_with(builder, nodes).await
    }

    #[cfg(not(feature = "cluster"))]
    async fn cluster(&self, _urls: &[String], _plan: &Plan<'_>) -> Result<Client> {
        Err(config_error("`cluster` needs the crate's `cluster` feature".into()).into())
    }

    async fn sentinel(&self, settings: &SentinelSettings, plan: Plan<'_>) -> Result<Client> {
        let urls = settings.urls.iter().map(String::as_str);
        let mut config = SentinelConfig::new(urls, &settings.master)?.db(settings.db);
        if let Some(user) = &settings.username {
            config = config.username(user);
        }
        if let Some(password) = &settings.password {
            config = config.password(password);
        }
        if let Some(timeout) = self.connect_timeout {
            config = config.connection_timeout(timeout);
        }
        if let Some(timeout) = self.response_timeout {
            config = config.response_timeout(timeout);
        }
        if let Some(replication) = plan.replication {
            config = config.replication(replication);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = plan.tls {
            config = config.tls(tls);
        }
        Client::connect_sentinel(config).await
    }

    /// The TLS settings the files make, read now.
    #[cfg(feature = "tls")]
    fn tls_settings(&self) -> Result<Option<crate::topology::tls::Tls>> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let mut tls = crate::topology::tls::Tls::new();
        if let Some(ca) = &files.ca_file {
            tls = tls.ca_file(ca)?;
        }
        match (&files.cert_file, &files.key_file) {
            (Some(cert), Some(key)) => tls = tls.client_cert_files(cert, key)?,
            (None, None) => {}
            _ => {
                return Err(config_error("tls: cert_file and key_file go together".into()).into());
            }
        }
        Ok(Some(tls))
    }

    #[cfg(not(feature = "tls"))]
    fn tls_settings(&self) -> Result<()> {
        match self.tls {
            Some(_) => Err(config_error("`tls` needs the crate's `tls` feature".into()).into()),
            None => Ok(()),
        }
    }
}

/// What [`Config::check`] found: the topology, and the settings read for it.
struct Plan<'a> {
    topology: Topology<'a>,
    replication: Option<Replication>,
    #[cfg(feature = "tls")]
    tls: Option<crate::topology::tls::Tls>,
}

/// Where the locks live, as a configuration names it.
enum Topology<'a> {
    Single(&'a str),
    Redlock(&'a [String]),
    Cluster(&'a [String]),
    Sentinel(&'a SentinelSettings),
}

/// `client` with its lock writes waiting for `replication`, when given.
async fn replicated(client: Client, replication: Option<Replication>) -> Result<Client> {
    match replication {
        Some(replication) => client.replicated(replication).await,
        None => Ok(client),
    }
}

fn config_error(reason: String) -> InvalidInput {
    InvalidInput::Config { reason }
}
