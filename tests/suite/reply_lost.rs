//! The fault that matters most: the server ran the command and its reply was lost (the
//! connection reset before the reply arrived). The client cannot know what happened; each
//! test checks what the library promises then, from the server's side.

use crate::support;

use std::time::Duration;

use lockset::{Error, Options, Retry};
use support::proxy::Proxy;
use support::{RedisServer, client_with_timeout, connect, eventually, ms};
use tokio::time::Instant;

/// Runs a raw command on `server` over a fresh connection.
async fn cmd<T: lockset::redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut conn = connect(server).await;
    let mut cmd = lockset::redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut conn).await.expect("raw command")
}

async fn exists(server: &RedisServer, key: &str) -> bool {
    cmd::<i64>(server, &["EXISTS", key]).await == 1
}

/// A private server behind a proxy, and a lock client through the proxy whose scripts are
/// loaded (so that a lost reply is the script's own, not a NOSCRIPT retry).
async fn setup() -> (
    RedisServer,
    Proxy,
    lockset::Client<lockset::redis::aio::ConnectionManager>,
) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client_with_timeout(&proxy.url(), ms(2_000)).await;
    let warm = client
        .obtain_multi(
            ["warm:1", "warm:2"],
            ms(5_000),
            &Options::default().fencing_key("warm:n"),
        )
        .await
        .unwrap();
    warm.refresh(ms(5_000), &Options::default()).await.unwrap();
    warm.ttl().await.unwrap();
    warm.release().await.unwrap();
    // A single key too: on Redis 6.2 the first one learns that SET NX GET is not there.
    let warm = client
        .obtain("warm:3", ms(5_000), &Options::default())
        .await
        .unwrap();
    warm.release().await.unwrap();
    (server, proxy, client)
}

#[tokio::test]
async fn an_obtain_whose_reply_is_lost_is_an_unknown_outcome_released_by_token() {
    let (server, proxy, client) = setup().await;
    proxy.lose_next_reply();
    let err = client
        .obtain_multi(["a", "b"], ms(60_000), &Options::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");
    assert_eq!(proxy.replies_lost(), 1);
    // It ran on the server; the clean-up by its token removes it, long before 60 s.
    eventually(ms(10_000), "released by token", async || {
        !exists(&server, "a").await && !exists(&server, "b").await
    })
    .await;
    tokio::time::timeout(ms(10_000), client.background_idle())
        .await
        .expect("clean-up done");
}

#[tokio::test]
async fn a_custom_token_obtain_whose_reply_is_lost_is_left_to_its_owner() {
    let (server, proxy, client) = setup().await;
    let mine = Options::default().token("my-token");
    proxy.lose_next_reply();
    let err = client.obtain("job", ms(60_000), &mine).await.unwrap_err();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");
    // The token may have held the key before: nothing deletes it; obtaining again with the
    // token finds out, and gets it.
    assert!(exists(&server, "job").await);
    let lock = client
        .obtain(
            "job",
            ms(60_000),
            &mine.clone().retry(Retry::linear(ms(50))),
        )
        .await
        .unwrap();
    lock.release().await.unwrap();
    assert!(!exists(&server, "job").await);
}

#[tokio::test]
async fn a_fencing_obtain_whose_reply_is_lost_burns_its_token_and_never_reuses_it() {
    let (server, proxy, client) = setup().await;
    let fenced = Options::default().fencing().retry(Retry::linear(ms(50)));
    let first = client.obtain("job", ms(60_000), &fenced).await.unwrap();
    let first_token = first.fencing_token().unwrap();
    first.release().await.unwrap();
    proxy.lose_next_reply();
    let err = client
        .obtain("job", ms(60_000), &Options::default().fencing())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");
    // The counter moved on the server, and the lock is released by token.
    eventually(ms(10_000), "released by token", async || {
        !exists(&server, "job").await
    })
    .await;
    let next = client.obtain("job", ms(60_000), &fenced).await.unwrap();
    assert!(
        next.fencing_token().unwrap() >= first_token + 2,
        "{first_token} then {:?}: the lost obtain's token is burnt, never handed out",
        next.fencing_token()
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_refresh_whose_reply_is_lost_caps_the_validity_from_its_send() {
    let (server, proxy, client) = setup().await;
    let lock = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    proxy.lose_next_reply();
    let err = lock
        .refresh(ms(2_000), &Options::default())
        .await
        .unwrap_err();
    let returned = Instant::now();
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(proxy.replies_lost(), 1);
    // It ran: the key now lives 2 s from then, and the holder believes no longer than that.
    let left: i64 = cmd(&server, &["PTTL", "job"]).await;
    assert!(left > 0 && left <= 2_000, "{left}");
    assert!(
        lock.valid_until() <= returned + ms(2_000),
        "validity {:?} past the failed refresh + 2 s",
        lock.valid_until() - returned
    );
    // After the reconnect, a refresh succeeds and the validity follows it.
    lock.refresh(ms(30_000), &Options::default().retry(Retry::linear(ms(50))))
        .await
        .unwrap();
    assert!(lock.valid_until() > Instant::now() + ms(20_000));
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_release_whose_reply_is_lost_reports_an_error_but_the_keys_are_gone() {
    let (server, proxy, client) = setup().await;
    let lock = client
        .obtain_multi(["a", "b", "c"], ms(60_000), &Options::default())
        .await
        .unwrap();
    let lost = lock.lost_signal();
    proxy.lose_next_reply();
    let err = lock.release().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(proxy.replies_lost(), 1);
    // The holder stopped believing when it asked for the release.
    assert!(lost.is_lost());
    // It ran: every key is gone, and anyone can take them.
    for key in ["a", "b", "c"] {
        assert!(!exists(&server, key).await, "{key}");
    }
    let other = client_with_timeout(&server.url(), ms(2_000)).await;
    other
        .obtain_multi(["a", "b", "c"], ms(5_000), &Options::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_reset_while_the_request_is_held_back_never_reaches_the_server() {
    let (server, proxy, client) = setup().await;
    proxy.stall(true);
    let sent = proxy.requests() + 1;
    let once = Options::default();
    let (outcome, ()) = tokio::join!(client.obtain("job", ms(60_000), &once), async {
        proxy.wait_for(Proxy::requests, sent).await;
        proxy.drop_connections();
        proxy.stall(false);
    });
    let err = outcome.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(proxy.resets() >= 1);
    // A reset (RST) discards what the proxy held: the obtain never ran.
    tokio::time::timeout(Duration::from_secs(10), client.background_idle())
        .await
        .expect("clean-up done");
    assert!(!exists(&server, "job").await);
}

/// With 300 ms of latency each way, a validity counted from the reply would run 600 ms past
/// the keys' expiry; counted from the send, it ends before it.
#[tokio::test]
async fn validity_counts_from_the_send_not_the_reply() {
    let (_server, proxy, client) = setup().await;
    proxy.set_latency(ms(300));
    let before = Instant::now();
    let lock = client
        .obtain_multi(["a", "b"], ms(10_000), &Options::default())
        .await
        .unwrap();
    assert!(before.elapsed() >= ms(600), "the latency applies");
    assert!(
        lock.valid_until() < before + ms(10_000) + ms(300),
        "obtain: validity {:?} from the call",
        lock.valid_until() - before
    );
    let before = Instant::now();
    lock.refresh(ms(10_000), &Options::default()).await.unwrap();
    assert!(
        lock.valid_until() < before + ms(10_000) + ms(300),
        "refresh: validity {:?} from the call",
        lock.valid_until() - before
    );
    let before = Instant::now();
    lock.ttl().await.unwrap();
    assert!(lock.valid_until() < before + ms(10_000) + ms(300));
    proxy.set_latency(Duration::ZERO);
    lock.release().await.unwrap();
}
