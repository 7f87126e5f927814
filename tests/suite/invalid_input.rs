//! Bad input: a typed error before anything is sent, and nothing left in Redis.

use crate::support;

use std::time::Duration;

use lockset::{Error, InvalidInput, MAX_KEYS, MAX_TTL, Options};
use support::{Env, ms};

/// Asserts that no lock command reached the server and no key exists.
async fn assert_nothing_sent(env: &Env) {
    for command in ["set", "evalsha", "eval", "script|load"] {
        assert_eq!(env.calls(command).await, 0, "{command} was sent");
    }
    assert_eq!(env.dbsize().await, 0);
}

fn invalid(result: Result<impl std::fmt::Debug, Error>) -> InvalidInput {
    match result {
        Err(Error::InvalidInput(invalid)) => invalid,
        other => panic!("expected invalid input, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_key_sets_are_rejected() {
    let env = Env::start().await;
    let client = &env.client;
    let o = Options::default();
    let no_keys: [&str; 0] = [];
    assert_eq!(
        invalid(client.obtain_multi(no_keys, ms(1_000), &o).await),
        InvalidInput::NoKeys
    );
    assert_eq!(
        invalid(client.obtain("", ms(1_000), &o).await),
        InvalidInput::EmptyKey { index: 0 }
    );
    assert_eq!(
        invalid(client.obtain_multi(["a", "", "b"], ms(1_000), &o).await),
        InvalidInput::EmptyKey { index: 1 }
    );
    assert_eq!(
        invalid(client.obtain_multi(["a", "b", "a"], ms(1_000), &o).await),
        InvalidInput::DuplicateKey { key: "a".into() }
    );
    // Names of waiter queues and records: a string there would break a release's hand-off.
    assert_eq!(
        invalid(client.obtain("{job}:lockset:queue", ms(1_000), &o).await),
        InvalidInput::ReservedKey {
            key: "{job}:lockset:queue".into()
        }
    );
    assert_eq!(env.dbsize().await, 0);
    let too_many: Vec<String> = (0..=MAX_KEYS).map(|i| i.to_string()).collect();
    assert_eq!(
        invalid(client.obtain_multi(too_many, ms(1_000), &o).await),
        InvalidInput::TooManyKeys {
            count: MAX_KEYS + 1,
            max: MAX_KEYS
        }
    );
    assert_nothing_sent(&env).await;
}

#[tokio::test]
async fn bad_ttls_are_rejected() {
    let env = Env::start().await;
    let o = Options::default();
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(999),
    ] {
        assert_eq!(
            invalid(env.client.obtain("a", ttl, &o).await),
            InvalidInput::TtlTooShort { ttl }
        );
    }
    for ttl in [MAX_TTL + Duration::from_millis(1), Duration::MAX] {
        assert_eq!(
            invalid(env.client.obtain("a", ttl, &o).await),
            InvalidInput::TtlTooLong { ttl, max: MAX_TTL }
        );
    }
    assert_nothing_sent(&env).await;
}

#[tokio::test]
async fn an_empty_custom_token_is_rejected() {
    let env = Env::start().await;
    let o = Options::default().token("");
    assert_eq!(
        invalid(env.client.obtain("a", ms(1_000), &o).await),
        InvalidInput::EmptyToken
    );
    assert_nothing_sent(&env).await;
}

#[tokio::test]
async fn invalid_input_errors_explain_themselves() {
    let env = Env::start().await;
    let err = env
        .client
        .obtain_multi(["x", "x"], ms(1_000), &Options::default())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: key \"x\" appears more than once"
    );
}

#[tokio::test]
async fn refresh_with_a_bad_ttl_changes_nothing() {
    let env = Env::start().await;
    let o = Options::default();
    let lock = env.client.obtain("a", ms(60_000), &o).await.unwrap();
    // A refresh is a script, or SET IFEQ where the server has it.
    let writes = async || env.calls("evalsha").await + env.calls("set").await;
    let refreshes = writes().await;
    assert_eq!(
        invalid(lock.refresh(Duration::ZERO, &o).await),
        InvalidInput::TtlTooShort {
            ttl: Duration::ZERO
        }
    );
    assert_eq!(writes().await, refreshes);
    assert!(lock.ttl().await.unwrap().unwrap() > ms(30_000));
}

#[tokio::test]
async fn a_fractional_millisecond_ttl_rounds_up() {
    let env = Env::start().await;
    // 1.5 ms must become 2 ms, never 1 ms. Check the command Redis saw via SLOWLOG.
    env.cmd::<String>(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
        .await;
    env.client
        .obtain("a", Duration::from_micros(1_500), &Options::default())
        .await
        .unwrap();
    let log: lockset::redis::Value = env.cmd(&["SLOWLOG", "GET", "100"]).await;
    let text = format!("{log:?}");
    assert!(text.contains("\"PX\""), "{text}");
    assert!(text.contains("\"2\""), "expected PX 2 in {text}");
}

/// Every key of a lock stores its metadata, and a release reads every key's value: past
/// [`lockset::MAX_LOCK_METADATA`] bytes over all keys a lock is refused before anything is
/// sent (2,500 keys of 64 KiB blocked the server ~1 s in a release, which timed out). At the
/// limit, its release takes well within redis-rs's 500 ms response timeout.
#[tokio::test]
async fn metadata_over_all_keys_past_the_limit_is_refused_before_sending() {
    use lockset::{MAX_LOCK_METADATA, MAX_METADATA};
    let env = Env::start().await;
    let client = &env.client;
    let most = MAX_LOCK_METADATA / MAX_METADATA;
    let keys = |n: usize| -> Vec<String> { (0..n).map(|i| format!("{{big}}:{i}")).collect() };
    let big = Options::default().metadata("m".repeat(MAX_METADATA));
    let start = tokio::time::Instant::now();
    assert_eq!(
        invalid(client.obtain_multi(keys(most + 1), ms(10_000), &big).await),
        InvalidInput::LockMetadataTooLarge {
            keys: most + 1,
            len: MAX_METADATA,
            max: MAX_LOCK_METADATA,
        }
    );
    assert!(start.elapsed() < ms(100), "{:?}", start.elapsed());
    assert_nothing_sent(&env).await;
    let lock = client
        .obtain_multi(keys(most), ms(10_000), &big)
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    lock.release().await.unwrap();
    assert!(start.elapsed() < ms(250), "{:?}", start.elapsed());
}

/// Metadata is stored in every key of a lock: past [`MAX_METADATA`] bytes it is refused
/// before anything is sent (obtain, adopt, refresh), and the lock keeps what it had. (10 MB
/// on 10 keys raised a server's memory by 120 MB, and the next release timed out.)
#[tokio::test]
async fn metadata_over_the_limit_is_refused_before_sending() {
    use lockset::MAX_METADATA;
    let env = Env::start().await;
    let client = &env.client;
    let big = Options::default().metadata("m".repeat(MAX_METADATA + 1));
    let start = tokio::time::Instant::now();
    assert_eq!(
        invalid(client.obtain_multi(["a", "b"], ms(10_000), &big).await),
        InvalidInput::MetadataTooLong {
            len: MAX_METADATA + 1,
            max: MAX_METADATA
        }
    );
    let adopt = big.clone().token("mine");
    assert!(matches!(
        invalid(client.adopt(["a"], ms(10_000), &adopt).await),
        InvalidInput::MetadataTooLong { .. }
    ));
    assert!(start.elapsed() < ms(100), "{:?}", start.elapsed());
    assert_nothing_sent(&env).await;
    // At the limit, it is stored; a refresh past it changes nothing.
    let at_limit = Options::default().metadata("m".repeat(MAX_METADATA));
    let lock = client.obtain("a", ms(10_000), &at_limit).await.unwrap();
    assert!(matches!(
        invalid(lock.refresh(ms(20_000), &big).await),
        InvalidInput::MetadataTooLong { .. }
    ));
    assert_eq!(lock.metadata().len(), MAX_METADATA);
    lock.release().await.unwrap();
}
