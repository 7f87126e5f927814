//! Soak: 64 tasks lock random subsets of 100 keys for a bounded time. Ignored by default;
//! `.ci/run` runs it briefly:
//! `LOCKSET_SOAK_SECS=20 cargo test --all-features --test soak -- --ignored`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockset::{Jitter, Options, Retry};
use rand::RngExt as _;
use support::{Env, ms};
use tokio::time::Instant;

const TASKS: usize = 64;
const KEYS: usize = 100;

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs the soak for `duration`; returns (locks taken, deadlines missed).
async fn soak(
    polling: &lockset::Client<lockset::redis::aio::MultiplexedConnection>,
    held: &Arc<Vec<AtomicBool>>,
    violations: &Arc<AtomicU64>,
    duration: Duration,
) -> (u64, u64) {
    let until = Instant::now() + duration;
    let options = Options::default()
        .retry(Retry::linear(ms(1)).jitter(Jitter::Full))
        .timeout(ms(500));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, options, held, violations) = (
                polling.clone(),
                options.clone(),
                held.clone(),
                violations.clone(),
            );
            tokio::spawn(async move {
                let (mut taken, mut missed) = (0, 0);
                while Instant::now() < until {
                    let mut picked: Vec<usize> = {
                        let mut rng = rand::rng();
                        let size = rng.random_range(1..=5);
                        (0..size).map(|_| rng.random_range(0..KEYS)).collect()
                    };
                    picked.sort_unstable();
                    picked.dedup();
                    let keys: Vec<String> = picked.iter().map(|k| format!("soak:{k}")).collect();
                    match client.obtain_multi(keys, ms(5_000), &options).await {
                        Ok(lock) => {
                            taken += 1;
                            for &k in &picked {
                                if held[k].swap(true, Ordering::SeqCst) {
                                    violations.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            tokio::task::yield_now().await;
                            for &k in &picked {
                                held[k].store(false, Ordering::SeqCst);
                            }
                            lock.release().await.expect("release of a held lock");
                        }
                        Err(err) => {
                            assert!(err.is_not_obtained(), "only not-obtained errors: {err:?}");
                            missed += 1;
                        }
                    }
                }
                (taken, missed)
            })
        })
        .collect();
    let (mut taken, mut missed) = (0, 0);
    for task in tasks {
        let (t, m) = task.await.unwrap();
        taken += t;
        missed += m;
    }
    (taken, missed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak test; .ci/run runs it with a short duration"]
async fn soak_random_key_subsets() {
    let seconds: u64 = std::env::var("LOCKSET_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let env = Env::start().await;
    // A polling client: with release events on, the resident set still grows under this much
    // churn (about 1 MB/s, also with one malloc arena); the cause is not found yet, see the
    // README.
    let polling = lockset::Client::new(env.raw.clone());
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let violations = Arc::new(AtomicU64::new(0));
    // Warm up, then measure memory across the rest.
    soak(
        &polling,
        &held,
        &violations,
        Duration::from_secs(seconds.min(5)).max(Duration::from_secs(1)),
    )
    .await;
    let before = resident_kib();
    let (taken, missed) = soak(&polling, &held, &violations, Duration::from_secs(seconds)).await;
    let after = resident_kib();
    println!("soak: {taken} locks taken, {missed} deadlines missed, RSS {before} -> {after} KiB");
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    assert!(taken > 0);
    assert!(
        after < before + 20 * 1024,
        "resident memory grew from {before} KiB to {after} KiB"
    );
    assert_eq!(env.dbsize().await, 0);
    assert_eq!(polling.background_tasks(), 0);
}
