//! Test support: private redis-servers and connections to them.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod fair;
pub mod masters;
pub mod proxy;
/// The library's own bundled scripts (`src/server/scripts.rs`), for tests that load or run
/// one by hand.
#[path = "../../src/server/scripts.rs"]
pub mod scripts;
pub mod sentinel;
pub mod server;
#[cfg(feature = "tls")]
pub mod tls;

use std::time::Duration;

use lockset::Client;
use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use lockset::redis::{self, AsyncConnectionConfig};
pub use server::RedisServer;

/// A private server with a lock client and a raw connection for inspecting keys.
pub struct Env {
    pub server: RedisServer,
    pub client: Client<ConnectionManager>,
    pub raw: MultiplexedConnection,
}

impl Env {
    pub async fn start() -> Self {
        let server = RedisServer::start();
        let client = Client::connect(&server.url()).await.expect("connect");
        let raw = connect(&server).await;
        let env = Self {
            server,
            client,
            raw,
        };
        // The command counts start here: what the tests count is what their calls send,
        // not what connecting asked (whether the server runs the scripts).
        let _: () = env.cmd(&["CONFIG", "RESETSTAT"]).await;
        env
    }

    /// A second client on the same server, as another process would have.
    pub async fn other_client(&self) -> Client<ConnectionManager> {
        Client::connect(&self.server.url()).await.expect("connect")
    }

    /// Runs a raw command on the inspection connection.
    pub async fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut self.raw.clone())
            .await
            .unwrap_or_else(|err| panic!("{args:?}: {err}"))
    }

    pub async fn exists(&self, key: &str) -> bool {
        self.cmd::<i64>(&["EXISTS", key]).await == 1
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        self.cmd(&["GET", key]).await
    }

    pub async fn dbsize(&self) -> i64 {
        self.cmd(&["DBSIZE"]).await
    }

    /// Loads the lock scripts, so that every later attempt of a multi-key obtain is exactly
    /// one EVALSHA (see [`Env::attempts`]).
    pub async fn load_scripts(&self) {
        let lock = self
            .client
            .obtain_multi(
                ["{warm}:a", "{warm}:b"],
                ms(10_000),
                &lockset::Options::default(),
            )
            .await
            .expect("warm-up obtain");
        lock.ttl().await.expect("warm-up ttl");
        lock.refresh(ms(10_000), &lockset::Options::default())
            .await
            .expect("warm-up refresh");
        lock.release().await.expect("warm-up release");
    }

    /// How many obtain attempts of multi-key locks the server saw (after [`Env::load_scripts`]):
    /// each is one EVALSHA, on every Redis version.
    pub async fn attempts(&self) -> u64 {
        self.calls("evalsha").await
    }

    /// How long the server spent running scripts so far (EVALSHA and EVAL, from INFO
    /// commandstats): its own time, whatever the clients' side took.
    pub async fn script_time(&self) -> Duration {
        let info: String = self.cmd(&["INFO", "commandstats"]).await;
        let usec = |command: &str| {
            let prefix = format!("cmdstat_{command}:");
            info.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("usec=")))
                .map_or(0, |n| n.parse::<u64>().expect("usec"))
        };
        Duration::from_micros(usec("evalsha") + usec("eval"))
    }

    /// How many times the server ran `command` (from INFO commandstats).
    pub async fn calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]).await;
        let prefix = format!("cmdstat_{}:calls=", command.to_lowercase());
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls count"))
    }
}

/// A lock client over `url` (a server, or a proxy in front of one) whose replies time out
/// after `timeout`, reconnecting after a drop.
pub async fn client_with_timeout(url: &str, timeout: Duration) -> Client<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(ms(1_000)));
    let client = redis::Client::open(url).expect("url");
    let conn = ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect");
    Client::new(conn)
}

/// A client whose lock commands go straight to `server` and whose release events go
/// through `events_url` (a proxy, to inject faults into the pub/sub connection only).
pub async fn client_with_events_via(
    server: &RedisServer,
    events_url: &str,
) -> Client<ConnectionManager> {
    let direct = redis::Client::open(server.url()).expect("url");
    let conn = ConnectionManager::new(direct).await.expect("connect");
    let events = redis::Client::open(events_url).expect("url");
    Client::new(conn)
        .with_release_events(events)
        .expect("release events")
}

/// A plain multiplexed connection to `server`.
pub async fn connect(server: &RedisServer) -> MultiplexedConnection {
    connect_with(server, AsyncConnectionConfig::new()).await
}

/// A multiplexed connection whose replies time out after `timeout`.
pub async fn connect_with_timeout(
    server: &RedisServer,
    timeout: Duration,
) -> MultiplexedConnection {
    connect_with(
        server,
        AsyncConnectionConfig::new().set_response_timeout(Some(timeout)),
    )
    .await
}

async fn connect_with(
    server: &RedisServer,
    config: AsyncConnectionConfig,
) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect")
}

/// Shared state that is only correct if at most one holder touches it at a time: a
/// non-atomic read-modify-write of a counter (concurrent holders lose updates) and a count of
/// holders inside (a second one is a violation).
#[derive(Default)]
pub struct Exclusion {
    counter: std::sync::atomic::AtomicU64,
    inside: std::sync::atomic::AtomicUsize,
    violations: std::sync::atomic::AtomicUsize,
}

impl Exclusion {
    /// The critical section: call it while holding the lock.
    pub async fn critical_section(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.inside.fetch_add(1, SeqCst) != 0 {
            self.violations.fetch_add(1, SeqCst);
        }
        let read = self.counter.load(SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(read + 1, SeqCst);
        self.inside.fetch_sub(1, SeqCst);
    }

    /// Asserts that no two holders overlapped and no update was lost in `sections` sections.
    pub fn assert_exclusive(&self, sections: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(self.violations.load(SeqCst), 0, "two holders at once");
        assert_eq!(self.counter.load(SeqCst), sections, "lost updates");
    }
}

/// Waits until `condition` holds, checking every few milliseconds; fails the test after
/// `within` (generous: this is for a loaded machine).
pub async fn eventually(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !condition().await {
        assert!(start.elapsed() < within, "{what}: not after {within:?}");
        tokio::time::sleep(ms(2)).await;
    }
}

/// Waits for `lost` to fire, and fails the test unless it fires by `due` + 1 s (the slack a
/// loaded machine needs; a signal that waits for a generous timeout instead fails).
pub async fn lost_by(lost: &lockset::LostSignal, due: tokio::time::Instant) {
    let slack = ms(1_000);
    let fired = tokio::time::timeout_at(due + slack, lost.lost()).await;
    assert!(
        fired.is_ok(),
        "the lost signal did not fire within {slack:?} of when it was due"
    );
}

/// A primary and one replica of it, once the replica is in sync (see
/// [`server::replica_in_sync`]).
pub async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(None, &["--repl-diskless-sync-delay", "0"]);
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(None, &["--replicaof", "127.0.0.1", &port]);
    eventually(ms(10_000), "replica in sync", async || {
        server::replica_in_sync(replica.port())
    })
    .await;
    (primary, replica)
}

/// Holds `key` by `holder`, has a waiter on `waiter` wait for it (polling only every 20 s),
/// releases it once the waiter listens, and checks that the waiter got it within 5 s: only a
/// release event can have woken it in time.
pub async fn a_release_wakes<C>(holder: &Client<C>, waiter: &Client<C>, key: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let lock = holder
        .obtain(key, ms(30_000), &lockset::Options::default())
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.to_owned());
        async move {
            let options = lockset::Options::default()
                .retry(lockset::Retry::linear(ms(20_000)))
                .timeout(ms(30_000));
            waiter.obtain(&key, ms(5_000), &options).await
        }
    });
    eventually(ms(10_000), "the waiter listens", async || {
        waiter.release_channels_watched() > 0
    })
    .await;
    let released = tokio::time::Instant::now();
    lock.release().await.unwrap();
    let theirs = waiting.await.unwrap().expect("woken by the release");
    assert!(released.elapsed() < ms(5_000), "{:?}", released.elapsed());
    theirs.release().await.unwrap();
}

/// Says, past the test harness's capture (so it shows in every run), that `test` checks less
/// than it could on this server, and why: a server without a command the test needs.
pub fn skipping(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// How many times a statistical scenario repeats itself: `quick` in the README's test command,
/// `full` with `LOCKSET_SLOW_TESTS=1` (which `.ci/run` sets on Redis 7.0), the sample the guide's figures
/// quote. Both check the same invariant on every repetition; the full sample only makes a rare
/// breach likelier to show.
pub fn repetitions(quick: usize, full: usize) -> usize {
    if slow_tests() { full } else { quick }
}

/// Whether `LOCKSET_SLOW_TESTS=1` asks for the full samples and the slow scenarios.
pub fn slow_tests() -> bool {
    std::env::var("LOCKSET_SLOW_TESTS").as_deref() == Ok("1")
}

/// Whether the scenario `test`, which waits out the library's fixed connection timings
/// (`waits`), runs: only with `LOCKSET_SLOW_TESTS=1`, as `.ci/run` sets on Redis 7.0, so
/// that the README's test command stays short. Says so on a `SKIPPED` line when it does not.
pub fn slow_scenario(test: &str, waits: &str) -> bool {
    let runs = slow_tests();
    if !runs {
        skipping(
            test,
            &format!("it waits out {waits}; runs with LOCKSET_SLOW_TESTS=1"),
        );
    }
    runs
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The process's resident memory in KiB (`VmRSS`).
pub fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/self/status")
}
