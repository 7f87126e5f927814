//! What an error tells: who holds a refused key (its metadata, never its token) and for how
//! long; and that a refresh of a lock that is gone says "not held", the error that means
//! "stop the work".

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockset::{Error, Lock, Mode, Options, QuorumConfig, Retry};
use support::masters::Masters;
use support::{Env, ms};
use tokio::time::Instant;

/// The holder's options: metadata a user would recognise (a host and a process).
fn holder() -> Options {
    Options::default().metadata("vm:17548")
}

/// Five masters (each within `node_timeout`), and a Redlock lock on `keys` whose writes
/// have reached every master.
async fn redlock_holding(
    node_timeout: Duration,
    keys: &[&str],
    ttl: Duration,
    options: &Options,
) -> (Masters, Lock) {
    let m = Masters::start(QuorumConfig::default().node_timeout(node_timeout)).await;
    let lock = m
        .redlock
        .obtain_multi(keys.iter().copied(), ttl, options)
        .await
        .unwrap();
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("the obtain's writes done within 10 s");
    (m, lock)
}

/// Asserts that `err` is a refusal naming `key`, held by `metadata` for at most `ttl` (and
/// more than `ttl` − 2 s), and that its message says so without `token`.
fn assert_names_the_holder(err: &Error, key: &str, metadata: &str, ttl: Duration, token: &str) {
    assert!(err.is_not_obtained(), "{err:?}");
    let Error::NotObtained {
        key: held,
        holder,
        ttl_left,
        ..
    } = err
    else {
        panic!("not NotObtained: {err:?}");
    };
    assert_eq!(held, key, "{err:?}");
    assert_eq!(holder.as_deref(), Some(metadata), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("{key:?}")) && message.contains(metadata),
        "{message}"
    );
    assert!(
        !message.contains(token),
        "the holder's token leaked: {message}"
    );
    if let Some(left) = ttl_left {
        assert!(
            *left <= ttl && *left > ttl.saturating_sub(ms(2_000)),
            "{left:?}"
        );
        assert!(message.contains("left"), "{message}");
    }
}

#[tokio::test]
async fn a_refusal_names_the_key_its_holders_metadata_and_the_ttl_left() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job2", ms(5_000), &holder())
        .await
        .unwrap();
    let other = env.other_client().await;
    // One key without a script (SET NX GET), at once: the holder's value came back anyway.
    let start = Instant::now();
    let err = other
        .obtain("job2", ms(5_000), &Options::default())
        .await
        .unwrap_err();
    assert!(start.elapsed() < ms(1_000), "{:?}", start.elapsed());
    assert_names_the_holder(&err, "job2", "vm:17548", ms(5_000), lock.token());
    // Several keys, by script: the key that blocks is named, not the first.
    let err = other
        .obtain_multi(["free", "job2"], ms(5_000), &Options::default())
        .await
        .unwrap_err();
    assert_names_the_holder(&err, "job2", "vm:17548", ms(5_000), lock.token());
    assert!(!env.exists("free").await, "a partial lock was left");
    // A waiter that gives up after its retries: it marked the holder and queued on the way.
    // Each retry names the holder as well.
    let named = Arc::new(Mutex::new(Vec::new()));
    let seen = named.clone();
    let waiter = Options::default()
        .retry(Retry::linear(ms(20)).limit(3))
        .on_retry(move |event| {
            let holder = event.holder.map(str::to_owned);
            seen.lock().unwrap().push(holder);
        });
    let err = other.obtain("job2", ms(5_000), &waiter).await.unwrap_err();
    let named = named.lock().unwrap().clone();
    assert!(!named.is_empty(), "no retry was reported");
    assert!(
        named
            .iter()
            .all(|holder| holder.as_deref() == Some("vm:17548")),
        "{named:?}"
    );
    assert_names_the_holder(&err, "job2", "vm:17548", ms(5_000), lock.token());
    let Error::NotObtained { ttl_left, .. } = &err else {
        unreachable!()
    };
    assert!(ttl_left.is_some(), "a waiter learns the TTL left: {err:?}");
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_refusal_by_a_holder_without_metadata_names_the_key_only() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(5_000), &Options::default())
        .await
        .unwrap();
    let other = env.other_client().await;
    let err = other
        .obtain("job", ms(5_000), &Options::default())
        .await
        .unwrap_err();
    let Error::NotObtained { key, holder, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!((key.as_str(), holder), ("job", &None));
    let message = err.to_string();
    assert!(
        message.contains("\"job\"") && message.contains("another owner"),
        "{message}"
    );
    assert!(!message.contains(lock.token()), "{message}");
}

#[tokio::test]
async fn a_refusal_by_an_exclusive_holder_of_a_shared_key_names_it() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("doc", ms(5_000), &holder())
        .await
        .unwrap();
    let other = env.other_client().await;
    let err = other
        .obtain(("doc", Mode::Shared), ms(5_000), &Options::default())
        .await
        .unwrap_err();
    assert_names_the_holder(&err, "doc", "vm:17548", ms(5_000), lock.token());
    // Readers hold a set of shares: the key is named, no single holder is.
    lock.release().await.unwrap();
    let _reader = env
        .client
        .obtain(("doc", Mode::Shared), ms(5_000), &holder())
        .await
        .unwrap();
    let err = other
        .obtain("doc", ms(5_000), &Options::default())
        .await
        .unwrap_err();
    let Error::NotObtained { key, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(key, "doc");
    assert!(err.to_string().contains("\"doc\""), "{err}");
}

#[tokio::test]
async fn a_refresh_of_a_deleted_lock_is_not_held_at_once() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    env.cmd::<i64>(&["DEL", "job"]).await;
    // A retry strategy retries what may pass; a lock that is gone does not come back.
    let retrying = Options::default().retry(Retry::linear(ms(50)).limit(20));
    let start = Instant::now();
    let err = lock.refresh(ms(10_000), &retrying).await.unwrap_err();
    assert!(start.elapsed() < ms(500), "{:?}", start.elapsed());
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert!(err.is_not_held() && !err.is_not_obtained(), "{err:?}");
    assert!(!env.exists("job").await, "refresh recreated the key");
}

#[tokio::test]
async fn a_refresh_of_a_lock_taken_over_is_not_held() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    env.cmd::<i64>(&["DEL", "job"]).await;
    let _thief = env
        .other_client()
        .await
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    let err = lock
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_held() && !err.is_not_obtained(), "{err:?}");
}

#[tokio::test]
async fn a_redlock_refresh_of_a_lock_gone_from_a_majority_is_not_held() {
    let (m, lock) = redlock_holding(ms(1_000), &["job"], ms(10_000), &Options::default()).await;
    for i in [0, 1, 2] {
        m.cmd::<i64>(i, &["DEL", "job"]).await;
    }
    let start = Instant::now();
    let err = lock
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(start.elapsed() < ms(2_000), "{:?}", start.elapsed());
    assert!(err.is_not_held() && !err.is_not_obtained(), "{err:?}");
}

#[tokio::test]
async fn a_refusal_shows_the_first_256_bytes_of_long_metadata() {
    let env = Env::start().await;
    let long = "é".repeat(600); // 1,200 bytes, two per character
    let lock = env
        .client
        .obtain("job", ms(5_000), &Options::default().metadata(&long))
        .await
        .unwrap();
    let other = env.other_client().await;
    for keys in [vec!["job"], vec!["free", "job"]] {
        let err = other
            .obtain_multi(keys.clone(), ms(5_000), &Options::default())
            .await
            .unwrap_err();
        let Error::NotObtained { holder, .. } = &err else {
            panic!("{keys:?}: {err:?}");
        };
        assert_eq!(
            holder.as_deref(),
            Some("é".repeat(128).as_str()),
            "{keys:?}"
        );
    }
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_redlock_refusal_names_the_key_and_its_holder() {
    let (m, lock) = redlock_holding(ms(1_000), &["free", "job2"], ms(5_000), &holder()).await;
    // The free key is freed on every master: the refusal names the key still held.
    for i in 0..5 {
        m.cmd::<i64>(i, &["DEL", "free"]).await;
    }
    let err = m
        .redlock
        .obtain_multi(["free", "job2"], ms(5_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    let Error::NotObtained { key, holder, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(key, "job2", "{err:?}");
    assert_eq!(holder.as_deref(), Some("vm:17548"), "{err:?}");
    assert!(!err.to_string().contains(lock.token()), "{err}");
}

/// A Redlock refresh that one master refuses while two do not answer has learnt nothing
/// decisive: the lock may still be on a majority. It is `is_unavailable()` (retry), not
/// "not held" (which would tell the caller to stop work whose lock nobody has lost).
#[tokio::test]
async fn a_redlock_refresh_refused_by_a_minority_while_others_fail_is_unavailable() {
    let (m, lock) = redlock_holding(ms(200), &["job"], ms(20_000), &Options::default()).await;
    m.cmd::<()>(0, &["SET", "job", "5:other", "PX", "20000"])
        .await;
    m.servers[3].pause();
    m.servers[4].pause();
    let start = Instant::now();
    let err = lock
        .refresh(ms(20_000), &Options::default())
        .await
        .unwrap_err();
    let took = start.elapsed();
    m.servers[3].resume();
    m.servers[4].resume();
    assert!(took < ms(5_000), "{took:?}");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(!err.is_not_held() && !err.is_not_obtained(), "{err:?}");
    assert!(
        !lock.lost_signal().is_lost(),
        "nothing decided the lock lost"
    );
}
