//! The history checker: 8–32 clients (each its own `Client`, as separate processes) run
//! random, seeded lock operations over a small pool of keys while a seeded schedule injects
//! faults; every holder's belief is recorded on one monotonic clock and checked: no two
//! owners believe they hold one key at the same moment, fencing tokens increase in the order
//! beliefs start, every obtain returns within its deadline + 250 ms, nothing is left behind
//! once every client stopped and the longest TTL passed (waiter queues: three of the longest
//! lease), and memory stays bounded.
//!
//! Ignored by default; `LOCKSET_HISTORY_SECS` is the total time, shared by the topologies
//! (they run one after another):
//!
//! `LOCKSET_HISTORY_SECS=60 cargo test --release --all-features --test history -- --ignored --nocapture`
//!
//! `LOCKSET_HISTORY_SEED=<seed>` replays a seed's schedule (clients, operations, faults).

mod support;

#[path = "support/history/mod.rs"]
mod history;

use std::time::Duration;

use history::faults::{Fault, Plan, Restart, schedule};
use history::{Outcome, Setup, topology};
use lockset::Replication;
use lockset::redis::aio::ConnectionLike;

/// The topologies run one after another, never at once: they share two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This topology's share of `LOCKSET_HISTORY_SECS` (default 20 s in all).
fn share(percent: u64) -> Duration {
    let total: u64 = std::env::var("LOCKSET_HISTORY_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(20);
    Duration::from_millis(total * 10 * percent)
}

/// `LOCKSET_HISTORY_SEED`, or a fresh random seed (printed, so a failure can be replayed).
fn seed() -> u64 {
    let seed = std::env::var("LOCKSET_HISTORY_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    println!("history seed {seed} (LOCKSET_HISTORY_SEED={seed} replays it)");
    seed
}

/// Runs the topology `build` makes from the seed, for `length` (less when it finds a
/// violation).
async fn run<C>(length: Duration, build: impl AsyncFnOnce(u64) -> Setup<C>) -> Outcome
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = seed();
    let setup = build(seed).await;
    history::run(setup, seed, length).await
}

/// Prints the outcome and fails on anything it found.
fn report(outcome: &Outcome) {
    println!("{}", outcome.summary);
    let problems = outcome.problems();
    for problem in &problems {
        println!("{problem}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn single_server_history_is_safe() {
    report(&run(share(15), topology::single).await);
}

/// One or two of the five masters are down from the start (paused or killed before any
/// client spoke to them) for a quarter to half of the run, besides the usual faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn redlock_history_with_delayed_restarts_is_safe() {
    report(
        &run(share(15), async |seed| {
            topology::redlock(seed, Restart::Delayed).await
        })
        .await,
    );
}

/// Why the Redlock guide insists on delayed restarts: a master without persistence that comes
/// back at once has forgotten locks a majority still counts on. Restart enough masters
/// within one TTL and a second owner reaches a majority while the first still believes it
/// holds the lock. The checker must see that happen here: restarts weigh more and come more
/// often than in the test above, which restarts masters too, each only after the longest
/// TTL, and must see nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn redlock_history_without_delayed_restarts_is_unsafe() {
    // A violation needs a majority restarted within one TTL of a grant. Most seeds' schedules
    // bring one within seconds; some not within 15 s (measured: found in the first to third
    // attempt): a fresh seed every 15 s, eight in all. Counted in attempts, not in time since
    // the test began: the topologies run one at a time, and CI failed once when this test
    // had spent most of its time budget waiting for the Sentinel runs (two attempts in 120 s).
    const ATTEMPT: Duration = Duration::from_secs(15);
    let attempts = (share(10).as_secs() / ATTEMPT.as_secs()).max(8);
    for _ in 0..attempts {
        let outcome = run(ATTEMPT, async |seed| {
            topology::redlock(seed, Restart::Immediate).await
        })
        .await;
        println!("{}", outcome.summary);
        if let Some(found) = outcome.violations.first() {
            println!("found, as expected:\n{found}");
            return;
        }
    }
    panic!(
        "restarting Redlock masters empty at once must let two owners hold a lock, \
         and the checker must see it (nothing seen in {attempts} runs of {ATTEMPT:?})"
    );
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn cluster_history_is_safe() {
    report(&run(share(15), topology::cluster).await);
}

/// A primary and two replicas behind three sentinels, with the primary killed, paused,
/// promoted away from on purpose, cut off from its replicas and restarted empty before the
/// sentinels notice, and every write acknowledged by every replica the sentinels could
/// promote (the default); some locks are taken by clients made for that one lock, as
/// `lockset run` makes them. (With one replica of two, a promotion on purpose loses locks:
/// see `a_manual_failover_keeps_every_replicated_lock` in `tests/suite/failover.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn sentinel_history_with_replicated_writes_is_safe() {
    report(
        &run(share(25), async |seed| {
            topology::sentinel(seed, Replication::all()).await
        })
        .await,
    );
}

/// Why writes wait for replicas: without, a failover loses the locks the old primary took
/// that its replicas had not copied, and a second owner takes them while the first still
/// believes it holds them. The checker must see that here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long randomized run; LOCKSET_HISTORY_SECS sets its length"]
async fn sentinel_history_without_replication_is_unsafe() {
    // It stops at the first violation; give it time for a few failovers.
    let length = share(10).max(Duration::from_secs(40));
    let outcome = run(length, async |seed| {
        topology::sentinel(seed, Replication::none()).await
    })
    .await;
    println!("{}", outcome.summary);
    let found = outcome.violations.first().expect(
        "failovers that lose unreplicated writes must let two owners hold a lock, and the \
         checker must see it",
    );
    println!("found, as expected:\n{found}");
}

/// The schedules draw every kind of fault a topology allows (cheap: no servers).
#[test]
fn schedules_draw_every_allowed_fault() {
    let kind = |fault: &Fault| std::mem::discriminant(fault);
    let mut down = Plan::mixed(5, 5, Restart::Delayed, Vec::new());
    down.down_at_start = 2;
    let plans = [
        (Plan::mixed(1, 2, Restart::Delayed, Vec::new()), 6),
        (Plan::mixed(3, 0, Restart::Never, vec![1, 2, 3]), 2),
        (down.clone(), 6),
        (Plan::failover(3), 9),
    ];
    for (plan, kinds) in plans {
        let faults = schedule(42, &plan, Duration::from_secs(60));
        let mut seen = Vec::new();
        for (_, fault) in &faults {
            if !seen.contains(&kind(fault)) {
                seen.push(kind(fault));
            }
        }
        assert_eq!(seen.len(), kinds, "{plan:?}: {faults:?}");
        assert_eq!(
            faults,
            schedule(42, &plan, Duration::from_secs(60)),
            "seeded"
        );
        let at_start = faults.iter().filter(|(at, _)| at.is_zero()).count();
        assert_eq!(at_start, plan.down_at_start, "{plan:?}: {faults:?}");
    }
}
