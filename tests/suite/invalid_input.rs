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
