//! The blocking API (feature `blocking`): plain threads, no runtime of the test's own; its
//! refusal inside an async runtime.
#![cfg(feature = "blocking")]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockset::blocking::Client;
use lockset::{Error, Mode, Options, QuorumConfig, Replication, Retry};
use support::sentinel::Failover;
use support::server::{RedisServer, cli};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn exists(server: &RedisServer, key: &str) -> bool {
    cli(server.port(), &["EXISTS", key]).trim() == "1"
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    cli(server.port(), &["PTTL", key]).trim().parse().unwrap()
}

/// Waits up to `within` for `condition`, checking every 10 ms.
/// A server of the test's own, and a blocking client connected to it.
fn connected() -> (RedisServer, Client) {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).unwrap();
    (server, client)
}

/// Three servers of the test's own, and a blocking Redlock client of them.
fn quorum_of_three() -> (Vec<RedisServer>, Client) {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let masters: Vec<Client> = servers
        .iter()
        .map(|server| Client::connect(&server.url()).unwrap())
        .collect();
    let redlock = Client::quorum(masters, QuorumConfig::default()).unwrap();
    (servers, redlock)
}

fn eventually(within: Duration, what: &str, condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(ms(10));
    }
}

#[test]
fn a_lock_obtained_refreshed_and_released_from_a_plain_thread() {
    let (server, client) = connected();
    let options = Options::default().metadata("worker-1");
    let lock = client
        .obtain_multi(["{j}:a", "{j}:b"], ms(10_000), &options)
        .unwrap();
    assert_eq!(lock.keys(), ["{j}:a", "{j}:b"]);
    assert_eq!(lock.metadata(), "worker-1");
    let left = lock.ttl().unwrap().unwrap();
    assert!(left > ms(5_000) && left <= ms(10_000), "{left:?}");

    // Another client finds it held.
    let other = Client::connect(&server.url()).unwrap();
    let err = other
        .obtain("{j}:a", ms(10_000), &Options::default())
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");

    lock.refresh(ms(20_000), &Options::default()).unwrap();
    assert!(pttl(&server, "{j}:b") > 10_000);
    lock.release().unwrap();
    assert!(!exists(&server, "{j}:a") && !exists(&server, "{j}:b"));
}

#[test]
fn a_dropped_guard_releases_its_lock_from_a_plain_thread() {
    let (server, client) = connected();
    let guard = client
        .obtain("job", ms(60_000), &Options::default())
        .unwrap()
        .keep_alive();
    assert!(exists(&server, "job"));
    drop(guard);
    // Released in the background, long before the TTL.
    eventually(ms(5_000), "the dropped guard's release", || {
        !exists(&server, "job")
    });
    assert!(client.wait_background(ms(5_000)).unwrap());
    assert_eq!(client.background_tasks(), 0);
}

#[test]
fn the_last_handle_dropped_still_releases_a_dropped_guard() {
    let (server, client) = connected();
    let guard = client
        .obtain("job", ms(60_000), &Options::default())
        .unwrap()
        .into_guard();
    drop(client);
    // The guard is the last handle: its release runs before the runtime stops.
    drop(guard);
    assert!(!exists(&server, "job"));
}

/// The same inside an async runtime, where the last handle cannot block to wait: the
/// release still happens, soon (the blocking guide says dropping there is fine).
#[test]
fn the_last_handle_dropped_inside_an_async_runtime_still_releases_a_dropped_guard() {
    let (server, client) = connected();
    let guard = client
        .obtain("job", ms(60_000), &Options::default())
        .unwrap()
        .into_guard();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let start = std::time::Instant::now();
    runtime.block_on(async move {
        drop(guard);
        drop(client);
    });
    // Dropping did not wait for the release.
    assert!(start.elapsed() < ms(100), "{:?}", start.elapsed());
    eventually(ms(2_000), "the guard's release", || !exists(&server, "job"));
}

#[test]
fn a_watchdog_keeps_the_lock_alive_while_the_thread_blocks() {
    let (server, client) = connected();
    let guard = client
        .obtain("long", ms(300), &Options::default())
        .unwrap()
        .keep_alive_every(ms(50));
    let lost = guard.lost_signal();
    // Blocking work, four TTLs long: only the watchdog (on the client's runtime) refreshes.
    std::thread::sleep(ms(1_200));
    assert!(!lost.is_lost());
    assert!(pttl(&server, "long") > 0, "the key expired");
    let other = Client::connect(&server.url()).unwrap();
    let err = other
        .obtain("long", ms(300), &Options::default())
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
    assert!(!exists(&server, "long"));
    // Released: the signal fires.
    assert!(lost.wait_timeout(ms(1_000)).unwrap());
}

#[test]
fn the_lost_signal_fires_when_the_lock_expires() {
    let (_server, client) = connected();
    let lock = client
        .obtain("brief", ms(200), &Options::default())
        .unwrap();
    let lost = lock.lost_signal();
    assert!(!lost.wait_timeout(ms(50)).unwrap());
    let start = Instant::now();
    lost.wait().unwrap();
    assert!(start.elapsed() < ms(2_000), "{:?}", start.elapsed());
    assert!(lost.is_lost());
}

#[test]
fn with_lock_runs_the_work_under_the_lock_and_releases_it() {
    let (server, client) = connected();
    let options = Options::default().watchdog_interval(ms(50));
    let seen = client
        .with_lock(["{w}:a", "{w}:b"], ms(300), &options, |lost| {
            std::thread::sleep(ms(700));
            (lost.is_lost(), exists(&server, "{w}:a"))
        })
        .unwrap();
    assert_eq!(seen, (false, true));
    assert!(!exists(&server, "{w}:a") && !exists(&server, "{w}:b"));

    // Work that panics: the lock is released all the same.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        client.with_lock(["{w}:a"], ms(60_000), &Options::default(), |_| {
            panic!("the work failed")
        })
    }));
    assert!(panicked.is_err());
    eventually(ms(5_000), "the release after a panic", || {
        !exists(&server, "{w}:a")
    });
}

#[test]
fn threads_share_one_client_and_never_hold_one_key_together() {
    let (_server, client) = connected();
    let inside = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU32::new(0));
    let options = Options::default()
        .retry(Retry::linear(ms(5)))
        .timeout(ms(30_000));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (client, inside, done, options) = (
                client.clone(),
                inside.clone(),
                done.clone(),
                options.clone(),
            );
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let lock = client.obtain("shared", ms(10_000), &options).unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    std::thread::sleep(ms(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release().unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 60);
}

#[test]
fn modes_work_as_in_the_async_api() {
    let (_server, client) = connected();
    let one = client
        .obtain(("catalog", Mode::Shared), ms(10_000), &Options::default())
        .unwrap();
    let two = client
        .obtain(("catalog", Mode::Shared), ms(10_000), &Options::default())
        .unwrap();
    let err = client
        .obtain("catalog", ms(10_000), &Options::default())
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    one.release().unwrap();
    two.release().unwrap();
    client
        .obtain("catalog", ms(10_000), &Options::default())
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn a_redlock_quorum_of_blocking_clients() {
    let (servers, redlock) = quorum_of_three();
    let lock = redlock
        .obtain("report", ms(10_000), &Options::default())
        .unwrap();
    eventually(ms(5_000), "the lock on every master", || {
        servers.iter().all(|server| exists(server, "report"))
    });
    lock.release().unwrap();
    assert!(redlock.wait_background(ms(5_000)).unwrap());
    assert!(servers.iter().all(|server| !exists(server, "report")));
}

/// A quorum's last handle dropped inside an async runtime with a dropped guard: its release
/// goes over the masters' connections, which stay up until it is done.
#[test]
fn a_quorums_last_handle_dropped_inside_an_async_runtime_still_releases_a_dropped_guard() {
    let (servers, redlock) = quorum_of_three();
    let guard = redlock
        .obtain("report", ms(60_000), &Options::default())
        .unwrap()
        .into_guard();
    eventually(ms(5_000), "the lock on every master", || {
        servers.iter().all(|server| exists(server, "report"))
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        drop(guard);
        drop(redlock);
    });
    eventually(ms(3_000), "the guard's release on every master", || {
        servers.iter().all(|server| !exists(server, "report"))
    });
}

#[test]
fn a_sentinel_client() {
    let failover = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(Failover::start(1));
    let client = Client::connect_sentinel(failover.config(Replication::all())).unwrap();
    let lock = client
        .obtain("report", ms(10_000), &Options::default())
        .unwrap();
    assert!(lock.ttl().unwrap().is_some());
    lock.release().unwrap();
}

#[test]
fn calls_from_inside_an_async_runtime_are_refused_not_a_panic() {
    let (server, client) = connected();
    let lock = client
        .obtain("job", ms(10_000), &Options::default())
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = server.url();
    let refused = runtime.block_on(async {
        let connect = Client::connect(&url).map(drop);
        let obtain = client
            .obtain("other", ms(10_000), &Options::default())
            .map(drop);
        let ttl = lock.ttl().map(drop);
        let in_blocking_thread = tokio::task::spawn_blocking({
            let client = client.clone();
            move || {
                client
                    .obtain("other", ms(10_000), &Options::default())
                    .map(drop)
            }
        })
        .await
        .unwrap();
        [connect, obtain, ttl, in_blocking_thread]
    });
    for outcome in refused {
        let err = outcome.unwrap_err();
        assert!(err.is_inside_async_runtime(), "{err:?}");
        assert!(matches!(err, Error::InsideAsyncRuntime));
    }
    // Nothing was sent.
    assert!(!exists(&server, "other"));
    // Dropping the last handle of a client inside a runtime neither panics nor blocks.
    runtime.block_on(async move {
        drop(lock);
        drop(client);
    });
}
