//! One `Client` type for every topology: a service chooses where its locks live from its
//! configuration at run time, and its functions name `Client`, `Lock` and `Guard` without a
//! connection type.

use std::time::Duration;

use lockset::{Client, Guard, Lock, Options, QuorumConfig, Replication, Retry, SentinelConfig};

#[cfg(feature = "cluster")]
use crate::support::cluster::Cluster;
use crate::support::sentinel::Failover;
use crate::support::{RedisServer, ms};

/// Where the locks live, as a service's configuration says it.
enum Topology {
    Single(String),
    Sentinel(Box<SentinelConfig>),
    Redlock(Vec<String>),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
}

/// Compiles because every constructor returns the same `Client`.
async fn client_for(topology: Topology) -> lockset::Result<Client> {
    Ok(match topology {
        Topology::Single(url) => Client::connect(&url).await?,
        Topology::Sentinel(config) => Client::connect_sentinel(*config).await?,
        Topology::Redlock(urls) => {
            let mut masters = Vec::new();
            for url in urls {
                masters.push(Client::connect(&url).await?);
            }
            // Generous for a loaded machine (see `redlock.rs`'s `config`).
            Client::quorum(masters, QuorumConfig::default().node_timeout(ms(1_000)))?
        }
        #[cfg(feature = "cluster")]
        Topology::Cluster(urls) => Client::connect_cluster(urls).await?,
    })
}

/// A lock and a guard, named without a connection type.
async fn hold(client: &Client, key: &str) -> lockset::Result<Guard> {
    let lock: Lock = client
        .obtain(key, Duration::from_secs(10), &Options::default())
        .await?;
    Ok(lock.into_guard())
}

/// The same service code on `topology`: a lock that keeps a rival out, and is released.
async fn exercise(topology: Topology, named: &str) {
    let client = client_for(topology).await.expect("connect");
    // `Debug` says where the locks live.
    let shown = format!("{client:?}");
    assert!(shown.contains(&format!("topology: \"{named}\"")), "{shown}");
    let guard = hold(&client, "{job}:report").await.expect("obtain");
    let rival = client
        .obtain(
            "{job}:report",
            Duration::from_secs(10),
            &Options::default().retry(Retry::NoRetry),
        )
        .await
        .expect_err("held");
    assert!(rival.is_not_obtained(), "{rival:?}");
    guard.release().await.expect("release");
    let again = hold(&client, "{job}:report").await.expect("free again");
    again.release().await.expect("release");
}

#[tokio::test]
async fn one_server() {
    let server = RedisServer::start();
    exercise(Topology::Single(server.url()), "single").await;
}

#[tokio::test]
async fn a_sentinel_deployment() {
    let failover = Failover::start(1).await;
    let config = Box::new(failover.config(Replication::all()));
    exercise(Topology::Sentinel(config), "single").await;
}

#[tokio::test]
async fn a_redlock_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls = servers.iter().map(RedisServer::url).collect();
    exercise(Topology::Redlock(urls), "redlock").await;
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn a_cluster() {
    let cluster = Cluster::start();
    exercise(Topology::Cluster(cluster.urls()), "cluster").await;
}
