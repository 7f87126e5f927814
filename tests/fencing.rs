//! Fencing tokens: strictly increasing per counter, and a resource that checks them rejects
//! every write of a holder that was paused past its TTL.

mod support;

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
        last = token;
        lock.release().await.unwrap();
    }
    // Never reset by release or expiry: the counter outlives the lock.
    assert_eq!(env.get("{job}:fence").await.as_deref(), Some("5"));
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
    assert_eq!(lock.fencing_token(), Some(1));
    assert_eq!(env.get("{u1}:a:fence").await.as_deref(), Some("1"));

    let named = Options::default().fencing_key("{u1}:orders");
    let lock = env
        .client
        .obtain("{u1}:c", ms(60_000), &named)
        .await
        .unwrap();
    assert_eq!(lock.fencing_token(), Some(1));
    assert_eq!(env.get("{u1}:orders").await.as_deref(), Some("1"));
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
    let _held = env
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
    assert_eq!(env.get("{job}:fence").await.as_deref(), Some("1"));
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

/// A resource that accepts a write only with a token at least as high as any it has seen.
#[derive(Default)]
struct Storage {
    highest: u64,
    minted: Vec<u64>,
    accepted: Vec<u64>,
    rejected: usize,
}

impl Storage {
    fn write(&mut self, token: u64) -> bool {
        if token < self.highest {
            self.rejected += 1;
            return false;
        }
        self.highest = token;
        self.accepted.push(token);
        true
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
                    storage.lock().unwrap().write(token);
                    if (task + round) % 4 == 0 {
                        // A process pause (GC, swap, stalled VM) longer than the TTL.
                        tokio::time::sleep(ttl + ms(50)).await;
                    }
                    storage.lock().unwrap().write(token);
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
    // No stale write got in: accepted tokens never go backwards, so once a newer holder
    // wrote, no older holder's write was accepted again.
    assert!(
        storage.accepted.windows(2).all(|w| w[0] <= w[1]),
        "{:?}",
        storage.accepted
    );
    assert!(
        storage.rejected > 0,
        "the pauses should have produced stale writes to reject"
    );
    assert_eq!(
        storage.accepted.len() + storage.rejected,
        (2 * TASKS * ROUNDS) as usize
    );
}
