//! Five private masters, a client for each, and a Redlock client over all of them.

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Lock, Options, QuorumConfig, Retry};

use super::RedisServer;

/// Five private masters, a client for each, and a Redlock client over all of them.
pub struct Masters {
    pub servers: Vec<RedisServer>,
    pub nodes: Vec<Client<ConnectionManager>>,
    pub redlock: Client<ConnectionManager>,
}

impl Masters {
    pub async fn start(config: QuorumConfig) -> Self {
        let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
        let mut nodes = Vec::new();
        for server in &servers {
            nodes.push(Client::connect(&server.url()).await.unwrap());
        }
        let redlock = Client::quorum(nodes.clone(), config).unwrap();
        Self {
            servers,
            nodes,
            redlock,
        }
    }

    /// Runs a raw command on master `i` over a fresh connection.
    pub async fn cmd<T: lockset::redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> T {
        let mut conn = super::connect(&self.servers[i]).await;
        let mut cmd = lockset::redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|err| panic!("master {i}: {args:?}: {err}"))
    }

    /// What master `i` stores at `key`.
    pub async fn get(&self, i: usize, key: &str) -> Option<String> {
        self.cmd(i, &["GET", key]).await
    }

    /// On how many of `masters` a waiter marked `key`'s holder (its value starts with `!`).
    pub async fn marked(&self, masters: impl IntoIterator<Item = usize>, key: &str) -> usize {
        let mut marked = 0;
        for i in masters {
            marked += usize::from(self.get(i, key).await.is_some_and(|v| v.starts_with('!')));
        }
        marked
    }

    /// Whether master `i` holds `key` for `lock`: its value, or a share of it.
    pub async fn holds(&self, i: usize, key: &str, lock: &Lock<ConnectionManager>) -> bool {
        let token = lock.token();
        let value = format!("{}:{token}{}", token.len(), lock.metadata());
        let kind: String = self.cmd(i, &["TYPE", key]).await;
        match kind.as_str() {
            "zset" => {
                let score: Option<f64> = self.cmd(i, &["ZSCORE", key, &value]).await;
                score.is_some()
            }
            // A waiter may have marked it.
            _ => self
                .get(i, key)
                .await
                .is_some_and(|held| held.trim_start_matches('!') == value),
        }
    }

    /// Refreshes `lock` until every master holds each of its keys. An obtain returns once
    /// the masters it needs agreed; on a loaded machine the others may have timed out, and a
    /// test that then takes the lock from one more master may take too many. A refresh
    /// restores the lock on masters that lost it, once enough still hold it.
    pub async fn spread(&self, lock: &Lock<ConnectionManager>) {
        let options = Options::default()
            .retry(Retry::linear(super::ms(50)))
            .timeout(super::ms(10_000));
        super::eventually(super::ms(20_000), "the lock on every master", async || {
            lock.refresh(super::ms(30_000), &options).await.unwrap();
            for i in 0..self.servers.len() {
                for key in lock.keys() {
                    if !self.holds(i, key, lock).await {
                        return false;
                    }
                }
            }
            true
        })
        .await;
    }

    /// `key`'s remaining TTL on master `i` in ms (-2: missing, -1: no expiry).
    pub async fn pttl(&self, i: usize, key: &str) -> i64 {
        self.cmd(i, &["PTTL", key]).await
    }

    /// How many keys each of the given masters holds.
    pub async fn dbsizes(&self, masters: impl IntoIterator<Item = usize>) -> Vec<i64> {
        let mut sizes = Vec::new();
        for i in masters {
            sizes.push(self.cmd(i, &["DBSIZE"]).await);
        }
        sizes
    }

    /// Loads the lock scripts on every master, so that no attempt pays a NOSCRIPT round
    /// trip (which a test with short node limits on a loaded machine may not afford).
    pub async fn load_scripts(&self) {
        let scripts = [
            super::bundled(include_str!("../../lua/obtain.lua")),
            super::bundled(include_str!("../../lua/pttl.lua")),
            super::bundled(include_str!("../../lua/refresh.lua")),
            super::bundled(include_str!("../../lua/release.lua")),
        ];
        for i in 0..self.servers.len() {
            for script in &scripts {
                let _: String = self.cmd(i, &["SCRIPT", "LOAD", script]).await;
            }
        }
    }

    /// How many masters store exactly `value` at every one of `keys`.
    pub async fn holding(&self, keys: &[&str], value: &str) -> usize {
        let mut holding = 0;
        for i in 0..self.servers.len() {
            let mut all = true;
            for key in keys {
                all &= self.get(i, key).await.as_deref() == Some(value);
            }
            holding += usize::from(all);
        }
        holding
    }
}

/// How long each obtain and each release of a run of lock cycles took.
#[derive(Debug, Default)]
pub struct Cycles {
    pub obtains: Vec<std::time::Duration>,
    pub releases: Vec<std::time::Duration>,
}

impl Cycles {
    /// Runs `count` cycles on `redlock` (obtain `key` for 10 s, release at once).
    ///
    /// A release returns once a majority deleted the lock: a master still busy with the
    /// lock's obtain deletes it a moment later. With masters down, the next obtain may find
    /// it there, on one master too many: it retries (every 2 ms).
    pub async fn run(redlock: &Client<ConnectionManager>, key: &str, count: usize) -> Self {
        let options = Options::default()
            .retry(Retry::linear(super::ms(2)))
            .timeout(super::ms(2_000));
        let mut cycles = Self::default();
        for _ in 0..count {
            let start = tokio::time::Instant::now();
            let lock = redlock
                .obtain(key, super::ms(10_000), &options)
                .await
                .unwrap_or_else(|err| panic!("obtain {key}: {err}"));
            let obtained = tokio::time::Instant::now();
            lock.release()
                .await
                .unwrap_or_else(|err| panic!("release {key}: {err}"));
            cycles.obtains.push(obtained - start);
            cycles.releases.push(obtained.elapsed());
        }
        cycles
    }

    /// Asserts that obtains and releases took a few milliseconds, not a per-node limit:
    /// medians under `median`, every one under `slowest`.
    pub fn assert_within(&self, median: std::time::Duration, slowest: std::time::Duration) {
        for (what, times) in [("obtain", &self.obtains), ("release", &self.releases)] {
            let mut sorted = times.clone();
            sorted.sort();
            let middle = sorted[sorted.len() / 2];
            let last = sorted[sorted.len() - 1];
            println!("{what}: median {middle:?}, slowest {last:?}");
            assert!(
                middle < median && last < slowest,
                "{what}: median {middle:?} (bound {median:?}), slowest {last:?} (bound \
                 {slowest:?}); all: {times:?}"
            );
        }
    }
}
