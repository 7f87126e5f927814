//! Obtain, TTL, refresh and release of single-key locks, against a real redis-server.

use crate::support;

use lockset::{Client, Error, Options, parse_value};
use support::{Env, connect, ms};

fn opts() -> Options {
    Options::default()
}

#[tokio::test]
async fn obtain_ttl_release_cycle() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    assert_eq!(lock.key(), "job");
    assert_eq!(lock.keys(), ["job".to_string()]);
    assert_eq!(lock.token().len(), 22);

    let left = lock.ttl().await.unwrap().expect("held");
    assert!(left > ms(5_000) && left <= ms(10_000), "{left:?}");

    lock.release().await.unwrap();
    assert!(!env.exists("job").await);
}

#[tokio::test]
async fn held_key_is_not_obtained_by_another() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let _lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    let err = other.obtain("job", ms(10_000), &opts()).await.unwrap_err();
    assert!(matches!(err, Error::NotObtained { .. }), "{err:?}");
    assert!(err.is_not_obtained());
}

#[tokio::test]
async fn released_key_can_be_obtained_again() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    lock.release().await.unwrap();
    env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
}

#[tokio::test]
async fn metadata_is_stored_after_the_token() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &opts().metadata("host-1 pid 42"))
        .await
        .unwrap();
    assert_eq!(lock.metadata(), "host-1 pid 42");
    let stored = env.get("job").await.unwrap();
    assert_eq!(parse_value(&stored), Some((lock.token(), "host-1 pid 42")));
}

#[tokio::test]
async fn custom_token_is_used() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &opts().token("my-token"))
        .await
        .unwrap();
    assert_eq!(lock.token(), "my-token");
    assert_eq!(env.get("job").await.as_deref(), Some("8:my-token"));
}

#[tokio::test]
async fn reobtain_with_own_token_resets_ttl_and_metadata() {
    let env = Env::start().await;
    let first = env
        .client
        .obtain("job", ms(2_000), &opts().token("t1").metadata("old"))
        .await
        .unwrap();
    let second = env
        .client
        .obtain("job", ms(60_000), &opts().token("t1").metadata("new"))
        .await
        .unwrap();
    assert_eq!(second.metadata(), "new");
    assert_eq!(env.get("job").await.as_deref(), Some("2:t1new"));
    assert!(second.ttl().await.unwrap().unwrap() > ms(30_000));
    // Same token, same owner: the first handle still sees the lock as held.
    assert!(first.ttl().await.unwrap().is_some());
}

#[tokio::test]
async fn reobtain_of_a_superset_with_own_token_succeeds() {
    let env = Env::start().await;
    let options = opts().token("t1");
    env.client.obtain("a", ms(10_000), &options).await.unwrap();
    let lock = env
        .client
        .obtain_multi(["a", "b", "c"], ms(10_000), &options)
        .await
        .unwrap();
    assert_eq!(lock.keys().len(), 3);
    for key in ["a", "b", "c"] {
        assert_eq!(env.get(key).await.as_deref(), Some("2:t1"));
    }
}

#[tokio::test]
async fn reobtain_fails_when_another_token_holds_any_key() {
    let env = Env::start().await;
    env.client
        .obtain("a", ms(10_000), &opts().token("t1"))
        .await
        .unwrap();
    env.client
        .obtain("b", ms(10_000), &opts().token("t2"))
        .await
        .unwrap();
    let err = env
        .client
        .obtain_multi(["a", "b"], ms(10_000), &opts().token("t1"))
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    assert_eq!(env.get("b").await.as_deref(), Some("2:t2"));
}

#[tokio::test]
async fn a_token_prefix_cannot_take_over_a_lock() {
    let env = Env::start().await;
    env.client
        .obtain("job", ms(10_000), &opts().token("abcdef").metadata("xyz"))
        .await
        .unwrap();
    // Prefixes of the token, and the token followed by (part of) the metadata.
    for token in ["a", "abc", "abcde", "abcdefx", "abcdefxyz", "6:abc"] {
        for keys in [vec!["job"], vec!["job", "other"]] {
            let err = env
                .client
                .obtain_multi(keys.clone(), ms(10_000), &opts().token(token))
                .await
                .unwrap_err();
            assert!(err.is_not_obtained(), "{token} {keys:?}: {err:?}");
        }
    }
    assert_eq!(env.get("job").await.as_deref(), Some("6:abcdefxyz"));
    assert!(!env.exists("other").await);
}

#[tokio::test]
async fn refresh_extends_the_lock() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(5_000), &opts()).await.unwrap();
    lock.refresh(ms(60_000), &opts()).await.unwrap();
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left > ms(30_000), "{left:?}");
}

#[tokio::test]
async fn refresh_with_metadata_replaces_the_stored_metadata() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain_multi(["a", "b"], ms(10_000), &opts().metadata("old"))
        .await
        .unwrap();
    let tag = format!("22:{}", lock.token());
    lock.refresh(ms(60_000), &opts().metadata("new"))
        .await
        .unwrap();
    assert_eq!(lock.metadata(), "new");
    for key in ["a", "b"] {
        assert_eq!(env.get(key).await, Some(format!("{tag}new")), "{key}");
        let left: i64 = env.cmd(&["PTTL", key]).await;
        assert!(left > 30_000, "{key} extended: {left}");
    }
    // Without metadata, a refresh keeps what is stored.
    lock.refresh(ms(60_000), &opts()).await.unwrap();
    assert_eq!(env.get("a").await, Some(format!("{tag}new")));
    // A waiter's mark stays in front of the new value (the release must announce itself).
    let marked = format!("!{tag}new");
    let _: () = env.cmd(&["SET", "a", &marked, "PX", "60000"]).await;
    lock.refresh(ms(60_000), &opts().metadata(""))
        .await
        .unwrap();
    assert_eq!(lock.metadata(), "");
    assert_eq!(env.get("a").await, Some(format!("!{tag}")));
    assert_eq!(env.get("b").await, Some(tag.clone()));
    // A refresh that fails changes nothing, metadata included.
    let _: () = env.cmd(&["SET", "b", "5:otherx", "PX", "60000"]).await;
    let err = lock
        .refresh(ms(60_000), &opts().metadata("lost"))
        .await
        .unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(env.get("a").await, Some(format!("!{tag}")));
    assert_eq!(lock.metadata(), "");
}

#[tokio::test]
async fn refresh_of_an_expired_lock_is_not_held() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    // Expire it now rather than sleeping past its TTL.
    env.cmd::<i64>(&["PEXPIRE", "job", "1"]).await;
    while env.exists("job").await {
        tokio::task::yield_now().await;
    }
    let err = lock.refresh(ms(10_000), &opts()).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert!(
        !env.exists("job").await,
        "refresh must not recreate the key"
    );
}

#[tokio::test]
async fn refresh_of_a_lock_taken_over_is_not_held() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    env.cmd::<i64>(&["DEL", "job"]).await;
    let _thief = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    let err = lock.refresh(ms(60_000), &opts()).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    // What the server keeps, not the thief's view (which its own validity caps).
    let left: i64 = env.cmd(&["PTTL", "job"]).await;
    assert!(
        0 < left && left <= 10_000,
        "the thief's key was extended: {left} ms"
    );
}

#[tokio::test]
async fn a_failed_refresh_of_a_multi_key_lock_extends_no_key() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain_multi(["{j}:a", "{j}:b"], ms(10_000), &opts())
        .await
        .unwrap();
    env.cmd::<i64>(&["DEL", "{j}:b"]).await;
    let _thief = env
        .client
        .obtain("{j}:b", ms(10_000), &opts())
        .await
        .unwrap();
    let err = lock.refresh(ms(60_000), &opts()).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    for key in ["{j}:a", "{j}:b"] {
        let left: i64 = env.cmd(&["PTTL", key]).await;
        assert!(0 < left && left <= 10_000, "{key} was extended: {left} ms");
    }
}

#[tokio::test]
async fn release_of_a_foreign_lock_is_not_held() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    env.cmd::<i64>(&["DEL", "job"]).await;
    let thief = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    let err = lock.release().await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert!(err.is_not_held());
    assert_eq!(env.get("job").await, Some(format!("22:{}", thief.token())));
}

#[tokio::test]
async fn second_release_of_the_same_token_is_not_held() {
    let env = Env::start().await;
    let options = opts().token("shared");
    let first = env
        .client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap();
    let second = env
        .client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap();
    first.release().await.unwrap();
    let err = second.release().await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
}

#[tokio::test]
async fn ttl_distinguishes_lost_from_held() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    // Held without expiry: still capped by what the holder was told (its validity).
    env.cmd::<i64>(&["PERSIST", "job"]).await;
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left <= ms(10_000), "{left:?}");
    env.cmd::<i64>(&["DEL", "job"]).await;
    assert_eq!(lock.ttl().await.unwrap(), None);
}

#[tokio::test]
async fn a_key_holding_a_list_gives_a_wrong_type_error() {
    let env = Env::start().await;
    env.cmd::<i64>(&["RPUSH", "queue", "x"]).await;
    let err = env
        .client
        .obtain("queue", ms(10_000), &opts())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key } if key == "queue"),
        "{err:?}"
    );
    assert!(err.to_string().contains("queue"));
    assert_eq!(env.cmd::<String>(&["TYPE", "queue"]).await, "list");
}

#[tokio::test]
async fn a_hash_in_a_key_set_gives_a_wrong_type_error_and_changes_nothing() {
    let env = Env::start().await;
    env.cmd::<i64>(&["HSET", "h", "f", "v"]).await;
    let err = env
        .client
        .obtain_multi(["free", "h", "also-free"], ms(10_000), &opts())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key } if key == "h"),
        "{err:?}"
    );
    assert!(!env.exists("free").await && !env.exists("also-free").await);
    assert_eq!(env.cmd::<String>(&["TYPE", "h"]).await, "hash");
}

#[tokio::test]
async fn a_lock_whose_key_became_a_hash_is_not_held() {
    let env = Env::start().await;
    let lock = env.client.obtain("job", ms(10_000), &opts()).await.unwrap();
    env.cmd::<i64>(&["DEL", "job"]).await;
    env.cmd::<i64>(&["HSET", "job", "f", "v"]).await;
    assert_eq!(lock.ttl().await.unwrap(), None);
    assert!(matches!(
        lock.refresh(ms(10_000), &opts()).await,
        Err(Error::NotHeld)
    ));
    assert!(matches!(lock.release().await, Err(Error::NotHeld)));
    assert_eq!(env.cmd::<String>(&["TYPE", "job"]).await, "hash");
}

#[tokio::test]
async fn debug_output_never_shows_the_token() {
    let env = Env::start().await;
    let options = opts().token("super-secret-token").metadata("visible");
    let lock = env
        .client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap();
    for debug in [
        format!("{lock:?}"),
        format!("{options:?}"),
        format!("{:?}", env.client),
    ] {
        assert!(!debug.contains("super-secret"), "{debug}");
    }
    assert!(format!("{lock:?}").contains("visible"));
}

#[tokio::test]
async fn works_over_a_plain_multiplexed_connection() {
    let env = Env::start().await;
    let client = Client::new(connect(&env.server).await);
    let lock = client
        .obtain_multi(["a", "b"], ms(10_000), &opts())
        .await
        .unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    lock.refresh(ms(10_000), &opts()).await.unwrap();
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn clients_are_cheap_clones_sharing_one_connection() {
    let env = Env::start().await;
    env.client
        .obtain("warm", ms(10_000), &opts())
        .await
        .unwrap();
    let connections = async || {
        let list: String = env.cmd(&["CLIENT", "LIST"]).await;
        list.lines().count()
    };
    // Connecting probes the server with a connection of its own first, which closes in the
    // background: counted from once it has (the manager's and the inspection connection).
    support::eventually(ms(5_000), "the probe connection closed", async || {
        connections().await == 2
    })
    .await;
    let before = connections().await;
    let clone = env.client.clone();
    let lock = clone.obtain("job", ms(10_000), &opts()).await.unwrap();
    // The lock is the clone's and the original's alike: one owner per token, not per clone.
    let err = env
        .client
        .obtain("job", ms(10_000), &opts())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotObtained { .. }), "{err:?}");
    assert_eq!(connections().await, before, "a clone opened a connection");
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_concurrent_obtainers_give_one_winner() {
    let env = Env::start().await;
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let client = env.client.clone();
            tokio::spawn(async move { client.obtain("prize", ms(30_000), &opts()).await })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => winners += 1,
            Err(err) => assert!(matches!(err, Error::NotObtained { .. }), "{err:?}"),
        }
    }
    assert_eq!(winners, 1);
}
