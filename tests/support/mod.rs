//! Test support: private redis-servers and connections to them.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod proxy;
mod server;

use std::time::Duration;

use lockset::Client;
use lockset::redis::aio::{ConnectionManager, MultiplexedConnection};
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
        Self {
            server,
            client,
            raw,
        }
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

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
