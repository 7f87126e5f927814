//! Connecting to where the locks live: one server, a Redlock quorum, or a cluster.

use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use lockset::redis::cluster::ClusterClient;
use lockset::redis::cluster_async::ClusterConnection;
use lockset::redis::{self, IntoConnectionInfo as _, RedisError};
use lockset::{Client, Config, Replication, SentinelConfig, SentinelConnection, Tls, TlsFiles};

use crate::exit::{self, Failure, UNAVAILABLE};

/// The URL used when neither `--redis` nor the environment names one.
const DEFAULT_URL: &str = "redis://127.0.0.1/";

/// How often a connection is retried before `lockset` gives up with "unreachable". The
/// library's default (6 attempts, 9 s or more) is meant for long-running services; a command line
/// should answer quickly, and a reconnect is tried again on the next command anyway.
const CONNECT_RETRIES: usize = 1;

/// A lock client, and the raw connections to look at keys with: one per Redlock master,
/// else one.
pub(crate) struct Redis<C> {
    /// The library's client (one type whatever the topology).
    pub(crate) client: Client,
    /// Raw connections for reading holders on each server (see `holder`).
    pub(crate) nodes: Vec<C>,
}

/// The connected backend; each kind of server needs a raw connection type of its own.
pub(crate) enum Target {
    /// One server, or a Redlock quorum of several.
    Single(Redis<ConnectionManager>),
    /// A Redis Cluster.
    Cluster(Redis<ClusterConnection>),
    /// The primary of a Sentinel deployment, followed across failovers.
    Sentinel(Redis<SentinelConnection>),
}

/// The URLs to use: `--redis` (or `LOCKSET_REDIS`, which clap reads, ignoring it when
/// empty), else `REDIS_URL`, else the local default. An empty `--redis` is a mistake (an
/// unset variable, most likely), not a wish for the default: with it, every host would lock
/// on a Redis of its own.
pub(crate) fn urls(given: &[String]) -> Result<Vec<String>, String> {
    let given: Vec<String> = given.iter().map(|url| url.trim().to_owned()).collect();
    if given.iter().any(String::is_empty) {
        return Err(
            "a --redis URL is empty (an unset variable?); leave --redis out to use \
             $REDIS_URL or the local default"
                .to_owned(),
        );
    }
    if !given.is_empty() {
        return Ok(given);
    }
    Ok(match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => vec![url.trim().to_owned()],
        _ => vec![DEFAULT_URL.to_owned()],
    })
}

/// Parsed URLs, checked before anything is sent, and how many replicas must acknowledge
/// each lock write.
#[derive(Clone)]
pub(crate) struct Plan {
    place: Place,
    replicas: Option<u32>,
}

/// Where the locks live.
#[derive(Clone)]
enum Place {
    /// One server (boxed: the client is large).
    Server(Box<redis::Client>),
    /// A Redlock quorum: the masters, and the library's configuration of them.
    Quorum(Vec<redis::Client>, Box<Config>),
    /// Seed nodes of a cluster (boxed: the client is large).
    Cluster(Box<ClusterClient>),
    /// Sentinels and the name of the primary they watch.
    Sentinel(Box<SentinelConfig>),
}

/// The TLS settings of `--tls-ca-cert`, `--tls-cert` and `--tls-key` (files read and
/// checked now: a bad one is bad usage), and the files as a configuration names them, or
/// `None` when none is given. `tls_urls`: whether any URL given is `rediss://`; without,
/// the options would be silently ignored.
pub(crate) fn tls(
    ca: Option<&std::path::Path>,
    cert: Option<(&std::path::Path, &std::path::Path)>,
    tls_urls: bool,
) -> Result<Option<(Tls, TlsFiles)>, Failure> {
    if ca.is_none() && cert.is_none() {
        return Ok(None);
    }
    if !tls_urls {
        return Err(Failure::Usage(
            "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs, and none is given"
                .to_owned(),
        ));
    }
    let usage = |err: lockset::Error| Failure::from_error(&err);
    let mut tls = Tls::new();
    if let Some(ca) = ca {
        tls = tls.ca_file(ca).map_err(usage)?;
    }
    if let Some((cert, key)) = cert {
        tls = tls.client_cert_files(cert, key).map_err(usage)?;
    }
    let files = TlsFiles {
        ca_file: ca.map(std::path::Path::to_path_buf),
        cert_file: cert.map(|(cert, _)| cert.to_path_buf()),
        key_file: cert.map(|(_, key)| key.to_path_buf()),
    };
    Ok(Some((tls, files)))
}

/// Whether `url` asks for TLS.
pub(crate) fn is_tls_url(url: &str) -> bool {
    let url = url.trim_start().to_ascii_lowercase();
    url.starts_with("rediss://") || url.starts_with("valkeys://")
}

/// Where `--sentinel` and `--master` say the primary is: `master` is a name, or
/// `redis://[[USER]:PASSWORD@]NAME[/DB]` with the data nodes' login and database. The data
/// nodes are reached over TLS when `master` is `rediss://...`, when the sentinels are, or
/// when `tls` is given.
pub(crate) fn sentinel_plan(
    sentinels: &[String],
    master: Option<&str>,
    replicas: Option<u32>,
    restart_grace: Option<std::time::Duration>,
    tls: Option<Tls>,
) -> Result<Plan, Failure> {
    let master = master
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            Failure::Usage(
                "--sentinel needs --master NAME: the name the sentinels know the primary by"
                    .to_owned(),
            )
        })?;
    if sentinels.iter().any(|url| url.trim().is_empty()) {
        return Err(Failure::Usage(
            "a --sentinel URL is empty (an unset variable?)".to_owned(),
        ));
    }
    let bad =
        |what: &str, err: &dyn std::fmt::Display| Failure::Usage(format!("invalid {what}: {err}"));
    let (name, login) = if master.contains("://") {
        let info = master
            .into_connection_info()
            .map_err(|err| bad("--master URL", &err))?;
        let name = match info.addr() {
            redis::ConnectionAddr::Tcp(host, _) | redis::ConnectionAddr::TcpTls { host, .. } => {
                host.clone()
            }
            _ => return Err(bad("--master URL", &"it names no master")),
        };
        (name, Some(info.redis_settings().clone()))
    } else {
        (master.to_owned(), None)
    };
    let urls: Vec<&str> = sentinels.iter().map(|url| url.trim()).collect();
    let tls_nodes = is_tls_url(master) || urls.iter().any(|url| is_tls_url(url));
    let mut config = SentinelConfig::new(urls, name)
        .map_err(|err| bad("--sentinel URL", &err))?
        .replication(replicas.map_or_else(Replication::all, Replication::replicas));
    if let Some(grace) = restart_grace {
        config = config.restart_grace(grace);
    }
    if let Some(tls) = tls.or_else(|| tls_nodes.then(Tls::new)) {
        config = config.tls(tls);
    }
    if let Some(login) = login {
        if let Some(user) = login.username() {
            config = config.username(user);
        }
        if let Some(password) = login.password() {
            config = config.password(password);
        }
        config = config.db(login.db());
    }
    Ok(Plan {
        place: Place::Sentinel(Box::new(config)),
        replicas: None,
    })
}

/// Parses `urls` without connecting: a bad URL is bad usage. With `replicas`, each lock
/// write waits for that many replicas of its server. `rediss://` URLs use `tls` (the
/// system's roots without).
pub(crate) fn plan(
    urls: &[String],
    cluster: bool,
    replicas: Option<u32>,
    tls: Option<(Tls, TlsFiles)>,
) -> Result<Plan, Failure> {
    let (tls, files) = tls.unzip();
    let bad_url = |err: RedisError| Failure::Usage(format!("invalid --redis URL: {err}"));
    let place = if cluster {
        let mut builder = ClusterClient::builder(urls.to_vec()).retries(1);
        // Certificates make redis-rs connect to every node over TLS: only with TLS options,
        // which need rediss:// URLs.
        if let Some(tls) = &tls {
            builder = builder.certs(tls.certificates());
        }
        Place::Cluster(Box::new(builder.build().map_err(bad_url)?))
    } else {
        let tls = tls.unwrap_or_default();
        let mut clients = urls
            .iter()
            .map(|url| {
                tls.client(url.as_str())
                    .map_err(|err| Failure::Usage(format!("invalid --redis URL: {err}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        match clients.len() {
            1 => Place::Server(Box::new(clients.remove(0))),
            _ => {
                let config = Config {
                    redlock: urls.to_vec(),
                    connect_retries: Some(CONNECT_RETRIES),
                    tls: files,
                    ..Config::default()
                };
                Place::Quorum(clients, Box::new(config))
            }
        }
    };
    Ok(Plan { place, replicas })
}

/// Connects per `plan`. Every single server gets release events, so waiters wake when a
/// holder releases (on a Redlock quorum, through each master's client); a cluster polls.
pub(crate) async fn connect(plan: Plan) -> Result<Target, Failure> {
    let target = match plan.place {
        Place::Cluster(client) => {
            let conn = client
                .get_async_connection()
                .await
                .map_err(|err| exit::redis_failure("cannot reach Redis at the cluster", &err))?;
            Target::Cluster(Redis {
                client: Client::cluster(conn.clone()),
                nodes: vec![conn],
            })
        }
        Place::Server(client) => {
            let client = *client;
            let conn = manager(&client)
                .await
                .map_err(|err| unreachable(&client, &err))?;
            Target::Single(Redis {
                client: master(conn.clone(), client)?,
                nodes: vec![conn],
            })
        }
        Place::Quorum(clients, config) => quorum(clients, &config).await?,
        // Replicated as its configuration says.
        Place::Sentinel(config) => return sentinel(*config).await,
    };
    match plan.replicas {
        Some(replicas) => target.replicated(Replication::replicas(replicas)).await,
        None => Ok(target),
    }
}

/// The primary the sentinels of `config` name.
async fn sentinel(config: SentinelConfig) -> Result<Target, Failure> {
    let failed = |err: lockset::Error| match err {
        lockset::Error::InvalidInput(_) => Failure::from_error(&err),
        err if err.is_not_replicated() => Failure::new(
            UNAVAILABLE,
            format!("the primary has too few replicas for a lock that survives a failover: {err}"),
        ),
        lockset::Error::Redis(err) if is_no_such_database(&err) => Failure::Usage(format!(
            "invalid --master URL: the primary has no such database ({err})"
        )),
        // A refused login (the sentinels' or the data nodes') is lasting, as on one server.
        lockset::Error::Redis(err) => {
            exit::redis_failure("cannot reach the primary through the sentinels", &err)
        }
        err => Failure::new(
            UNAVAILABLE,
            format!("cannot reach the primary through the sentinels: {err}"),
        ),
    };
    let conn = SentinelConnection::connect(config).await.map_err(failed)?;
    let client = Client::sentinel(conn.clone()).await.map_err(failed)?;
    Ok(Target::Sentinel(Redis {
        client,
        nodes: vec![conn],
    }))
}

impl Target {
    /// Every lock write waits for `replication` (checked against the primaries first).
    async fn replicated(self, replication: Replication) -> Result<Self, Failure> {
        let failed = |err: lockset::Error| Failure::from_error(&err);
        Ok(match self {
            Self::Single(Redis { client, nodes }) => Self::Single(Redis {
                client: client.replicated(replication).await.map_err(failed)?,
                nodes,
            }),
            Self::Cluster(Redis { client, nodes }) => Self::Cluster(Redis {
                client: client.replicated(replication).await.map_err(failed)?,
                nodes,
            }),
            Self::Sentinel(Redis { client, nodes }) => Self::Sentinel(Redis {
                client: client.replicated(replication).await.map_err(failed)?,
                nodes,
            }),
        })
    }
}

/// A Redlock quorum, connected by the library as `config` says: every master at once, on
/// once a majority is connected (a minority may be down or paused; the library warns of
/// each, which `ui` shows), a master refusing the login, database or TLS fails. The raw
/// connections for reading holders connect when a read first needs them.
async fn quorum(clients: Vec<redis::Client>, config: &Config) -> Result<Target, Failure> {
    let client = config.connect().await.map_err(|err| quorum_failure(&err))?;
    let nodes = clients
        .into_iter()
        .map(|client| {
            ConnectionManager::new_lazy_with_config(client.clone(), self::config())
                .map_err(|err| unreachable(&client, &err))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target::Single(Redis { client, nodes }))
}

/// The failure to connect to a Redlock quorum: bad usage for a database a master does not
/// have, else as any library error (a refused login lasting, no majority reachable retried
/// within `--wait`).
fn quorum_failure(err: &lockset::Error) -> Failure {
    match err {
        lockset::Error::Redis(redis) if is_no_such_database(redis) => Failure::Usage(format!(
            "invalid --redis URL: a Redis master has no such database ({redis})"
        )),
        lockset::Error::Redis(redis) => {
            exit::redis_failure("cannot reach the Redis masters", redis)
        }
        err => Failure::from_error(err),
    }
}

/// A single-server client: `Client::connect` without its long connection retries.
fn master(conn: ConnectionManager, client: redis::Client) -> Result<Client, Failure> {
    Client::new(conn)
        .with_release_events(client)
        .map_err(|err| Failure::from_error(&err))
}

/// A connection manager that gives up after [`CONNECT_RETRIES`].
async fn manager(client: &redis::Client) -> Result<ConnectionManager, RedisError> {
    ConnectionManager::new_with_config(client.clone(), config()).await
}

fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new().set_number_of_retries(CONNECT_RETRIES)
}

/// `host:port` of a server, for messages.
fn address(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// The failure to connect to `client`'s server: bad usage when the URL names a database
/// the server does not have, else unreachable.
fn unreachable(client: &redis::Client, err: &RedisError) -> Failure {
    let what = address(client);
    if is_no_such_database(err) {
        let db = client.get_connection_info().redis_settings().db();
        return Failure::Usage(format!(
            "invalid --redis URL: the server at {what} has no database {db} ({err})"
        ));
    }
    let tls = matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    if tls && err.is_timeout() {
        // A plain-text port never answers a TLS handshake: the wait ends in a timeout that
        // says nothing of TLS (the library's `Client::connect` asks the same).
        return Failure::lasting(
            UNAVAILABLE,
            format!(
                "cannot reach Redis at {what}: no TLS handshake in time ({err}): is this a TLS \
                 port? (a plain-text port takes a redis:// URL)"
            ),
        );
    }
    exit::redis_failure(&format!("cannot reach Redis at {what}"), err)
}

/// The server refused the database the URL selects.
fn is_no_such_database(err: &RedisError) -> bool {
    err.detail()
        .is_some_and(|detail| detail.contains("DB index is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_usage_errors() {
        for cluster in [false, true] {
            let plan = plan(&["http://nope/".to_owned()], cluster, None, None);
            assert!(matches!(plan, Err(Failure::Usage(_))), "cluster: {cluster}");
        }
    }
}
