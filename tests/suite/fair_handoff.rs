//! Fair waiting: what a lock taken from a hand-off notice is worth. The new holder sends
//! nothing, so the server's grant and the holder's belief must be exactly right: beliefs
//! never overlap, under latency, lost replies, cancellation and keys whose queues share a
//! name; a lock lasts its TTL also when the hand-off gave less (the waiter's lease was
//! shorter), on any runtime, whatever the holder does next; a queued waiter waits as long
//! as its strategy says, also with endless intervals; and the waiters that do not queue are
//! still told of a release.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Options, Retry};
use support::fair::{
    HANDED_WITHIN, handed, hold, queued_up_to, slow_polling, wait_for, wait_for_keys,
};
use support::proxy::Proxy;
use support::{Env, eventually, ms};
use tokio::time::{Instant, timeout};

/// How many connections subscribe to `channel` on the server.
async fn subscribers(env: &Env, channel: &str) -> i64 {
    let reply: Vec<lockset::redis::Value> = env.cmd(&["PUBSUB", "NUMSUB", channel]).await;
    match reply.get(1) {
        Some(lockset::redis::Value::Int(n)) => *n,
        _ => 0,
    }
}

/// A waiter that marks the holder without queueing (`fair(false)`, a custom token, shared or
/// counted keys) is told of the release of a key that was handed on in between: the handed
/// key stays marked, so that its next release announces itself. (A hand-off once dropped
/// the mark: the waiter slept until its next poll while the key was free.)
#[tokio::test]
async fn a_barging_waiter_hears_of_a_key_freed_after_a_hand_off() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let (fair_client, barging_client) = (env.other_client().await, env.other_client().await);
    let barging = wait_for_keys(&barging_client, vec!["job"], slow_polling().fair(false));
    // It listens, and has marked the holder.
    eventually(ms(10_000), "the barging waiter listens", async || {
        subscribers(&env, "job").await == 1 && env.get("job").await.unwrap().starts_with('!')
    })
    .await;
    let fair = wait_for_keys(&fair_client, vec!["job"], slow_polling());
    queued_up_to(&env, "job", 1).await;
    held.release().await.unwrap();
    let first = handed(HANDED_WITHIN, fair, "handed to the fair waiter").await;
    assert!(
        env.get("job").await.unwrap().starts_with('!'),
        "still marked"
    );
    first.release().await.unwrap();
    let freed = Instant::now();
    let lock = handed(
        HANDED_WITHIN,
        barging,
        "the barging waiter was told that the key is free",
    )
    .await;
    assert!(freed.elapsed() < HANDED_WITHIN, "{:?}", freed.elapsed());
    lock.release().await.unwrap();
}

/// A rolling upgrade puts waiters of the previous version, whose records keep no turn, in
/// the same queues: a release hands on to them as to any other (once, the missing turn made
/// the script fail after it had handed the key on).

#[tokio::test]
async fn a_release_hands_on_to_a_waiter_queued_by_the_previous_version() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    // A waiter of the previous version: its record as that version's queue_up wrote it
    // (v, t, i, n, l and the keys; no 's'), and it marked the holder.
    let record = "job{job}:lockset:queue:0123456789abcdef1";
    let value = "16:0123456789abcdef";
    let _: i64 = env
        .cmd(&[
            "HSET",
            record,
            "v",
            value,
            "t",
            "60000",
            "i",
            "0123456789abcdef1",
            "n",
            "1",
            "l",
            "1",
            "1",
            "job",
        ])
        .await;
    let _: i64 = env.cmd(&["PEXPIRE", record, "5000"]).await;
    let _: i64 = env
        .cmd(&["ZADD", "job{job}:lockset:queue", "1", record])
        .await;
    let current = env.get("job").await.unwrap();
    let _: String = env
        .cmd(&["SET", "job", &format!("!{current}"), "KEEPTTL"])
        .await;
    let released = held.release().await;
    assert!(
        released.is_ok(),
        "the release failed: {:?}; the key now holds {:?}",
        released.err(),
        env.get("job").await
    );
    // Handed on, still marked (somebody waited for it).
    assert_eq!(env.get("job").await, Some(format!("!{value}")));
}

/// A rolling upgrade, the other way: a release of the previous version knows nothing of
/// the clients' own hand-off channels, and tells a waiter on the release channel of the key
/// its record names (`l`). A waiter whose record names its client's own channel (`c`) still
/// hears it there, at once.
#[tokio::test]
async fn a_hand_off_told_on_the_keys_channel_reaches_a_waiter_that_named_its_own() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let waiter = wait_for(&other, "job", slow_polling());
    queued_up_to(&env, "job", 1).await;
    let queue = lockset::queue_key_for("job").unwrap();
    let members: Vec<String> = env.cmd(&["ZRANGE", &queue, "0", "0"]).await;
    let record: HashMap<String, String> = env.cmd(&["HGETALL", &members[0]]).await;
    assert!(!record["c"].is_empty(), "names its own channel: {record:?}");
    // The previous version's hand-off: the key holds the waiter's value, its entry and
    // record go, and the notice goes on the key's own channel.
    let _: String = env
        .cmd(&["SET", "job", &record["v"], "PX", &record["t"]])
        .await;
    let _: i64 = env.cmd(&["ZREM", &queue, &members[0]]).await;
    let _: i64 = env.cmd(&["DEL", &members[0]]).await;
    let notice = format!("g{}:{}:{}", record["i"], record["s"], record["t"]);
    let told = Instant::now();
    let _: i64 = env.cmd(&["PUBLISH", "job", &notice]).await;
    let lock = handed(HANDED_WITHIN, waiter, "told on the key's channel").await;
    assert!(told.elapsed() < HANDED_WITHIN, "{:?}", told.elapsed());
    assert!(lock.valid_until() > Instant::now() + ms(50_000));
    lock.release().await.unwrap();
    drop(held);
    assert_eq!(env.dbsize().await, 0);
}

/// A queued waiter's strategy delays count time waited, not attempts: a lease renewal
/// (every third of the lease) uses only what it sleeps of a delay, and the rest is kept.
/// (Once each renewal used up a whole delay: three retries 3 s apart gave up after about
/// half a second.)

#[tokio::test]
async fn a_queued_waiter_waits_as_long_as_its_strategy_delays() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(3_000)).limit(3))
            .timeout(ms(60_000))
            .waiter_lease(ms(600));
        let obtained = other.obtain("job", ms(60_000), &options).await;
        (obtained, started.elapsed())
    });
    queued_up_to(&env, "job", 1).await;
    // Well within the 9 s of delays its strategy allows.
    tokio::time::sleep(ms(2_500)).await;
    if waiter.is_finished() {
        let (obtained, after) = waiter.await.unwrap();
        panic!(
            "the waiter gave up after {after:?} of the 9 s its strategy allows: {:?}",
            obtained.err()
        );
    }
    held.release().await.unwrap();
    let lock = timeout(HANDED_WITHIN, waiter)
        .await
        .unwrap()
        .unwrap()
        .0
        .unwrap();
    lock.release().await.unwrap();
}

// What every holder believes never overlaps on any key. Fair
// waiters for overlapping key sets, short leases (so that hand-offs give little and are
// extended), TTLs shorter than the lease (so that a hand-off gives the TTL and nothing
// extends it), holds longer than the TTL (so that some holders outlive their validity and
// their keys expire), and half the clients behind a proxy with latency (so that the turn a
// hand-off names was sent well before the hand-off). The checker catches two broken
// versions: one that counts a hand-off's validity from when the notice is heard instead of
// from the named turn's send (src/waiting/fair.rs), and one that hands a key freed by a release of
// several keys to two waiters (lua/release.lua, `released` checked before `GET`). Each
// holder's belief is the interval
// from obtain's return to the earlier of its release and its validity (sampled until the
// release); two beliefs on one key must never overlap. All on one clock.
//
// A holder whose process was starved may get obtain's reply only after its validity ended:
// it never believed it held the lock, and its belief is empty. Its lock began on the
// server long before its obtain returned, and may have expired there and gone to another
// holder before that: an empty belief says nothing about who came next, and is left out.
// (Once it was placed at its obtain's return like any other: the holder that legitimately
// took the key after it expired looked like a predecessor still believing, e.g. "believed
// until 18 ms after holder 52 started" where holder 52's validity had ended 213 ms before
// its obtain returned.)

#[derive(Clone, Copy, Debug)]
struct Belief {
    holder: u64,
    from: Instant,
    until: Instant,
}

impl Belief {
    /// Whether the holder believed at any moment: its validity had not ended when its
    /// obtain returned.
    fn held(&self) -> bool {
        self.from < self.until
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sound_beliefs_of_fair_holders_never_overlap() {
    beliefs_never_overlap(["{s}:a", "{s}:b", "{s}:c"], false).await;
}

/// The same while replies to the proxied clients are lost now and then: their attempts'
/// outcomes are unknown, they start over under new tokens and ids (notices for the old ids
/// are stale), and their clean-ups release and leave in the background; and while some
/// obtains are cancelled mid-wait (maybe with a hand-off on its way to them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sound_beliefs_never_overlap_while_replies_are_lost() {
    beliefs_never_overlap(["{l}:a", "{l}:b", "{l}:c"], true).await;
}

/// The same with keys whose queues share a name: "t" and "t{t}" (and a third key of the slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sound_beliefs_never_overlap_on_a_key_and_its_braced_twin() {
    beliefs_never_overlap(["t", "t{t}", "{t}:x"], false).await;
}

async fn beliefs_never_overlap(keys: [&'static str; 3], lose_replies: bool) {
    let env = Env::start().await;
    let proxy = Arc::new(Proxy::start(env.server.port()).await);
    proxy.set_latency(ms(15));
    let beliefs: Arc<Mutex<HashMap<&'static str, Vec<Belief>>>> = Arc::default();
    let next_holder = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let client = if t % 2 == 0 {
            env.other_client().await
        } else {
            let commands = lockset::redis::Client::open(proxy.url()).unwrap();
            let conn = ConnectionManager::new(commands).await.unwrap();
            let events = lockset::redis::Client::open(env.server.url()).unwrap();
            Client::new(conn).with_release_events(events).unwrap()
        };
        let (beliefs, next_holder, stop) = (beliefs.clone(), next_holder.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) {
                round += 1;
                let pick = (t + round) % 4;
                let names: Vec<&'static str> = match pick {
                    0 => vec![keys[0], keys[1]],
                    1 => vec![keys[1], keys[2]],
                    2 => vec![keys[2], keys[0]],
                    _ => vec![keys[(t as usize + round as usize) % 3]],
                };
                // Every fourth round a TTL shorter than the lease: a hand-off gives the TTL
                // itself, nothing extends it, and only the validity ends the belief.
                let short = round.is_multiple_of(4);
                // Otherwise every other round a lease that covers the TTL (hand-offs give all
                // of it, and are taken as they are told), or a shorter one (hand-offs give
                // less, and an attempt makes the keys the holder's for the full TTL).
                let ttl = ms(200 + 50 * ((t + round) % 4));
                let (ttl, lease) = if short {
                    (ms(100 + 20 * (t % 3)), ms(300))
                } else if round.is_multiple_of(2) {
                    (ttl, ttl * 2)
                } else {
                    (ttl, ms(90 + 30 * (round % 3)))
                };
                let options = Options::default()
                    .retry(Retry::linear(ms(400)))
                    .timeout(ms(20_000))
                    .waiter_lease(lease);
                let obtaining = client.obtain_multi(names.clone(), ttl, &options);
                // With faults, every fifth obtain is also cancelled after a short while.
                let obtained = if lose_replies && round.is_multiple_of(5) {
                    timeout(ms(20 + 10 * (round % 7)), obtaining)
                        .await
                        .unwrap_or(Err(lockset::Error::DeadlineExceeded))
                } else {
                    obtaining.await
                };
                let Ok(lock) = obtained else {
                    continue;
                };
                let from = Instant::now();
                let holder = next_holder.fetch_add(1, Ordering::SeqCst);
                // Hold: mostly short, sometimes beyond the TTL (no refresh).
                let hold = if round.is_multiple_of(7) || (short && round.is_multiple_of(8)) {
                    ttl + ms(100)
                } else {
                    ms(round % 20)
                };
                // It believes it holds the lock at any moment before its validity then.
                let end = Instant::now() + hold;
                let mut ran_out = None;
                while Instant::now() < end {
                    let valid = lock.valid_until();
                    if Instant::now() >= valid {
                        ran_out = Some(valid);
                        break;
                    }
                    tokio::time::sleep(ms(5)).await;
                }
                let until = ran_out.unwrap_or_else(|| Instant::now().min(lock.valid_until()));
                {
                    let mut beliefs = beliefs.lock().unwrap();
                    for name in &names {
                        beliefs.entry(name).or_default().push(Belief {
                            holder,
                            from,
                            until,
                        });
                    }
                }
                let _ = lock.release().await;
            }
        }));
    }
    let faults = tokio::spawn({
        let (proxy, stop) = (proxy.clone(), stop.clone());
        async move {
            let mut lost = 0;
            while lose_replies && !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(ms(250)).await;
                proxy.lose_next_reply();
                lost += 1;
            }
            lost
        }
    });
    // Long enough for hundreds of holders, a fifth of them taken from a notice.
    tokio::time::sleep(ms(8_000)).await;
    stop.store(true, Ordering::SeqCst);
    let lost = faults.await.unwrap();
    if lose_replies {
        eprintln!("{} replies lost", proxy.replies_lost());
        assert!(lost > 10 && proxy.replies_lost() > 10);
    }
    for task in tasks {
        timeout(ms(30_000), task).await.unwrap().unwrap();
    }
    let beliefs = beliefs.lock().unwrap();
    let (mut total, mut empty) = (0, 0);
    for (key, list) in beliefs.iter() {
        let (mut list, never): (Vec<Belief>, Vec<Belief>) =
            list.iter().copied().partition(Belief::held);
        list.sort_by_key(|b| b.from);
        total += list.len();
        empty += never.len();
        // The belief that reaches furthest among those that started before each one.
        let mut furthest: Option<Belief> = None;
        for b in list {
            if let Some(a) = furthest {
                assert!(
                    a.until <= b.from,
                    "{key}: holder {} believed until {:?} after holder {} started \
                     (and believed for {:?})",
                    a.holder,
                    a.until - b.from,
                    b.holder,
                    b.until - b.from
                );
            }
            if furthest.is_none_or(|a| b.until > a.until) {
                furthest = Some(b);
            }
        }
    }
    eprintln!("{total} beliefs checked, {empty} empty (obtain returned after the validity)");
    assert!(total > 100, "too few holders to tell: {total}");
}

/// A hand-off that gives less than the TTL (the 60 s lock's default lease is 15 s) is made
/// the holder's for the full TTL before obtain returns, not by a background task that a
/// holder could starve: one that then works for seconds without yielding keeps the lock, on
/// a current-thread runtime ...
#[tokio::test]
async fn a_handed_lock_is_not_taken_over_while_its_holder_works_within_its_ttl() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let holder = env.other_client().await;
    let waiter = wait_for_keys(&holder, vec!["job"], slow_polling());
    queued_up_to(&env, "job", 1).await;
    held.release().await.unwrap();
    let lock = handed(HANDED_WITHIN, waiter, "handed over").await;
    let obtained = std::time::Instant::now();
    // Another process wants the lock too, polling every 100 ms.
    let other = poller(env.server.url(), "job", 2_800);
    // Three seconds of work that does not yield (well within 60 s).
    std::thread::sleep(ms(3_000));
    if let Some(at) = other.join().unwrap() {
        panic!(
            "another client obtained the lock {:?} into a 60 s lock obtained from a hand-off, \
             while its holder was still working (valid_until was {:?} after obtain)",
            at - obtained,
            lock.valid_until()
                .saturating_duration_since(Instant::from_std(obtained))
        );
    }
    lock.release().await.unwrap();
}

/// ... and on a multi-thread one, where a task spawned by the holder's task waits in its
/// worker's LIFO slot, which no other worker may take, until the holder yields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_lock_outlives_work_that_does_not_yield_on_a_multi_thread_runtime() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let holder = env.other_client().await;
    let waiter = tokio::spawn(async move {
        let lock = holder
            .obtain("job", ms(60_000), &slow_polling())
            .await
            .unwrap();
        let obtained = std::time::Instant::now();
        let valid_for = lock.valid_until().saturating_duration_since(Instant::now());
        // Three seconds of work that does not yield (well within 60 s).
        std::thread::sleep(ms(3_000));
        let worked = std::time::Instant::now();
        (lock, obtained, worked, valid_for)
    });
    queued_up_to(&env, "job", 1).await;
    held.release().await.unwrap();
    let other = poller(env.server.url(), "job", 3_500);
    let (lock, obtained, worked, valid_for) = timeout(ms(10_000), waiter)
        .await
        .expect("the waiter finished")
        .unwrap();
    let taken_over = tokio::task::spawn_blocking(move || other.join().unwrap())
        .await
        .unwrap();
    if let Some(at) = taken_over
        && at < worked
    {
        panic!(
            "another client obtained the lock {:?} into a 60 s lock taken from a hand-off \
             (valid for {valid_for:?} when taken), while its holder was still working",
            at - obtained
        );
    }
    lock.release().await.ok();
}

/// A strategy that never polls (an endless interval) waits for its hand-off: the time a
/// queued waiter keeps for later never overflows.
#[tokio::test]
async fn a_queued_waiter_with_an_endless_interval_is_handed_the_lock() {
    queued_with_then_handed(Retry::linear(Duration::MAX)).await;
}

/// The same when the endless interval comes after short ones.
#[tokio::test]
async fn a_queued_waiter_with_a_short_then_endless_interval_is_handed_the_lock() {
    queued_with_then_handed(Retry::intervals([ms(1), ms(1), Duration::MAX])).await;
}

/// A waiter with strategy `retry` and a 300 ms lease queues, renews its place several
/// times, and is handed the lock (an overflow would panic its obtain).
async fn queued_with_then_handed(retry: Retry) {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let waiter = tokio::spawn(async move {
        let options = Options::default()
            .retry(retry)
            .timeout(ms(30_000))
            .waiter_lease(ms(300));
        other.obtain("job", ms(60_000), &options).await
    });
    queued_up_to(&env, "job", 1).await;
    // Several lease renewals (every 100 ms).
    tokio::time::sleep(ms(1_000)).await;
    held.release().await.unwrap();
    let obtained = timeout(HANDED_WITHIN, waiter)
        .await
        .expect("handed within 2 s");
    let lock = match obtained {
        Ok(lock) => lock.expect("obtained"),
        Err(err) => panic!("the waiter's obtain panicked: {err}"),
    };
    lock.release().await.unwrap();
}

/// Another process that wants `key` and polls every 100 ms for `for_ms`; returns when it got
/// it (std clock), if it did.
fn poller(
    url: String,
    key: &'static str,
    for_ms: u64,
) -> std::thread::JoinHandle<Option<std::time::Instant>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let client = Client::connect(&url).await.unwrap();
            let options = Options::default()
                .retry(Retry::linear(ms(100)))
                .timeout(ms(for_ms))
                .fair(false);
            let lock = client.obtain(key, ms(60_000), &options).await.ok()?;
            let at = std::time::Instant::now();
            lock.release().await.ok();
            Some(at)
        })
    })
}

/// A fair waiter whose first attempt went out before its release channel was live tries
/// once more as soon as it is (a release may have come between): that recheck takes one
/// delay of its strategy, but the time it did not sleep is still the waiter's. With a
/// strategy of one retry after 3 s, the waiter queues in its recheck and is handed the lock
/// released 300 ms later (before, it gave up a few ms after starting: the recheck had used
/// the only delay, and nothing was left to wait with). The same happened under load to a
/// strategy of 1 ms, 1 ms, then endless, when the subscription took longer than 2 ms.
#[tokio::test]
async fn a_recheck_that_used_the_last_delay_leaves_its_time_to_the_queued_waiter() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let other = env.other_client().await;
    let started = tokio::time::Instant::now();
    let waiter = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::intervals([ms(3_000)]))
            .timeout(ms(10_000));
        other.obtain("job", ms(60_000), &options).await
    });
    queued_up_to(&env, "job", 1).await;
    tokio::time::sleep(ms(300)).await;
    assert!(
        !waiter.is_finished(),
        "gave up after {:?}",
        started.elapsed()
    );
    held.release().await.unwrap();
    let lock = timeout(HANDED_WITHIN, waiter)
        .await
        .expect("handed within 2 s")
        .expect("no panic")
        .expect("obtained");
    let took = started.elapsed();
    assert!(took < ms(2_500), "obtained after {took:?}");
    lock.release().await.unwrap();
}
