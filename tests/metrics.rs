//! Metrics (feature `metrics`): the figures of scripted scenarios, captured by
//! `metrics-util`'s debugging recorder and checked exactly. Each test names a lock family of
//! its own (`Options::metrics_label`) and reads only its figures: the tests share the one
//! global recorder.
#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use lockset::{Error, Options, Retry};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::fair::{hold, queued_up_to, slow_polling};
use support::{Env, eventually, ms};

/// Every figure captured so far: (name, sorted labels) → value. A snapshot of the debugging
/// recorder resets what it reads (counters and gauges to zero, histograms emptied), so the
/// figures of every snapshot are added up here, for all tests.
#[derive(Default)]
struct Figures {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

type Series = (String, Vec<(String, String)>);

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

fn figures() -> &'static Mutex<Figures> {
    static FIGURES: OnceLock<Mutex<Figures>> = OnceLock::new();
    FIGURES.get_or_init(Mutex::default)
}

/// Installs the recorder (once per test binary), before any lock operation of the test.
fn record() {
    snapshotter();
}

/// The figures of the lock family `family` now, by name and the labels other than `lock`.
fn family(family: &str) -> Family {
    let mut all = figures().lock().unwrap();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *all.counters.entry(series).or_default() += n,
            DebugValue::Gauge(g) => *all.gauges.entry(series).or_default() += g.into_inner(),
            DebugValue::Histogram(values) => all
                .histograms
                .entry(series)
                .or_default()
                .extend(values.into_iter().map(|v| v.into_inner())),
        }
    }
    let mine = |(name, labels): &Series| {
        labels
            .contains(&("lock".to_owned(), family.to_owned()))
            .then(|| {
                let rest: Vec<String> = labels
                    .iter()
                    .filter(|(key, _)| key != "lock")
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect();
                format!("{name}{{{}}}", rest.join(","))
            })
    };
    Family {
        counters: all
            .counters
            .iter()
            .filter_map(|(s, n)| Some((mine(s)?, *n)))
            .filter(|(_, n)| *n > 0)
            .collect(),
        gauges: all
            .gauges
            .iter()
            .filter_map(|(s, g)| Some((mine(s)?, *g)))
            .collect(),
        histograms: all
            .histograms
            .iter()
            .filter_map(|(s, v)| Some((mine(s)?, v.clone())))
            .filter(|(_, v)| !v.is_empty())
            .collect(),
    }
}

/// One family's figures: counters that are not zero, every gauge, histograms with values.
#[derive(Debug)]
struct Family {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<String, Vec<f64>>,
}

impl Family {
    fn counters(&self) -> Vec<(&str, u64)> {
        let mut counters: Vec<(&str, u64)> = self
            .counters
            .iter()
            .map(|(s, n)| (s.as_str(), *n))
            .collect();
        counters.sort_unstable();
        counters
    }

    /// How many values each histogram has.
    fn recorded(&self) -> Vec<(&str, usize)> {
        let mut counts: Vec<(&str, usize)> = self
            .histograms
            .iter()
            .map(|(s, v)| (s.as_str(), v.len()))
            .collect();
        counts.sort_unstable();
        counts
    }

    fn values(&self, series: &str) -> Vec<f64> {
        self.histograms.get(series).cloned().unwrap_or_default()
    }

    fn waiters(&self) -> f64 {
        self.gauges.get("lockset_waiters{}").copied().unwrap_or(0.0)
    }
}

#[tokio::test]
async fn an_uncontended_cycle_counts_one_of_each() {
    record();
    let env = Env::start().await;
    let options = Options::default().metrics_label("cycle");
    let lock = env
        .client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap();
    lock.refresh(ms(10_000), &Options::default()).await.unwrap();
    lock.ttl().await.unwrap();
    tokio::time::sleep(ms(20)).await;
    lock.release().await.unwrap();

    let figures = family("cycle");
    assert_eq!(
        figures.counters(),
        [
            ("lockset_obtains_total{outcome=obtained}", 1),
            ("lockset_refreshes_total{outcome=refreshed}", 1),
            ("lockset_releases_total{outcome=released}", 1),
        ]
    );
    assert_eq!(
        figures.recorded(),
        [
            ("lockset_hold_seconds{end=released}", 1),
            ("lockset_obtain_attempts{}", 1),
            ("lockset_obtain_wait_seconds{outcome=obtained}", 1),
        ]
    );
    assert_eq!(figures.values("lockset_obtain_attempts{}"), [1.0]);
    let held = figures.values("lockset_hold_seconds{end=released}")[0];
    assert!((0.02..10.0).contains(&held), "held {held} s");
    assert_eq!(figures.waiters(), 0.0);
}

#[tokio::test]
async fn obtains_count_by_outcome_with_their_attempts() {
    record();
    let env = Env::start().await;
    let _holder = hold(&env, "busy").await;
    let options = Options::default().metrics_label("outcomes");

    // Held: one attempt, not obtained.
    let err = env.client.obtain("busy", ms(10_000), &options).await;
    assert!(matches!(err, Err(Error::NotObtained { .. })), "{err:?}");
    // Held, two retries: three attempts, then the strategy gives up.
    let twice = options
        .clone()
        .retry(Retry::intervals([ms(5), ms(5)]))
        .fair(false);
    let err = env.client.obtain("busy", ms(10_000), &twice).await;
    assert!(matches!(err, Err(Error::NotObtained { .. })), "{err:?}");
    // Held until after the deadline.
    let patient = options
        .clone()
        .retry(Retry::linear(ms(20)))
        .timeout(ms(100))
        .fair(false);
    let err = env.client.obtain("busy", ms(10_000), &patient).await;
    assert!(matches!(err, Err(Error::DeadlineExceeded)), "{err:?}");
    // Bad input: nothing sent.
    let err = env.client.obtain("", ms(10_000), &options).await;
    assert!(matches!(err, Err(Error::InvalidInput(_))), "{err:?}");
    // Redis down: unavailable, told apart from bad input and from a holder (an alert on
    // `outcome="unavailable"` means Redis, not contention).
    let server = support::RedisServer::start();
    let down = lockset::Client::connect(&server.url()).await.unwrap();
    drop(server);
    let err = down.obtain("busy", ms(10_000), &options).await;
    assert!(err.as_ref().is_err_and(Error::is_unavailable), "{err:?}");
    // Anything else (here a key that holds a list) is an error.
    let _: () = lockset::redis::cmd("RPUSH")
        .arg("a-list")
        .arg("x")
        .query_async(&mut support::connect(&env.server).await)
        .await
        .unwrap();
    let err = env.client.obtain("a-list", ms(10_000), &options).await;
    assert!(matches!(err, Err(Error::WrongType { .. })), "{err:?}");

    let figures = family("outcomes");
    assert_eq!(
        figures.counters(),
        [
            ("lockset_obtains_total{outcome=deadline}", 1),
            ("lockset_obtains_total{outcome=error}", 1),
            ("lockset_obtains_total{outcome=invalid_input}", 1),
            ("lockset_obtains_total{outcome=not_obtained}", 2),
            ("lockset_obtains_total{outcome=unavailable}", 1),
        ]
    );
    let mut attempts = figures.values("lockset_obtain_attempts{}");
    attempts.sort_by(f64::total_cmp);
    // The bad input's obtain made no attempt; the deadline's made several.
    assert_eq!(attempts[..3], [0.0, 1.0, 1.0], "{attempts:?}");
    assert!(attempts[attempts.len() - 1] >= 2.0, "{attempts:?}");
    let waited = figures.values("lockset_obtain_wait_seconds{outcome=deadline}");
    assert_eq!(waited.len(), 1);
    assert!((0.1..10.0).contains(&waited[0]), "{waited:?}");
    // Nobody waits any more.
    assert_eq!(figures.waiters(), 0.0);
}

#[tokio::test]
async fn a_lock_found_lost_counts_its_cause_and_ends_its_hold_once() {
    record();
    let env = Env::start().await;
    let options = Options::default().metrics_label("lost");

    // A refresh finds the key gone.
    let lock = env.client.obtain("a", ms(10_000), &options).await.unwrap();
    env.cmd::<i64>(&["DEL", "a"]).await;
    let err = lock.refresh(ms(10_000), &Options::default()).await;
    assert!(matches!(err, Err(Error::NotHeld)), "{err:?}");
    // Its release finds nothing to release, and ends no second hold.
    assert!(lock.release().await.unwrap_err().is_not_held());

    // A TTL query finds the key taken over.
    let lock = env.client.obtain("b", ms(10_000), &options).await.unwrap();
    env.cmd::<String>(&["SET", "b", "someone else"]).await;
    assert_eq!(lock.ttl().await.unwrap(), None);

    // A refresh comes after the validity ran out (nothing is sent).
    let lock = env.client.obtain("c", ms(30), &options).await.unwrap();
    tokio::time::sleep(ms(60)).await;
    let err = lock.refresh(ms(10_000), &Options::default()).await;
    assert!(matches!(err, Err(Error::NotHeld)), "{err:?}");

    let figures = family("lost");
    assert_eq!(
        figures.counters(),
        [
            ("lockset_locks_lost_total{cause=expired}", 1),
            ("lockset_locks_lost_total{cause=refresh}", 1),
            ("lockset_locks_lost_total{cause=ttl}", 1),
            ("lockset_obtains_total{outcome=obtained}", 3),
            ("lockset_refreshes_total{outcome=not_held}", 2),
            ("lockset_releases_total{outcome=not_held}", 1),
        ]
    );
    assert_eq!(
        figures.values("lockset_hold_seconds{end=lost}").len(),
        3,
        "{figures:?}"
    );
    assert!(
        figures
            .values("lockset_hold_seconds{end=released}")
            .is_empty()
    );
}

#[tokio::test]
async fn the_watchdog_counts_its_refreshes_and_the_loss_it_finds() {
    record();
    let env = Env::start().await;
    let options = Options::default().metrics_label("watchdog");
    let guard = env
        .client
        .obtain("w", ms(300), &options)
        .await
        .unwrap()
        .keep_alive_every(ms(50));
    let lost = guard.lost_signal();
    eventually(ms(10_000), "two watchdog refreshes", async || {
        family("watchdog")
            .counters
            .get("lockset_refreshes_total{outcome=refreshed}")
            .is_some_and(|n| *n >= 2)
    })
    .await;
    env.cmd::<i64>(&["DEL", "w"]).await;
    tokio::time::timeout(ms(10_000), lost.lost()).await.unwrap();
    let figures = family("watchdog");
    assert_eq!(
        figures
            .counters
            .get("lockset_locks_lost_total{cause=refresh}"),
        Some(&1),
        "{figures:?}"
    );
    assert_eq!(
        figures
            .counters
            .get("lockset_refreshes_total{outcome=not_held}"),
        Some(&1),
        "{figures:?}"
    );
    drop(guard);
}

#[tokio::test]
async fn a_hand_off_counts_the_waiter_while_it_waits_and_its_hand_over() {
    record();
    let env = Env::start().await;
    let holder = hold(&env, "queue").await;
    let options = slow_polling().metrics_label("hand-off");
    let client = env.client.clone();
    let waiter = tokio::spawn(async move { client.obtain("queue", ms(60_000), &options).await });
    queued_up_to(&env, "queue", 1).await;
    eventually(ms(10_000), "the waiter in the gauge", async || {
        family("hand-off").waiters() == 1.0
    })
    .await;
    tokio::time::sleep(ms(50)).await;
    holder.release().await.unwrap();
    let lock = tokio::time::timeout(ms(10_000), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let figures = family("hand-off");
    assert_eq!(
        figures.counters(),
        [
            ("lockset_handoffs_total{}", 1),
            ("lockset_obtains_total{outcome=obtained}", 1),
        ]
    );
    assert_eq!(figures.waiters(), 0.0);
    let handover = figures.values("lockset_handover_seconds{}");
    assert_eq!(handover.len(), 1);
    assert!(handover[0] < 2.0, "{handover:?}");
    let waited = figures.values("lockset_obtain_wait_seconds{outcome=obtained}");
    assert!(waited[0] >= 0.05, "{waited:?}");
    lock.release().await.unwrap();
}

#[tokio::test]
async fn labels_are_never_a_key_or_a_token() {
    record();
    let env = Env::start().await;
    let token = "a-secret-token";
    let lock = env
        .client
        .obtain("secret-key", ms(10_000), &Options::default().token(token))
        .await
        .unwrap();
    lock.release().await.unwrap();
    let _ = family("none");
    let all = figures().lock().unwrap();
    let series = all
        .counters
        .keys()
        .chain(all.gauges.keys())
        .chain(all.histograms.keys());
    let mut seen = 0;
    for (name, labels) in series {
        seen += 1;
        assert!(name.starts_with("lockset_"), "{name}");
        for (key, value) in labels {
            assert!(
                ["outcome", "cause", "end", "lock"].contains(&key.as_str()),
                "{name}: {key}={value}"
            );
            assert!(!value.contains("secret"), "{name}: {key}={value}");
        }
    }
    assert!(seen >= 20, "{seen} series");
}
