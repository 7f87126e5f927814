//! Five private masters, a client for each, and a Redlock client over all of them.

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Lock, Options, QuorumConfig, Retry};

use super::RedisServer;

/// Five private masters, a client for each, and a Redlock client over all of them.
pub struct Masters {
    pub servers: Vec<RedisServer>,
    pub nodes: Vec<Client<ConnectionManager>>,
    pub redlock: Client<ConnectionManager>,
}

impl Masters {
    pub async fn start(config: QuorumConfig) -> Self {
        let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
        let mut nodes = Vec::new();
        for server in &servers {
            nodes.push(Client::connect(&server.url()).await.unwrap());
        }
        let redlock = Client::quorum(nodes.clone(), config).unwrap();
        Self {
            servers,
            nodes,
            redlock,
        }
    }

    /// Runs a raw command on master `i` over a fresh connection.
    pub async fn cmd<T: lockset::redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> T {
        let mut conn = super::connect(&self.servers[i]).await;
        let mut cmd = lockset::redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|err| panic!("master {i}: {args:?}: {err}"))
    }

    /// What master `i` stores at `key`.
    pub async fn get(&self, i: usize, key: &str) -> Option<String> {
        self.cmd(i, &["GET", key]).await
    }

    /// On how many of `masters` a waiter marked `key`'s holder (its value starts with `!`).
    pub async fn marked(&self, masters: impl IntoIterator<Item = usize>, key: &str) -> usize {
        let mut marked = 0;
        for i in masters {
            marked += usize::from(self.get(i, key).await.is_some_and(|v| v.starts_with('!')));
        }
        marked
    }

    /// Whether master `i` holds `key` for `lock`: its value, or a share of it.
    pub async fn holds(&self, i: usize, key: &str, lock: &Lock<ConnectionManager>) -> bool {
        let token = lock.token();
        let value = format!("{}:{token}{}", token.len(), lock.metadata());
        let kind: String = self.cmd(i, &["TYPE", key]).await;
        match kind.as_str() {
            "zset" => {
                let score: Option<f64> = self.cmd(i, &["ZSCORE", key, &value]).await;
                score.is_some()
            }
            // A waiter may have marked it.
            _ => self
                .get(i, key)
                .await
                .is_some_and(|held| held.trim_start_matches('!') == value),
        }
    }

    /// Refreshes `lock` until every master holds each of its keys. An obtain returns once
    /// the masters it needs agreed; on a loaded machine the others may have timed out, and a
    /// test that then takes the lock from one more master may take too many. A refresh
    /// restores the lock on masters that lost it, once enough still hold it.
    pub async fn spread(&self, lock: &Lock<ConnectionManager>) {
        let options = Options::default()
            .retry(Retry::linear(super::ms(50)))
            .timeout(super::ms(10_000));
        super::eventually(super::ms(20_000), "the lock on every master", async || {
            lock.refresh(super::ms(30_000), &options).await.unwrap();
            for i in 0..self.servers.len() {
                for key in lock.keys() {
                    if !self.holds(i, key, lock).await {
                        return false;
                    }
                }
            }
            true
        })
        .await;
        // The last refresh's parts on slow masters run on in the background, and one may
        // still restore the lock on a master the test restarts next.
        tokio::time::timeout(super::ms(10_000), self.redlock.background_idle())
            .await
            .expect("the refresh's writes done within 10 s");
    }

    /// `key`'s remaining TTL on master `i` in ms (-2: missing, -1: no expiry).
    pub async fn pttl(&self, i: usize, key: &str) -> i64 {
        self.cmd(i, &["PTTL", key]).await
    }

    /// How many keys each of the given masters holds.
    pub async fn dbsizes(&self, masters: impl IntoIterator<Item = usize>) -> Vec<i64> {
        let mut sizes = Vec::new();
        for i in masters {
            sizes.push(self.cmd(i, &["DBSIZE"]).await);
        }
        sizes
    }

    /// Loads the lock scripts on every master, so that no attempt pays a NOSCRIPT round
    /// trip (which a test with short node limits on a loaded machine may not afford).
    pub async fn load_scripts(&self) {
        let scripts = super::scripts::all();
        for i in 0..self.servers.len() {
            for (_, script) in &scripts {
                let _: String = self.cmd(i, &["SCRIPT", "LOAD", &script.source]).await;
            }
        }
    }

    /// How many masters store exactly `value` at every one of `keys`.
    pub async fn holding(&self, keys: &[&str], value: &str) -> usize {
        let mut holding = 0;
        for i in 0..self.servers.len() {
            let mut all = true;
            for key in keys {
                all &= self.get(i, key).await.as_deref() == Some(value);
            }
            holding += usize::from(all);
        }
        holding
    }
}

/// How long each obtain and each release of a run of lock cycles took.
#[derive(Debug, Default)]
pub struct Cycles {
    pub obtains: Vec<std::time::Duration>,
    pub releases: Vec<std::time::Duration>,
}

impl Cycles {
    /// Runs `count` cycles on `redlock` (obtain `key` for 10 s, release at once).
    ///
    /// A release returns once a majority deleted the lock: a master still busy with the
    /// lock's obtain deletes it a moment later. With masters down, the next obtain may find
    /// it there, on one master too many: it retries (every 2 ms).
    pub async fn run(redlock: &Client<ConnectionManager>, key: &str, count: usize) -> Self {
        let options = Options::default()
            .retry(Retry::linear(super::ms(2)))
            .timeout(super::ms(2_000));
        let mut cycles = Self::default();
        for _ in 0..count {
            let start = tokio::time::Instant::now();
            let lock = redlock
                .obtain(key, super::ms(10_000), &options)
                .await
                .unwrap_or_else(|err| panic!("obtain {key}: {err}"));
            let obtained = tokio::time::Instant::now();
            lock.release()
                .await
                .unwrap_or_else(|err| panic!("release {key}: {err}"));
            cycles.obtains.push(obtained - start);
            cycles.releases.push(obtained.elapsed());
        }
        cycles
    }

    /// Asserts that obtains and releases took a few milliseconds, not a per-node limit:
    /// medians under `median`, every one under `slowest`.
    pub fn assert_within(&self, median: std::time::Duration, slowest: std::time::Duration) {
        for (what, times) in [("obtain", &self.obtains), ("release", &self.releases)] {
            let mut sorted = times.clone();
            sorted.sort();
            let middle = sorted[sorted.len() / 2];
            let last = sorted[sorted.len() - 1];
            println!("{what}: median {middle:?}, slowest {last:?}");
            assert!(
                middle < median && last < slowest,
                "{what}: median {middle:?} (bound {median:?}), slowest {last:?} (bound \
                 {slowest:?}); all: {times:?}"
            );
        }
    }
}

/// What [`pause_under_load`] measured: background tasks before, during (the most seen), in
/// the pause's steady state (the median of those seen from `settled` into it on: a live
/// master that misses a deadline on a loaded machine has every operation's task wait out one
/// per-node limit, which the most seen would show) and after it; the
/// process's resident memory (KiB) before, during (the most), and after; the lock cycles
/// run, and how long after its resume the paused master was left with no released lock.
#[derive(Debug)]
pub struct PauseReport {
    pub cycles: u64,
    pub failed: u64,
    pub tasks: [usize; 4],
    pub rss_kib: [u64; 3],
    /// How many keys the resumed master held once it had answered everything sent before
    /// its resume, and when it held none (`None`: still some at the bound).
    pub stale_at_resume: i64,
    pub cleared_after: Option<std::time::Duration>,
    /// When the resumed master had answered everything sent before its resume.
    pub caught_up_after: std::time::Duration,
}

/// Runs `workers` tasks of lock cycles on distinct keys (obtain for `ttl`, release at once)
/// against `m.redlock`, each lock with 8 KiB of metadata (so that a few seconds' traffic
/// fills the paused master's socket buffers, as minutes of small locks do), pauses master `paused` (SIGSTOP) for `pause` under that load, stops
/// the load, resumes the master, and waits until it answered everything sent before (an
/// obtain by its own client, on the same connection, answers after the backlog). Then it
/// must hold no lock within `bound` of the resume: every lock was released everywhere else.
pub async fn pause_under_load(
    m: &Masters,
    paused: usize,
    pause: std::time::Duration,
    workers: usize,
    ttl: std::time::Duration,
    settled: std::time::Duration,
    bound: std::time::Duration,
) -> PauseReport {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use tokio::time::Instant;

    // Scripts loaded and run ids known everywhere, nothing left under way.
    Cycles::run(&m.redlock, "warm", 3).await;
    tokio::time::timeout(super::ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks after warm-up");
    let before = (m.redlock.background_tasks(), super::resident_kib());
    let stop = Arc::new(AtomicBool::new(false));
    let (cycles, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let options = Options::default()
        .retry(Retry::linear(super::ms(5)))
        .timeout(super::ms(5_000))
        .metadata("m".repeat(8 * 1024));
    let load: Vec<_> = (0..workers)
        .map(|worker| {
            let (redlock, options) = (m.redlock.clone(), options.clone());
            let (stop, cycles, failed) = (stop.clone(), cycles.clone(), failed.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    n += 1;
                    let key = format!("load:{worker}:{n}");
                    let done = match redlock.obtain(&key, ttl, &options).await {
                        Ok(lock) => lock.release().await.is_ok(),
                        Err(_) => false,
                    };
                    let counter = if done { &cycles } else { &failed };
                    counter.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(super::ms(300)).await;
    m.servers[paused].pause();
    let (mut during, mut steady) = ((0, 0), Vec::new());
    let mut samples = tokio::time::interval(super::ms(100));
    let paused_at = Instant::now();
    while paused_at.elapsed() < pause {
        samples.tick().await;
        let tasks = m.redlock.background_tasks();
        during.0 = during.0.max(tasks);
        during.1 = during.1.max(super::resident_kib());
        if paused_at.elapsed() >= settled {
            steady.push(tasks);
        }
    }
    stop.store(true, Relaxed);
    for worker in load {
        worker.await.expect("load task");
    }
    m.servers[paused].resume();
    let resumed = Instant::now();
    // Answered once everything sent before it on that connection was.
    let lock = m.nodes[paused]
        .obtain("after-resume", super::ms(10_000), &Options::default())
        .await
        .expect("the resumed master answers");
    lock.release().await.expect("release on the resumed master");
    let caught_up_after = resumed.elapsed();
    let mut stale_at_resume = None;
    let cleared_after = loop {
        let size: i64 = m.cmd(paused, &["DBSIZE"]).await;
        stale_at_resume.get_or_insert(size);
        if size == 0 {
            break Some(resumed.elapsed());
        }
        if resumed.elapsed() > bound {
            break None;
        }
        tokio::time::sleep(super::ms(5)).await;
    };
    tokio::time::timeout(super::ms(20_000), m.redlock.background_idle())
        .await
        .expect("background tasks after the resume");
    PauseReport {
        cycles: cycles.load(Relaxed),
        failed: failed.load(Relaxed),
        tasks: [
            before.0,
            during.0,
            median(steady),
            m.redlock.background_tasks(),
        ],
        rss_kib: [before.1, during.1, super::resident_kib()],
        stale_at_resume: stale_at_resume.unwrap_or(0),
        cleared_after,
        caught_up_after,
    }
}

/// The median of `samples` (0 for none).
fn median(mut samples: Vec<usize>) -> usize {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or(0)
}
