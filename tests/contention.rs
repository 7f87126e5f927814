//! Mutual exclusion under contention: many tasks, a shared non-atomic counter, zero lost
//! updates and never two holders at once.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockset::{Jitter, Options, Retry};
use support::{Env, Exclusion, ms};

const TASKS: usize = 32;
const ROUNDS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_key_lock_under_contention_loses_no_update() {
    let env = Env::start().await;
    let shared = Arc::new(Exclusion::default());
    let options = Options::default()
        .retry(Retry::linear(ms(2)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));

    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, shared, options) = (env.client.clone(), shared.clone(), options.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = client
                        .obtain_multi(["{c}:a", "{c}:b"], ms(30_000), &options)
                        .await
                        .expect("obtain within the timeout");
                    shared.critical_section().await;
                    lock.release().await.expect("release a held lock");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    shared.assert_exclusive((TASKS * ROUNDS) as u64);
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_under_contention_never_share_a_key() {
    let env = Env::start().await;
    // Three counters, each guarded by its own key; each task locks a pair of them.
    let counters: Arc<[Exclusion; 3]> = Arc::new(Default::default());
    let pairs = [[0, 1], [1, 2], [0, 2]];
    let options = Options::default()
        .retry(Retry::linear(ms(2)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));

    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (client, counters, options) =
                (env.client.clone(), counters.clone(), options.clone());
            let pair = pairs[i % 3];
            tokio::spawn(async move {
                let keys = pair.map(|c| format!("{{c}}:{c}"));
                for _ in 0..50 {
                    let lock = client
                        .obtain_multi(keys.clone(), ms(30_000), &options)
                        .await
                        .unwrap();
                    for c in pair {
                        counters[c].critical_section().await;
                    }
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    for shared in counters.iter() {
        shared.assert_exclusive(8 * 50);
    }
}
