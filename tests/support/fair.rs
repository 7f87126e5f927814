//! Fair waiting: waiters that poll so slowly that only a hand-off gets them the lock in
//! time, and a look at the waiter queues.

use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Lock, Options, Retry};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use super::{Env, eventually, ms};

/// Polling alone would wait 15 s between attempts.
pub fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(Duration::from_secs(120))
}

/// How soon a hand-off must reach its waiter: far beyond the event path (about a
/// millisecond), far below the polling interval.
pub const HANDED_WITHIN: Duration = Duration::from_millis(2_000);

/// Locks `key` for 60 s on `env`'s client, without waiting.
pub async fn hold(env: &Env, key: &str) -> Lock<ConnectionManager> {
    env.client
        .obtain(key, ms(60_000), &Options::default())
        .await
        .unwrap()
}

/// The lock `waiter` obtained within `within`.
pub async fn handed(
    within: Duration,
    waiter: JoinHandle<Result<Lock<ConnectionManager>, lockset::Error>>,
    what: &str,
) -> Lock<ConnectionManager> {
    timeout(within, waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {within:?}"))
        .unwrap()
        .unwrap()
}

/// Spawns an obtain of `key` for 60 s on `client`.
pub fn wait_for(
    client: &Client<ConnectionManager>,
    key: &'static str,
    options: Options,
) -> JoinHandle<Result<Lock<ConnectionManager>, lockset::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.obtain(key, ms(60_000), &options).await })
}

/// Spawns an obtain of `keys` for 60 s on `client`.
pub fn wait_for_keys(
    client: &Client<ConnectionManager>,
    keys: Vec<&'static str>,
    options: Options,
) -> JoinHandle<Result<Lock<ConnectionManager>, lockset::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.obtain_multi(keys, ms(60_000), &options).await })
}

/// How many waiters are in `key`'s queue.
pub async fn queued(env: &Env, key: &str) -> i64 {
    let queue = lockset::queue_key_for(key).expect("a key with a queue");
    env.cmd(&["ZCARD", &queue]).await
}

/// Waits until `n` waiters are in `key`'s queue.
pub async fn queued_up_to(env: &Env, key: &str, n: i64) {
    eventually(ms(10_000), &format!("{n} waiters queued"), async || {
        queued(env, key).await == n
    })
    .await;
}
