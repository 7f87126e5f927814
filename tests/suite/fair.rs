//! Fair waiting: waiters queue in Redis, first come first served across clients, and a
//! release hands the lock straight to the first of them. Every waiter here polls so slowly
//! (15 s) that only a hand-off, or a bound of the queue itself, can get it the lock within
//! the limits checked.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Options, Retry};
use support::fair::{
    HANDED_WITHIN, handed, hold, queued, queued_up_to, slow_polling, wait_for, wait_for_keys,
};
use support::proxy::Proxy;
use support::{Env, Exclusion, eventually, ms};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

#[tokio::test]
async fn waiters_in_eight_clients_get_the_lock_in_arrival_order() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let client = env.other_client().await;
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let lock = client.obtain("job", ms(60_000), &slow_polling()).await?;
            order.lock().unwrap().push(i);
            lock.release().await
        }));
        // Arrival order: each waiter is in the queue before the next one starts.
        queued_up_to(&env, "job", i + 1).await;
    }
    let released = Instant::now();
    held.release().await.unwrap();
    for waiter in waiters {
        timeout(HANDED_WITHIN * 4, waiter)
            .await
            .expect("every waiter had its turn")
            .unwrap()
            .unwrap();
    }
    assert!(released.elapsed() < HANDED_WITHIN * 4);
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
    // Nothing is left behind: no queue, no waiter record.
    assert_eq!(env.dbsize().await, 0);
}

/// A 10 s lock: the default lease (15 s) covers it, and the hand-off gives the full TTL.
#[tokio::test]
async fn a_release_hands_the_lock_to_the_waiter_without_a_race() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let waiter = tokio::spawn(async move {
        let options = slow_polling().metadata("next");
        other.obtain("job", ms(10_000), &options).await
    });
    queued_up_to(&env, "job", 1).await;
    let sets = env.calls("set").await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, waiter, "handed over").await;
    assert_eq!(lock.metadata(), "next");
    // The lock went from one holder to the next in the release: the key never was free.
    let value = env.get("job").await.unwrap();
    assert!(value.ends_with("next"), "{value}");
    // One SET, by the release's hand-off; the waiter took it as it was told: no attempt
    // after it (its SET NX), no race.
    assert_eq!(env.calls("set").await - sets, 1);
    // Its validity counts from before the hand-off: never more than the server's TTL, and
    // nearly all of it.
    valid_within_the_servers_ttl(&env, &lock, "job").await;
    assert!(lock.valid_until() > Instant::now() + ms(8_000));
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// The server's work per fair acquisition (issue 39): the key a release frees is marked for
/// its next holder whoever else waits, so a hand-off of a single key never counts its queue;
/// only a waiter's other keys are marked by who waits for them.
#[tokio::test]
async fn a_single_key_hand_off_does_not_count_its_queue() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let waiters = releasing_waiters(&env, "job", 2).await;
    let counted = env.calls("zcard").await;
    let handed = env.calls("hmget").await;
    held.release().await.unwrap();
    each_had_its_turn(waiters, HANDED_WITHIN * 2).await;
    // Two hand-offs (the holder's release, then the first waiter's), no queue counted.
    assert_eq!(env.calls("hmget").await - handed, 2, "two hand-offs");
    assert_eq!(env.calls("zcard").await - counted, 0);
    assert_eq!(env.dbsize().await, 0);
}

/// A 60 s lock: the default lease (15 s) does not cover it, and the hand-off gives the
/// keys for the rest of the lease only (a waiter that died blocks them no longer). The
/// waiter makes them its own for the full TTL by one more attempt before obtain returns.
#[tokio::test]
async fn a_hand_off_shorter_than_the_ttl_is_made_the_full_ttl_before_obtain_returns() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let waiter = wait_for(&other, "job", slow_polling());
    queued_up_to(&env, "job", 1).await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, waiter, "handed over").await;
    let left = valid_within_the_servers_ttl(&env, &lock, "job").await;
    assert!(left > ms(50_000), "{left:?}");
    assert!(lock.valid_until() > Instant::now() + ms(50_000));
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// Asserts that `lock` believes itself valid no longer than `key` lives on the server (to
/// the millisecond PTTL rounds to); returns what is left of the key's TTL. The key expires no
/// later than the reply's arrival plus the TTL it reports (the server read it before), so that
/// is the bound: measured from the question instead, a slow reply would fail a sound lock.
async fn valid_within_the_servers_ttl(
    env: &Env,
    lock: &lockset::Lock<ConnectionManager>,
    key: &str,
) -> Duration {
    let left = ms(env.cmd::<u64>(&["PTTL", key]).await);
    let answered = Instant::now();
    assert!(
        lock.valid_until() <= answered + left + ms(1),
        "believed {:?} beyond the key's expiry",
        lock.valid_until()
            .saturating_duration_since(answered + left)
    );
    left
}

#[tokio::test]
async fn a_cancelled_obtain_leaves_no_queue_entry() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let waiter = wait_for(&other, "job", slow_polling());
    queued_up_to(&env, "job", 1).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    other.background_idle().await;
    assert_eq!(queued(&env, "job").await, 0);
    // Only the holder's key is left.
    assert_eq!(env.dbsize().await, 1);
    held.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// A waiter stalled past its lease (its record expired) while the holder's key expired: its
/// next attempt finds the key free and wins, and leaves the queue even so.
#[tokio::test]
async fn a_waiter_whose_lease_lapsed_leaves_the_queue_when_it_wins() {
    let env = Env::start().await;
    let _held = hold(&env, "job").await;
    let other = env.other_client().await;
    let options = Options::default()
        .retry(Retry::linear(ms(20)))
        .waiter_lease(ms(300))
        .timeout(ms(60_000));
    let waiter = wait_for(&other, "job", options);
    queued_up_to(&env, "job", 1).await;
    let member: Vec<String> = env
        .cmd(&["ZRANGE", "job{job}:lockset:queue", "0", "0"])
        .await;
    // Both at once: no renewal of the record comes between.
    let _: () = env
        .cmd(&[
            "EVAL",
            "redis.call('DEL', KEYS[1], KEYS[2])",
            "2",
            "job",
            &member[0],
        ])
        .await;
    let lock = handed(ms(10_000), waiter, "the waiter won by an attempt").await;
    assert_eq!(
        queued(&env, "job").await,
        0,
        "a queue entry was left behind"
    );
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn a_waiter_whose_deadline_passes_leaves_the_queue_at_once() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let (first, second) = (env.other_client().await, env.other_client().await);
    let impatient = wait_for(&first, "job", slow_polling().timeout(ms(1_000)));
    queued_up_to(&env, "job", 1).await;
    let patient = wait_for(&second, "job", slow_polling());
    queued_up_to(&env, "job", 2).await;
    let err = impatient.await.unwrap().unwrap_err();
    assert!(err.is_not_obtained(), "{err}");
    first.background_idle().await;
    assert_eq!(queued(&env, "job").await, 1);
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, patient, "the patient waiter is next").await;
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_killed_mid_wait_stops_blocking_within_its_lease() {
    let env = Env::start().await;
    let lease = ms(1_000);
    let held = hold(&env, "job").await;
    // The doomed waiter reaches the server through a proxy, which then goes silent: its
    // process is gone, and so is any clean-up it would send.
    let proxy = Proxy::start(env.server.port()).await;
    let doomed = Client::connect(&proxy.url()).await.unwrap();
    let dying = wait_for(&doomed, "job", slow_polling().waiter_lease(lease));
    queued_up_to(&env, "job", 1).await;
    let other = env.other_client().await;
    let survivor = wait_for(&other, "job", slow_polling().waiter_lease(lease));
    queued_up_to(&env, "job", 2).await;
    proxy.stall(true);
    dying.abort();
    drop(doomed);
    // The release hands the lock to the dead waiter while its lease lasts; it holds it no
    // longer than that lease, then the survivor gets it.
    held.release().await.unwrap();
    let released = Instant::now();
    let lock = timeout(lease * 3 + HANDED_WITHIN, survivor)
        .await
        .expect("the survivor got the lock within the dead waiter's lease")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < lease * 3 + HANDED_WITHIN);
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_hand_off_to_a_waiter_that_gives_up_is_passed_on() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    // The first waiter is cut off behind a proxy that stalls after it queued: it is handed
    // the lock, but does not hear of it before its deadline.
    let proxy = Proxy::start(env.server.port()).await;
    let server = lockset::redis::Client::open(proxy.url()).unwrap();
    let conn = ConnectionManager::new(server.clone()).await.unwrap();
    let stalled = Client::new(conn).with_release_events(server).unwrap();
    let first = wait_for(&stalled, "job", slow_polling().timeout(ms(1_500)));
    queued_up_to(&env, "job", 1).await;
    let other = env.other_client().await;
    let second = wait_for(&other, "job", slow_polling());
    queued_up_to(&env, "job", 2).await;
    proxy.stall(true);
    held.release().await.unwrap();
    let err = first.await.unwrap().unwrap_err();
    assert!(
        err.is_not_obtained() || matches!(err, lockset::Error::UnknownOutcome(_)),
        "{err}"
    );
    // Its clean-up, once it gets through, releases what it was handed, to the next waiter.
    proxy.stall(false);
    let resumed = Instant::now();
    let lock = handed(HANDED_WITHIN * 2, second, "passed on").await;
    assert!(resumed.elapsed() < HANDED_WITHIN * 2);
    lock.release().await.unwrap();
    stalled.background_idle().await;
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn a_waiter_for_two_keys_does_not_hold_up_a_waiter_for_one_of_them() {
    let env = Env::start().await;
    let held = hold(&env, "b").await;
    let other = env.other_client().await;
    let both = wait_for_keys(&other, vec!["a", "b"], slow_polling());
    queued_up_to(&env, "b", 1).await;
    // "a" is free: a waiter for it alone goes in at once, and again after the release: the
    // waiter for both, blocked by "b", keeps nobody from "a".
    let third = env.other_client().await;
    for _ in 0..2 {
        let a = timeout(
            HANDED_WITHIN,
            third.obtain("a", ms(60_000), &slow_polling()),
        )
        .await
        .expect("not held up")
        .unwrap();
        a.release().await.unwrap();
    }
    let a = third
        .obtain("a", ms(60_000), &slow_polling())
        .await
        .unwrap();
    // Released, "b" cannot go to the waiter for both ("a" is held; never some of its keys):
    // it marks the holder of "a", whose release then hands both keys on at once.
    held.release().await.unwrap();
    assert!(env.get("a").await.unwrap().starts_with('!'));
    a.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, both, "both keys at once").await;
    // Both hold its value (maybe behind a waiter's mark).
    let (a, b) = (env.get("a").await.unwrap(), env.get("b").await.unwrap());
    assert_eq!(a.trim_start_matches('!'), b.trim_start_matches('!'));
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// Locking "a" then, inside, "b" (nested, two obtains) goes on while another waits for
/// both at once: nothing keeps "b" for that waiter while "a" is held.
#[tokio::test]
async fn nested_obtains_do_not_deadlock_with_a_waiter_for_both_keys() {
    let env = Env::start().await;
    let (a, b) = ("{n}:a", "{n}:b");
    let outer = hold(&env, a).await;
    let held_b = hold(&env, b).await;
    let other = env.other_client().await;
    // Blocked by "b" first: it marks the holder of "b".
    let both = wait_for_keys(&other, vec![b, a], slow_polling());
    queued_up_to(&env, b, 1).await;
    held_b.release().await.unwrap();
    let quick = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(3_000));
    let inner = env.client.obtain(b, ms(60_000), &quick).await.unwrap();
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, both, "handed on").await;
    lock.release().await.unwrap();
}

/// "job" and "job{job}" have queues of one name; a release of one goes to a waiter for it.
#[tokio::test]
async fn a_key_and_its_braced_twin_are_handed_to_their_own_waiters() {
    let env = Env::start().await;
    let plain = hold(&env, "job").await;
    let braced = hold(&env, "job{job}").await;
    let (c1, c2) = (env.other_client().await, env.other_client().await);
    let for_braced = wait_for_keys(&c1, vec!["job{job}"], slow_polling().metadata("braced"));
    queued_up_to(&env, "job", 1).await;
    let for_plain = wait_for_keys(&c2, vec!["job"], slow_polling().metadata("plain"));
    queued_up_to(&env, "job", 2).await;
    plain.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, for_plain, "handed to the waiter for \"job\"").await;
    assert_eq!(lock.metadata(), "plain");
    lock.release().await.unwrap();
    braced.release().await.unwrap();
    let lock = handed(
        HANDED_WITHIN,
        for_braced,
        "handed to the waiter for \"job{job}\"",
    )
    .await;
    assert_eq!(lock.metadata(), "braced");
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// A waiter with a short lease never shortens the life of a queue that a waiter with a
/// longer lease is first in.
#[tokio::test]
async fn a_short_lease_does_not_expire_the_queue_under_a_longer_one() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let (c1, c2, c3) = (
        env.other_client().await,
        env.other_client().await,
        env.other_client().await,
    );
    let first = wait_for_keys(
        &c1,
        vec!["job"],
        slow_polling().waiter_lease(ms(30_000)).metadata("first"),
    );
    queued_up_to(&env, "job", 1).await;
    let short = wait_for_keys(
        &c2,
        vec!["job"],
        slow_polling().waiter_lease(ms(60)).timeout(ms(400)),
    );
    queued_up_to(&env, "job", 2).await;
    assert!(short.await.unwrap().is_err());
    c2.background_idle().await;
    // Longer than three of the short lease: the queue would be gone by now.
    tokio::time::sleep(ms(500)).await;
    assert_eq!(queued(&env, "job").await, 1);
    let second = wait_for_keys(&c3, vec!["job"], slow_polling().metadata("second"));
    queued_up_to(&env, "job", 2).await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, first, "the first waiter is next").await;
    assert_eq!(lock.metadata(), "first");
    lock.release().await.unwrap();
    handed(HANDED_WITHIN, second, "then the second")
        .await
        .release()
        .await
        .unwrap();
}

/// A waiter whose renewal got no reply starts over with a new token and id; it still hears
/// the hand-off made to the new id.
#[tokio::test]
async fn a_waiter_that_started_over_hears_its_hand_off() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let proxy = Proxy::start(env.server.port()).await;
    let commands = lockset::redis::Client::open(proxy.url()).unwrap();
    let conn = ConnectionManager::new(commands).await.unwrap();
    let events = lockset::redis::Client::open(env.server.url()).unwrap();
    let client = Client::new(conn).with_release_events(events).unwrap();
    // Renewals every 3 s: only the hand-off notice can get it the lock sooner.
    let waiter = wait_for_keys(
        &client,
        vec!["job"],
        slow_polling().waiter_lease(ms(9_000)).metadata("W"),
    );
    queued_up_to(&env, "job", 1).await;
    let queue = "job{job}:lockset:queue";
    let before: Vec<String> = env.cmd(&["ZRANGE", queue, "0", "-1"]).await;
    proxy.lose_next_reply();
    eventually(ms(10_000), "queued again under a new id", async || {
        let now: Vec<String> = env.cmd(&["ZRANGE", queue, "0", "-1"]).await;
        now.len() == 1 && now != before
    })
    .await;
    held.release().await.unwrap();
    let released = Instant::now();
    let lock = timeout(ms(10_000), waiter)
        .await
        .expect("handed over")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < HANDED_WITHIN,
        "{:?}",
        released.elapsed()
    );
    lock.release().await.unwrap();
}

#[tokio::test]
async fn waiters_with_overlapping_key_sets_all_make_progress() {
    use std::sync::atomic::{AtomicU64, Ordering};

    let env = Env::start().await;
    let keys = ["{o}:a", "{o}:b", "{o}:c", "{o}:d"];
    let exclusion: Arc<Vec<(Exclusion, AtomicU64)>> =
        Arc::new(keys.iter().map(|_| Default::default()).collect());
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let client = env.other_client().await;
        let exclusion = exclusion.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..15usize {
                // Overlapping pairs and triples, picked differently by each task and round.
                let picked: std::collections::BTreeSet<usize> = (0..2 + (t + round) % 2)
                    .map(|j| (t + j * (1 + round % 3)) % keys.len())
                    .collect();
                let names: Vec<&str> = picked.iter().map(|&i| keys[i]).collect();
                let lock = client
                    .obtain_multi(&names, ms(30_000), &slow_polling())
                    .await
                    .unwrap();
                for &i in &picked {
                    exclusion[i].0.critical_section().await;
                    exclusion[i].1.fetch_add(1, Ordering::SeqCst);
                }
                lock.release().await.unwrap();
            }
        }));
    }
    timeout(Duration::from_secs(60), async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await
    .expect("no deadlock, no starvation");
    for (exclusion, sections) in exclusion.iter() {
        exclusion.assert_exclusive(sections.load(Ordering::SeqCst));
    }
    assert_eq!(env.dbsize().await, 0);
}

/// A release of two keys hands each to its own queue's first waiter: a waiter for both,
/// which came later, does not take the key another waiter was first in line for.
#[tokio::test]
async fn a_release_of_several_keys_keeps_each_queues_order() {
    let env = Env::start().await;
    let (a, b) = ("{r}:a", "{r}:b");
    let held = env
        .client
        .obtain_multi([a, b], ms(60_000), &Options::default())
        .await
        .unwrap();
    let (c1, c2) = (env.other_client().await, env.other_client().await);
    let first = wait_for_keys(&c1, vec![b], slow_polling().metadata("first"));
    queued_up_to(&env, b, 1).await;
    let later = wait_for_keys(&c2, vec![a, b], slow_polling().metadata("later"));
    queued_up_to(&env, a, 1).await;
    queued_up_to(&env, b, 2).await;
    // Make sure both keys are marked (the later waiter marked only the key it met first).
    let _: String = env
        .cmd(&[
            "SET",
            b,
            &format!("!{}", env.get(b).await.unwrap().trim_start_matches('!')),
            "KEEPTTL",
        ])
        .await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, first, "the first in line for b gets it").await;
    assert_eq!(lock.metadata(), "first");
    lock.release().await.unwrap();
    handed(HANDED_WITHIN, later, "then the waiter for both")
        .await
        .release()
        .await
        .unwrap();
}

/// A release of `{a, b}` hands `a` to the first waiter for it; `b`'s first waiter also
/// wants `a`, and is next in `a`'s queue: it must not be handed `a` in the same release
/// (two holders of `a`), but wait for the first to release it.
#[tokio::test]
async fn one_release_never_hands_a_key_to_two_waiters() {
    let env = Env::start().await;
    let held = env
        .client
        .obtain_multi(["{o}:a", "{o}:b"], ms(60_000), &Options::default())
        .await
        .unwrap();
    let (c1, c2) = (env.other_client().await, env.other_client().await);
    let first = wait_for_keys(&c1, vec!["{o}:a"], slow_polling().metadata("first"));
    queued_up_to(&env, "{o}:a", 1).await;
    // Held at b first: it queues on b (first there) and on a (second).
    let second = wait_for_keys(&c2, vec!["{o}:b", "{o}:a"], slow_polling());
    queued_up_to(&env, "{o}:a", 2).await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, first, "a goes to its first waiter").await;
    assert_eq!(lock.metadata(), "first");
    assert!(env.get("{o}:a").await.unwrap().ends_with("first"));
    lock.release().await.unwrap();
    handed(HANDED_WITHIN, second, "then both go to the second")
        .await
        .release()
        .await
        .unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// Waiters with a caller's own token queue like waiters with random ones: in arrival order
/// across clients, each handed the lock by the release before it.
#[tokio::test]
async fn waiters_with_their_own_tokens_queue_in_arrival_order() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let client = env.other_client().await;
        let options = slow_polling().token(format!("worker-{i}"));
        waiters.push(wait_for(&client, "job", options));
        queued_up_to(&env, "job", i + 1).await;
    }
    let mut released = Instant::now();
    held.release().await.unwrap();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let lock = handed(HANDED_WITHIN, waiter, "a waiter with its own token").await;
        let value = env.get("job").await.unwrap();
        assert!(
            value.contains(&format!("worker-{i}")),
            "{value}: not worker-{i}'s turn"
        );
        released = Instant::now();
        lock.release().await.unwrap();
    }
    assert!(released.elapsed() < HANDED_WITHIN);
    assert_eq!(env.dbsize().await, 0);
}

/// A re-obtain by a token that holds "{o}:a" (an outer lock) and waits for "{o}:b" too,
/// queued: once b is released it has both, and a keeps the longer TTL it had. When such a
/// waiter gives up instead, it leaves the queue, and the outer lock stays as it was.
#[tokio::test]
async fn a_queued_reobtain_by_token_keeps_its_outer_lock() {
    let env = Env::start().await;
    let token = Options::default().token("outer-token");
    let outer = env
        .client
        .obtain("{o}:a", ms(60_000), &token)
        .await
        .unwrap();
    let b = hold(&env, "{o}:b").await;
    // Gives up after 500 ms: leaves the queue, and a is still the outer lock's.
    let gave_up = env
        .client
        .obtain_multi(
            ["{o}:a", "{o}:b"],
            ms(5_000),
            &slow_polling().token("outer-token").timeout(ms(500)),
        )
        .await;
    assert!(gave_up.unwrap_err().is_deadline_exceeded());
    eventually(ms(5_000), "the waiter left the queue", async || {
        queued(&env, "{o}:b").await == 0
    })
    .await;
    assert!(
        outer
            .ttl()
            .await
            .unwrap()
            .is_some_and(|left| left > ms(50_000))
    );
    // Waits again, queued, until b is released.
    let waiter = wait_for_keys(
        &env.client,
        vec!["{o}:a", "{o}:b"],
        slow_polling().token("outer-token"),
    );
    queued_up_to(&env, "{o}:b", 1).await;
    b.release().await.unwrap();
    let both = handed(HANDED_WITHIN, waiter, "the re-obtain by token").await;
    let a_left: i64 = env.cmd(&["PTTL", "{o}:a"]).await;
    assert!(
        a_left > 50_000,
        "the outer lock's key was shortened to {a_left} ms"
    );
    both.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// A hand-off is told to its waiter's client alone (issue 39), on a channel that client
/// listens on for its own hand-offs, never on the key's release channel, which every
/// client with a waiter for the key listens on (each would wake up to drop it). Watched
/// by a subscriber to every channel: two hand-offs, two notices, neither on `job`.
#[tokio::test]
async fn a_hand_off_is_told_to_its_waiters_client_alone() {
    let env = Env::start().await;
    let mut all = lockset::redis::Client::open(env.server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    all.psubscribe("*").await.unwrap();
    let held = hold(&env, "job").await;
    let waiters = releasing_waiters(&env, "job", 2).await;
    let released = Instant::now();
    held.release().await.unwrap();
    each_had_its_turn(waiters, HANDED_WITHIN * 2).await;
    assert!(
        released.elapsed() < HANDED_WITHIN * 2,
        "{:?}",
        released.elapsed()
    );
    let mut messages = all.on_message();
    let mut notices = Vec::new();
    while let Ok(Some(message)) =
        timeout(ms(200), futures_util::StreamExt::next(&mut messages)).await
    {
        // Hand-off notices only ("g<id>:…"); the last holder's release is still announced.
        let payload: String = message.get_payload().unwrap();
        if payload.starts_with('g') {
            notices.push(message.get_channel_name().to_owned());
        }
    }
    assert_eq!(notices.len(), 2, "one notice per hand-off: {notices:?}");
    assert!(
        notices.iter().all(|channel| channel != "job"),
        "{notices:?}"
    );
    assert_ne!(
        notices[0], notices[1],
        "each waiter's client has its own channel"
    );
    assert_eq!(env.dbsize().await, 0);
}

/// Spawns `n` waiters for `key`, each in a client of its own and queued before the next
/// starts; each releases the lock as soon as it has it.
async fn releasing_waiters(
    env: &Env,
    key: &'static str,
    n: i64,
) -> Vec<JoinHandle<Result<(), lockset::Error>>> {
    let mut waiters = Vec::new();
    for i in 0..n {
        let other = env.other_client().await;
        waiters.push(tokio::spawn(async move {
            let lock = other.obtain(key, ms(10_000), &slow_polling()).await?;
            lock.release().await
        }));
        queued_up_to(env, key, i + 1).await;
    }
    waiters
}

/// Waits until every one of `waiters` had the lock and released it, within `within` each.
async fn each_had_its_turn(waiters: Vec<JoinHandle<Result<(), lockset::Error>>>, within: Duration) {
    for waiter in waiters {
        timeout(within, waiter)
            .await
            .expect("each waiter had its turn")
            .unwrap()
            .unwrap();
    }
}
