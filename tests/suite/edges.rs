//! The edges: a release is all or nothing, validity is never more than the server grants,
//! Redlock never deletes or resurrects a lock behind its holder's back, and errors say what
//! happened. Each test here names a hole found in an earlier version.

use crate::support;

use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Error, InvalidInput, Options, QuorumConfig, Retry};
use support::masters::Masters;
use support::proxy::Proxy;
use support::{Env, RedisServer, client_with_timeout, eventually, ms};
use tokio::time::Instant;

fn patient() -> Options {
    Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(Duration::from_secs(20))
}

// ---------------------------------------------------------------------------------------
// 1. A release is all or nothing, whatever announcing it does.

/// A lock client of a user who may not PUBLISH: Redis 7's default
/// `acl-pubsub-default resetchannels`, spelled out (6.2 defaults to all channels).
async fn client_without_channel_rights(env: &Env) -> Client<ConnectionManager> {
    env.cmd::<String>(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~*",
        "+@all",
        "resetchannels",
    ])
    .await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", env.server.port());
    Client::connect(&url).await.unwrap()
}

#[tokio::test]
async fn a_release_deletes_every_key_even_when_announcing_is_forbidden() {
    let env = Env::start().await;
    let client = client_without_channel_rights(&env).await;
    let lock = client
        .obtain_multi(["a", "b", "c"], ms(60_000), &Options::default())
        .await
        .unwrap();
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0, "a key outlived its release");
}

// The release announces the keys a waiter marked; the announcement is what a user without
// channel rights may not send. Every key must go all the same, and the release succeed.
#[tokio::test]
async fn a_release_of_marked_keys_by_a_user_without_channel_rights_deletes_every_key() {
    let env = Env::start().await;
    let holder = client_without_channel_rights(&env).await;
    let keys = ["{m}:a", "{m}:b", "{m}:c"];
    let lock = holder
        .obtain_multi(keys, ms(60_000), &Options::default())
        .await
        .unwrap();
    // A waiter of another client (with channel rights) marks the key it finds held first.
    let waiter = tokio::spawn({
        let client = env.other_client().await;
        async move { client.obtain_multi(keys, ms(1_000), &patient()).await }
    });
    eventually(ms(10_000), "a key marked", async || {
        env.get(keys[0]).await.is_some_and(|v| v.starts_with('!'))
    })
    .await;
    let denied = async || {
        env.cmd::<Vec<lockset::redis::Value>>(&["ACL", "LOG"])
            .await
            .len()
    };
    let before = denied().await;
    lock.release().await.unwrap();
    // The waiter gets every key (by polling: the announcement was refused) ...
    let obtained = tokio::time::timeout(ms(10_000), waiter)
        .await
        .expect("the waiter obtains the released keys")
        .unwrap()
        .unwrap();
    // ... and the release did try to announce (else this test would not test it): the
    // server logged a denied channel.
    assert!(denied().await > before, "no announcement was tried");
    obtained.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0, "a key outlived its release");
}

#[tokio::test]
async fn a_client_without_release_events_announces_nothing_and_polls() {
    let env = Env::start().await;
    let quiet = env.other_client().await.without_release_events();
    let holder = quiet
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let retries = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let waiter = tokio::spawn({
        let (quiet, counted) = (quiet.clone(), retries.clone());
        async move {
            let options = Options::default()
                .retry(Retry::linear(ms(20)))
                .timeout(ms(20_000))
                .on_retry(move |_| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            quiet.obtain("job", ms(1_000), &options).await
        }
    });
    // Let the waiter fail at least once, so that it would listen if it could (counted by
    // its retries: on Redis 6.2 an attempt is a script, on 7 a SET).
    eventually(ms(10_000), "a retry", async || {
        retries.load(std::sync::atomic::Ordering::SeqCst) >= 1 || waiter.is_finished()
    })
    .await;
    assert!(
        !waiter.is_finished(),
        "the waiter ended: {:?}",
        waiter.await
    );
    assert_eq!(quiet.release_channels_watched(), 0);
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(env.calls("publish").await, 0, "a quiet client announced");
    assert_eq!(env.calls("subscribe").await, 0, "a quiet client listened");
}

// ---------------------------------------------------------------------------------------
// 2. Validity follows the last refresh that was sent, and never exceeds the keys' life.

#[tokio::test]
async fn a_refresh_to_a_shorter_ttl_shortens_the_validity() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let lost = lock.lost_signal();
    let before = Instant::now();
    lock.refresh(ms(1_500), &Options::default()).await.unwrap();
    let after = Instant::now();
    let until = lock.valid_until();
    assert!(until <= after + ms(1_500), "validity beyond the new TTL");
    assert!(
        until >= before + ms(1_500),
        "validity shorter than the new TTL"
    );

    tokio::time::timeout(ms(20_000), lost.lost()).await.unwrap();
    let late = Instant::now().saturating_duration_since(until);
    assert!(late < ms(1_000), "the lost signal fired {late:?} late");
    // The server agrees: the key is gone soon after.
    eventually(ms(10_000), "key expiry", async || !env.exists("job").await).await;
}

#[tokio::test]
async fn a_reobtain_with_a_shorter_ttl_never_shortens_what_the_token_holds() {
    let env = Env::start().await;
    let token = Options::default().token("outer-token");
    let outer = env.client.obtain("job", ms(60_000), &token).await.unwrap();
    let outer_until = outer.valid_until();
    let inner = env
        .client
        .obtain_multi(["job", "extra"], ms(1_000), &token)
        .await
        .unwrap();
    let job: i64 = env.cmd(&["PTTL", "job"]).await;
    let extra: i64 = env.cmd(&["PTTL", "extra"]).await;
    assert!(
        job > 50_000,
        "the re-obtain shortened the outer lock's key to {job} ms"
    );
    assert!(extra <= 1_000, "a new key got {extra} ms");
    assert_eq!(outer.valid_until(), outer_until);
    assert!(inner.valid_until() <= Instant::now() + ms(1_000));
    // ... and a longer re-obtain extends it.
    env.client.obtain("job", ms(120_000), &token).await.unwrap();
    let job: i64 = env.cmd(&["PTTL", "job"]).await;
    assert!(job > 100_000, "{job}");
}

#[tokio::test]
async fn a_refresh_with_an_unknown_outcome_never_leaves_a_validity_longer_than_the_keys() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client_with_timeout(&proxy.url(), ms(300)).await;
    let lock = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    proxy.set_latency(ms(1_000));
    let err = lock
        .refresh(ms(2_000), &Options::default())
        .await
        .unwrap_err();
    let returned = Instant::now();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    // The refresh may have run: then the key expires 2 s after it was sent.
    assert!(
        lock.valid_until() <= returned + ms(2_000),
        "validity still {:?} ahead",
        lock.valid_until() - Instant::now()
    );
    proxy.set_latency(Duration::ZERO);
}

// ---------------------------------------------------------------------------------------
// 3.–6. Redlock.

fn config() -> QuorumConfig {
    QuorumConfig::default().node_timeout(ms(300))
}

/// Waits until every node client has sent everything queued before (a lock operation on
/// the same connection runs after them).
async fn flush(m: &Masters) {
    for (i, node) in m.nodes.iter().enumerate() {
        let probe = format!("flush:{i}");
        let lock = node.obtain(probe, ms(10_000), &patient()).await.unwrap();
        lock.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_failed_redlock_reobtain_by_token_never_deletes_the_lock_the_token_held() {
    let m = Masters::start(config()).await;
    let token = Options::default().token("job-owner-token");
    let outer = m.redlock.obtain("job", ms(30_000), &token).await.unwrap();
    let value = "15:job-owner-token";
    eventually(ms(10_000), "all masters hold it", async || {
        m.holding(&["job"], value).await == 5
    })
    .await;

    for i in 2..5 {
        m.servers[i].pause();
    }
    let err = m
        .redlock
        .obtain("job", ms(30_000), &token)
        .await
        .unwrap_err();
    for i in 2..5 {
        m.servers[i].resume();
    }
    assert!(err.is_unavailable(), "{err:?}");
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    flush(&m).await;

    assert_eq!(
        m.holding(&["job"], value).await,
        5,
        "the failed re-obtain deleted keys"
    );
    let rival = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap_err();
    assert!(rival.is_not_obtained(), "{rival:?}");
    assert!(outer.ttl().await.unwrap().is_some());
}

#[tokio::test]
async fn a_redlock_refresh_never_brings_back_a_lock_that_expired_everywhere() {
    let m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain_multi(["{j}:a", "{j}:b"], ms(300), &Options::default())
        .await
        .unwrap();
    eventually(ms(10_000), "expiry everywhere", async || {
        m.dbsizes(0..5).await == vec![0; 5]
    })
    .await;
    let err = lock
        .refresh(ms(30_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5], "keys were re-created");
    assert!(lock.lost_signal().is_lost());
}

#[tokio::test]
async fn a_redlock_refresh_restores_restarted_masters_only_while_a_majority_holds_the_lock() {
    let mut m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    // The obtain returned once a majority agreed; a write to a slower master still on its
    // way would land on a master restarted below and make a majority hold the lock again
    // (CI on valkey-8.1, 2026-11-29: the refresh then succeeded, as it should there).
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("the obtain's writes done within 10 s");
    // A majority forgets the lock; nobody else takes it.
    for i in 0..3 {
        m.servers[i].restart();
    }
    // Retried while the nodes reconnect; then a majority answers "not held".
    let err = lock.refresh(ms(30_000), &patient()).await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    assert_eq!(m.dbsizes(0..3).await, vec![0; 3], "keys were re-created");
}

#[tokio::test]
async fn redlock_ttl_with_a_majority_unreachable_is_an_error_not_a_loss() {
    let m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    let lost = lock.lost_signal();
    let until = lock.valid_until();
    for i in 2..5 {
        m.servers[i].pause();
    }
    let answer = lock.ttl().await;
    for i in 2..5 {
        m.servers[i].resume();
    }
    let err = answer.unwrap_err();
    assert!(matches!(err, Error::Quorum { .. }), "{err:?}");
    assert!(err.is_unavailable() && !err.is_not_held(), "{err:?}");
    assert!(!lost.is_lost(), "slow masters fired the lost signal");
    assert_eq!(lock.valid_until(), until);
    // The masters that missed their deadline take part again once a probe finds them
    // answering (one PING away).
    eventually(ms(1_000), "the resumed masters answer", async || {
        lock.ttl().await.is_ok_and(|left| left.is_some())
    })
    .await;
}

#[tokio::test]
async fn redlock_obtain_and_refresh_reach_every_master_that_is_up() {
    // Four masters direct, one behind 30 ms of latency: it always answers last, after the
    // decision. Fresh masters: the scripts are not loaded (NOSCRIPT, then a retry).
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let proxy = Proxy::start(servers[4].port()).await;
    let mut nodes = Vec::new();
    for server in &servers[..4] {
        nodes.push(Client::connect(&server.url()).await.unwrap());
    }
    nodes.push(Client::connect(&proxy.url()).await.unwrap());
    let redlock = Client::quorum(
        nodes.clone(),
        QuorumConfig::default().node_timeout(ms(2_000)),
    )
    .unwrap();
    let m = Masters {
        servers,
        nodes,
        redlock: redlock.clone(),
    };
    proxy.set_latency(ms(30));

    let keys = ["{r}:a", "{r}:b"];
    let lock = redlock
        .obtain_multi(keys, ms(10_000), &Options::default())
        .await
        .unwrap();
    let value = format!("22:{}", lock.token());
    eventually(ms(10_000), "every master holds the lock", async || {
        m.holding(&keys, &value).await == 5
    })
    .await;

    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    eventually(ms(10_000), "every master refreshed", async || {
        m.pttl(4, "{r}:b").await > 30_000
    })
    .await;
    // The release returns once a majority deleted; the slow master's delete goes on in the
    // background.
    lock.release().await.unwrap();
    tokio::time::timeout(ms(10_000), redlock.background_idle())
        .await
        .expect("background tasks");
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5]);
}

// ---------------------------------------------------------------------------------------
// 7. Fencing counters are never lock keys.

#[tokio::test]
async fn a_fencing_counter_that_is_also_a_lock_key_is_refused_before_sending() {
    let env = Env::start().await;
    let err = env
        .client
        .obtain_multi(
            ["x", "{x}:fence"],
            ms(10_000),
            &Options::default().fencing(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(InvalidInput::FencingKeyIsLocked { key }) if key == "{x}:fence"),
        "{err:?}"
    );
    let err = env
        .client
        .obtain("{y}b", ms(10_000), &Options::default().fencing_key("{y}b"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(InvalidInput::FencingKeyIsLocked { key }) if key == "{y}b"),
        "{err:?}"
    );
    // An empty counter key, as an empty lock key is: refused, no key "" counted.
    let err = env
        .client
        .obtain("z", ms(10_000), &Options::default().fencing_key(""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(InvalidInput::EmptyFencingKey)),
        "{err:?}"
    );
    assert_eq!(env.dbsize().await, 0);
    assert_eq!(env.calls("evalsha").await + env.calls("set").await, 0);
}

// ---------------------------------------------------------------------------------------
// Errors that say what happened.

#[tokio::test]
async fn a_counter_that_is_not_an_integer_surfaces_the_servers_own_error() {
    let env = Env::start().await;
    env.cmd::<String>(&["SET", "{job}:fence", "not a number"])
        .await;
    let err = env
        .client
        .obtain("job", ms(60_000), &Options::default().fencing())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(err.to_string().contains("not an integer"), "{err}");
    assert!(!env.exists("job").await);
}

#[tokio::test]
async fn a_counter_holding_a_hash_is_a_wrong_type_error_naming_it() {
    let env = Env::start().await;
    env.cmd::<i64>(&["HSET", "{job}:fence", "f", "v"]).await;
    let err = env
        .client
        .obtain_multi(
            ["job", "{job}:other"],
            ms(60_000),
            &Options::default().fencing(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key } if key == "{job}:fence"),
        "{err:?}"
    );
    assert!(!env.exists("job").await && !env.exists("{job}:other").await);
}

#[tokio::test]
async fn quorum_errors_tell_unavailable_apart_from_held() {
    let mut m = Masters::start(config()).await;
    // Held by someone else on a majority: not obtained.
    for i in 0..3 {
        m.nodes[i]
            .obtain("held", ms(60_000), &Options::default())
            .await
            .unwrap();
    }
    let err = m
        .redlock
        .obtain("held", ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_obtained() && !err.is_unavailable(), "{err:?}");

    // A majority down: unavailable, not "held by someone else".
    for i in 0..3 {
        m.servers[i].stop();
    }
    let err = m
        .redlock
        .obtain("free", ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_unavailable() && !err.is_not_obtained(), "{err:?}");
}

#[tokio::test]
async fn quorums_refuse_the_same_server_twice_and_a_zero_node_timeout() {
    let m = Masters::start(config()).await;
    let same_client = [m.nodes[0].clone(), m.nodes[0].clone(), m.nodes[1].clone()];
    let err = Client::quorum(same_client, config()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::DuplicateNode { .. })),
        "{err:?}"
    );
    let again = Client::connect(&m.servers[0].url()).await.unwrap();
    let same_address = [m.nodes[0].clone(), again, m.nodes[1].clone()];
    let err = Client::quorum(same_address, config()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::DuplicateNode { .. })),
        "{err:?}"
    );
    let err = Client::quorum(
        m.nodes.clone(),
        QuorumConfig::default().node_timeout(Duration::ZERO),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::ZeroNodeTimeout)),
        "{err:?}"
    );
    // Release events belong to each master's client; a quorum cannot take one of its own.
    let url = m.servers[0].url();
    let err = m
        .redlock
        .clone()
        .with_release_events(lockset::redis::Client::open(url).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::ReleaseEventsNeedOneServer)
        ),
        "{err:?}"
    );
    // Nor a bound on one connection's requests: its attempts wait for every master.
    let err = m
        .redlock
        .clone()
        .connection_answers_within(ms(500))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::AnswerBoundNeedsOneConnection)
        ),
        "{err:?}"
    );
    // A master's own client takes one, but not a zero one.
    let err = m.nodes[0]
        .clone()
        .connection_answers_within(Duration::ZERO)
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::ZeroAnswerBound)),
        "{err:?}"
    );
    assert!(
        m.nodes[0]
            .clone()
            .connection_answers_within(ms(500))
            .is_ok()
    );
}

// ---------------------------------------------------------------------------------------
// The keys people have.

#[tokio::test]
async fn obtain_multi_takes_the_keys_people_have() {
    let env = Env::start().await;
    let c = &env.client;
    let o = Options::default();
    let ttl = ms(10_000);
    let owned: Vec<String> = vec!["c".into(), "d".into()];
    let slice: &[String] = &owned;

    c.obtain_multi(&["a", "b"], ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(["a", "b"], ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(&owned, ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(slice, ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(owned.iter().map(String::as_str), ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(owned.clone(), ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain_multi(vec!["e", "f"], ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain(&owned[0], ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.obtain(owned[0].clone(), ttl, &o)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(env.dbsize().await, 0);
}

// ---------------------------------------------------------------------------------------
// Found by review of the first fix: each failed on it.

fn once() -> Options {
    Options::default().retry(Retry::NoRetry)
}

/// Loads the scripts on every master.
async fn warm_up(m: &Masters) {
    m.redlock
        .obtain_multi(["{w}:a", "{w}:b"], ms(10_000), &once())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_failed_redlock_obtain_by_token_never_deletes_a_concurrent_success_by_that_token() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(2_000))).await;
    warm_up(&m).await;
    let keys = ["{j}:a", "{j}:b"];
    let token = once().token("shared-token");
    for server in &m.servers {
        server.pause();
    }
    // The first attempt's validity runs out while the masters are paused.
    let first = tokio::spawn({
        let (redlock, token) = (m.redlock.clone(), token.clone());
        async move { redlock.obtain_multi(keys, ms(50), &token).await }
    });
    tokio::time::sleep(ms(30)).await;
    let second = tokio::spawn({
        let (redlock, token) = (m.redlock.clone(), token.clone());
        async move { redlock.obtain_multi(keys, ms(30_000), &token).await }
    });
    tokio::time::sleep(ms(100)).await;
    for server in &m.servers {
        server.resume();
    }
    assert!(first.await.unwrap().is_err());
    let second = second.await.unwrap().expect("the second obtains");
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    flush(&m).await;
    let rival = m.redlock.obtain_multi(keys, ms(30_000), &once()).await;
    assert!(
        rival.is_err(),
        "a rival obtained while the second believes {:?} more",
        second
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_cancelled_redlock_obtain_by_token_never_deletes_the_retry_by_that_token() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(2_000))).await;
    warm_up(&m).await;
    let keys = ["{j}:a", "{j}:b"];
    let token = once().token("shared-token");
    for server in &m.servers {
        server.pause();
    }
    let first =
        tokio::time::timeout(ms(50), m.redlock.obtain_multi(keys, ms(30_000), &token)).await;
    assert!(first.is_err(), "cancelled");
    let retry = tokio::spawn({
        let (redlock, token) = (m.redlock.clone(), token.clone());
        async move { redlock.obtain_multi(keys, ms(30_000), &token).await }
    });
    tokio::time::sleep(ms(50)).await;
    for server in &m.servers {
        server.resume();
    }
    let lock = retry.await.unwrap().expect("the retry obtains");
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    flush(&m).await;
    let rival = m.redlock.obtain_multi(keys, ms(30_000), &once()).await;
    assert!(
        rival.is_err(),
        "a rival obtained while the retry believes {:?} more",
        lock.valid_until().saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_cancelled_refresh_to_a_shorter_ttl_caps_the_validity() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = Client::connect(&proxy.url()).await.unwrap();
    let lock = client.obtain("job", ms(60_000), &once()).await.unwrap();
    // Load refresh.lua, so that the slow request below is the refresh itself.
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    proxy.set_latency(ms(200));
    let cancelled =
        tokio::time::timeout(ms(50), lock.refresh(ms(1_000), &Options::default())).await;
    assert!(cancelled.is_err(), "cancelled");
    proxy.set_latency(Duration::ZERO);
    assert!(
        lock.valid_until() <= Instant::now() + ms(1_000),
        "validity {:?} ahead, beyond the cancelled refresh's TTL",
        lock.valid_until().saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_cancelled_redlock_refresh_to_a_shorter_ttl_caps_the_validity() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(2_000))).await;
    let lock = m.redlock.obtain("job", ms(60_000), &once()).await.unwrap();
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    for server in &m.servers {
        server.pause();
    }
    let cancelled =
        tokio::time::timeout(ms(50), lock.refresh(ms(1_000), &Options::default())).await;
    for server in &m.servers {
        server.resume();
    }
    assert!(cancelled.is_err(), "cancelled");
    assert!(
        lock.valid_until() <= Instant::now() + ms(1_000),
        "validity {:?} ahead, beyond the cancelled refresh's TTL",
        lock.valid_until().saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_confirmed_refresh_never_lifts_the_cap_of_a_later_unconfirmed_one() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client_with_timeout(&proxy.url(), ms(300)).await;
    let lock = client.obtain("job", ms(60_000), &once()).await.unwrap();
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    proxy.set_latency(ms(100));
    // A long refresh, then a short one sent after it and cancelled in flight: it still runs
    // after the long one on the server.
    let (long_options, short_options) = (Options::default(), Options::default());
    let long = lock.refresh(ms(60_000), &long_options);
    let short = async {
        tokio::time::sleep(ms(20)).await;
        let cancelled = tokio::time::timeout(ms(30), lock.refresh(ms(1_000), &short_options)).await;
        assert!(cancelled.is_err(), "cancelled");
        // The refresh was sent before this moment.
        Instant::now()
    };
    let (long, short_sent) = tokio::join!(long, short);
    long.unwrap();
    proxy.set_latency(Duration::ZERO);
    assert!(
        lock.valid_until() <= short_sent + ms(1_000),
        "validity {:?} ahead, beyond the later refresh's TTL",
        lock.valid_until().saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_quorum_refuses_one_server_under_two_names() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let nodes = [
        Client::connect(&a.url()).await.unwrap(),
        Client::connect(&format!("redis://localhost:{}/", a.port()))
            .await
            .unwrap(),
        Client::connect(&b.url()).await.unwrap(),
    ];
    let quorum = Client::quorum(nodes, config()).unwrap();
    refuses_duplicate(&quorum, 0, 1).await;
}

/// Asserts that `quorum` refuses to obtain, naming masters `first` and `second` as one server.
///
/// Run ids are asked for beside the masters' first operation: the obtain that finds the two
/// names of one server is refused, unless distinct masters decided it before the second name
/// answered (then it holds a majority of distinct servers); every obtain after it is refused
/// before anything is sent.
async fn refuses_duplicate(quorum: &Client<ConnectionManager>, first: usize, second: usize) {
    let is_duplicate = |err: &Error| {
        matches!(
            err,
            Error::InvalidInput(InvalidInput::DuplicateNode { first: f, second: s })
                if (*f, *s) == (first, second)
        )
    };
    match quorum.obtain("job", ms(10_000), &once()).await {
        Ok(lock) => lock.release().await.unwrap(),
        Err(err) => assert!(is_duplicate(&err), "{err:?}"),
    }
    tokio::time::timeout(ms(10_000), quorum.background_idle())
        .await
        .unwrap();
    let err = quorum.obtain("job", ms(10_000), &once()).await.unwrap_err();
    assert!(is_duplicate(&err), "{err:?}");
}

// With the third master down, the two names of one server would make a "majority" of one
// server: the masters that answer are compared all the same.
#[tokio::test]
async fn a_quorum_refuses_one_server_under_two_names_while_another_master_is_down() {
    let a = RedisServer::start();
    let mut b = RedisServer::start();
    let nodes = [
        Client::connect(&b.url()).await.unwrap(),
        Client::connect(&a.url()).await.unwrap(),
        Client::connect(&format!("redis://localhost:{}/", a.port()))
            .await
            .unwrap(),
    ];
    b.stop();
    let quorum = Client::quorum(nodes, config()).unwrap();
    // Two answers from one server make no majority: the first obtain is refused too.
    let err = quorum.obtain("job", ms(10_000), &once()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::DuplicateNode {
                first: 1,
                second: 2
            })
        ),
        "{err:?}"
    );
    refuses_duplicate(&quorum, 1, 2).await;
    let keys: i64 = lockset::redis::cmd("DBSIZE")
        .query_async(&mut support::connect(&a).await)
        .await
        .unwrap();
    assert_eq!(
        keys, 0,
        "nothing is left once the refused obtains were undone"
    );
}

#[tokio::test]
async fn a_master_that_lost_the_keys_is_not_counted_as_held_by_another() {
    let mut m = Masters::start(config()).await;
    let lock = m.redlock.obtain("job", ms(30_000), &once()).await.unwrap();
    // Masters 3 and 4 must hold it: the restart and the pauses take the other three.
    m.spread(&lock).await;
    m.servers[0].restart();
    m.servers[1].pause();
    m.servers[2].pause();
    // Let master 0's client reconnect.
    let patient = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(10_000));
    m.nodes[0]
        .obtain("probe", ms(1_000), &patient)
        .await
        .unwrap();
    let err = lock.refresh(ms(30_000), &once()).await.unwrap_err();
    m.servers[1].resume();
    m.servers[2].resume();
    assert!(err.is_unavailable() && !err.is_not_obtained(), "{err}");
}

#[tokio::test]
async fn a_waiter_never_rewrites_a_value_this_library_did_not_write() {
    let env = Env::start().await;
    env.cmd::<String>(&["SET", "job", "hello"]).await;
    let options = Options::default()
        .retry(Retry::linear(ms(10)))
        .timeout(ms(300));
    let err = env
        .client
        .obtain("job", ms(1_000), &options)
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    assert_eq!(env.get("job").await.as_deref(), Some("hello"));
}

#[tokio::test]
async fn a_negative_fencing_counter_is_an_error_and_locks_nothing() {
    let env = Env::start().await;
    env.cmd::<String>(&["SET", "{job}:fence", "-5"]).await;
    let err = env
        .client
        .obtain("job", ms(60_000), &once().fencing())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not positive"), "{err}");
    assert!(!env.exists("job").await);
}

#[tokio::test]
async fn a_cancelled_guard_release_still_releases_on_drop() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = Client::connect(&proxy.url()).await.unwrap();
    let guard = client
        .obtain("job", ms(60_000), &once())
        .await
        .unwrap()
        .into_guard();
    proxy.set_latency(ms(200));
    let cancelled = tokio::time::timeout(ms(50), guard.release()).await;
    assert!(cancelled.is_err(), "cancelled");
    proxy.set_latency(Duration::ZERO);
    let mut raw = support::connect(&server).await;
    eventually(ms(10_000), "released", async || {
        let exists: i64 = lockset::redis::cmd("EXISTS")
            .arg("job")
            .query_async(&mut raw)
            .await
            .unwrap();
        exists == 0
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// 7. An obtain returns by its deadline, even when Redis stops answering mid-attempt.

/// How long past its deadline an obtain may return on a loaded machine.
const PAST_DEADLINE: Duration = Duration::from_millis(1_000);

#[tokio::test]
async fn an_obtain_returns_by_its_deadline_when_the_server_stops_answering() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    // Replies time out long after the deadline: only the deadline can end this obtain.
    let client = client_with_timeout(&proxy.url(), ms(10_000)).await;
    client
        .obtain("warm", ms(1_000), &Options::default())
        .await
        .unwrap();
    proxy.stall(true);
    let options = Options::default().timeout(ms(300));
    let start = Instant::now();
    let err = client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");
    assert!(took < ms(300) + PAST_DEADLINE, "returned after {took:?}");
    // The attempt reaches the server once it answers again, and is cleaned up behind it.
    proxy.stall(false);
    eventually(ms(8_000), "the cut attempt cleaned up", async || {
        !exists(&server, "job").await && client.background_tasks() == 0
    })
    .await;
}

#[tokio::test]
async fn a_redlock_obtain_returns_by_its_deadline_when_a_majority_stops_answering() {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let mut proxies = Vec::new();
    let mut nodes = Vec::new();
    for server in &servers {
        let proxy = Proxy::start(server.port()).await;
        nodes.push(client_with_timeout(&proxy.url(), ms(10_000)).await);
        proxies.push(proxy);
    }
    // The per-node limit (5% of the TTL: 3 s) is far beyond the deadline.
    let redlock = Client::quorum(nodes, QuorumConfig::default()).unwrap();
    // Connections made and scripts asked for, within a generous per-node limit (500 ms): a
    // loaded machine missed 50 ms here.
    redlock
        .obtain("warm", ms(10_000), &Options::default())
        .await
        .unwrap();
    for proxy in &proxies[..3] {
        proxy.stall(true);
    }
    let options = Options::default().timeout(ms(300));
    let start = Instant::now();
    let err = redlock
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(took < ms(300) + PAST_DEADLINE, "returned after {took:?}");
    for proxy in &proxies[..3] {
        proxy.stall(false);
    }
    for server in &servers {
        eventually(ms(8_000), "the cut attempt cleaned up", async || {
            !exists(server, "job").await
        })
        .await;
    }
    tokio::time::timeout(ms(8_000), redlock.background_idle())
        .await
        .expect("no background task left");
}

/// Whether `server` stores `key`, asked over a fresh connection.
async fn exists(server: &RedisServer, key: &str) -> bool {
    let mut conn = support::connect(server).await;
    let found: i64 = lockset::redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    found == 1
}

#[tokio::test]
async fn a_zero_timeout_still_tries_once() {
    let env = Env::start().await;
    let options = Options::default().timeout(Duration::ZERO);
    let lock = env.client.obtain("job", ms(5_000), &options).await.unwrap();
    let other = env.other_client().await;
    let err = other.obtain("job", ms(5_000), &options).await.unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    lock.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 8. Adopting a lock by its token (another process passed it on): nothing is written, and
//    a lock that expired stays lost.

#[tokio::test]
async fn an_adopted_lock_refreshes_to_a_shorter_ttl_and_releases() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain_multi(
            ["db", "cache"],
            ms(60_000),
            &Options::default().metadata("m"),
        )
        .await
        .unwrap();
    let other = env.other_client().await;
    let options = Options::default().token(lock.token()).metadata("m");
    let sent = Instant::now();
    let adopted = other
        .adopt(["db", "cache"], ms(30_000), &options)
        .await
        .unwrap();
    // Counted from the TTL query's send, for what the server said was left (at most 60 s).
    assert!(adopted.valid_until() <= Instant::now() + ms(60_000));
    assert!(adopted.valid_until() > sent + ms(50_000));
    assert_eq!(adopted.token(), lock.token());
    assert_eq!(adopted.fencing_token(), None);
    adopted
        .refresh(ms(5_000), &Options::default())
        .await
        .unwrap();
    let left: i64 = env.cmd(&["PTTL", "db"]).await;
    assert!(left > 0 && left <= 5_000, "{left}");
    adopted.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
    assert!(matches!(lock.release().await, Err(Error::NotHeld)));
}

#[tokio::test]
async fn adopting_takes_nothing_that_the_token_does_not_hold() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("db", ms(60_000), &Options::default())
        .await
        .unwrap();
    let token = Options::default().token(lock.token());
    // One key expired (or was never taken): nothing is created.
    let err = env
        .client
        .adopt(["db", "cache"], ms(10_000), &token)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert!(!env.exists("cache").await);
    // Another owner's lock.
    let err = env
        .client
        .adopt(
            ["db"],
            ms(10_000),
            &Options::default().token("not-the-token"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    let err = env
        .client
        .adopt(["db"], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::TokenRequired)),
        "{err:?}"
    );
    lock.release().await.unwrap();
    let err = env
        .client
        .adopt(["db"], ms(10_000), &token)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn a_redlock_lock_is_adopted_on_a_majority() {
    let m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    let token = Options::default().token(lock.token());
    let adopted = m.redlock.adopt(["job"], ms(30_000), &token).await.unwrap();
    // Redlock's drift allowance applies to an adopted lock's validity too.
    assert!(adopted.valid_until() < Instant::now() + ms(30_000));
    adopted.release().await.unwrap();
    // A release returns once a majority deleted the keys; the rest follow in the background.
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5]);
}
