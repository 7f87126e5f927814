//! The history checker (issue 11): many clients, random operations, faults from a seeded
//! schedule, and a proof over what every holder believed. See `tests/history.rs`.
#![allow(unreachable_pub)]

pub mod deployment;
pub mod faults;
pub mod record;
pub mod topology;
pub mod workload;

use std::pin::Pin;

use crate::support::resident_kib;
use std::sync::Arc;
use std::time::Duration;

use lockset::Client;
use lockset::redis::aio::ConnectionLike;
use tokio::time::Instant;

use faults::{Plan, Targets};
use record::{History, Stats};
use workload::{MAX_FRESH_TTL, MAX_LEASE, MAX_TTL, Worker};

/// Resident memory may grow this much between the warm-up and the end of a run.
pub const RSS_GROWTH_LIMIT_KIB: u64 = 48 * 1024;

/// Makes a client for one operation, as a short-lived process (`lockset run`) makes one.
pub type Connect<C> =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = lockset::Result<Client<C>>> + Send>> + Send + Sync>;

/// A topology ready to run: its clients (one per simulated process), its keys, and what
/// faults can act on.
pub struct Setup<C> {
    pub name: String,
    pub clients: Vec<Client<C>>,
    /// One per client, in a topology whose clients also lock through clients made for one
    /// operation (empty in the others): how that client makes one.
    pub fresh: Vec<Connect<C>>,
    /// Groups of keys; one lock takes its keys from one group.
    pub pool: Vec<Vec<String>>,
    pub fencing: bool,
    pub targets: Arc<Targets>,
    pub plan: Plan,
}

/// What a run found.
pub struct Outcome {
    pub violations: Vec<String>,
    pub misses: Vec<String>,
    /// Lock keys still on a server after every client stopped and the longest TTL passed
    /// (waiter queues and records: three of the longest lease).
    pub leftovers: Vec<String>,
    /// Background tasks (watchdogs, clean-ups) still running then.
    pub background: usize,
    pub rss_kib: (u64, u64),
    pub summary: String,
}

impl Outcome {
    /// Everything the run found wrong, in a few lines each (empty when all is well).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.violations.clone();
        problems.extend(self.misses.iter().cloned());
        if !self.leftovers.is_empty() {
            problems.push(format!(
                "clean-up: lock keys left behind: {:?}",
                self.leftovers
            ));
        }
        if self.background > 0 {
            problems.push(format!(
                "clean-up: {} background tasks still running",
                self.background
            ));
        }
        let (before, after) = self.rss_kib;
        if after > before + RSS_GROWTH_LIMIT_KIB {
            problems.push(format!(
                "memory: resident set grew from {before} KiB to {after} KiB"
            ));
        }
        problems
    }
}

/// Runs `setup` for `length` with faults from `seed`'s schedule, then checks the clean-up.
/// Stops at the first violation, unless `LOCKSET_HISTORY_KEEP_GOING` is set.
pub async fn run<C>(setup: Setup<C>, seed: u64, length: Duration) -> Outcome
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keep_going = std::env::var_os("LOCKSET_HISTORY_KEEP_GOING").is_some();
    let history = History::new(&setup.name, seed, keep_going);
    let longest_ttl = longest_ttl(&setup);
    let until = Instant::now() + length;
    let schedule = faults::schedule(seed, &setup.plan, length);
    // Servers down from the start are down before any client speaks.
    let injector = faults::inject(schedule, setup.targets.clone(), history.clone(), until).await;
    let checker = tokio::spawn({
        let history = history.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                history.check();
            }
        }
    });
    let warm_up = tokio::spawn(async move {
        tokio::time::sleep((length / 5).min(Duration::from_secs(10))).await;
        resident_kib()
    });
    let pool = Arc::new(setup.pool);
    let workers: Vec<_> = setup
        .clients
        .iter()
        .enumerate()
        .map(|(id, client)| {
            let worker = Worker::new(
                id,
                (client.clone(), setup.fresh.get(id).cloned()),
                seed,
                pool.clone(),
                history.clone(),
                setup.fencing,
            );
            tokio::spawn(worker.run(until))
        })
        .collect();
    for worker in workers {
        worker.await.expect("a client task panicked");
    }
    let rss_before = if warm_up.is_finished() {
        warm_up.await.expect("memory sample")
    } else {
        warm_up.abort();
        resident_kib()
    };
    let rss_after = resident_kib();
    // Shorter than `length` when a violation stopped the run.
    let ran = history.start.elapsed().min(length);
    // Every fault heals before the clean-up is judged.
    injector.await.expect("fault injector");
    checker.abort();
    history.finish();
    // A run that a violation stopped is judged by it alone: its clean-up is not waited for.
    let (background, leftovers) = match history.stopped() {
        true => (0, Vec::new()),
        false => clean_up(&setup.clients, &setup.targets, longest_ttl).await,
    };
    let stats = history.stats();
    let summary = summary(
        &history,
        &stats,
        setup.clients.len(),
        (ran, length),
        (rss_before, rss_after),
    );
    Outcome {
        violations: history.violations(),
        misses: history.misses(),
        leftovers,
        background,
        rss_kib: (rss_before, rss_after),
        summary,
    }
}

/// The longest TTL any operation of `setup` asks for.
fn longest_ttl<C>(setup: &Setup<C>) -> Duration {
    match setup.fresh.is_empty() {
        true => MAX_TTL,
        false => MAX_FRESH_TTL,
    }
}

/// Waits until the clients' background tasks ended and every key had its time to expire
/// (`longest_ttl`); returns how many tasks were left then, and the keys left on the servers.
async fn clean_up<C>(
    clients: &[Client<C>],
    targets: &Targets,
    longest_ttl: Duration,
) -> (usize, Vec<String>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let background = settle(clients).await;
    // Commands queued in a paused server ran when it resumed: give their keys a full TTL.
    tokio::time::sleep(longest_ttl + Duration::from_millis(250)).await;
    (background, leftovers(targets).await)
}

/// Keys still on the servers: lock keys now (the longest TTL passed), waiter queues and
/// records once they had their own time. A waiter whose leave a fault stopped (a killed
/// connection, a paused server) leaves its record until its lease ends, and its queue
/// entries until the queue expires, three leases after the last waiter joined.
async fn leftovers(targets: &Targets) -> Vec<String> {
    let is_queue = |key: &String| key.contains(":lockset:queue");
    let start = Instant::now();
    loop {
        let keys = targets.servers.leftover_keys().await;
        if !keys.iter().any(is_queue) || start.elapsed() > 3 * MAX_LEASE {
            return keys;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded) until no client runs background tasks; returns how many are left.
async fn settle<C>(clients: &[Client<C>]) -> usize
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let start = Instant::now();
    loop {
        let left: usize = clients.iter().map(Client::background_tasks).sum();
        if left == 0 || start.elapsed() > Duration::from_secs(10) {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn summary(
    history: &History,
    stats: &Stats,
    clients: usize,
    (ran, length): (Duration, Duration),
    rss: (u64, u64),
) -> String {
    let slack = stats
        .min_gap
        .map_or("none".to_owned(), |gap| format!("{gap:?}"));
    format!(
        "history {}: seed {}, {:.1} of {:.0} s, {clients} clients: {} operations ({} obtains, {} \
         cancelled, {} errors; {} clients made for one operation, {} of them failed to \
         connect), {} beliefs, {} faults ({} failovers), max overlap slack {slack} (closest gap \
         between owners of one key), {} deadlines missed ({} without a fault), {} violations, at most {} \
         beliefs kept, RSS {} -> {} KiB",
        history.name,
        history.seed,
        ran.as_secs_f64(),
        length.as_secs_f64(),
        stats.ops,
        stats.obtains,
        stats.cancelled,
        stats.errors,
        stats.fresh_clients,
        stats.fresh_connects_failed,
        stats.beliefs,
        stats.faults,
        stats.failovers,
        stats.deadlines_missed,
        stats.missed_without_faults,
        stats.violations,
        stats.most_kept,
        rss.0,
        rss.1,
    )
}
