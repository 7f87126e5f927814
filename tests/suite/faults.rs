//! Faults: connections reset or cut mid-reply, replies delayed past the timeout, servers
//! restarted empty or paused. No lock is ever held by two owners, and no key outlives its
//! TTL because of the library.

use crate::support;

use std::time::Duration;

use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use lockset::{Client, Error, Options, Retry};
use support::proxy::Proxy;
use support::{RedisServer, connect, eventually, lost_by, ms};
use tokio::time::Instant;

/// A lock client through `url`, with a short response timeout.
async fn client(url: &str) -> Client<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(ms(300)))
        .set_connection_timeout(Some(ms(1_000)));
    let conn =
        ConnectionManager::new_with_config(lockset::redis::Client::open(url).unwrap(), config)
            .await
            .unwrap();
    Client::new(conn)
}

/// Patient options, for "the next operation succeeds after reconnect".
fn patient() -> Options {
    Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(Duration::from_secs(20))
}

/// The key's remaining TTL in ms straight from the server (-2: gone).
async fn pttl(server: &RedisServer, key: &str) -> i64 {
    let mut conn = connect(server).await;
    lockset::redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Waits (bounded) until `key` is gone from `server`.
async fn until_gone(server: &RedisServer, key: &str, within: Duration) {
    eventually(within, key, async || pttl(server, key).await == -2).await;
}

#[tokio::test]
async fn a_reset_during_obtain_fails_it_and_the_next_obtain_succeeds() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client(&proxy.url()).await;
    proxy.stall(true);
    let once = Options::default();
    let sent = proxy.requests() + 1;
    let (outcome, ()) = tokio::join!(client.obtain("job", ms(10_000), &once), async {
        proxy.wait_for(Proxy::requests, sent).await; // the obtain is in flight
        proxy.drop_connections();
        proxy.stall(false);
    });
    let err = outcome.unwrap_err();
    assert!(
        matches!(err, Error::UnknownOutcome(_) | Error::Redis(_)),
        "{err:?}"
    );
    let lock = client.obtain("job", ms(10_000), &patient()).await.unwrap();
    // Held by exactly one owner.
    let other = client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(other.is_not_obtained(), "{other:?}");
    lock.release().await.unwrap();
    assert_eq!(pttl(&server, "job").await, -2);
}

#[tokio::test]
async fn a_reset_during_refresh_is_retried_after_reconnect() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client(&proxy.url()).await;
    let lock = client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    proxy.stall(true);
    let patient = patient();
    let sent = proxy.requests() + 1;
    let (refreshed, ()) = tokio::join!(lock.refresh(ms(30_000), &patient), async {
        proxy.wait_for(Proxy::requests, sent).await; // the refresh is in flight
        proxy.drop_connections();
        proxy.stall(false);
    });
    refreshed.unwrap();
    assert!(pttl(&server, "job").await > 20_000);
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_reset_during_release_leaves_the_lock_to_its_ttl_and_nobody_else() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client(&proxy.url()).await;
    let lock = client
        .obtain("job", ms(2_000), &Options::default())
        .await
        .unwrap();
    proxy.stall(true);
    let sent = proxy.requests() + 1;
    let (released, ()) = tokio::join!(lock.release(), async {
        proxy.wait_for(Proxy::requests, sent).await; // the release is in flight
        proxy.drop_connections();
        proxy.stall(false);
    });
    assert!(released.is_err());
    // The release never arrived: the lock is still held, and only for its TTL.
    let left = pttl(&server, "job").await;
    assert!(left > 0 && left <= 2_000, "{left}");
    let direct = Client::new(connect(&server).await);
    assert!(
        direct
            .obtain("job", ms(10_000), &Options::default())
            .await
            .unwrap_err()
            .is_not_obtained()
    );
    until_gone(&server, "job", Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_reply_cut_midway_is_an_unknown_outcome_cleaned_up_by_token() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client(&proxy.url()).await;
    // Load the scripts first, so the cut hits the obtain itself.
    client
        .obtain_multi(["a", "b"], ms(1_000), &Options::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.cut_next_reply();
    let err = client
        .obtain_multi(["a", "b"], ms(60_000), &Options::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::UnknownOutcome(_) | Error::Redis(_)),
        "{err:?}"
    );
    // The obtain ran on the server; its clean-up removes it, long before the 60 s TTL.
    until_gone(&server, "a", Duration::from_secs(10)).await;
    until_gone(&server, "b", Duration::from_secs(10)).await;
    client
        .obtain_multi(["a", "b"], ms(5_000), &patient())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_reply_delayed_past_the_timeout_is_an_unknown_outcome_cleaned_up_by_token() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client(&proxy.url()).await;
    client
        .obtain("warm", ms(1_000), &Options::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(ms(800));
    let err = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");
    proxy.set_latency(Duration::ZERO);
    // The delayed obtain did lock the key, and the clean-up queued behind it removes it,
    // long before its 60 s TTL.
    until_gone(&server, "job", Duration::from_secs(20)).await;
}

#[tokio::test]
async fn a_server_restarted_empty_reports_every_lock_lost() {
    let mut server = RedisServer::start();
    let client = client(&server.url()).await;
    let lock = client
        .obtain_multi(["a", "b"], ms(60_000), &Options::default())
        .await
        .unwrap();
    server.restart();
    // The first command after the restart may meet the dead connection; then it reconnects.
    let start = Instant::now();
    let left = loop {
        match lock.ttl().await {
            Ok(left) => break left,
            Err(_) => assert!(
                start.elapsed() < Duration::from_secs(20),
                "never reconnected"
            ),
        }
        tokio::time::sleep(ms(50)).await;
    };
    assert_eq!(left, None);
    assert!(lock.lost_signal().is_lost());
    assert!(matches!(
        lock.refresh(ms(60_000), &patient()).await,
        Err(Error::NotHeld)
    ));
    assert!(matches!(lock.release().await, Err(Error::NotHeld)));
    assert_eq!(
        pttl(&server, "a").await,
        -2,
        "refresh must not recreate a lost lock"
    );
}

#[tokio::test]
async fn a_server_paused_past_the_ttl_fires_the_lost_signal_of_a_kept_alive_lock() {
    let server = RedisServer::start();
    let client = client(&server.url()).await;
    let guard = client
        .obtain("job", ms(300), &Options::default())
        .await
        .unwrap()
        .keep_alive();
    let lost = guard.lost_signal();
    server.pause();
    // No refresh succeeds while it is paused: the signal fires when the validity runs out,
    // while the server is still paused.
    let due = guard.valid_until();
    lost_by(&lost, due).await;
    server.resume();
    drop(guard);
}

/// A refresh cut at its deadline by a paused server is a Redis error (the reply did not come
/// in time), not an obtain's unknown outcome, and its message speaks of no obtain.
#[tokio::test]
async fn a_refresh_cut_at_its_deadline_is_a_redis_error() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let lock = client
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    server.pause();
    let start = tokio::time::Instant::now();
    let err = lock
        .refresh(ms(30_000), &Options::default().timeout(ms(300)))
        .await
        .unwrap_err();
    let took = start.elapsed();
    server.resume();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(!err.to_string().contains("obtain"), "{err}");
    // The deadline, the attempt's grace past it, and a loaded machine's slack.
    assert!(took < ms(700), "{took:?}");
}

/// A server that went away (its port refusing connections) costs each call of a client
/// made by `Client::connect` a short reconnection attempt, not the connection manager's
/// first-connection retries (about 9.5 s for every `ttl()` and `release()` before): the
/// keys expire with their TTL, and the caller hears at once that Redis is gone.
#[tokio::test]
async fn calls_against_a_server_gone_end_within_a_second() {
    let mut server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let lock = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    server.stop();
    // The first call meets the dead connection; the next ones try to reconnect.
    let _ = lock.ttl().await;
    for call in 0..2 {
        let start = Instant::now();
        let ttl = lock.ttl().await;
        assert!(ttl.is_err(), "{ttl:?}");
        let took = start.elapsed();
        assert!(took < ms(1_500), "call {call}: ttl() took {took:?}");
    }
    let start = Instant::now();
    assert!(lock.release().await.is_err());
    let took = start.elapsed();
    assert!(took < ms(1_500), "release() took {took:?}");
}
