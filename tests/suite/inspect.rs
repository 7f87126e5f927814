//! `lockset::inspect`: who holds a key (exclusive, shared, counted), for how long, whether
//! somebody waits, and the waiters queued; never a token. It only reads.

use crate::support;

use std::time::Duration;

use lockset::{Holding, KeyState, Mode, Options};
use support::fair::{queued_up_to, slow_polling, wait_for};
use support::{Env, ms};

async fn inspect(env: &Env, keys: &[&str]) -> Vec<KeyState> {
    lockset::inspect(&mut env.raw.clone(), keys).await.unwrap()
}

async fn one(env: &Env, key: &str) -> KeyState {
    inspect(env, &[key]).await.remove(0)
}

fn metadata(metadata: &str) -> Options {
    Options::default().metadata(metadata)
}

#[tokio::test]
async fn a_free_key_is_free() {
    let env = Env::start().await;
    let state = one(&env, "job").await;
    assert_eq!(state.key, "job");
    assert!(state.is_free(), "{state:?}");
    assert_eq!((state.mode(), state.holders().len()), (None, 0));
    assert!(!state.waited_for && state.writer_waiting.is_none());
    assert!(state.waiters.is_empty());
}

#[tokio::test]
async fn an_exclusive_key_shows_its_holder_and_time_left_never_the_token() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(30_000), &metadata("web-1:42"))
        .await
        .unwrap();
    let states = inspect(&env, &["job", "other"]).await;
    assert_eq!(states.len(), 2);
    let state = &states[0];
    assert_eq!(state.mode(), Some(Mode::Exclusive));
    let Holding::Exclusive(holder) = &state.holding else {
        panic!("{state:?}")
    };
    assert_eq!(holder.metadata, "web-1:42");
    let left = holder.ttl.unwrap();
    assert!(left > ms(25_000) && left <= ms(30_000), "{left:?}");
    assert!(holder.is_owned_by(lock.token()));
    assert!(!holder.is_owned_by(&lock.token()[1..]));
    assert!(!state.waited_for);
    assert!(
        !format!("{states:?}").contains(lock.token()),
        "never the token"
    );
    assert!(states[1].is_free());
}

#[tokio::test]
async fn a_shared_key_lists_every_holder_first_to_expire_first() {
    let env = Env::start().await;
    let b = env
        .client
        .obtain(("doc", Mode::Shared), ms(60_000), &metadata("reader-b"))
        .await
        .unwrap();
    let a = env
        .client
        .obtain(("doc", Mode::Shared), ms(20_000), &metadata("reader-a"))
        .await
        .unwrap();
    let state = one(&env, "doc").await;
    assert_eq!(state.mode(), Some(Mode::Shared));
    let Holding::Shared(holders) = &state.holding else {
        panic!("{state:?}")
    };
    let names: Vec<&str> = holders.iter().map(|h| h.metadata.as_str()).collect();
    assert_eq!(names, ["reader-a", "reader-b"]);
    assert!(holders[0].ttl.unwrap() <= ms(20_000));
    assert!(holders[1].ttl.unwrap() > ms(50_000));
    assert!(holders[0].is_owned_by(a.token()) && holders[1].is_owned_by(b.token()));
    let text = format!("{state:?}");
    assert!(
        !text.contains(a.token()) && !text.contains(b.token()),
        "{text}"
    );

    // Once every holder is gone, the key is free.
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert!(one(&env, "doc").await.is_free());
}

#[tokio::test]
async fn a_counted_key_shows_its_limit_and_holders() {
    let env = Env::start().await;
    let permit = Mode::Permit { limit: 3 };
    let _one = env
        .client
        .obtain(("exports", permit), ms(30_000), &metadata("export-1"))
        .await
        .unwrap();
    let _two = env
        .client
        .obtain(("exports", permit), ms(40_000), &Options::default())
        .await
        .unwrap();
    let state = one(&env, "exports").await;
    assert_eq!(state.mode(), Some(permit));
    let Holding::Permits { limit, holders } = &state.holding else {
        panic!("{state:?}")
    };
    assert_eq!(*limit, 3);
    let names: Vec<&str> = holders.iter().map(|h| h.metadata.as_str()).collect();
    assert_eq!(names, ["export-1", ""]);
}

#[tokio::test]
async fn a_waiter_marks_the_key_and_queues() {
    let env = Env::start().await;
    let _held = env
        .client
        .obtain("job", ms(60_000), &metadata("holder"))
        .await
        .unwrap();
    let other = env.other_client().await;
    let waiter = wait_for(&other, "job", slow_polling().metadata("waiter-A"));
    queued_up_to(&env, "job", 1).await;
    let state = one(&env, "job").await;
    assert!(state.waited_for, "{state:?}");
    assert_eq!(state.holders()[0].metadata, "holder");
    assert_eq!(state.waiters.len(), 1, "{state:?}");
    assert_eq!(state.waiters[0].metadata, "waiter-A");
    assert_eq!(state.waiters[0].keys, ["job"]);
    waiter.abort();
}

#[tokio::test]
async fn a_writer_waiting_for_readers_is_seen() {
    let env = Env::start().await;
    let _reader = env
        .client
        .obtain(("doc", Mode::Shared), ms(60_000), &metadata("reader"))
        .await
        .unwrap();
    // A writer that does not queue marks the key "=x" while it retries.
    let other = env.other_client().await;
    let options = Options::default()
        .fair(false)
        .retry(lockset::Retry::linear(ms(100)))
        .timeout(ms(30_000));
    let writer = tokio::spawn(async move { other.obtain("doc", ms(60_000), &options).await });
    let mut state = one(&env, "doc").await;
    for _ in 0..100 {
        if state.writer_waiting.is_some() {
            break;
        }
        tokio::time::sleep(ms(50)).await;
        state = one(&env, "doc").await;
    }
    assert!(state.writer_waiting.is_some(), "{state:?}");
    assert!(state.waited_for, "{state:?}");
    assert_eq!(state.mode(), Some(Mode::Shared));
    assert_eq!(state.holders().len(), 1);
    writer.abort();
}

#[tokio::test]
async fn other_values_are_foreign_or_of_the_wrong_type() {
    let env = Env::start().await;
    env.cmd::<()>(&["SET", "plain", "hello", "PX", "60000"])
        .await;
    env.cmd::<()>(&["RPUSH", "list", "x"]).await;
    env.cmd::<()>(&["ZADD", "scores", "1", "alice"]).await;
    let states = inspect(&env, &["plain", "list", "scores"]).await;
    let Holding::Foreign { ttl } = states[0].holding else {
        panic!("{:?}", states[0])
    };
    assert!(ttl.is_some_and(|ttl| ttl <= Duration::from_secs(60)));
    assert_eq!(
        states[1].holding,
        Holding::WrongType {
            kind: "list".to_owned()
        }
    );
    assert_eq!(
        states[2].holding,
        Holding::WrongType {
            kind: "zset".to_owned()
        }
    );
    assert!(states.iter().all(|state| state.mode().is_none()));
}

#[tokio::test]
async fn it_only_reads() {
    let env = Env::start().await;
    let _held = env
        .client
        .obtain(("doc", Mode::Shared), ms(60_000), &metadata("reader"))
        .await
        .unwrap();
    let before: Vec<String> = env.cmd(&["ZRANGE", "doc", "0", "-1"]).await;
    let size = env.dbsize().await;
    inspect(&env, &["doc", "free"]).await;
    let after: Vec<String> = env.cmd(&["ZRANGE", "doc", "0", "-1"]).await;
    assert_eq!((before, size), (after, env.dbsize().await));
}
