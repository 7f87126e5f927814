//! Fencing tokens: strictly increasing per counter, and a resource that checks them rejects
//! every write of a holder that was paused past its TTL.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockset::{Error, InvalidInput, Jitter, Options, Retry};
use support::{Env, ms};

#[tokio::test]
async fn every_obtain_mints_a_higher_token() {
    let env = Env::start().await;
    let options = Options::default().fencing();
    let mut last = 0;
    for _ in 0..5 {
        let lock = env
            .client
            .obtain("job", ms(60_000), &options)
            .await
            .unwrap();
        let token = lock.fencing_token().unwrap();
        assert!(token > last, "{token} after {last}");
        // At least the server's clock in microseconds (2026: about 1.8e15).
        assert!(token > 1_700_000_000_000_000, "{token}");
        last = token;
        lock.release().await.unwrap();
    }
    // Never reset by release or expiry: the counter outlives the lock.
    assert_eq!(env.get("{job}:fence").await, Some(last.to_string()));
    assert!(!env.exists("job").await);
}

#[tokio::test]
async fn reobtain_by_token_mints_a_new_higher_token() {
    let env = Env::start().await;
    let options = Options::default().fencing().token("mine");
    let first = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap();
    let again = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap();
    assert!(again.fencing_token() > first.fencing_token());
}

#[tokio::test]
async fn multi_key_locks_use_the_first_keys_counter_or_a_named_one() {
    let env = Env::start().await;
    let derived = Options::default().fencing();
    let lock = env
        .client
        .obtain_multi(["{u1}:a", "{u1}:b"], ms(60_000), &derived)
        .await
        .unwrap();
    let token = lock.fencing_token().unwrap();
    assert_eq!(env.get("{u1}:a:fence").await, Some(token.to_string()));

    let named = Options::default().fencing_key("{u1}:orders");
    let lock = env
        .client
        .obtain("{u1}:c", ms(60_000), &named)
        .await
        .unwrap();
    let token = lock.fencing_token().unwrap();
    assert_eq!(env.get("{u1}:orders").await, Some(token.to_string()));
}

#[tokio::test]
async fn locks_without_fencing_have_no_token_and_no_counter() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain_multi(["a", "b"], ms(60_000), &Options::default())
        .await
        .unwrap();
    assert_eq!(lock.fencing_token(), None);
    assert_eq!(env.dbsize().await, 2);
}

#[tokio::test]
async fn a_failed_obtain_mints_nothing() {
    let env = Env::start().await;
    let options = Options::default().fencing();
    let held = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap();
    assert!(
        env.client
            .obtain("job", ms(60_000), &options)
            .await
            .is_err()
    );
    let token = held.fencing_token().unwrap();
    assert_eq!(env.get("{job}:fence").await, Some(token.to_string()));
}

#[tokio::test]
async fn an_underivable_counter_key_is_invalid_input() {
    let env = Env::start().await;
    let err = env
        .client
        .obtain("odd}key", ms(60_000), &Options::default().fencing())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(InvalidInput::NoFencingKey { key }) if key == "odd}key"),
        "{err:?}"
    );
    assert_eq!(env.dbsize().await, 0);
}

/// A resource that accepts a write only with a token at least as high as any it has seen,
/// and a record of each write: its token, whether its holder still believed it held the lock
/// (its validity had not run out), and whether it was accepted.
#[derive(Default)]
struct Storage {
    highest: u64,
    minted: Vec<u64>,
    writes: Vec<(u64, bool, bool)>,
}

impl Storage {
    /// Writes with `lock`'s token; the belief is checked under the storage's own lock, so
    /// that no other write comes between.
    fn write(&mut self, lock: &lockset::Lock<lockset::redis::aio::ConnectionManager>) {
        let token = lock.fencing_token().unwrap();
        let believed = tokio::time::Instant::now() < lock.valid_until();
        let accepted = token >= self.highest;
        if accepted {
            self.highest = token;
        }
        self.writes.push((token, believed, accepted));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holders_are_fenced_off() {
    const TASKS: u64 = 32;
    const ROUNDS: u64 = 10;
    let env = Env::start().await;
    let storage = Arc::new(Mutex::new(Storage::default()));
    let ttl = ms(100);
    let options = Options::default()
        .fencing()
        .retry(Retry::linear(ms(2)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));

    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (client, storage, options) = (env.client.clone(), storage.clone(), options.clone());
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let lock = client.obtain("resource", ttl, &options).await.unwrap();
                    let token = lock.fencing_token().unwrap();
                    storage.lock().unwrap().minted.push(token);
                    storage.lock().unwrap().write(&lock);
                    if (task + round) % 4 == 0 {
                        // A process pause (GC, swap, stalled VM) longer than the TTL.
                        tokio::time::sleep(ttl + ms(50)).await;
                    }
                    storage.lock().unwrap().write(&lock);
                    // A paused holder may have lost the lock by now; either outcome is fine.
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let storage = storage.lock().unwrap();
    // Every acquisition got a token of its own.
    let mut minted = storage.minted.clone();
    minted.sort_unstable();
    minted.dedup();
    assert_eq!(minted.len(), (TASKS * ROUNDS) as usize);
    // The holders' beliefs are true and fencing catches the rest: every write from a holder
    // that still believed it held the lock was accepted (nobody newer had written), so every
    // rejected write came from one whose validity had run out (it slept past its TTL). A
    // holder past its validity may still be accepted, when nobody took the lock meanwhile.
    let wrong: Vec<_> = storage
        .writes
        .iter()
        .filter(|(_, believed, accepted)| *believed && !accepted)
        .collect();
    let rejected = storage.writes.iter().filter(|w| !w.2).count();
    assert!(
        wrong.is_empty(),
        "writes (token, believed, accepted): {wrong:?}"
    );
    assert!(
        rejected > 0,
        "the pauses should have produced stale writes to reject"
    );
    assert_eq!(storage.writes.len(), (2 * TASKS * ROUNDS) as usize);
}

/// A server without persistence that restarts empty forgets its counters. Were the counter to
/// start over at 1, a holder paused across the restart (token 3, say) would outrank every
/// later holder at the resource: the very zombie that fencing exists to turn away.
#[tokio::test]
async fn tokens_keep_increasing_across_a_restart_that_forgot_the_counter() {
    let mut server = support::RedisServer::start();
    let client = lockset::Client::connect(&server.url()).await.unwrap();
    let options = Options::default()
        .fencing()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(20_000));
    let mut before = 0;
    for _ in 0..3 {
        let lock = client.obtain("job", ms(60_000), &options).await.unwrap();
        before = lock.fencing_token().unwrap();
        lock.release().await.unwrap();
    }
    server.restart();
    // The first command after the restart may meet the dead connection (retried until the
    // deadline: a connection error is transient).
    let after = client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap()
        .fencing_token()
        .unwrap();
    assert!(after > before, "{after} after {before}, across a restart");
}

/// A counter that comes back older (an old snapshot, a replica promoted while behind) must
/// not mint a token that an earlier holder's outranks.
#[tokio::test]
async fn tokens_keep_increasing_when_the_counter_comes_back_older() {
    let env = Env::start().await;
    let options = Options::default().fencing();
    let lock = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap();
    let before = lock.fencing_token().unwrap();
    lock.release().await.unwrap();
    let _: () = env.cmd(&["SET", "{job}:fence", "5"]).await;
    let lock = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap();
    let after = lock.fencing_token().unwrap();
    assert!(
        after > before,
        "{after} after {before}, from a counter set back to 5"
    );
}
