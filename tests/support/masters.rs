//! Five private masters, a client for each, and a Redlock client over all of them.

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, QuorumConfig};

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
