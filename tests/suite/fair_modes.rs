//! Fair waiting for shared and counted keys: readers, writers and permit waiters of a key
//! queue together, first come first served across clients; a release hands a shared key to
//! every reader at the head of the queue at once (up to the next writer), a counted key to
//! as many permit waiters as permits came free, and a mixed set only when every key is the
//! waiter's. Every waiter polls every 15 s, so only a hand-off gets it the lock within the
//! bounds checked; and neither readers nor writers that keep coming starve the other.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Lock, Mode, Options};
use support::fair::{HANDED_WITHIN, queued_up_to, slow_polling};
use support::{Env, ms};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const READ: Mode = Mode::Shared;
const WRITE: Mode = Mode::Exclusive;

type Waiting = JoinHandle<(Instant, Lock<ConnectionManager>)>;

/// An obtain of `keys` (each in its mode), in a task of its own, that reports when it got
/// the lock.
fn spawn_waiter(client: &Client<ConnectionManager>, keys: Vec<(&'static str, Mode)>) -> Waiting {
    let client = client.clone();
    tokio::spawn(async move {
        let lock = client.obtain_multi(keys, ms(60_000), &slow_polling()).await;
        (Instant::now(), lock.unwrap())
    })
}

/// The locks of `waiters`, each of which must have got it within [`HANDED_WITHIN`] of
/// `released`.
async fn handed(
    waiters: Vec<Waiting>,
    released: Instant,
    what: &str,
) -> Vec<Lock<ConnectionManager>> {
    let mut locks = Vec::new();
    for waiter in waiters {
        let (at, lock) = timeout(ms(60_000), waiter)
            .await
            .unwrap_or_else(|_| panic!("{what}: not handed the lock"))
            .unwrap();
        let waited = at.saturating_duration_since(released);
        assert!(
            waited < HANDED_WITHIN,
            "{what}: handed only after {waited:?}"
        );
        locks.push(lock);
    }
    locks
}

/// Asserts that none of `waiters` has the lock yet.
async fn still_waiting(waiters: &[Waiting], what: &str) {
    // A hand-off takes a millisecond or two: one that was made would show by now.
    tokio::time::sleep(ms(300)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "{what} got the lock out of turn"
    );
}

async fn release_all(locks: Vec<Lock<ConnectionManager>>) {
    for lock in locks {
        lock.release().await.unwrap();
    }
}

/// A writer holds "doc"; then, in this order and each in a client of its own, two readers,
/// a writer and two more readers wait. The writer's release hands the key to the first two
/// readers at once (not to the readers behind the writer); their releases to the writer;
/// its release to the last two readers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_served_in_arrival_order_across_clients() {
    let env = Env::start().await;
    let holder = env
        .client
        .obtain("doc", ms(60_000), &Options::default())
        .await
        .unwrap();
    let mut arrivals = Vec::new();
    for (i, mode) in [READ, READ, WRITE, READ, READ].into_iter().enumerate() {
        let client = env.other_client().await;
        arrivals.push(spawn_waiter(&client, vec![("doc", mode)]));
        queued_up_to(&env, "doc", i as i64 + 1).await;
    }
    let mut arrivals = arrivals.into_iter();
    let first_readers: Vec<_> = arrivals.by_ref().take(2).collect();
    let writer = arrivals.next().unwrap();
    let last_readers: Vec<_> = arrivals.collect();

    let released = Instant::now();
    holder.release().await.unwrap();
    let readers = handed(first_readers, released, "the first two readers").await;
    still_waiting(std::slice::from_ref(&writer), "the writer").await;
    still_waiting(&last_readers, "a reader behind the writer").await;

    let released = Instant::now();
    release_all(readers).await;
    let writer = handed(vec![writer], released, "the writer").await;
    still_waiting(&last_readers, "a reader behind the writer").await;

    let released = Instant::now();
    release_all(writer).await;
    release_all(handed(last_readers, released, "the last two readers").await).await;
    assert_eq!(env.dbsize().await, 0, "no queue or record left behind");
}

/// Three permits of "exports" are held; five permit waiters queue. A release of two
/// permits hands them to the first two waiters (at once, in order), and nobody else; one
/// more release to the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_permits_go_to_as_many_waiters_in_arrival_order() {
    let env = Env::start().await;
    let permit = Mode::Permit { limit: 3 };
    let mut held = Vec::new();
    for _ in 0..3 {
        let lock = env
            .client
            .obtain(("exports", permit), ms(60_000), &Options::default())
            .await
            .unwrap();
        held.push(lock);
    }
    let mut waiters = Vec::new();
    for i in 0..5 {
        let client = env.other_client().await;
        waiters.push(spawn_waiter(&client, vec![("exports", permit)]));
        queued_up_to(&env, "exports", i + 1).await;
    }
    let mut waiters = waiters.into_iter();
    let released = Instant::now();
    release_all(held.drain(..2).collect()).await;
    let first = handed(
        waiters.by_ref().take(2).collect(),
        released,
        "the first two",
    )
    .await;
    let rest: Vec<_> = waiters.collect();
    still_waiting(&rest, "a third permit waiter").await;
    let mut rest = rest.into_iter();
    let released = Instant::now();
    release_all(held).await;
    let third = handed(vec![rest.next().unwrap()], released, "the third").await;
    let rest: Vec<_> = rest.collect();
    still_waiting(&rest, "a fourth permit waiter").await;
    release_all(first).await;
    release_all(third).await;
    release_all(handed(rest, Instant::now(), "the last two").await).await;
}

/// A waiter for "{m}:a" exclusive and "{m}:b" shared is handed its set only when both are
/// its own: not at the release of a (b is still written), but at b's; a reader of b that
/// queued behind it shares b with it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_set_is_handed_only_when_every_key_is_its_own() {
    let env = Env::start().await;
    let holders = env.other_client().await;
    let a = holders
        .obtain("{m}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let b = holders
        .obtain("{m}:b", ms(60_000), &Options::default())
        .await
        .unwrap();
    let mixed = spawn_waiter(&env.client, vec![("{m}:a", WRITE), ("{m}:b", READ)]);
    queued_up_to(&env, "{m}:b", 1).await;
    let reader_client = env.other_client().await;
    let reader = spawn_waiter(&reader_client, vec![("{m}:b", READ)]);
    queued_up_to(&env, "{m}:b", 2).await;
    a.release().await.unwrap();
    still_waiting(std::slice::from_ref(&mixed), "the mixed set").await;
    let released = Instant::now();
    b.release().await.unwrap();
    let locks = handed(
        vec![mixed, reader],
        released,
        "the mixed set and the reader",
    )
    .await;
    assert_eq!(env.cmd::<String>(&["TYPE", "{m}:a"]).await, "string");
    assert_eq!(
        env.cmd::<i64>(&["ZCOUNT", "{m}:b", "0", "+inf"]).await,
        2,
        "two readers of b"
    );
    release_all(locks).await;
    assert_eq!(env.dbsize().await, 0);
}

/// A fair writer that gives up (its deadline) leaves the queue: readers behind it, and new
/// ones, get in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_holds_no_reader_back() {
    let env = Env::start().await;
    let reader = env
        .client
        .obtain(("doc", READ), ms(60_000), &Options::default())
        .await
        .unwrap();
    let writer = env.other_client().await;
    let gave_up = writer
        .obtain("doc", ms(60_000), &slow_polling().timeout(ms(1_000)))
        .await;
    assert!(gave_up.unwrap_err().is_deadline_exceeded());
    support::eventually(ms(5_000), "the writer left the queue", async || {
        support::fair::queued(&env, "doc").await == 0
    })
    .await;
    let other = env.other_client().await;
    let second = other
        .obtain(("doc", READ), ms(60_000), &Options::default())
        .await;
    release_all(vec![second.unwrap(), reader]).await;
}

/// How long each holder of the starvation tests holds its lock.
const HOLD: Duration = Duration::from_millis(200);

/// `n` tasks, each with a client of its own, that take `key` in `mode` fairly, hold it for
/// [`HOLD`] and take it again at once, until stopped; returns the stop flag, the count of
/// locks taken and the tasks.
async fn keep_taking(
    env: &Env,
    n: usize,
    mode: Mode,
) -> (Arc<AtomicBool>, Arc<AtomicUsize>, Vec<JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let client = env.other_client().await;
        let (stop, taken) = (stop.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(SeqCst) {
                let lock = client
                    .obtain(("doc", mode), ms(30_000), &slow_polling())
                    .await
                    .unwrap();
                taken.fetch_add(1, SeqCst);
                tokio::time::sleep(HOLD).await;
                lock.release().await.unwrap();
            }
        }));
    }
    (stop, taken, tasks)
}

async fn stop_all(stop: &AtomicBool, tasks: Vec<JoinHandle<()>>) {
    stop.store(true, SeqCst);
    for task in tasks {
        timeout(ms(60_000), task)
            .await
            .expect("a looping task stops")
            .unwrap();
    }
}

/// Starvation bound, readers: a writer that queues behind readers that keep coming waits
/// only for those that hold the key when it comes (one hold time), since no reader joins
/// them once it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_readers_does_not_starve_a_queued_writer() {
    let env = Env::start().await;
    let (stop, taken, readers) = keep_taking(&env, 8, READ).await;
    support::eventually(ms(10_000), "readers reading", async || {
        taken.load(SeqCst) >= 16
    })
    .await;
    let writer = env.other_client().await;
    let start = Instant::now();
    let lock = writer
        .obtain("doc", ms(10_000), &slow_polling())
        .await
        .unwrap();
    let waited = start.elapsed();
    println!("the writer waited {waited:?} beside 8 looping readers holding {HOLD:?}");
    assert!(
        waited < HOLD + HANDED_WITHIN,
        "the writer waited {waited:?}"
    );
    lock.release().await.unwrap();
    stop_all(&stop, readers).await;
}

/// Starvation bound, writers: a reader that queues behind writers that keep coming waits
/// only for the writers queued before it (at most one hold time each), since the writers
/// that come after it queue behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_writers_does_not_starve_a_queued_reader() {
    const WRITERS: u32 = 4;
    let env = Env::start().await;
    let (stop, taken, writers) = keep_taking(&env, WRITERS as usize, WRITE).await;
    support::eventually(ms(10_000), "writers writing", async || {
        taken.load(SeqCst) >= 8
    })
    .await;
    let reader = env.other_client().await;
    let start = Instant::now();
    let lock = reader
        .obtain(("doc", READ), ms(10_000), &slow_polling())
        .await
        .unwrap();
    let waited = start.elapsed();
    println!("the reader waited {waited:?} beside {WRITERS} looping writers holding {HOLD:?}");
    assert!(
        waited < HOLD * WRITERS + HANDED_WITHIN,
        "the reader waited {waited:?}"
    );
    lock.release().await.unwrap();
    stop_all(&stop, writers).await;
}
