//! Soak: 64 tasks on 4 clients with release events on (as 4 processes would be) lock random
//! subsets of 100 keys for a bounded time; mutual exclusion holds and resident memory stays
//! flat. Ignored by default; `.ci/run` runs it briefly, a long local run takes 10 minutes:
//! `LOCKSET_SOAK_SECS=600 cargo test --all-features --test soak -- --ignored --nocapture`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockset::{Jitter, Options, Retry};
use rand::RngExt as _;
use support::{Env, ms, resident_kib};
use tokio::time::Instant;

const TASKS: usize = 64;
const KEYS: usize = 100;

/// Runs the soak for `duration`; returns (locks taken, deadlines missed).
async fn soak(
    clients: &[lockset::Client<lockset::redis::aio::ConnectionManager>],
    held: &Arc<Vec<AtomicBool>>,
    violations: &Arc<AtomicU64>,
    duration: Duration,
) -> (u64, u64) {
    let until = Instant::now() + duration;
    let options = Options::default()
        .retry(Retry::linear(ms(1)).jitter(Jitter::Full))
        .timeout(ms(500));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (client, options, held, violations) = (
                clients[task % clients.len()].clone(),
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

/// Samples the resident set every 10 s while `run` runs; returns its output and the samples.
async fn sampled<T>(run: impl std::future::Future<Output = T>) -> (T, Vec<u64>) {
    let samples = std::sync::Mutex::new(vec![resident_kib()]);
    let sampler = async {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            samples.lock().unwrap().push(resident_kib());
        }
    };
    let output = tokio::select! {
        output = run => output,
        () = sampler => unreachable!(),
    };
    let mut samples = samples.into_inner().unwrap();
    samples.push(resident_kib());
    (output, samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak test; .ci/run runs it with a short duration"]
async fn soak_random_key_subsets() {
    let seconds: u64 = std::env::var("LOCKSET_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let env = Env::start().await;
    let mut clients = vec![env.client.clone()];
    for _ in 1..4 {
        clients.push(env.other_client().await);
    }
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let violations = Arc::new(AtomicU64::new(0));
    // Warm up, then measure memory across the rest.
    soak(
        &clients,
        &held,
        &violations,
        Duration::from_secs(seconds.min(5)).max(Duration::from_secs(1)),
    )
    .await;
    let run = soak(&clients, &held, &violations, Duration::from_secs(seconds));
    let ((taken, missed), samples) = sampled(run).await;
    let (before, after) = (samples[0], samples[samples.len() - 1]);
    let peak = samples.iter().copied().max().unwrap_or(after);
    println!(
        "soak: {taken} locks taken in {seconds} s, {missed} deadlines missed, \
         RSS every 10 s (KiB): {samples:?}"
    );
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    assert!(taken > 0);
    assert!(
        peak < before + 8 * 1024,
        "resident memory grew from {before} KiB to {peak} KiB"
    );
    assert_eq!(env.dbsize().await, 0);
    for client in &clients {
        assert_eq!(client.background_tasks(), 0);
    }
}
