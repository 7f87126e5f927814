//! Mutual exclusion under contention: many tasks, a shared non-atomic counter, zero lost
//! updates and never two holders at once.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use lockset::{Jitter, Options, Retry};
use support::{Env, Exclusion, ms};

const TASKS: usize = 32;

/// Rounds per task in the two-key scenario: 6,400 acquisitions at full size
/// (`LOCKSET_SLOW_TESTS=1`), 1,920 in the README's command.
fn rounds() -> usize {
    support::repetitions(60, 200)
}

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
                for _ in 0..rounds() {
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

    shared.assert_exclusive((TASKS * rounds()) as u64);
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

/// A critical section as real work has one: read shared state, await something (1 ms),
/// write it back. Two holders inside at once lose an update, and are counted.
#[derive(Default)]
struct Work {
    counter: std::sync::atomic::AtomicU64,
    inside: std::sync::atomic::AtomicUsize,
    violations: std::sync::atomic::AtomicUsize,
}

impl Work {
    async fn section(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.inside.fetch_add(1, SeqCst) != 0 {
            self.violations.fetch_add(1, SeqCst);
        }
        let read = self.counter.load(SeqCst);
        tokio::time::sleep(ms(1)).await;
        self.counter.store(read + 1, SeqCst);
        self.inside.fetch_sub(1, SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_per_task_with_real_work_loses_no_update() {
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 25;
    let env = Env::start().await;
    let work = Arc::new(Work::default());
    let options = Options::default()
        .retry(Retry::linear(ms(2)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        // As separate processes: own connections, own release events.
        let (client, work, options) = (env.other_client().await, work.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = client.obtain("job", ms(30_000), &options).await.unwrap();
                work.section().await;
                lock.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(work.violations.load(SeqCst), 0, "two holders at once");
    assert_eq!(
        work.counter.load(SeqCst),
        CLIENTS as u64 * ROUNDS,
        "lost updates"
    );
    assert_eq!(env.dbsize().await, 0);
}

/// Work longer than the TTL, without a watchdog: each holder works in steps while it still
/// believes it holds the lock (its validity leaves room for a step), tries one refresh when
/// the TTL is up, and stops when that fails. Its lock expires under it and the next holder
/// gets it; nobody may ever work while another does. A release that ignores the token, or a
/// refresh that succeeds for a lost lock, lets two holders work at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_whose_ttl_runs_out_stop_before_the_next_one_starts() {
    use std::sync::atomic::Ordering::SeqCst;
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 8;
    let ttl = ms(200);
    let step = ms(50);
    let room = ms(25);
    let env = Env::start().await;
    let work = Arc::new(Work::default());
    let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let options = Options::default()
        .retry(Retry::linear(ms(5)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (client, work, options, stopped) = (
            env.other_client().await,
            work.clone(),
            options.clone(),
            stopped.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = client.obtain("job", ttl, &options).await.unwrap();
                let believes = || tokio::time::Instant::now() + room < lock.valid_until();
                let mut refreshed = false;
                loop {
                    if !believes() {
                        if refreshed || lock.refresh(ttl, &Options::default()).await.is_err() {
                            stopped.fetch_add(1, SeqCst);
                            break;
                        }
                        refreshed = true;
                        continue;
                    }
                    work.section().await;
                    tokio::time::sleep(step).await;
                }
                // It stopped working; it releases late, as a slow process would, after its
                // key expired and the next holder took it: the release must leave that
                // holder's key alone.
                tokio::time::sleep_until(lock.valid_until() + ttl).await;
                let _ = lock.release().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(work.violations.load(SeqCst), 0, "two holders at once");
    assert!(stopped.load(SeqCst) > 0);
}
