//! Connecting to where the locks live: one server, a Redlock quorum, or a cluster.

use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use lockset::redis::cluster::ClusterClient;
use lockset::redis::cluster_async::ClusterConnection;
use lockset::redis::{self, RedisError};
use lockset::{Client, QuorumConfig};
use tokio::task::JoinSet;

use crate::exit::{self, Failure, UNAVAILABLE};

/// The URL used when neither `--redis` nor the environment names one.
const DEFAULT_URL: &str = "redis://127.0.0.1/";

/// How often a connection is retried before `lockset` gives up with "unreachable". The
/// library's default (6, about 6 s) is meant for long-running services; a command line
/// should answer quickly, and a reconnect is tried again on the next command anyway.
const CONNECT_RETRIES: usize = 1;

/// A lock client, and the raw connections to look at keys with: one per Redlock master,
/// else one.
pub(crate) struct Redis<C> {
    /// The library's client.
    pub(crate) client: Client<C>,
    /// Raw connections for reading holders (the library offers no way to, see `holder`).
    pub(crate) nodes: Vec<C>,
}

/// The connected backend; the two connection types need two client types.
pub(crate) enum Target {
    /// One server, or a Redlock quorum of several.
    Single(Redis<ConnectionManager>),
    /// A Redis Cluster.
    Cluster(Redis<ClusterConnection>),
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

/// Parsed URLs, checked before anything is sent.
pub(crate) enum Plan {
    /// Single servers: one, or a Redlock quorum.
    Servers(Vec<redis::Client>),
    /// Seed nodes of a cluster (boxed: the client is large).
    Cluster(Box<ClusterClient>),
}

/// Parses `urls` without connecting: a bad URL is bad usage.
pub(crate) fn plan(urls: &[String], cluster: bool) -> Result<Plan, Failure> {
    let bad_url = |err: RedisError| Failure::Usage(format!("invalid --redis URL: {err}"));
    if cluster {
        let client = ClusterClient::builder(urls.to_vec())
            .retries(1)
            .build()
            .map_err(bad_url)?;
        return Ok(Plan::Cluster(Box::new(client)));
    }
    let clients = urls
        .iter()
        .map(|url| redis::Client::open(url.as_str()).map_err(bad_url))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Plan::Servers(clients))
}

/// Connects per `plan`. Every single server gets release events, so waiters wake when a
/// holder releases (on a Redlock quorum, through each master's client); a cluster polls.
pub(crate) async fn connect(plan: Plan) -> Result<Target, Failure> {
    match plan {
        Plan::Cluster(client) => {
            let conn = client
                .get_async_connection()
                .await
                .map_err(|err| exit::redis_failure("cannot reach Redis at the cluster", &err))?;
            Ok(Target::Cluster(Redis {
                client: Client::cluster(conn.clone()),
                nodes: vec![conn],
            }))
        }
        Plan::Servers(mut clients) if clients.len() == 1 => {
            let client = clients.remove(0);
            let conn = manager(&client)
                .await
                .map_err(|err| unreachable(&client, &err))?;
            Ok(Target::Single(Redis {
                client: master(conn.clone(), client)?,
                nodes: vec![conn],
            }))
        }
        Plan::Servers(clients) => quorum(clients).await,
    }
}

/// A Redlock quorum. A minority of masters may be down: their connections are made lazily
/// (each operation tries again), so the quorum still counts them, and a majority decides.
async fn quorum(clients: Vec<redis::Client>) -> Result<Target, Failure> {
    let mut connecting = JoinSet::new();
    for (index, client) in clients.iter().enumerate() {
        let client = client.clone();
        connecting.spawn(async move { (index, manager(&client).await) });
    }
    let mut conns: Vec<Option<ConnectionManager>> = vec![None; clients.len()];
    let mut down = Vec::new();
    while let Some(joined) = connecting.join_next().await {
        match joined {
            Ok((index, Ok(conn))) => conns[index] = Some(conn),
            Ok((index, Err(err))) if is_no_such_database(&err) => {
                return Err(unreachable(&clients[index], &err));
            }
            Ok((index, Err(err))) => down.push(format!("{}: {err}", address(&clients[index]))),
            Err(err) => down.push(err.to_string()),
        }
    }
    let needed = clients.len() / 2 + 1;
    if clients.len() - down.len() < needed {
        let message = format!(
            "cannot reach a majority of the Redis masters ({needed} of {} needed): {}",
            clients.len(),
            down.join("; ")
        );
        return Err(Failure::new(UNAVAILABLE, message));
    }
    for line in &down {
        tracing::warn!("Redis master unreachable, the others make a majority: {line}");
    }
    let mut masters = Vec::with_capacity(clients.len());
    let mut nodes = Vec::with_capacity(clients.len());
    for (conn, client) in conns.into_iter().zip(clients) {
        let conn = match conn {
            Some(conn) => conn,
            None => ConnectionManager::new_lazy_with_config(client.clone(), config())
                .map_err(|err| unreachable(&client, &err))?,
        };
        masters.push(master(conn.clone(), client)?);
        nodes.push(conn);
    }
    let client = Client::quorum(masters, QuorumConfig::default())
        .map_err(|err| Failure::from_error(&err))?;
    Ok(Target::Single(Redis { client, nodes }))
}

/// A single-server client: `Client::connect` without its long connection retries.
fn master(
    conn: ConnectionManager,
    client: redis::Client,
) -> Result<Client<ConnectionManager>, Failure> {
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
            let plan = plan(&["http://nope/".to_owned()], cluster);
            assert!(matches!(plan, Err(Failure::Usage(_))), "cluster: {cluster}");
        }
    }
}
