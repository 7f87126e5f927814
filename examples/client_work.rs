//! The client's own work per uncontended cycle, with Redis taken out of the figure.
//!
//! lockset and a raw redis-rs baseline each run the bench's W1 cycle (obtain one key with
//! `SET NX PX`, release it by compare-and-delete) many times in one thread, through a
//! connection that answers every request at once with a fixed reply. What is left is the
//! CPU time each spends on its side of the connection: building commands, parsing replies,
//! and (for lockset) checking the request, its waiting state, the lock handle, and the
//! span and metrics calls as they cost with no `tracing` subscriber and no metrics recorder
//! installed (an application with either pays more). The bench (`examples/bench.rs`)
//! measures the whole cycle against a real server; there the server's and the network's
//! share dwarf this, and its ratios swing by more than the difference this shows, so a
//! change to lockset's hot path is judged here first and then in the bench.
//!
//! Run with `cargo run --release --example client_work [cycles [tasks [keys]]]` (200,000
//! cycles, one task, one key unless told; with more keys, a lock of that many, the bench's
//! W3 cycle: raw by a script each way). More tasks, as in `client_work 200000 64`, run at once, each on its
//! own key (the cycles, rounded down to a multiple of the tasks, split between them), and
//! every request lets the others run before it is answered (as waiting for a server would),
//! still in one thread. Each task's state then goes cold between its steps, as under the
//! bench's 64 concurrent tasks: what a larger future or handle costs there, which a single
//! task kept hot in cache hides.
//!
//! This measures; it tests nothing: the replies are fixed (the key is always free, the
//! release always finds it ours), so no behaviour is checked. Prints, per round, the
//! nanoseconds per cycle of each and the difference, then the lowest of each over the
//! rounds (the least disturbed by the rest of the machine).

use std::time::{Duration, Instant};

use lockset::redis::aio::ConnectionLike;
use lockset::redis::{Arg, Cmd, Pipeline, RedisFuture, Value};
use lockset::{Client, Options};

/// Rounds per run; each runs both implementations, raw first.
const ROUNDS: usize = 7;

/// A connection that answers at once, as a server with every key free would: `SET … NX`
/// with OK (set), or with nil when it ends in `GET` (no old value: set), a script or
/// `DELIFEQ` with 1 (done), `SCRIPT EXISTS` with "loaded", `COMMAND INFO` with "unknown
/// command" (no native compare-and-delete), anything else with OK. With `yields`, each
/// answer waits for the runtime's other tasks to run first.
#[derive(Clone, Copy)]
struct Instantly {
    yields: bool,
}

fn reply(cmd: &Cmd) -> Value {
    let word = |arg: Option<Arg<&[u8]>>| match arg {
        Some(Arg::Simple(word)) => word.to_ascii_uppercase(),
        _ => Vec::new(),
    };
    match word(cmd.args_iter().next()).as_slice() {
        b"SET" if word(cmd.args_iter().last()) == b"GET" => Value::Nil,
        b"SET" => Value::Okay,
        // lockset's obtain script (its sha not raw's, and the value and TTL after the keys)
        // answers {1}; every other script 1.
        b"EVALSHA" if is_lockset_obtain(cmd) => Value::Array(vec![Value::Int(1)]),
        b"EVALSHA" | b"EVAL" | b"DELIFEQ" => Value::Int(1),
        b"SCRIPT" => Value::Array(vec![Value::Int(1); 32]),
        b"COMMAND" => Value::Array(vec![Value::Nil]),
        _ => Value::Okay,
    }
}

/// The raw baseline's script hash (it loads nothing: the connection answers anything).
const RAW_SHA: &str = "7ba4a3d1aa3b3a1d5c4b1e2f3a4b5c6d7e8f9a0b";

/// Whether `cmd` is lockset's `EVALSHA` of its obtain script: not raw's hash, and two
/// arguments (value, TTL) after the keys, where a release has one.
fn is_lockset_obtain(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().skip(1);
    let sha = matches!(args.next(), Some(Arg::Simple(sha)) if sha != RAW_SHA.as_bytes());
    let keys = match args.next() {
        Some(Arg::Simple(n)) => std::str::from_utf8(n).ok().and_then(|n| n.parse().ok()),
        _ => None,
    };
    sha && keys.is_some_and(|keys: usize| args.count() == keys + 2)
}

impl Instantly {
    /// `value` as the answer to a request: at once, or after the other tasks had their turn.
    fn answer<T: Send + 'static>(self, value: T) -> RedisFuture<'static, T> {
        Box::pin(async move {
            if self.yields {
                tokio::task::yield_now().await;
            }
            Ok(value)
        })
    }
}

impl ConnectionLike for Instantly {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.answer(reply(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let values = pipeline.cmd_iter().map(reply).skip(offset).take(count);
        self.answer(values.collect())
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A random token, as the bench's raw baseline makes one per cycle.
fn token(seed: &mut u64) -> String {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    format!("{:022x}", *seed)
}

/// The raw baseline's cycle on `keys`, `cycles` times: the bench's `Raw::obtain` and
/// `Raw::release` (one key: `SET NX PX`; more: a script).
async fn raw(conn: Instantly, keys: Vec<String>, cycles: usize) {
    let mut seed = 1;
    for _ in 0..cycles {
        let value = token(&mut seed);
        let mut obtain = Cmd::new();
        if let [key] = keys.as_slice() {
            obtain.arg("SET").arg(key).arg(&value).arg("NX").arg("PX");
        } else {
            obtain
                .arg("EVALSHA")
                .arg(RAW_SHA)
                .arg(keys.len())
                .arg(&keys);
            obtain.arg(&value);
        }
        obtain.arg(10_000u64);
        let obtained: Option<String> = obtain.query_async(&mut conn.clone()).await.expect("obtain");
        assert!(obtained.is_some(), "the keys are always free");
        let mut release = Cmd::new();
        release
            .arg("EVALSHA")
            .arg(RAW_SHA)
            .arg(keys.len())
            .arg(&keys)
            .arg(&value);
        let released: i64 = release
            .query_async(&mut conn.clone())
            .await
            .expect("release");
        assert_eq!(released, 1);
    }
}

/// lockset's cycle on `keys`, `cycles` times.
async fn lockset(client: Client<Instantly>, keys: Vec<String>, cycles: usize) {
    let options = Options::default();
    let ttl = Duration::from_secs(10);
    for _ in 0..cycles {
        let lock = match keys.as_slice() {
            [key] => client.obtain(key, ttl, &options).await,
            keys => client.obtain_multi(keys, ttl, &options).await,
        };
        lock.expect("obtain").release().await.expect("release");
    }
}

/// `count` keys named after `base`: `base` itself for one.
fn keys(base: &str, count: usize) -> Vec<String> {
    match count {
        1 => vec![base.to_owned()],
        _ => (0..count).map(|key| format!("{base}:{key}")).collect(),
    }
}

/// How long `tasks` tasks take to run `cycle` on keys of their own, `cycles` in all. One task
/// runs in `main`'s own future, as the guard's figure always has: spawned, raw's cycle read
/// about 90 ns less and lockset's no less, which moved the ratio by 0.25.
async fn timed<F, Fut>(tasks: usize, cycles: usize, cycle: F) -> Duration
where
    F: Fn(String, usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let start = Instant::now();
    if tasks == 1 {
        cycle("key".to_owned(), cycles).await;
        return start.elapsed();
    }
    let running: Vec<_> = (0..tasks)
        .map(|task| tokio::spawn(cycle(format!("key:{task}"), cycles / tasks)))
        .collect();
    for task in running {
        task.await.expect("a cycle task");
    }
    start.elapsed()
}

fn per_cycle(took: Duration, cycles: usize) -> f64 {
    took.as_nanos() as f64 / cycles as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let cycles: usize = args
        .next()
        .map(|arg| arg.parse().expect("cycles: a number"))
        .unwrap_or(200_000);
    let tasks: usize = args
        .next()
        .map(|arg| arg.parse().expect("tasks: a number"))
        .unwrap_or(1)
        .clamp(1, cycles.max(1));
    let per_lock: usize = args
        .next()
        .map(|arg| arg.parse().expect("keys: a number"))
        .unwrap_or(1)
        .max(1);
    let conn = Instantly { yields: tasks > 1 };
    // Release events on, as `Client::connect` and the bench have them: the pub/sub
    // connection opens only when an obtain waits, which none here does (every key is free).
    let events = lockset::redis::Client::open("redis://127.0.0.1:1/").expect("url");
    // As `Client::connect` has it: the connection's bound on one request is known (this one
    // answers at once), so an attempt far from its deadline arms no timer.
    let client = Client::new(conn)
        .with_release_events(events)
        .and_then(|client| client.connection_answers_within(Duration::from_millis(500)))
        .expect("release events and the answer bound");
    // One cycle first: lockset's first obtain asks the server what it supports.
    lockset(client.clone(), keys("warm", per_lock), 1).await;
    let cycles = cycles / tasks * tasks;
    assert!(cycles > 0, "cycles: at least one per task");
    println!("{cycles} cycles of {per_lock} key(s) in {tasks} task(s) per round");
    let (mut best_raw, mut best_lockset) = (f64::MAX, f64::MAX);
    for round in 1..=ROUNDS {
        let raw = timed(tasks, cycles, |key, n| raw(conn, keys(&key, per_lock), n)).await;
        let lockset = timed(tasks, cycles, |key, n| {
            lockset(client.clone(), keys(&key, per_lock), n)
        })
        .await;
        let (raw, lockset) = (per_cycle(raw, cycles), per_cycle(lockset, cycles));
        println!(
            "round {round}: raw {raw:.0} ns, lockset {lockset:.0} ns per cycle (+{:.0})",
            lockset - raw
        );
        best_raw = best_raw.min(raw);
        best_lockset = best_lockset.min(lockset);
    }
    println!(
        "lowest: raw {best_raw:.0} ns, lockset {best_lockset:.0} ns per cycle (+{:.0})",
        best_lockset - best_raw
    );
}
