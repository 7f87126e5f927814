//! Benchmark harness: lockset against a raw redis-rs baseline, in one process and one run.
//!
//! Run with `cargo run --release --example bench`. Starts its own redis-server (or uses
//! `REDIS_URL`), runs every workload for both implementations, alternating rounds so that
//! machine noise hits both alike, prints one JSON line per result and a summary of ratios.
//!
//! - W1 uncontended: C tasks, each on its own key, obtain + release, no retry.
//! - W2 contended: 8 tasks on one key, obtain with retry (linear 1 ms fallback for both),
//!   hold 0 ms, release; hand-off latency from a release being sent to the next acquisition,
//!   and a mutual-exclusion check.
//! - W3 multi-key: one task, locks of K keys.
//!
//! The raw baseline does the minimum by hand: `SET key value NX PX ttl`, then EVALSHA of a
//! compare-and-delete (per key with a pipeline for W3, which is not all-or-nothing).

#[path = "../tests/support/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use lockset::redis::aio::MultiplexedConnection;
use lockset::redis::{self, Script};
use lockset::{Client, Options, Retry};
use rand::Rng as _;
use tokio::sync::Mutex;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const ROUNDS: usize = 11;
const ROUND: Duration = Duration::from_millis(500);

const RAW_RELEASE: &str = r"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
return 1";

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

/// What one round measured.
#[derive(Default)]
struct Sample {
    ops: u64,
    seconds: f64,
    latencies_us: Vec<u32>,
    handoffs_us: Vec<u32>,
    violations: u64,
}

impl Sample {
    fn merge(&mut self, other: Self) {
        self.ops += other.ops;
        self.seconds += other.seconds;
        self.latencies_us.extend(other.latencies_us);
        self.handoffs_us.extend(other.handoffs_us);
        self.violations += other.violations;
    }
}

/// The two implementations, sharing one server.
struct Bench {
    raw: MultiplexedConnection,
    lockset: Client<MultiplexedConnection>,
    release: Script,
}

fn token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl Bench {
    /// One raw obtain attempt: true when obtained.
    async fn raw_obtain(&self, keys: &[String], value: &str) -> bool {
        let mut conn = self.raw.clone();
        if let [key] = keys {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("SET");
            return set.is_some();
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64);
        }
        let set: Vec<Option<String>> = pipe.query_async(&mut conn).await.expect("SET pipeline");
        set.iter().all(Option::is_some)
    }

    async fn raw_release(&self, keys: &[String], value: &str) {
        let mut invocation = self.release.prepare_invoke();
        invocation.key(keys).arg(value);
        let _: i64 = invocation
            .invoke_async(&mut self.raw.clone())
            .await
            .expect("release");
    }

    /// W1 and W3: `tasks` tasks, each locking its own `keys_per_lock` keys in a loop.
    async fn uncontended(
        self: &Arc<Self>,
        which: Impl,
        tasks: usize,
        keys_per_lock: usize,
    ) -> Sample {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (bench, stop) = (self.clone(), stop.clone());
                tokio::spawn(async move {
                    let keys: Vec<String> = (0..keys_per_lock)
                        .map(|k| format!("{{w{t}}}:{k}"))
                        .collect();
                    let mut latencies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        match which {
                            Impl::Raw => {
                                let value = token();
                                assert!(bench.raw_obtain(&keys, &value).await, "uncontended");
                                bench.raw_release(&keys, &value).await;
                            }
                            Impl::Lockset => {
                                let lock = bench
                                    .lockset
                                    .obtain_multi(keys.iter().cloned(), TTL, &Options::default())
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

    /// W2: `tasks` tasks contend for one key, retrying with a 1 ms linear fallback.
    async fn contended(self: &Arc<Self>, which: Impl, tasks: usize) -> Sample {
        let stop = Arc::new(AtomicBool::new(false));
        let inside = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicU64::new(0));
        // When the last release was sent.
        let released: Arc<Mutex<Option<Instant>>> = Arc::default();
        let options = Options::default()
            .retry(Retry::linear(Duration::from_millis(1)))
            .timeout(Duration::from_secs(30));
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (bench, stop, options) = (self.clone(), stop.clone(), options.clone());
                let (inside, violations, released) =
                    (inside.clone(), violations.clone(), released.clone());
                tokio::spawn(async move {
                    let keys = vec!["w2".to_string()];
                    let (mut latencies, mut handoffs) = (Vec::new(), Vec::new());
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let value = token();
                        let lock = match which {
                            Impl::Raw => {
                                while !bench.raw_obtain(&keys, &value).await {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                                None
                            }
                            Impl::Lockset => Some(
                                bench
                                    .lockset
                                    .obtain("w2", TTL, &options)
                                    .await
                                    .expect("obtain"),
                            ),
                        };
                        let acquired = Instant::now();
                        if let Some(sent) = released.lock().await.take() {
                            handoffs.push(micros(acquired.saturating_duration_since(sent)));
                        }
                        latencies.push(micros(acquired - start));
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                        *released.lock().await = Some(Instant::now());
                        match lock {
                            None => bench.raw_release(&keys, &value).await,
                            Some(lock) => lock.release().await.expect("release"),
                        }
                    }
                    (latencies, handoffs)
                })
            })
            .collect();
        let start = Instant::now();
        tokio::time::sleep(ROUND).await;
        stop.store(true, Ordering::Relaxed);
        let mut sample = Sample::default();
        for handle in handles {
            let (latencies, handoffs) = handle.await.expect("task");
            sample.latencies_us.extend(latencies);
            sample.handoffs_us.extend(handoffs);
        }
        sample.seconds = start.elapsed().as_secs_f64();
        sample.ops = sample.latencies_us.len() as u64;
        sample.violations = violations.load(Ordering::SeqCst);
        sample
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

/// One workload configuration.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Workload {
    name: &'static str,
    concurrency: usize,
    keys: usize,
}

#[tokio::main]
async fn main() {
    let (url, _server) = server::url_or_start();
    let client = redis::Client::open(url.as_str()).expect("url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let bench = Arc::new(Bench {
        raw: conn.clone(),
        lockset: Client::new(conn).with_release_events(client).unwrap(),
        release: Script::new(RAW_RELEASE),
    });

    let mut workloads = Vec::new();
    for concurrency in [1, 16, 64] {
        workloads.push(Workload {
            name: "w1",
            concurrency,
            keys: 1,
        });
    }
    workloads.push(Workload {
        name: "w2",
        concurrency: 8,
        keys: 1,
    });
    for keys in [1, 10, 100, 1_000] {
        workloads.push(Workload {
            name: "w3",
            concurrency: 1,
            keys,
        });
    }

    // BENCH_ONLY=w1:64 runs just that workload and concurrency (for profiling).
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        workloads.retain(|w| format!("{}:{}", w.name, w.concurrency) == only);
    }
    let mut results: BTreeMap<(Workload, Impl), Sample> = BTreeMap::new();
    // Per workload, the lockset/raw throughput ratio of each pair of back-to-back rounds.
    let mut round_ratios: BTreeMap<Workload, Vec<f64>> = BTreeMap::new();
    for workload in &workloads {
        for round in 0..ROUNDS {
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
                let sample = match workload.name {
                    "w2" => bench.contended(which, workload.concurrency).await,
                    _ => {
                        bench
                            .uncontended(which, workload.concurrency, workload.keys)
                            .await
                    }
                };
                rates[which as usize] = sample.ops as f64 / sample.seconds;
                results.entry((*workload, which)).or_default().merge(sample);
            }
            round_ratios
                .entry(*workload)
                .or_default()
                .push(rates[1] / rates[0]);
        }
    }

    let mut summary = Vec::new();
    for ((workload, which), sample) in &mut results {
        let ops_per_sec = sample.ops as f64 / sample.seconds;
        let p50 = percentile(&mut sample.latencies_us, 0.50);
        let p99 = percentile(&mut sample.latencies_us, 0.99);
        let mut line = format!(
            r#"{{"impl":"{}","workload":"{}","concurrency":{},"keys":{},"ops":{},"seconds":{:.3},"ops_per_sec":{:.1},"p50_us":{},"p99_us":{}"#,
            which.name(),
            workload.name,
            workload.concurrency,
            workload.keys,
            sample.ops,
            sample.seconds,
            ops_per_sec,
            p50,
            p99
        );
        let mut handoff = (0, 0);
        if workload.name == "w2" {
            handoff = (
                percentile(&mut sample.handoffs_us, 0.50),
                percentile(&mut sample.handoffs_us, 0.99),
            );
            line.push_str(&format!(
                r#","handoff_p50_us":{},"handoff_p99_us":{},"violations":{}"#,
                handoff.0, handoff.1, sample.violations
            ));
        }
        line.push('}');
        println!("{line}");
        summary.push((*workload, *which, ops_per_sec, p50, p99, handoff));
    }

    println!();
    println!(
        "| workload | C | K | raw ops/s | lockset ops/s | lockset/raw (median of paired rounds) | raw p50/p99 µs | lockset p50/p99 µs | hand-off p50/p99 µs (raw → lockset) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for pair in summary.chunks(2) {
        let [raw, lockset] = pair else { continue };
        let handoff = if raw.0.name == "w2" {
            format!("{}/{} → {}/{}", raw.5.0, raw.5.1, lockset.5.0, lockset.5.1)
        } else {
            "-".to_string()
        };
        let ratios = round_ratios
            .get_mut(&raw.0)
            .map(std::mem::take)
            .unwrap_or_default();
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {}/{} | {}/{} | {} |",
            raw.0.name,
            raw.0.concurrency,
            raw.0.keys,
            raw.2,
            lockset.2,
            median(ratios),
            raw.3,
            raw.4,
            lockset.3,
            lockset.4,
            handoff
        );
    }
}
