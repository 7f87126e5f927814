//! Waiting you can trust: release events never hang a deadline, never lose a wake-up, never
//! spin, and reach waiters on a Redlock quorum too. Every waiter here polls so slowly that
//! only a release event (or the holder's expiry) can wake it within the bounds checked.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Options, QuorumConfig, Retry};
use support::masters::Masters;
use support::proxy::Proxy;
use support::{Env, client_with_events_via, eventually, ms};
use tokio::time::{Instant, timeout};

/// Polling alone would wait 15 s between attempts.
fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(Duration::from_secs(120))
}

/// How soon a waiter must have the lock after a release: far beyond the event path (about a
/// millisecond), far below the polling interval.
const WOKEN_WITHIN: Duration = Duration::from_millis(1_500);

/// Spawns an obtain of `key` on `client`; returns it with the moment it was spawned.
fn wait_for(
    client: &Client<ConnectionManager>,
    key: &'static str,
    options: Options,
) -> tokio::task::JoinHandle<Result<lockset::Lock<ConnectionManager>, lockset::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.obtain(key, ms(60_000), &options).await })
}

/// Waits until a waiter marked the holder's value of `key`, so that its release announces
/// itself.
async fn holder_marked(env: &Env, key: &str) {
    eventually(ms(10_000), "holder marked", async || {
        env.get(key).await.is_some_and(|v| v.starts_with('!'))
    })
    .await;
}

/// Asserts that `waiter` obtains within [`WOKEN_WITHIN`] of now.
async fn woken(
    waiter: tokio::task::JoinHandle<Result<lockset::Lock<ConnectionManager>, lockset::Error>>,
    what: &str,
) -> lockset::Lock<ConnectionManager> {
    let released = Instant::now();
    let lock = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: never woken"))
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "{what}: woken only after {took:?}");
    lock
}

#[tokio::test]
async fn an_obtain_with_a_deadline_returns_although_the_pubsub_connection_hangs() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let _held = env
        .other_client()
        .await
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    // The pub/sub connection accepts and never answers (a stalled proxy, half-open TCP).
    proxy.stall(true);
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(500));
    let start = Instant::now();
    let outcome = timeout(
        Duration::from_secs(20),
        client.obtain("job", ms(1_000), &options),
    )
    .await
    .expect("obtain hung past its deadline");
    let took = start.elapsed();
    let err = outcome.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(took >= ms(500), "gave up early, after {took:?}");
    assert!(took < ms(3_000), "returned only after {took:?}");
    // Polling still works meanwhile: a free key is obtained at once.
    client
        .obtain("free", ms(1_000), &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.stall(false);
}

// A release by the waiter's own client hands the lock over as soon as the release is
// queued, so that the waiter's attempt runs right behind it. When the server answers that
// release with NOSCRIPT (a fresh server that never ran release.lua, a restart, SCRIPT FLUSH),
// the release runs again only after the waiter's attempt, which finds the lock still held:
// the waiter must still be woken, not left to its polling.
#[tokio::test]
async fn a_local_hand_over_whose_release_met_noscript_still_wakes_the_waiter() {
    let env = Env::start().await;
    let client = &env.client;
    let held = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = wait_for(client, "job", slow_polling());
    holder_marked(&env, "job").await;
    // Only the release script is missing: the waiter's attempts run without delay.
    let _: String = env.cmd(&["SCRIPT", "FLUSH"]).await;
    let _: String = env
        .cmd(&["SCRIPT", "LOAD", &support::scripts::OBTAIN.source])
        .await;
    held.release().await.unwrap();
    let noscript: String = env.cmd(&["INFO", "errorstats"]).await;
    assert!(noscript.contains("errorstat_NOSCRIPT"), "{noscript}");
    woken(waiter, "after a release that met NOSCRIPT").await;
}

#[tokio::test]
async fn a_release_that_found_its_lock_expired_swallows_no_later_wake_up() {
    let env = Env::start().await;
    let client = &env.client;
    // Our own lock on "job" expires unnoticed.
    let expired = client
        .obtain("job", ms(100), &Options::default())
        .await
        .unwrap();
    eventually(ms(10_000), "expiry", async || !env.exists("job").await).await;
    // Another process takes it; one of our tasks waits for it.
    let other = env.other_client().await;
    let held = other
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = wait_for(client, "job", slow_polling());
    eventually(ms(10_000), "listening", async || {
        client.release_channels_watched() == 1
    })
    .await;
    holder_marked(&env, "job").await;
    // Our stale release finds nothing to release: no hand-over happened.
    assert!(expired.release().await.unwrap_err().is_not_held());
    // The real release must reach the waiter.
    held.release().await.unwrap();
    woken(waiter, "after a stale release").await;
}

#[tokio::test]
async fn a_deadline_passed_during_the_first_attempt_ends_the_obtain_without_subscribing() {
    let env = Env::start().await;
    env.load_scripts().await;
    let _held = env
        .other_client()
        .await
        .obtain("{j}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let before = env.attempts().await;
    let options = Options::default()
        .retry(Retry::linear(ms(10)))
        .deadline(Instant::now());
    let err = env
        .client
        .obtain_multi(["{j}:a", "{j}:b"], ms(1_000), &options)
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(env.attempts().await - before, 1, "one attempt only");
    assert_eq!(
        env.calls("subscribe").await,
        0,
        "subscribed past the deadline"
    );
}

/// Another client keeps one of "{f}:a" and "{f}:b" held, changing which one as fast as it
/// can, until the returned flag is set; the task ends after releasing the last.
async fn keep_flipping(env: &Env) -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
    let other = env.other_client().await;
    let stop = Arc::new(AtomicBool::new(false));
    let free = Options::default();
    // Held before the waiter starts.
    let first = other.obtain("{f}:a", ms(60_000), &free).await.unwrap();
    let flipper = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut held = first;
            let mut next = "{f}:b";
            while !stop.load(Ordering::SeqCst) {
                let now = other.obtain(next, ms(60_000), &free).await.unwrap();
                held.release().await.unwrap();
                held = now;
                next = if next == "{f}:a" { "{f}:b" } else { "{f}:a" };
            }
            held.release().await.unwrap();
        }
    });
    (stop, flipper)
}

/// Obtains both flipped keys with `options`, within 30 s; returns the outcome and the time.
async fn obtain_flipped(env: &Env, options: &Options) -> (lockset::Result<()>, Duration) {
    let (stop, flipper) = keep_flipping(env).await;
    let start = Instant::now();
    let outcome = timeout(
        Duration::from_secs(30),
        env.client
            .obtain_multi(["{f}:a", "{f}:b"], ms(1_000), options),
    )
    .await
    .expect("spun past its deadline");
    let took = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    flipper.await.unwrap();
    (outcome.map(drop), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_blocking_key_keeps_changing_neither_spins_nor_misses_its_deadline() {
    let env = Env::start().await;
    // Barging: a fair waiter would be handed the keys (see tests/fair.rs), and the flipper
    // could not take the key reserved for it.
    let options = Options::default()
        .retry(Retry::linear(ms(100)))
        .timeout(ms(1_000))
        .fair(false);
    let (outcome, took) = obtain_flipped(&env, &options).await;
    let err = outcome.unwrap_err();
    // The deadline ends the wait; on a loaded machine it may pass while an attempt still
    // waits for Redis (the flipper keeps the server busy), which is an unknown outcome.
    assert!(
        err.is_deadline_exceeded() || matches!(err, lockset::Error::UnknownOutcome(_)),
        "{err:?} after {took:?}"
    );
    assert!(took < ms(5_000), "returned only after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_of_a_waiter_counts_against_its_retry_strategy() {
    let env = Env::start().await;
    // With 5 retries allowed, a release event (the flipper releases hundreds of times a
    // second) or a new subscription's unslept recheck each use one up.
    let retries = Arc::new(AtomicU32::new(0));
    let options = Options::default()
        .retry(Retry::linear(ms(100)).limit(5))
        .timeout(ms(10_000))
        .fair(false)
        .on_retry({
            let retries = retries.clone();
            move |_| {
                retries.fetch_add(1, Ordering::SeqCst);
            }
        });
    let (outcome, _) = obtain_flipped(&env, &options).await;
    assert!(outcome.unwrap_err().is_not_obtained());
    assert_eq!(
        retries.load(Ordering::SeqCst),
        5,
        "retries for a strategy of 5"
    );
}

#[tokio::test]
async fn a_release_missed_while_the_subscriber_reconnects_still_wakes_the_waiter() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let held = env
        .other_client()
        .await
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = wait_for(&client, "job", slow_polling());
    holder_marked(&env, "job").await;
    // The pub/sub connection breaks, and cannot come back yet.
    proxy.stall(true);
    proxy.drop_connections();
    // The release is announced while nobody listens.
    held.release().await.unwrap();
    proxy.stall(false);
    woken(waiter, "after the subscriber reconnected").await;
}

#[tokio::test]
async fn the_holders_expiry_wakes_a_single_key_waiter() {
    let env = Env::start().await;
    woken_at_the_holders_expiry(&env, &env.client).await;
}

// A client without release events (polling) learns the holder's TTL too, also on the
// script-free single-key path, and wakes at its expiry instead of its next poll.
#[tokio::test]
async fn the_holders_expiry_wakes_a_single_key_waiter_without_release_events() {
    let env = Env::start().await;
    let polling = env.other_client().await.without_release_events();
    woken_at_the_holders_expiry(&env, &polling).await;
}

/// Asserts that `waiter`, polling slowly, obtains a key held for 500 ms by another client
/// soon after the holder's expiry.
async fn woken_at_the_holders_expiry(env: &Env, waiter: &Client<ConnectionManager>) {
    let _held = env
        .other_client()
        .await
        .obtain("job", ms(500), &Options::default())
        .await
        .unwrap();
    let start = Instant::now();
    let lock = timeout(
        Duration::from_secs(30),
        waiter.obtain("job", ms(60_000), &slow_polling()),
    )
    .await
    .expect("never woken");
    lock.unwrap();
    let took = start.elapsed();
    assert!(took < ms(500) + WOKEN_WITHIN, "woken only after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_releases_wake_n_waiters_also_across_a_subscriber_reconnect() {
    const WAITERS: usize = 8;
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let held = env
        .other_client()
        .await
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    // Each waiter releases as soon as it has the lock, which must wake the next one. Every
    // failed attempt is counted.
    let (retries, sleeps) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let counted = slow_polling().on_retry({
        let (retries, sleeps) = (retries.clone(), sleeps.clone());
        move |event| {
            retries.fetch_add(1, Ordering::SeqCst);
            // A recheck right after subscribing has no delay; a wait for the release has.
            if !event.delay.is_zero() {
                sleeps.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let (client, done, counted) = (client.clone(), done.clone(), counted.clone());
        tokio::spawn(async move {
            let lock = client.obtain("job", ms(60_000), &counted).await.unwrap();
            let _ = done.send(Instant::now());
            lock.release().await.unwrap();
        });
    }
    eventually(ms(10_000), "all listening", async || {
        client.release_channels_watched() == 1
            && env.get("job").await.is_some_and(|v| v.starts_with('!'))
            && sleeps.load(Ordering::SeqCst) == u32::try_from(WAITERS).unwrap()
    })
    .await;
    let waiting = retries.load(Ordering::SeqCst);
    held.release().await.unwrap();
    let mut last = Instant::now();
    for handed in 0..WAITERS {
        if handed == WAITERS / 2 {
            // N releases, N attempts: each release woke exactly one waiter, which got the lock.
            assert_eq!(
                retries.load(Ordering::SeqCst),
                waiting,
                "a woken waiter failed"
            );
            // The pub/sub connection breaks halfway through the chain (its waiters are all
            // woken then, since a release may have been missed: those attempts may fail).
            proxy.drop_connections();
        }
        let at = timeout(Duration::from_secs(60), finished.recv())
            .await
            .unwrap_or_else(|_| panic!("hand-over {handed} never happened"))
            .unwrap();
        let took = at.saturating_duration_since(last);
        assert!(took < WOKEN_WITHIN, "hand-over {handed} took {took:?}");
        last = at;
    }
}

#[tokio::test]
async fn redlock_waiters_wake_on_a_release() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(300))).await;
    let held = m
        .redlock
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let redlock = m.redlock.clone();
        async move { redlock.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "a majority marked", async || {
        m.marked(0..5, "job").await >= 3
    })
    .await;
    held.release().await.unwrap();
    let released = Instant::now();
    let lock = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("never woken")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "woken only after {took:?}");
    lock.release().await.unwrap();
    // A quorum's waiters barge (fair waiting is for one server or a cluster): no master
    // holds a queue or a waiter record.
    eventually(ms(10_000), "nothing left on any master", async || {
        m.dbsizes(0..5).await == vec![0; 5]
    })
    .await;
}

#[tokio::test]
async fn a_release_nobody_waits_for_announces_nothing() {
    let env = Env::start().await;
    for keys in [vec!["job"], vec!["{m}:a", "{m}:b", "{m}:c"]] {
        let lock = env
            .client
            .obtain_multi(keys, ms(10_000), &Options::default())
            .await
            .unwrap();
        lock.release().await.unwrap();
    }
    assert_eq!(env.calls("publish").await, 0);
}

/// A waiter that joins a channel its client already listens on marks the holder with its
/// first attempt and sleeps at once: one failed attempt, no recheck.
#[tokio::test]
async fn a_waiter_joining_a_live_channel_marks_with_its_first_attempt_and_sleeps() {
    let env = Env::start().await;
    let held = env
        .other_client()
        .await
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let first = wait_for(&env.client, "job", slow_polling());
    eventually(ms(10_000), "the client listens", async || {
        env.client.release_channels_watched() == 1
    })
    .await;
    holder_marked(&env, "job").await;
    let retries = Arc::new(Mutex::new(Vec::new()));
    let second = wait_for(
        &env.client,
        "job",
        slow_polling().on_retry({
            let retries = retries.clone();
            move |event| retries.lock().unwrap().push(event.delay)
        }),
    );
    eventually(ms(10_000), "the second waiter sleeps", async || {
        !retries.lock().unwrap().is_empty()
    })
    .await;
    let delays = retries.lock().unwrap().clone();
    assert_eq!(delays.len(), 1, "{delays:?}");
    assert!(!delays[0].is_zero(), "a recheck: {delays:?}");
    // One release wakes one of them; its release wakes the other.
    held.release().await.unwrap();
    let mut waiting = vec![first, second];
    while !waiting.is_empty() {
        let released = Instant::now();
        let (lock, _, others) = timeout(
            Duration::from_secs(30),
            futures_util::future::select_all(waiting),
        )
        .await
        .expect("never woken");
        let took = released.elapsed();
        assert!(took < WOKEN_WITHIN, "woken only after {took:?}");
        lock.unwrap().unwrap().release().await.unwrap();
        waiting = others;
    }
}
