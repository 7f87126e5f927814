//! Waiting without gaps: every notice a waiter can be sent reaches it, or one more attempt
//! closes the gap. A waiter's channel changes when its blocking key changes, when its
//! subscription lapses (a reconnect, a replaced connection) and on its first attempt; each
//! case is driven here through a fault proxy on the waiter's events connection that holds
//! back the SUBSCRIBE of one channel, so that a release lands exactly in the window. Every
//! waiter polls every 15 s, so only a notice, or an attempt the gap calls for, gets it the
//! lock within the bounds checked.

use crate::support;

use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Lock, Options, Retry};
use support::proxy::Proxy;
use support::{Env, client_with_events_via, eventually, ms};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// A release must reach its waiter within this: far beyond a notice's way (a millisecond
/// or two, plus the proxy's latency), far below a poll (15 s) or a lease renewal (5 s).
const WITHIN: Duration = Duration::from_millis(500);

type Waiter = JoinHandle<Result<Lock<ConnectionManager>, lockset::Error>>;

fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(Duration::from_secs(60))
}

/// Waits until the proxy held back `n` request chunks in all.
async fn held_back(proxy: &Proxy, n: u64, what: &str) {
    timeout(ms(10_000), proxy.wait_for(Proxy::held, n))
        .await
        .unwrap_or_else(|_| panic!("{what}: never held back"));
}

/// The lock `waiter` obtains within `within` of `since`.
async fn obtained_within(waiter: Waiter, since: Instant, within: Duration, what: &str) {
    let lock = timeout(ms(30_000), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: not obtained in 30 s"))
        .unwrap()
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let took = since.elapsed();
    println!("{what}: obtained {took:?} after the release");
    assert!(
        took < within,
        "{what}: obtained only {took:?} after the release"
    );
    lock.release().await.unwrap();
}

/// The scenario. `{k}:a` is held by H1, `{k}:b` by H2; W waits for both. W's first
/// attempt is blocked on a; while W's subscription to a is on its way, H1 releases a; W's
/// recheck finds b held (queueing on both keys, when fair) and W turns to b's channel; H2
/// releases b before W's SUBSCRIBE to b reaches the server. Returns the waiter, when b was
/// released, and the proxy (dropping it cuts W's events connection).
async fn blocking_key_changes_while_subscribing(
    env: &Env,
    options: Options,
    latency: Duration,
) -> (Waiter, Instant, Proxy) {
    let proxy = Proxy::start(env.server.port()).await;
    proxy.set_latency(latency);
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let holders = env.other_client().await;
    let a = holders
        .obtain("{k}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let b = holders
        .obtain("{k}:b", ms(60_000), &Options::default())
        .await
        .unwrap();
    proxy.hold_requests_containing("{k}:a");
    let waiter: Waiter = tokio::spawn(async move {
        client
            .obtain_multi(["{k}:a", "{k}:b"], ms(60_000), &options)
            .await
    });
    // W subscribes to a (held back): a is released meanwhile, announcing nothing.
    held_back(&proxy, 1, "W's SUBSCRIBE to a").await;
    a.release().await.unwrap();
    proxy.hold_requests_containing("{k}:b");
    // Its recheck finds b held; W subscribes to b (held back), and b is released now.
    held_back(&proxy, 2, "W's SUBSCRIBE to b").await;
    let released = Instant::now();
    b.release().await.unwrap();
    proxy.release_held();
    (waiter, released, proxy)
}

/// A fair waiter is handed both keys by b's release: its notice must reach it (it took
/// 5 s, the waiter's lease renewal, published on b's channel where nobody listened yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_whose_blocking_key_changes_hears_its_hand_off() {
    let env = Env::start().await;
    let (waiter, released, _proxy) =
        blocking_key_changes_while_subscribing(&env, slow_polling(), ms(5)).await;
    assert_eq!(
        support::fair::queued(&env, "{k}:b").await,
        0,
        "b's release handed the keys on"
    );
    obtained_within(waiter, released, WITHIN, "fair waiter").await;
}

/// The same with a short deadline: the waiter that was handed the keys must not fail with
/// "held by another owner" (itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_handed_its_keys_does_not_miss_its_deadline() {
    let env = Env::start().await;
    let options = slow_polling().timeout(ms(3_000));
    let (waiter, released, _proxy) =
        blocking_key_changes_while_subscribing(&env, options, ms(5)).await;
    obtained_within(waiter, released, WITHIN, "fair waiter with a 3 s deadline").await;
}

/// The same with 300 ms of latency on the events connection: the notice takes that long,
/// and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_hears_its_hand_off_through_a_slow_events_connection() {
    let env = Env::start().await;
    let (waiter, released, _proxy) =
        blocking_key_changes_while_subscribing(&env, slow_polling(), ms(300)).await;
    obtained_within(
        waiter,
        released,
        WITHIN + ms(1_200),
        "fair waiter, 300 ms latency",
    )
    .await;
}

/// A waiter that does not queue (barging) marked b's holder with its recheck: b's
/// announcement came before its subscription, and no attempt followed (it slept its 15 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barging_waiter_whose_blocking_key_changes_hears_the_release() {
    let env = Env::start().await;
    let options = slow_polling().fair(false);
    let (waiter, released, _proxy) =
        blocking_key_changes_while_subscribing(&env, options, ms(5)).await;
    obtained_within(waiter, released, WITHIN, "barging waiter").await;
}

/// A queued waiter whose events connection drops: a hand-off made while it was down is
/// taken once the subscription is back (the waiter is woken then, and attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_made_while_the_events_connection_is_down_is_taken_when_it_is_back() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let holder = env.other_client().await;
    let held = holder
        .obtain("{r}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter: Waiter = tokio::spawn({
        let client = client.clone();
        async move { client.obtain("{r}:a", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "the waiter queued", async || {
        support::fair::queued(&env, "{r}:a").await == 1
    })
    .await;
    // The events connection breaks, and its SUBSCRIBE cannot get through again yet.
    proxy.hold_requests_containing("{r}:a");
    proxy.drop_connections();
    held.release().await.unwrap();
    // Handed on while nobody listened.
    assert_eq!(support::fair::queued(&env, "{r}:a").await, 0);
    held_back(&proxy, 1, "the waiter's SUBSCRIBE after the drop").await;
    let back = Instant::now();
    proxy.release_held();
    obtained_within(
        waiter,
        back,
        WITHIN,
        "waiter after its events connection came back",
    )
    .await;
}

/// How long the randomized run lasts.
const RANDOMIZED_FOR: Duration = Duration::from_secs(6);
/// Latency on every events connection of the randomized run (each way).
const EVENTS_LATENCY: Duration = Duration::from_millis(10);

/// Waiters for random overlapping sets of 2 to 4 of 24 keys, in 4 clients whose events
/// connections have latency, take turns for a few seconds (fair, polling every 15 s). A
/// watcher reads every key every millisecond and notes when each obtain's value (told apart
/// by its metadata) first holds a key; no obtain may return later than one round trip of
/// the events connection, plus a bound for a loaded machine, after that: a hand-off's
/// notice reaches its waiter, or an attempt closes the gap. (Before the fix, hand-offs
/// notified where nobody listened waited for a lease renewal: seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_waiter_holds_its_keys_longer_than_a_round_trip_before_its_obtain_returns() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use rand::{RngExt as _, SeedableRng as _};

    const KEYS: usize = 24;
    let seed: u64 = std::env::var("GAPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("GAPS_SEED={seed}");
    let env = Env::start().await;
    env.load_scripts().await;
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("{{g}}:{i}")).collect());
    let mut proxies = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    // metadata -> when its obtain returned
    let returned: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let obtains = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..4u64 {
        let proxy = Proxy::start(env.server.port()).await;
        proxy.set_latency(EVENTS_LATENCY);
        let client = client_with_events_via(&env.server, &proxy.url()).await;
        proxies.push(proxy);
        for t in 0..2u64 {
            let (client, keys, stop, returned, obtains) = (
                client.clone(),
                keys.clone(),
                stop.clone(),
                returned.clone(),
                obtains.clone(),
            );
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (c * 2 + t + 1));
            tasks.push(tokio::spawn(async move {
                let mut round = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    round += 1;
                    let want = rng.random_range(2..=4);
                    let mut set: Vec<String> = Vec::new();
                    while set.len() < want {
                        let key = &keys[rng.random_range(0..KEYS)];
                        if !set.contains(key) {
                            set.push(key.clone());
                        }
                    }
                    let meta = format!("|{c}.{t}.{round}|");
                    let options = slow_polling().metadata(meta.clone());
                    let lock = client
                        .obtain_multi(&set, ms(5_000), &options)
                        .await
                        .unwrap_or_else(|err| panic!("{meta} {set:?}: {err}"));
                    returned.lock().unwrap().insert(meta, Instant::now());
                    obtains.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ms(rng.random_range(0..4))).await;
                    lock.release().await.unwrap();
                }
            }));
        }
    }
    // The watcher: when each obtain's value first held a key.
    let first_held: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watcher = tokio::spawn({
        let (mut raw, keys, stop, first_held) = (
            env.raw.clone(),
            keys.clone(),
            stop.clone(),
            first_held.clone(),
        );
        async move {
            while !stop.load(Ordering::SeqCst) {
                let values: Vec<Option<String>> = lockset::redis::cmd("MGET")
                    .arg(keys.as_slice())
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                let seen = Instant::now();
                {
                    let mut first = first_held.lock().unwrap();
                    for value in values.into_iter().flatten() {
                        if let Some(meta) = value.find('|').map(|at| &value[at..]) {
                            first.entry(meta.to_owned()).or_insert(seen);
                        }
                    }
                }
                tokio::time::sleep(ms(1)).await;
            }
        }
    });
    tokio::time::sleep(RANDOMIZED_FOR).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        timeout(ms(30_000), task)
            .await
            .expect("a waiter still waits 30 s after the run")
            .unwrap();
    }
    watcher.await.unwrap();
    let bound = EVENTS_LATENCY * 2 + ms(150);
    let (returned, first_held) = (returned.lock().unwrap(), first_held.lock().unwrap());
    let mut worst = Duration::ZERO;
    for (meta, returned) in returned.iter() {
        let Some(held) = first_held.get(meta) else {
            continue;
        };
        let gap = returned.saturating_duration_since(*held);
        worst = worst.max(gap);
        assert!(
            gap <= bound,
            "{meta}: its keys were its own {gap:?} before its obtain returned (seed {seed})"
        );
    }
    let obtains = obtains.load(Ordering::SeqCst);
    println!(
        "{obtains} obtains; the longest a waiter's keys were its own before it knew: {worst:?}"
    );
    assert!(
        obtains >= 100,
        "only {obtains} obtains in {RANDOMIZED_FOR:?}"
    );
}
