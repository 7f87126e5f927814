//! Memory: waiting on many distinct keys leaves the process's resident memory flat. A binary
//! of its own, since it reads the whole process's memory (the suite's other tests would move it).

mod support;

use std::time::Duration;

use lockset::{Options, QuorumConfig, Retry};
use support::masters::{Masters, pause_under_load};
use support::{Env, client_with_timeout, eventually, ms, resident_kib};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_over_many_waits_on_distinct_keys() {
    // 100k waits at full size, 30k in the README's command: a leak of 1 KiB a wait still shows
    // in the 27k measured (the bound below is 20 MiB), one of 250 bytes only at full size.
    let waits = support::repetitions(30_000, 100_000);
    const TASKS: usize = 50;
    let env = Env::start().await;
    // Every key is held (by a plain value): each obtain waits, listens, and gives up.
    for chunk in (0..waits).collect::<Vec<_>>().chunks(10_000) {
        let mut mset = lockset::redis::cmd("MSET");
        for i in chunk {
            mset.arg(format!("k{i}")).arg("held");
        }
        let () = mset.query_async(&mut env.raw.clone()).await.unwrap();
    }
    let options = Options::default()
        .retry(Retry::linear(ms(1)).limit(1))
        .timeout(Duration::from_secs(60));
    // Replies may take longer than redis-rs's default 500 ms on a loaded machine (an
    // unknown outcome, not the subject here).
    let client = client_with_timeout(&env.server.url(), Duration::from_secs(10))
        .await
        .with_release_events(lockset::redis::Client::open(env.server.url()).unwrap())
        .unwrap();
    let run = async |range: std::ops::Range<usize>| {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (client, options, range) = (client.clone(), options.clone(), range.clone());
                tokio::spawn(async move {
                    for i in range.skip(t).step_by(TASKS) {
                        let err = client
                            .obtain(format!("k{i}"), ms(60_000), &options)
                            .await
                            .unwrap_err();
                        assert!(err.is_not_obtained(), "{err:?}");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    };
    // Warm up allocators and connections, then measure the rest.
    run(0..waits / 10).await;
    let before = resident_kib();
    run(waits / 10..waits).await;
    let after = resident_kib();
    assert_eq!(client.release_channels_watched(), 0);
    assert!(
        after < before + 20 * 1024,
        "resident memory grew from {before} KiB to {after} KiB"
    );
    eventually(Duration::from_secs(30), "condition", async || {
        let channels: Vec<String> = env.cmd(&["PUBSUB", "CHANNELS"]).await;
        channels.is_empty()
    })
    .await;
}

/// Issue 38's scenario at length: five Redlock masters, one paused (SIGSTOP) for 3 minutes
/// (`LOCKSET_PAUSE_SECS` to change) under 16 tasks of lock cycles (10 s TTL, 8 KiB metadata),
/// then resumed. It must hold no released lock within 1 s of its resume, and the process's
/// memory must stop growing once the master missed its limit (the debts, bounded, are all that
/// grows). Before, it kept 720–962 released locks and grew 10 → 104–180 MB. Run alone:
/// `cargo test --release --all-features --test memory -- --ignored --nocapture paused_for_minutes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "3 minutes"]
async fn a_master_paused_for_minutes_keeps_no_released_lock() {
    let secs = std::env::var("LOCKSET_PAUSE_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(180);
    let m = Masters::start(QuorumConfig::default()).await;
    let report = pause_under_load(
        &m,
        2,
        Duration::from_secs(secs),
        16,
        ms(10_000),
        ms(2_000),
        ms(1_000),
    )
    .await;
    println!("{report:?}");
    assert!(report.cleared_after.is_some(), "{report:?}");
    // The median from 2 s into the pause on (see `PauseReport`).
    assert!(report.tasks[2] <= 16 * 10, "{report:?}");
    assert_eq!(report.tasks[3], 0, "{report:?}");
    // Requests in flight within the first missed limit, and at most 16 MiB of debts.
    assert!(
        report.rss_kib[1] < report.rss_kib[0] + 100 * 1024,
        "{report:?}"
    );
}
