//! The topologies under test, each with its clients built as separate processes would
//! build them: one server, a Redlock quorum of five masters, a three-master cluster, a
//! primary with two replicas behind three sentinels.

use std::sync::{Arc, Mutex};

use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use lockset::{Client, QuorumConfig, Replication, SentinelConfig};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};

use super::deployment::Deployment;
use super::faults::{Plan, Restart, Servers, Targets, Turns};
use super::workload::MAX_FRESH_TTL;
use super::{Connect, Setup};
use crate::support::proxy::Proxy;
use crate::support::sentinel::{Failover, MASTER};
use crate::support::{RedisServer, ms};

/// How many clients a seed gets: 8 to 32.
fn client_count(rng: &mut SmallRng) -> usize {
    rng.random_range(8..=32)
}

/// A small pool, so that contention is high.
fn plain_pool() -> Vec<Vec<String>> {
    vec![(0..10).map(|i| format!("k{i}")).collect()]
}

/// A single-server lock client of one of four kinds: `Client::connect` (release events,
/// redis-rs's default timeouts), a polling client, release events with short timeouts, or
/// release events over `events_url` (a proxy with latency: fair waiters whose notices come
/// late) with short timeouts.
async fn server_client(url: &str, kind: usize, events_url: &str) -> Client<ConnectionManager> {
    if kind == 0 {
        return Client::connect(url).await.expect("connect");
    }
    let redis = lockset::redis::Client::open(url).expect("url");
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(ms(200)))
        .set_connection_timeout(Some(ms(300)));
    let conn = ConnectionManager::new_with_config(redis.clone(), config)
        .await
        .expect("connect");
    let events = match kind {
        1 => return Client::new(conn),
        2 => redis,
        _ => lockset::redis::Client::open(events_url).expect("url"),
    };
    Client::new(conn)
        .with_release_events(events)
        .expect("release events on a single server")
}

/// Starts `count` servers, each with a fault proxy in front.
async fn servers(count: usize) -> (Vec<Arc<Mutex<RedisServer>>>, Vec<Arc<Proxy>>) {
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..count {
        let server = RedisServer::start();
        proxies.push(Arc::new(Proxy::start(server.port()).await));
        servers.push(Arc::new(Mutex::new(server)));
    }
    (servers, proxies)
}

/// The URL of server `i`: direct, or through its proxy.
fn url(
    servers: &[Arc<Mutex<RedisServer>>],
    proxies: &[Arc<Proxy>],
    i: usize,
    proxied: bool,
) -> String {
    match proxied {
        true => proxies[i].url(),
        false => servers[i].lock().expect("server").url(),
    }
}

/// One redis-server; clients reach it directly or through one of two proxies. Some clients'
/// release events come through a third proxy with 1 to 20 ms of latency (fair waiters for
/// one key or several, of every mode, whose subscriptions and notices come late). A killed
/// server comes back only after the longest TTL (without persistence it forgets its locks).
pub async fn single(seed: u64) -> Setup<ConnectionManager> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5176);
    let (servers, mut proxies) = servers(1).await;
    let port = servers[0].lock().expect("server").port();
    proxies.push(Arc::new(Proxy::start(port).await));
    let events = Arc::new(Proxy::start(port).await);
    events.set_latency(ms(rng.random_range(1..=20)));
    proxies.push(events.clone());
    let mut clients = Vec::new();
    for _ in 0..client_count(&mut rng) {
        let url = match rng.random_range(0..3) {
            0 => url(&servers, &proxies, 0, false),
            route => proxies[route - 1].url(),
        };
        clients.push(server_client(&url, rng.random_range(0..4), &events.url()).await);
    }
    Setup {
        name: "single server".to_owned(),
        clients,
        fresh: Vec::new(),
        pool: plain_pool(),
        fencing: true,
        plan: Plan::mixed(1, proxies.len(), Restart::Delayed, Vec::new()),
        targets: Arc::new(Targets {
            servers: Servers::Plain(servers),
            proxies,
            turns: Turns::default(),
        }),
    }
}

/// A Redlock quorum of five masters, each behind a proxy; every client has its own
/// connections to all five (some direct, some proxied) and its own per-node time limit.
/// With delayed restarts, one or two masters are down from the start (paused or killed,
/// before any client spoke to them) for a quarter to a half of the run.
pub async fn redlock(seed: u64, restart: Restart) -> Setup<ConnectionManager> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x4ED1);
    let (servers, proxies) = servers(5).await;
    let mut clients = Vec::new();
    for _ in 0..client_count(&mut rng) {
        let kind = rng.random_range(0..2);
        let mut nodes = Vec::new();
        for i in 0..servers.len() {
            let url = url(&servers, &proxies, i, rng.random_bool(0.5));
            nodes.push(server_client(&url, kind, &url).await);
        }
        let config = match rng.random_range(0..3) {
            0 => QuorumConfig::default(),
            1 => QuorumConfig::default().node_timeout(ms(50)),
            _ => QuorumConfig::default().node_timeout(ms(150)),
        };
        clients.push(Client::quorum(nodes, config).expect("quorum"));
    }
    let name = match restart {
        Restart::Immediate => "Redlock without delayed restarts",
        _ => "Redlock",
    };
    let mut plan = Plan::mixed(servers.len(), proxies.len(), restart, Vec::new());
    if restart == Restart::Delayed {
        plan.down_at_start = rng.random_range(1..=2);
    }
    if restart == Restart::Immediate {
        // Restarts often, so that a majority can forget a lock within one TTL.
        plan.gap_ms = (10, 120);
        plan.weights = [15, 60, 5, 5, 5, 5, 0, 0, 0, 0];
    }
    Setup {
        name: name.to_owned(),
        clients,
        fresh: Vec::new(),
        pool: plain_pool(),
        // Redlock refuses fencing tokens.
        fencing: false,
        plan,
        targets: Arc::new(Targets {
            servers: Servers::Plain(servers),
            proxies,
            turns: Turns::default(),
        }),
    }
}

/// A three-master Redis Cluster; keys come in three groups with a hash tag each, one group
/// per master at the start, and the faults pause masters and migrate the groups' slots.
#[cfg(feature = "cluster")]
pub async fn cluster(seed: u64) -> Setup<lockset::redis::aio::ConnectionManager> {
    use crate::support::cluster::Cluster;

    let mut rng = SmallRng::seed_from_u64(seed ^ 0xC1u64);
    let cluster = Arc::new(
        tokio::task::spawn_blocking(Cluster::start)
            .await
            .expect("cluster"),
    );
    let tags = tags_per_master(&cluster);
    let pool: Vec<Vec<String>> = tags
        .iter()
        .map(|tag| (0..5).map(|i| format!("{{{tag}}}:{i}")).collect())
        .collect();
    let slots = pool
        .iter()
        .map(|group| lockset::slot_number(&group[0]))
        .collect();
    let mut clients = Vec::new();
    for _ in 0..client_count(&mut rng) {
        // Half the clients have release events (sharded pub/sub): their waiters queue.
        if rng.random_bool(0.5) {
            let client = Client::connect_cluster(cluster.urls()).await;
            clients.push(client.expect("cluster client with release events"));
            continue;
        }
        let conn = lockset::redis::cluster::ClusterClient::builder(cluster.urls())
            .response_timeout(ms(300))
            .connection_timeout(ms(300))
            .retries(3)
            .build()
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("cluster connection");
        clients.push(Client::cluster(conn));
    }
    Setup {
        name: "cluster".to_owned(),
        clients,
        fresh: Vec::new(),
        pool,
        fencing: true,
        plan: Plan::mixed(cluster.nodes.len(), 0, Restart::Never, slots),
        targets: Arc::new(Targets {
            servers: Servers::Cluster(cluster),
            proxies: Vec::new(),
            turns: Turns::default(),
        }),
    }
}

/// One hash tag served by each master.
#[cfg(feature = "cluster")]
fn tags_per_master(cluster: &crate::support::cluster::Cluster) -> Vec<String> {
    let mut tags = Vec::new();
    for master in 0..cluster.nodes.len() {
        let tag = (0..)
            .map(|i| format!("g{i}"))
            .find(|tag| cluster.owner_of(lockset::slot_number(&format!("{{{tag}}}"))) == master)
            .expect("some tag lands on every master");
        tags.push(tag);
    }
    tags
}

/// A primary with two replicas behind three sentinels, each sentinel behind a proxy. Every
/// client follows the primary with a `Client::connect_sentinel` of its own, reaching each
/// sentinel directly or through its proxy, and counts a write once `replication` is met;
/// some of its scenarios go through a client it makes for that one scenario with the same
/// configuration, as `lockset run` does (with longer TTLs). Since TTLs differ from lock to
/// lock, a primary restarted empty grants nothing until the longest has passed since its
/// start (`SentinelConfig::restart_grace`, as the guide says such deployments need).
pub async fn sentinel(
    seed: u64,
    replication: Replication,
) -> Setup<lockset::redis::aio::ConnectionManager> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5E47);
    let failover = Failover::start(2).await;
    let mut proxies = Vec::new();
    for sentinel in &failover.sentinels {
        proxies.push(Arc::new(Proxy::start(sentinel.port()).await));
    }
    let mut clients = Vec::new();
    let mut fresh: Vec<Connect<lockset::redis::aio::ConnectionManager>> = Vec::new();
    for _ in 0..client_count(&mut rng) {
        let sentinels: Vec<String> = failover
            .sentinels
            .iter()
            .zip(&proxies)
            .map(|(sentinel, proxy)| match rng.random_bool(0.5) {
                true => proxy.url(),
                false => sentinel.url(),
            })
            .collect();
        let config = SentinelConfig::new(sentinels, MASTER)
            .expect("sentinel config")
            .restart_grace(MAX_FRESH_TTL);
        // Default time limits, or short ones (the reply's above the replicas' wait).
        let (replication, config) = match rng.random_range(0..3) {
            0 => (replication, config),
            1 => (
                replication.timeout(ms(150)),
                config.response_timeout(ms(300)).connection_timeout(ms(300)),
            ),
            _ => (
                replication.timeout(ms(60)),
                config.response_timeout(ms(150)),
            ),
        };
        let config = config.replication(replication);
        clients.push(
            Client::connect_sentinel(config.clone())
                .await
                .expect("connect"),
        );
        fresh.push(Arc::new(move || {
            Box::pin(Client::connect_sentinel(config.clone()))
        }));
    }
    let name = match replication.replicas_needed() {
        Some(0) => "Sentinel without replication".to_owned(),
        Some(n) => format!("Sentinel, {n} replicas acknowledging"),
        None => "Sentinel, every replica in sync acknowledging".to_owned(),
    };
    let mut plan = Plan::failover(proxies.len());
    if replication.replicas_needed() == Some(0) {
        // Promotions (also of a replica behind a cut-off primary) and pauses long enough
        // for a failover lose writes the old primary took: those the checker must see.
        plan.weights = [10, 5, 5, 5, 5, 5, 0, 50, 30, 5];
    }
    Setup {
        name,
        clients,
        fresh,
        pool: plain_pool(),
        fencing: true,
        plan,
        targets: Arc::new(Targets {
            servers: Servers::Sentinel(Arc::new(Deployment::new(failover))),
            proxies,
            turns: Turns::default(),
        }),
    }
}
