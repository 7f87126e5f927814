//! Benchmark harness: lockset against a raw redis-rs baseline, in one process and one run.
//!
//! Run with `cargo run --release --example bench`. Starts its own redis-server (or uses
//! `REDIS_URL`), runs every workload for both implementations, alternating rounds so that
//! machine noise hits both alike, prints one JSON line per result and a table of ratios.
//!
//! - W1 uncontended: C tasks, each on its own key, obtain + release, no retry. W1D: the same,
//!   against a raw baseline that releases with the server's own compare-and-delete
//!   (`DELIFEQ key value`, Valkey 9.0+) instead of a script; only on a server that has it
//!   (where lockset releases that way too).
//! - W2 contended: 8 tasks on one key, each obtain retried every 1 ms (lockset: linear 1 ms
//!   fallback, woken by release events), a critical section with an await inside (a
//!   non-atomic read, yield, write of a shared counter: a second holder would lose an update)
//!   and a hold of 0 or 1 ms, release. `shared`: every task on one client (lockset hands over
//!   in-process); `procs`: one client per task, with its own connections (and, for lockset, its
//!   own pub/sub connection), as separate processes would have. Hand-off is from a release
//!   being sent to the next holder having the lock.
//! - W3 multi-key: one task, locks of K keys.
//! - W4 modes: C tasks all reading one shared key (`read`), or each taking one of 1,000
//!   permits of one counted key (`permit`), obtain + release. Its baseline (the "raw"
//!   columns) is lockset's own exclusive cycle, each task on its own key: what a shared or
//!   counted key costs over a plain one. And contended as W2 `procs` is (8 tasks, one
//!   client each, the same critical section, hold 0 ms, the same figures): `rw`, readers
//!   and writers of one key (each task writes every fourth acquisition, reads the others);
//!   `sem`, one of 2 permits of one counted key. Their baseline is raw polling: a minimal
//!   reader/writer lock and semaphore by hand (one script: a writer's string key and a
//!   sorted set of sharers scored by expiry; release by compare-and-delete or ZREM), each
//!   obtain retried every 1 ms.
//! - W1R and W2R: W1 and W2 on a second primary, which has one replica, every obtain
//!   counting only once the replica acknowledged it: lockset with
//!   `Client::replicated(Replication::replicas(1))`, raw with `SET key value NX PX ttl` and
//!   `WAIT 1 250` in one request.
//! - W5 Redlock: C tasks, each on its own key, obtain + release on a quorum of five masters
//!   of its own, all up (`up`) or with one paused by SIGSTOP (`paused`), no retry. Its
//!   baseline (the "raw" columns) is the Redlock peer rslock (`LockManager`, five masters,
//!   default settings: redis-rs's 500 ms response timeout per master); its server commands
//!   and requests are not counted (`-`). The `up` and `paused` rows of one concurrency
//!   alternate round by round (the master is resumed, and its backlog worked off, between);
//!   below the table: each implementation's paused/up rate.
//!
//! The raw baseline does the minimum by hand, on the same cheap path lockset uses (commands
//! built once, scripts pre-loaded and sent by EVALSHA): W1 and W2 obtain with
//! `SET key value NX PX ttl` and release with a compare-and-delete script; W3 obtains with a
//! script doing MSETNX plus one PEXPIRE per key, and releases with MGET, compare, DEL.
//!
//! With the `metrics` feature and `BENCH_RECORDER=1`, a metrics recorder (metrics-util's
//! debugging recorder: atomic counters and histogram buckets, as exporters keep them) is
//! installed before the first lock operation, so lockset records every figure:
//! `BENCH_RECORDER=1 cargo run --release --example bench --features metrics`.
//!
//! Every result carries the server commands per operation, from `INFO commandstats` (script
//! calls and the commands they run both count): the work each lock costs the server; and
//! the requests per operation, counted as each client sends them (a script call is one),
//! plus the pub/sub requests from `INFO commandstats`: the round trips each lock costs its
//! clients. And the CPU time per operation of the server (`INFO cpu`) and of the clients
//! (this process's own, from `/proc/self/stat`: only one implementation runs in a round).

#[path = "../tests/support/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use lockset::redis::aio::{ConnectionLike, MultiplexedConnection};
use lockset::redis::{self, Cmd, Pipeline, RedisFuture, Script, Value};
use lockset::{Client, Mode, Options, QuorumConfig, Replication, Retry};
use rand::Rng as _;
use tokio::sync::Mutex;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// Paired rounds per workload; `BENCH_PAIRS` sets another number (the CI guard runs few).
const ROUNDS: usize = 21;

/// How many paired rounds each workload runs.
fn rounds() -> usize {
    std::env::var("BENCH_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(ROUNDS)
}
const ROUND: Duration = Duration::from_millis(500);
/// Tasks contending in W2.
const CONTENDERS: usize = 8;

/// The raw reader/writer lock's keys (W4 `rw` and `sem`).
const RAW_MODE_KEYS: [&str; 2] = ["{w4c}:w", "{w4c}:s"];

/// How many permits W4's `sem` rows contend for.
const SEM_PERMITS: u32 = 2;

/// Compare-and-delete of one key (W1, W2).
const RAW_RELEASE_ONE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// All or nothing: MSETNX, then one PEXPIRE per key (W3).
const RAW_OBTAIN_MANY: &str = r"
local pairs = {}
for i = 1, #KEYS do pairs[2 * i - 1] = KEYS[i]; pairs[2 * i] = ARGV[1] end
if redis.call('MSETNX', unpack(pairs)) == 0 then return 0 end
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
return 1";

/// A minimal reader/writer lock and semaphore (W4 `rw` and `sem`, raw): KEYS[1] the
/// writer's key, KEYS[2] the set of sharers scored by expiry; ARGV[1] "w" (write), "s"
/// (share) or a permit limit, ARGV[2] the value, ARGV[3] the TTL in ms. 1 when obtained.
const RAW_OBTAIN_MODE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local sharers = redis.call('ZCARD', KEYS[2])
if ARGV[1] == 'w' then
  if sharers > 0 then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if ARGV[1] ~= 's' and sharers >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + ARGV[3], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1";

/// MGET, compare, DEL (W3).
const RAW_RELEASE_MANY: &str = r"
local values = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do if values[i] ~= ARGV[1] then return 0 end end
return redis.call('DEL', unpack(KEYS))";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Impl {
    Raw,
    Lockset,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Lockset => "lockset",
        }
    }
}

/// One workload configuration.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Workload {
    /// "w1", "w2", ...; "w1r" and "w2r" for W1 and W2 with a replica.
    name: &'static str,
    /// How the tasks share clients (W2): "shared" or "procs"; "-" otherwise.
    clients: &'static str,
    concurrency: usize,
    keys: usize,
    /// Time each holder keeps the lock, in ms (W2).
    hold_ms: u64,
}

/// What one round measured.
#[derive(Default)]
struct Sample {
    ops: u64,
    seconds: f64,
    latencies_us: Vec<u32>,
    handoffs_us: Vec<u32>,
    violations: u64,
    /// Server commands run during the round.
    commands: u64,
    /// Requests clients sent during the round.
    requests: u64,
    /// The server's CPU time during the round (user and system, all threads), in µs.
    server_cpu_us: u64,
    /// This process's CPU time during the round (user and system, all threads), in µs: the
    /// clients' work, since only the round's implementation runs meanwhile.
    client_cpu_us: u64,
    /// Acquisitions per task (W2).
    per_task: Vec<u64>,
}

impl Sample {
    fn merge(&mut self, other: Self) {
        self.ops += other.ops;
        self.seconds += other.seconds;
        self.latencies_us.extend(other.latencies_us);
        self.handoffs_us.extend(other.handoffs_us);
        self.violations += other.violations;
        self.commands += other.commands;
        self.requests += other.requests;
        self.server_cpu_us += other.server_cpu_us;
        self.client_cpu_us += other.client_cpu_us;
        if self.per_task.len() < other.per_task.len() {
            self.per_task.resize(other.per_task.len(), 0);
        }
        for (mine, theirs) in self.per_task.iter_mut().zip(other.per_task) {
            *mine += theirs;
        }
    }

    /// The busiest task's share of all acquisitions.
    fn busiest_share(&self) -> f64 {
        let total: u64 = self.per_task.iter().sum();
        let busiest = self.per_task.iter().copied().max().unwrap_or(0);
        if total == 0 {
            0.0
        } else {
            busiest as f64 / total as f64
        }
    }
}

/// Requests sent by every client of the bench (both implementations; one runs at a time).
static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// A connection that counts the requests sent through it (a pipeline counts each command).
#[derive(Clone)]
struct Counted(MultiplexedConnection);

impl ConnectionLike for Counted {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        REQUESTS.fetch_add(1, Ordering::Relaxed);
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        REQUESTS.fetch_add(pipeline.len() as u64, Ordering::Relaxed);
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// The raw baseline's connection, with its scripts loaded.
#[derive(Clone)]
struct Raw {
    conn: Counted,
    release_one: String,
    obtain_many: String,
    release_many: String,
    obtain_mode: String,
    /// How many replicas must acknowledge a single-key obtain (`WAIT`), if any.
    replicas: Option<u32>,
}

/// How long a replicated obtain waits for its replica, raw and lockset alike.
const WAIT_MS: u64 = 250;

impl Raw {
    async fn new(client: &redis::Client, replicas: Option<u32>) -> Self {
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let mut load = async |source: &str| -> String {
            Script::new(source)
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .expect("SCRIPT LOAD")
        };
        let (release_one, obtain_many, release_many, obtain_mode) = (
            load(RAW_RELEASE_ONE).await,
            load(RAW_OBTAIN_MANY).await,
            load(RAW_RELEASE_MANY).await,
            load(RAW_OBTAIN_MODE).await,
        );
        Self {
            conn: Counted(conn),
            release_one,
            obtain_many,
            release_many,
            obtain_mode,
            replicas,
        }
    }

    /// One obtain attempt: true when obtained.
    async fn obtain(&self, keys: &[String], value: &str) -> bool {
        let ttl_ms = TTL.as_millis() as u64;
        let mut cmd = Cmd::new();
        if let [key] = keys {
            cmd.arg("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            let Some(replicas) = self.replicas else {
                let set: Option<String> =
                    cmd.query_async(&mut self.conn.clone()).await.expect("SET");
                return set.is_some();
            };
            // The write and the wait for its replica in one request, on one connection.
            let mut pipe = redis::pipe();
            pipe.add_command(cmd).cmd("WAIT").arg(replicas).arg(WAIT_MS);
            let (set, acked): (Option<String>, u32) = pipe
                .query_async(&mut self.conn.clone())
                .await
                .expect("SET + WAIT");
            assert!(set.is_none() || acked >= replicas, "not replicated in time");
            return set.is_some();
        }
        cmd.arg("EVALSHA")
            .arg(&self.obtain_many)
            .arg(keys.len())
            .arg(keys)
            .arg(value)
            .arg(ttl_ms);
        let done: i64 = cmd
            .query_async(&mut self.conn.clone())
            .await
            .expect("obtain");
        done == 1
    }

    /// One obtain attempt of the raw reader/writer lock or semaphore (W4): `mode` is "w",
    /// "s" or a permit limit. True when obtained.
    async fn obtain_mode(&self, mode: &str, value: &str) -> bool {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(&self.obtain_mode)
            .arg(2)
            .arg(&RAW_MODE_KEYS[..])
            .arg(mode)
            .arg(value)
            .arg(TTL.as_millis() as u64);
        let done: i64 = cmd
            .query_async(&mut self.conn.clone())
            .await
            .expect("obtain");
        done == 1
    }

    /// Releases what [`Raw::obtain_mode`] obtained in `mode`.
    async fn release_mode(&self, mode: &str, value: &str) {
        if mode == "w" {
            return self.release(&RAW_MODE_KEYS[..1], value, false).await;
        }
        let _: i64 = redis::cmd("ZREM")
            .arg(RAW_MODE_KEYS[1])
            .arg(value)
            .query_async(&mut self.conn.clone())
            .await
            .expect("release");
    }

    async fn release<K: redis::ToRedisArgs>(&self, keys: &[K], value: &str, native: bool) {
        if native && let [key] = keys {
            let mut cmd = Cmd::new();
            cmd.arg("DELIFEQ").arg(key).arg(value);
            let _: i64 = cmd
                .query_async(&mut self.conn.clone())
                .await
                .expect("DELIFEQ");
            return;
        }
        let script = if keys.len() == 1 {
            &self.release_one
        } else {
            &self.release_many
        };
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(value);
        let _: i64 = cmd
            .query_async(&mut self.conn.clone())
            .await
            .expect("release");
    }
}

/// The clients of both implementations: shared ones, and one per contending task.
struct Bench {
    inspect: MultiplexedConnection,
    raw: Raw,
    lockset: Client<Counted>,
    raw_per_task: Vec<Raw>,
    lockset_per_task: Vec<Client<Counted>>,
    /// W5's masters and clients, when W5 runs.
    redlock: Option<Mutex<Redlock>>,
}

/// Five masters of their own (W5), lockset's quorum client over them, and rslock's.
struct Redlock {
    servers: Vec<server::RedisServer>,
    lockset: Client<Counted>,
    rslock: rslock::LockManager,
    paused: bool,
}

/// One Redlock obtain + release of `key` (W5).
async fn cycle(lockset: &Client<Counted>, rslock: &rslock::LockManager, which: Impl, key: &str) {
    match which {
        Impl::Raw => {
            let lock = rslock
                .lock(key.as_bytes(), TTL)
                .await
                .expect("rslock: uncontended lock");
            rslock.unlock(&lock).await;
        }
        Impl::Lockset => {
            let lock = lockset
                .obtain(key, TTL, &Options::default())
                .await
                .expect("lockset: uncontended Redlock obtain");
            lock.release().await.expect("release");
        }
    }
}

/// Which of W5's masters the `paused` rows pause.
const PAUSED_MASTER: usize = 2;

impl Redlock {
    async fn start() -> Self {
        let servers: Vec<server::RedisServer> =
            (0..5).map(|_| server::RedisServer::start()).collect();
        let mut nodes = Vec::new();
        for server in &servers {
            let client = redis::Client::open(server.url()).expect("url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            nodes.push(Client::new(Counted(conn)));
        }
        let lockset = Client::quorum(nodes, QuorumConfig::default()).expect("quorum");
        let urls: Vec<String> = servers.iter().map(server::RedisServer::url).collect();
        let rslock = rslock::LockManager::new(urls);
        let redlock = Self {
            servers,
            lockset,
            rslock,
            paused: false,
        };
        // Both connect to every master (and load their scripts) while all are up.
        for which in [Impl::Raw, Impl::Lockset] {
            redlock.cycle(which, "{w5}:warm").await;
        }
        redlock
    }

    async fn cycle(&self, which: Impl, key: &str) {
        cycle(&self.lockset, &self.rslock, which, key).await;
    }

    /// Pauses the master (SIGSTOP), once.
    fn pause(&mut self) {
        if !self.paused {
            self.servers[PAUSED_MASTER].pause();
            self.paused = true;
        }
    }

    /// Resumes the paused master, and waits until it worked off its backlog (the rounds'
    /// obtains and deletes) and lockset's background work is done.
    async fn resume(&mut self) {
        if !self.paused {
            return;
        }
        self.servers[PAUSED_MASTER].resume();
        self.paused = false;
        let idle = self.lockset.background_idle();
        let _ = tokio::time::timeout(Duration::from_secs(30), idle).await;
        self.cycle(Impl::Raw, "{w5}:settled").await;
        self.cycle(Impl::Lockset, "{w5}:settled").await;
    }
}

impl Bench {
    /// W5's `paused` rows run with a master paused, every other row with all up.
    async fn pause_for(&self, workload: &Workload) {
        let Some(redlock) = &self.redlock else {
            return;
        };
        let mut redlock = redlock.lock().await;
        match workload.name == "w5" && workload.clients == "paused" {
            true => redlock.pause(),
            false => redlock.resume().await,
        }
    }
}

/// The workloads in groups whose rounds alternate: W5's `up` and `paused` rows of one
/// concurrency (their rates are compared with each other, so machine noise must hit both
/// alike), every other workload alone.
fn passes(workloads: &[Workload]) -> Vec<Vec<Workload>> {
    let mut passes: Vec<Vec<Workload>> = Vec::new();
    for workload in workloads {
        let partner = passes.iter_mut().find(|pass| {
            pass.iter().all(|w| {
                w.name == "w5" && workload.name == "w5" && w.concurrency == workload.concurrency
            })
        });
        match partner {
            Some(pass) => pass.push(*workload),
            None => passes.push(vec![*workload]),
        }
    }
    passes
}

async fn lockset_client(client: &redis::Client, replicas: Option<u32>) -> Client<Counted> {
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    // The connection's response timeout is redis-rs's default (500 ms), as the raw baseline's
    // is: lockset is told it, as `Client::connect` tells itself its own.
    let lockset = Client::new(Counted(conn))
        .with_release_events(client.clone())
        .and_then(|lockset| lockset.connection_answers_within(Duration::from_millis(500)))
        .expect("release events and the answer bound");
    match replicas {
        Some(replicas) => {
            let replication =
                Replication::replicas(replicas).timeout(Duration::from_millis(WAIT_MS));
            lockset.replicated(replication).await.expect("replicated")
        }
        None => lockset,
    }
}

fn token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// State the contending tasks of one W2 round share.
#[derive(Default)]
struct Contention {
    stop: AtomicBool,
    /// Holders inside the critical section now (more than one is a violation).
    inside: AtomicUsize,
    /// Writers inside it now (W4 `rw`: beside a writer, anyone else is a violation).
    writers: AtomicUsize,
    violations: AtomicU64,
    /// Incremented non-atomically by each holder: lost updates show overlapping holders.
    counter: AtomicU64,
    /// When the last release was sent.
    released: Mutex<Option<Instant>>,
}

/// What the tasks of one contended round return: their latencies and hand-offs.
type Measured = tokio::task::JoinHandle<(Vec<u32>, Vec<u32>)>;

impl Contention {
    /// Lets the round's tasks run for [`ROUND`], stops them, and gathers their figures:
    /// every acquisition went through the critical section once (a lost update counts as
    /// a violation).
    async fn gather(&self, handles: Vec<Measured>) -> Sample {
        let start = Instant::now();
        tokio::time::sleep(ROUND).await;
        self.stop.store(true, Ordering::Relaxed);
        let mut sample = Sample::default();
        for handle in handles {
            let (latencies, handoffs) = handle.await.expect("task");
            sample.per_task.push(latencies.len() as u64);
            sample.latencies_us.extend(latencies);
            sample.handoffs_us.extend(handoffs);
        }
        sample.seconds = start.elapsed().as_secs_f64();
        sample.ops = sample.latencies_us.len() as u64;
        let lost = sample
            .ops
            .saturating_sub(self.counter.load(Ordering::SeqCst));
        sample.violations = self.violations.load(Ordering::SeqCst) + lost;
        sample
    }

    /// A task that set out at `start` has the lock now: notes how long it waited, and the
    /// hand-over from the last release.
    async fn acquired(&self, start: Instant, latencies: &mut Vec<u32>, handoffs: &mut Vec<u32>) {
        let acquired = Instant::now();
        if let Some(sent) = self.released.lock().await.take() {
            handoffs.push(micros(acquired.saturating_duration_since(sent)));
        }
        latencies.push(micros(acquired - start));
    }

    /// A holder is about to send its release.
    async fn releasing(&self) {
        *self.released.lock().await = Some(Instant::now());
    }

    /// The critical section of a holder that shares the key with up to `limit` holders
    /// (W4): an atomic increment of the counter and an await; more than `limit` holders
    /// inside, or a writer beside it, is counted.
    async fn shared_section(&self, limit: usize, hold: Duration) {
        let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        if inside > limit || self.writers.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.counter.fetch_add(1, Ordering::SeqCst);
        self.hold(hold).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// A writer's critical section (W4 `rw`): [`Contention::critical_section`], seen by
    /// the sharers.
    async fn writer_section(&self, hold: Duration) {
        self.writers.fetch_add(1, Ordering::SeqCst);
        self.critical_section(hold).await;
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }

    async fn hold(&self, hold: Duration) {
        if hold.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(hold).await;
        }
    }

    /// The critical section: a read, an await, a write; a second holder inside is counted.
    async fn critical_section(&self, hold: Duration) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        let read = self.counter.load(Ordering::SeqCst);
        self.hold(hold).await;
        self.counter.store(read + 1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Bench {
    /// Server commands run so far (all of them but INFO), the requests sent so far (by
    /// the clients' connections, and on their pub/sub connections, which only send
    /// requests: no script runs these), and the server's CPU time so far in µs (`INFO cpu`:
    /// what the work cost it, network included; on two shared cores, the throughput).
    async fn commands(&self) -> (u64, u64, u64) {
        let cpu: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.inspect.clone())
            .await
            .expect("INFO cpu");
        let cpu_us: f64 = cpu
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                matches!(name, "used_cpu_sys" | "used_cpu_user")
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .sum::<f64>()
            * 1e6;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.inspect.clone())
            .await
            .expect("INFO");
        let calls: Vec<(&str, u64)> = info
            .lines()
            .filter(|line| !line.starts_with("cmdstat_info:"))
            .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(":calls="))
            .filter_map(|(name, rest)| Some((name, rest.split(',').next()?.parse().ok()?)))
            .collect();
        let pubsub = [
            "subscribe",
            "unsubscribe",
            "ssubscribe",
            "sunsubscribe",
            "ping",
        ];
        let listening: u64 = calls
            .iter()
            .filter(|(name, _)| pubsub.contains(name))
            .map(|(_, n)| n)
            .sum();
        let commands = calls.iter().map(|(_, n)| n).sum();
        (
            commands,
            REQUESTS.load(Ordering::Relaxed) + listening,
            cpu_us as u64,
        )
    }

    async fn run(self: &Arc<Self>, which: Impl, workload: Workload) -> Sample {
        let before = self.commands().await;
        let client_before = client_cpu_us();
        let mut sample = match workload.name {
            "w2" | "w2r" => self.contended(which, workload).await,
            "w4" if matches!(workload.clients, "rw" | "sem") => {
                self.contended_modes(which, workload).await
            }
            _ => self.uncontended(which, workload).await,
        };
        let after = self.commands().await;
        sample.commands = after.0 - before.0;
        sample.requests = after.1 - before.1;
        sample.server_cpu_us = after.2.saturating_sub(before.2);
        sample.client_cpu_us = client_cpu_us().saturating_sub(client_before);
        sample
    }

    /// W1 and W3: tasks each locking their own keys in a loop.
    async fn uncontended(self: &Arc<Self>, which: Impl, workload: Workload) -> Sample {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..workload.concurrency)
            .map(|t| {
                let (bench, stop) = (self.clone(), stop.clone());
                tokio::spawn(async move {
                    let keys: Vec<String> = (0..workload.keys)
                        .map(|k| format!("{{w{t}}}:{k}"))
                        .collect();
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        match which {
                            _ if workload.name == "w5" => {
                                let redlock = bench.redlock.as_ref().expect("W5's masters");
                                let (lockset, rslock) = {
                                    let redlock = redlock.lock().await;
                                    (redlock.lockset.clone(), redlock.rslock.clone())
                                };
                                cycle(&lockset, &rslock, which, &keys[0]).await;
                            }
                            Impl::Raw if workload.name == "w4" => {
                                let lock = bench
                                    .lockset
                                    .obtain(&keys[0], TTL, &Options::default())
                                    .await
                                    .expect("the baseline's exclusive obtain");
                                lock.release().await.expect("release");
                            }
                            Impl::Raw => {
                                let value = token();
                                assert!(bench.raw.obtain(&keys, &value).await, "uncontended");
                                let native = workload.name == "w1d";
                                bench.raw.release(&keys, &value, native).await;
                            }
                            Impl::Lockset if workload.name == "w4" => {
                                let mode = match workload.clients {
                                    "read" => Mode::Shared,
                                    _ => Mode::Permit { limit: 1_000 },
                                };
                                let lock = bench
                                    .lockset
                                    .obtain(("{w4}:shared", mode), TTL, &Options::default())
                                    .await
                                    .expect("a shared or counted obtain");
                                lock.release().await.expect("release");
                            }
                            Impl::Lockset => {
                                let lock = bench
                                    .lockset
                                    .obtain_multi(&keys, TTL, &Options::default())
                                    .await
                                    .expect("uncontended obtain");
                                lock.release().await.expect("release");
                            }
                        }
                        latencies.push(micros(start.elapsed()));
                    }
                    latencies
                })
            })
            .collect();
        let start = Instant::now();
        tokio::time::sleep(ROUND).await;
        stop.store(true, Ordering::Relaxed);
        let mut sample = Sample::default();
        for handle in handles {
            sample.latencies_us.extend(handle.await.expect("task"));
        }
        sample.seconds = start.elapsed().as_secs_f64();
        sample.ops = sample.latencies_us.len() as u64;
        sample
    }

    /// W2: tasks contending for one key.
    async fn contended(self: &Arc<Self>, which: Impl, workload: Workload) -> Sample {
        let shared = Arc::new(Contention::default());
        let hold = Duration::from_millis(workload.hold_ms);
        let options = Options::default()
            .retry(Retry::linear(Duration::from_millis(1)))
            .timeout(Duration::from_secs(30));
        let handles: Vec<_> = (0..workload.concurrency)
            .map(|t| {
                let (raw, lockset) = match workload.clients {
                    "procs" => (
                        self.raw_per_task[t].clone(),
                        self.lockset_per_task[t].clone(),
                    ),
                    _ => (self.raw.clone(), self.lockset.clone()),
                };
                let (shared, options) = (shared.clone(), options.clone());
                tokio::spawn(async move {
                    let keys = vec!["w2".to_string()];
                    let (mut latencies, mut handoffs) = (Vec::new(), Vec::new());
                    while !shared.stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let value = token();
                        let lock = match which {
                            Impl::Raw => {
                                while !raw.obtain(&keys, &value).await {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                                None
                            }
                            Impl::Lockset => {
                                Some(lockset.obtain("w2", TTL, &options).await.expect("obtain"))
                            }
                        };
                        shared.acquired(start, &mut latencies, &mut handoffs).await;
                        shared.critical_section(hold).await;
                        shared.releasing().await;
                        match lock {
                            None => raw.release(&keys, &value, false).await,
                            Some(lock) => lock.release().await.expect("release"),
                        }
                    }
                    (latencies, handoffs)
                })
            })
            .collect();
        shared.gather(handles).await
    }
}

impl Bench {
    /// W4 `rw` and `sem`: tasks of their own clients contending for one key in modes: a
    /// quarter of the acquisitions write and the rest read (`rw`), or each takes one of
    /// [`SEM_PERMITS`] permits (`sem`).
    async fn contended_modes(self: &Arc<Self>, which: Impl, workload: Workload) -> Sample {
        let shared = Arc::new(Contention::default());
        let hold = Duration::from_millis(workload.hold_ms);
        let options = Options::default()
            .retry(Retry::linear(Duration::from_millis(1)))
            .timeout(Duration::from_secs(30));
        let handles: Vec<_> = (0..workload.concurrency)
            .map(|t| {
                let raw = self.raw_per_task[t].clone();
                let lockset = self.lockset_per_task[t].clone();
                let (shared, options) = (shared.clone(), options.clone());
                tokio::spawn(async move {
                    let (mut latencies, mut handoffs) = (Vec::new(), Vec::new());
                    let mut n = t;
                    while !shared.stop.load(Ordering::Relaxed) {
                        n += 1;
                        let (mode, raw_mode, limit) = match workload.clients {
                            "rw" if n % 4 == 0 => (Mode::Exclusive, "w".to_owned(), 1),
                            "rw" => (Mode::Shared, "s".to_owned(), usize::MAX),
                            _ => (
                                Mode::Permit { limit: SEM_PERMITS },
                                SEM_PERMITS.to_string(),
                                SEM_PERMITS as usize,
                            ),
                        };
                        let start = Instant::now();
                        let value = token();
                        let lock = match which {
                            Impl::Raw => {
                                while !raw.obtain_mode(&raw_mode, &value).await {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                                None
                            }
                            Impl::Lockset => Some(
                                lockset
                                    .obtain(("{w4c}:key", mode), TTL, &options)
                                    .await
                                    .expect("obtain"),
                            ),
                        };
                        shared.acquired(start, &mut latencies, &mut handoffs).await;
                        match mode {
                            Mode::Exclusive => shared.writer_section(hold).await,
                            _ => shared.shared_section(limit, hold).await,
                        }
                        shared.releasing().await;
                        match lock {
                            None => raw.release_mode(&raw_mode, &value).await,
                            Some(lock) => lock.release().await.expect("release"),
                        }
                    }
                    (latencies, handoffs)
                })
            })
            .collect();
        shared.gather(handles).await
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(values: &mut [u32], p: f64) -> u32 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let index = ((values.len() - 1) as f64 * p).round() as usize;
    values[index]
}

fn workloads(delifeq: bool) -> Vec<Workload> {
    let base = Workload {
        name: "w1",
        clients: "-",
        concurrency: 1,
        keys: 1,
        hold_ms: 0,
    };
    let mut workloads = Vec::new();
    for concurrency in [1, 16, 64] {
        workloads.push(Workload {
            concurrency,
            ..base
        });
    }
    // W1 against a raw baseline that releases with DELIFEQ, where the server has it.
    if delifeq {
        for concurrency in [1, 16, 64] {
            workloads.push(Workload {
                name: "w1d",
                concurrency,
                ..base
            });
        }
    }
    for (clients, hold_ms) in [("shared", 0), ("procs", 0), ("procs", 1)] {
        workloads.push(Workload {
            name: "w2",
            clients,
            concurrency: CONTENDERS,
            hold_ms,
            ..base
        });
    }
    for keys in [1, 10, 100, 1_000] {
        workloads.push(Workload {
            name: "w3",
            keys,
            ..base
        });
    }
    // W1 and W2 again, on a primary with a replica that acknowledges every obtain.
    for concurrency in [1, 16, 64] {
        workloads.push(Workload {
            name: "w1r",
            concurrency,
            ..base
        });
    }
    workloads.push(Workload {
        name: "w2r",
        clients: "procs",
        concurrency: CONTENDERS,
        ..base
    });
    for (clients, concurrency) in [
        ("read", 1),
        ("read", 16),
        ("read", 64),
        ("permit", 1),
        ("permit", 16),
        ("rw", CONTENDERS),
        ("sem", CONTENDERS),
    ] {
        workloads.push(Workload {
            name: "w4",
            clients,
            concurrency,
            ..base
        });
    }
    for clients in ["up", "paused"] {
        for concurrency in [1, 16] {
            workloads.push(Workload {
                name: "w5",
                clients,
                concurrency,
                ..base
            });
        }
    }
    // BENCH_ONLY=w2 (or w1:64, w2:procs, w3:1000, w4:read, w5:paused) runs just those
    // workloads.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        workloads.retain(|w| {
            let tag = match w.name {
                "w1" | "w1r" | "w1d" => format!("{}:{}", w.name, w.concurrency),
                "w2" | "w2r" | "w4" | "w5" => format!("{}:{}", w.name, w.clients),
                _ => format!("{}:{}", w.name, w.keys),
            };
            only.split(',')
                .any(|o| o == w.name || tag == o || tag.starts_with(&format!("{o}:")))
        });
    }
    workloads
}

impl Bench {
    /// Clients of both implementations for the server behind `client`; with `replicas`,
    /// every single-key obtain waits for that many replicas.
    async fn new(client: &redis::Client, replicas: Option<u32>) -> Self {
        let mut raw_per_task = Vec::new();
        let mut lockset_per_task = Vec::new();
        for _ in 0..CONTENDERS {
            raw_per_task.push(Raw::new(client, replicas).await);
            lockset_per_task.push(lockset_client(client, replicas).await);
        }
        Self {
            inspect: client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
            raw: Raw::new(client, replicas).await,
            lockset: lockset_client(client, replicas).await,
            raw_per_task,
            lockset_per_task,
            redlock: None,
        }
    }
}

/// A primary with one replica in sync, for W1R and W2R; the servers stop when dropped.
async fn replicated_primary() -> (redis::Client, [server::RedisServer; 2]) {
    let at_once = ["--repl-diskless-sync-delay", "0"];
    let primary = server::RedisServer::start_with(None, &at_once);
    let port = primary.port().to_string();
    let replica = server::RedisServer::start_with(None, &["--replicaof", "127.0.0.1", &port]);
    while !server::replica_in_sync(replica.port()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = redis::Client::open(primary.url()).expect("url");
    (client, [primary, replica])
}

/// Installs a metrics recorder when `BENCH_RECORDER` is set (feature `metrics`).
fn install_recorder() {
    if std::env::var("BENCH_RECORDER").is_err() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        recorder.install().expect("the only recorder");
        eprintln!("bench: metrics recorder installed");
    }
    #[cfg(not(feature = "metrics"))]
    panic!("BENCH_RECORDER needs --features metrics");
}

#[tokio::main]
async fn main() {
    install_recorder();
    let (url, _server) = server::url_or_start();
    let client = redis::Client::open(url.as_str()).expect("url");
    let delifeq = server_has(&client, "DELIFEQ").await;
    let workloads = workloads(delifeq);
    let mut bench = Bench::new(&client, None).await;
    if workloads.iter().any(|w| w.name == "w5") {
        bench.redlock = Some(Mutex::new(Redlock::start().await));
    }
    let bench = Arc::new(bench);
    // The replicated workloads run on a primary of their own, with one replica.
    let mut _replicated_servers = None;
    let mut replicated = None;
    if workloads.iter().any(|w| w.name.ends_with('r')) {
        let (client, servers) = replicated_primary().await;
        replicated = Some(Arc::new(Bench::new(&client, Some(1)).await));
        _replicated_servers = Some(servers);
    }

    let mut results: BTreeMap<(Workload, Impl), Sample> = BTreeMap::new();
    // Per workload, the lockset/raw throughput ratio of each pair of back-to-back rounds.
    let mut round_ratios: BTreeMap<Workload, Vec<f64>> = BTreeMap::new();
    for pass in passes(&workloads) {
        for round in 0..rounds() {
            for workload in &pass {
                bench.pause_for(workload).await;
                let mut rates = [0.0; 2];
                // Alternate which goes first, so neither always runs on a warmer machine.
                let order = if round % 2 == 0 {
                    [Impl::Raw, Impl::Lockset]
                } else {
                    [Impl::Lockset, Impl::Raw]
                };
                for which in order {
                    // BENCH_IMPL=raw or lockset measures just one (for profiling).
                    if std::env::var("BENCH_IMPL").is_ok_and(|only| only != which.name()) {
                        rates[which as usize] = 1.0;
                        continue;
                    }
                    let on = match &replicated {
                        Some(replicated) if workload.name.ends_with('r') => replicated,
                        _ => &bench,
                    };
                    let sample = on.run(which, *workload).await;
                    rates[which as usize] = sample.ops as f64 / sample.seconds;
                    results.entry((*workload, which)).or_default().merge(sample);
                }
                // BENCH_ROUNDS=1 prints each round's rates (to see how much they vary).
                if std::env::var("BENCH_ROUNDS").is_ok() {
                    eprintln!(
                        "{} {} {} {} round {round}: raw {:.0} lockset {:.0}",
                        workload.name,
                        workload.clients,
                        workload.concurrency,
                        workload.hold_ms,
                        rates[0],
                        rates[1]
                    );
                }
                round_ratios
                    .entry(*workload)
                    .or_default()
                    .push(rates[1] / rates[0]);
            }
        }
    }
    if let Some(redlock) = &bench.redlock {
        redlock.lock().await.resume().await;
    }
    report(results, round_ratios);
}

/// Whether the server at `client` knows `command` (`COMMAND INFO` answers nil otherwise).
async fn server_has(client: &redis::Client, command: &str) -> bool {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(command)
        .query_async(&mut conn)
        .await
        .expect("COMMAND INFO");
    info.first().is_some_and(|info| *info != Value::Nil)
}

/// One implementation's figures for one workload.
struct Figures {
    ops_per_sec: f64,
    p50: u32,
    p99: u32,
    handoff: (u32, u32),
    commands_per_op: f64,
    requests_per_op: f64,
    server_cpu_us_per_op: f64,
    client_cpu_us_per_op: f64,
    busiest: f64,
    violations: u64,
}

fn report(
    mut results: BTreeMap<(Workload, Impl), Sample>,
    mut round_ratios: BTreeMap<Workload, Vec<f64>>,
) {
    let mut summary: Vec<(Workload, Impl, Figures)> = Vec::new();
    for ((workload, which), sample) in &mut results {
        let figures = Figures {
            ops_per_sec: sample.ops as f64 / sample.seconds,
            p50: percentile(&mut sample.latencies_us, 0.50),
            p99: percentile(&mut sample.latencies_us, 0.99),
            handoff: (
                percentile(&mut sample.handoffs_us, 0.50),
                percentile(&mut sample.handoffs_us, 0.99),
            ),
            commands_per_op: sample.commands as f64 / sample.ops.max(1) as f64,
            requests_per_op: sample.requests as f64 / sample.ops.max(1) as f64,
            server_cpu_us_per_op: sample.server_cpu_us as f64 / sample.ops.max(1) as f64,
            client_cpu_us_per_op: sample.client_cpu_us as f64 / sample.ops.max(1) as f64,
            busiest: sample.busiest_share(),
            violations: sample.violations,
        };
        println!(
            r#"{{"impl":"{}","workload":"{}","clients":"{}","concurrency":{},"keys":{},"hold_ms":{},"ops":{},"seconds":{:.3},"ops_per_sec":{:.1},"p50_us":{},"p99_us":{},"handoff_p50_us":{},"handoff_p99_us":{},"commands_per_op":{:.2},"requests_per_op":{:.2},"server_cpu_us_per_op":{:.1},"client_cpu_us_per_op":{:.1},"busiest_share":{:.3},"violations":{}}}"#,
            which.name(),
            workload.name,
            workload.clients,
            workload.concurrency,
            workload.keys,
            workload.hold_ms,
            sample.ops,
            sample.seconds,
            figures.ops_per_sec,
            figures.p50,
            figures.p99,
            figures.handoff.0,
            figures.handoff.1,
            figures.commands_per_op,
            figures.requests_per_op,
            figures.server_cpu_us_per_op,
            figures.client_cpu_us_per_op,
            figures.busiest,
            figures.violations,
        );
        summary.push((*workload, *which, figures));
    }

    println!();
    println!(
        "| workload | clients | C | K | hold ms | raw ops/s | lockset ops/s | lockset/raw | raw p50/p99 µs | lockset p50/p99 µs | hand-off p50/p99 µs raw → lockset | server cmds/op raw → lockset | requests/op raw → lockset | busiest share raw → lockset | violations | server CPU µs/op raw → lockset | client CPU µs/op raw → lockset |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for pair in summary.chunks(2) {
        let [(workload, _, raw), (_, _, lockset)] = pair else {
            continue;
        };
        let contended = workload.name.starts_with("w2") || matches!(workload.clients, "rw" | "sem");
        let ratios = round_ratios
            .get_mut(workload)
            .map(std::mem::take)
            .unwrap_or_default();
        let handoff = if contended {
            format!(
                "{}/{} → {}/{}",
                raw.handoff.0, raw.handoff.1, lockset.handoff.0, lockset.handoff.1
            )
        } else {
            "-".to_string()
        };
        let share = if contended {
            format!("{:.2} → {:.2}", raw.busiest, lockset.busiest)
        } else {
            "-".to_string()
        };
        // W5's masters are not the one `commands()` asks, and its peer's requests are not
        // counted.
        let (commands, requests, cpu) = if workload.name == "w5" {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            (
                format!(
                    "{:.1} → {:.1}",
                    raw.commands_per_op, lockset.commands_per_op
                ),
                format!(
                    "{:.2} → {:.2}",
                    raw.requests_per_op, lockset.requests_per_op
                ),
                format!(
                    "{:.1} → {:.1}",
                    raw.server_cpu_us_per_op, lockset.server_cpu_us_per_op
                ),
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {}/{} | {}/{} | {} | {} | {} | {} | {} | {} | {:.1} → {:.1} |",
            workload.name,
            workload.clients,
            workload.concurrency,
            workload.keys,
            workload.hold_ms,
            raw.ops_per_sec,
            lockset.ops_per_sec,
            median(ratios),
            raw.p50,
            raw.p99,
            lockset.p50,
            lockset.p99,
            handoff,
            commands,
            requests,
            share,
            raw.violations + lockset.violations,
            cpu,
            raw.client_cpu_us_per_op,
            lockset.client_cpu_us_per_op,
        );
    }
    paused_against_up(&summary);
}

/// This process's CPU time so far (user and system, every thread), in µs, from
/// `/proc/self/stat` (in clock ticks, 100 a second on Linux: a round's total is hundreds).
fn client_cpu_us() -> u64 {
    const TICK_US: u64 = 10_000;
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The fields after the command name (which may hold spaces) in parentheses: utime and
    // stime are the 12th and 13th of them.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|field| field.parse::<u64>().ok())
        .sum();
    ticks * TICK_US
}

/// W5: each implementation's rate with a master paused, against its rate with all up.
fn paused_against_up(summary: &[(Workload, Impl, Figures)]) {
    let rate = |clients: &str, concurrency: usize, which: Impl| {
        summary
            .iter()
            .find(|(w, i, _)| {
                w.name == "w5"
                    && w.clients == clients
                    && w.concurrency == concurrency
                    && *i == which
            })
            .map(|(_, _, figures)| figures.ops_per_sec)
    };
    for concurrency in [1, 16] {
        for (which, name) in [(Impl::Lockset, "lockset"), (Impl::Raw, "rslock")] {
            if let (Some(up), Some(paused)) = (
                rate("up", concurrency, which),
                rate("paused", concurrency, which),
            ) {
                println!(
                    "w5 C={concurrency} {name}: {paused:.0} ops/s with a master paused, {up:.0} all up: {:.2}",
                    paused / up
                );
            }
        }
    }
}
