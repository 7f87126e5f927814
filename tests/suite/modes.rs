//! Shared (read) and counted (permit) keys, mixed with exclusive ones in one atomic obtain,
//! on one server.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Error, InvalidInput, Jitter, Lock, Mode, Options, Retry};
use support::{Env, ms};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const READ: Mode = Mode::Shared;
const WRITE: Mode = Mode::Exclusive;

fn permits(limit: u32) -> Mode {
    Mode::Permit { limit }
}

/// Tries once.
fn once() -> Options {
    Options::default()
}

/// Waits only for release events: polls once a minute.
fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(ms(60_000)))
        .timeout(ms(120_000))
}

/// A poll that would take far longer than being woken by a release event.
const WOKEN_WITHIN: Duration = Duration::from_secs(5);

type Waiting = JoinHandle<(Instant, Lock<ConnectionManager>)>;

/// An obtain of `key` in `mode` per `options`, in a task of its own, that reports when it
/// got the lock.
fn spawn_waiter(
    client: &Client<ConnectionManager>,
    key: &'static str,
    mode: Mode,
    options: Options,
) -> Waiting {
    let client = client.clone();
    tokio::spawn(async move {
        let lock = client.obtain((key, mode), ms(30_000), &options).await;
        (Instant::now(), lock.unwrap())
    })
}

/// Waits until a writer waits for "doc" ahead of new readers: queued for it (a fair
/// writer), or with its mark on it (a writer that does not queue).
async fn writer_waits(env: &Env) {
    support::eventually(ms(10_000), "the writer queued", async || {
        let marked = env.cmd::<Option<f64>>(&["ZSCORE", "doc", "=x"]).await;
        marked.is_some() || support::fair::queued(env, "doc").await > 0
    })
    .await;
}

/// The lock of `waiter`, which must have got it within [`WOKEN_WITHIN`] of `released`.
async fn woken(waiter: Waiting, released: Instant, what: &str) -> Lock<ConnectionManager> {
    let (at, lock) = tokio::time::timeout(ms(90_000), waiter)
        .await
        .expect("the waiter returns")
        .unwrap();
    let waited = at.saturating_duration_since(released);
    assert!(waited < WOKEN_WITHIN, "{what} slept {waited:?}");
    lock
}

#[tokio::test]
async fn readers_share_a_key_that_excludes_writers_until_the_last_reader_leaves() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let first = env
        .client
        .obtain(("doc", READ), ms(10_000), &once())
        .await
        .unwrap();
    let second = other
        .obtain(("doc", READ), ms(10_000), &once())
        .await
        .unwrap();
    assert_eq!(first.modes(), vec![READ]);
    for client in [&env.client, &other] {
        let writer = client.obtain("doc", ms(10_000), &once()).await;
        assert!(
            matches!(writer, Err(Error::NotObtained { .. })),
            "{writer:?}"
        );
    }
    first.release().await.unwrap();
    let writer = other.obtain("doc", ms(10_000), &once()).await;
    assert!(
        matches!(writer, Err(Error::NotObtained { .. })),
        "{writer:?}"
    );
    second.release().await.unwrap();
    assert_eq!(
        env.dbsize().await,
        0,
        "the last reader's release leaves nothing"
    );

    let writer = env.client.obtain("doc", ms(10_000), &once()).await.unwrap();
    for mode in [READ, permits(2)] {
        let reader = other.obtain(("doc", mode), ms(10_000), &once()).await;
        assert!(
            matches!(reader, Err(Error::NotObtained { .. })),
            "{reader:?}"
        );
    }
    // A writer's key stays today's plain value.
    let value = env.get("doc").await.unwrap();
    assert_eq!(lockset::parse_value(&value).unwrap().0, writer.token());
    writer.release().await.unwrap();
}

#[tokio::test]
async fn a_mixed_lock_takes_every_key_in_its_mode_or_none() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let keys = [("order", WRITE), ("catalog", READ), ("exports", permits(2))];
    let lock = env
        .client
        .obtain_multi(keys, ms(10_000), &Options::default().metadata("job-1"))
        .await
        .unwrap();
    assert_eq!(lock.modes(), vec![WRITE, READ, permits(2)]);
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left > ms(9_000) && left <= ms(10_000), "{left:?}");

    // Another reader of the catalog and another exporter get in; the order is taken.
    let reader = other
        .obtain_multi(
            [("catalog", READ), ("exports", permits(2))],
            ms(10_000),
            &once(),
        )
        .await
        .unwrap();
    let blocked = other
        .obtain_multi([("catalog", READ), ("order", READ)], ms(10_000), &once())
        .await;
    assert!(
        matches!(blocked, Err(Error::NotObtained { .. })),
        "{blocked:?}"
    );
    // The failed obtain left nothing: the catalog has two holders.
    let holders: i64 = env.cmd(&["ZCOUNT", "catalog", "(-inf", "+inf"]).await;
    assert_eq!(holders, 2);
    // Both permits are taken.
    let third = other
        .obtain(("exports", permits(2)), ms(10_000), &once())
        .await;
    assert!(matches!(third, Err(Error::NotObtained { .. })), "{third:?}");

    lock.refresh(ms(20_000), &Options::default()).await.unwrap();
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left > ms(19_000), "{left:?}");
    lock.release().await.unwrap();
    assert!(!env.exists("order").await);
    reader.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn refresh_with_metadata_replaces_it_in_every_mode() {
    let env = Env::start().await;
    let keys = [("w", WRITE), ("r", READ), ("p", permits(2))];
    let lock = env
        .client
        .obtain_multi(keys, ms(10_000), &once().metadata("old"))
        .await
        .unwrap();
    // Another holder's share stays as it is.
    let other = env
        .client
        .obtain(("r", READ), ms(10_000), &once().metadata("other"))
        .await
        .unwrap();
    lock.refresh(ms(60_000), &once().metadata("new"))
        .await
        .unwrap();
    assert_eq!(lock.metadata(), "new");
    let tag = format!("22:{}", lock.token());
    assert_eq!(env.get("w").await, Some(format!("{tag}new")));
    for key in ["r", "p"] {
        let members: Vec<String> = env.cmd(&["ZRANGE", key, "0", "-1"]).await;
        assert!(members.contains(&format!("{tag}new")), "{key}: {members:?}");
        assert!(
            !members.contains(&format!("{tag}old")),
            "{key}: {members:?}"
        );
        let score: f64 = env.cmd(&["ZSCORE", key, &format!("{tag}new")]).await;
        let now: Vec<String> = env.cmd(&["TIME"]).await;
        let now_ms = now[0].parse::<f64>().unwrap() * 1000.0;
        assert!(score - now_ms > 30_000.0, "{key} extended");
    }
    let members: Vec<String> = env.cmd(&["ZRANGE", "r", "0", "-1"]).await;
    assert!(
        members.contains(&format!("22:{}other", other.token())),
        "{members:?}"
    );
    assert!(lock.ttl().await.unwrap().unwrap() > ms(30_000));
    lock.release().await.unwrap();
    other.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn storage_of_shared_and_counted_keys() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain_multi(
            [("r", READ), ("p", permits(3))],
            ms(10_000),
            &Options::default().metadata("meta"),
        )
        .await
        .unwrap();
    let value = format!("{}:{}meta", lock.token().len(), lock.token());
    for (key, mode) in [("r", "=s"), ("p", "=p3")] {
        assert_eq!(env.cmd::<String>(&["TYPE", key]).await, "zset");
        let members: Vec<String> = env.cmd(&["ZRANGE", key, "0", "-1"]).await;
        assert_eq!(members, vec![mode.to_owned(), value.clone()], "{key}");
        let expiry: f64 = env.cmd(&["ZSCORE", key, &value]).await;
        let time: Vec<String> = env.cmd(&["TIME"]).await;
        let now = time[0].parse::<f64>().unwrap() * 1000.0;
        assert!(
            (expiry - now - 10_000.0).abs() < 2_000.0,
            "{expiry} vs {now}"
        );
        let pttl: i64 = env.cmd(&["PTTL", key]).await;
        assert!(pttl > 9_000 && pttl <= 10_000, "{pttl}");
    }
    lock.release().await.unwrap();
}

#[tokio::test]
async fn bad_modes_are_refused_before_anything_is_sent() {
    let env = Env::start().await;
    let cases = [
        (
            vec![("a", permits(0))],
            InvalidInput::ZeroLimit { key: "a".into() },
        ),
        (
            vec![("a", READ), ("a", WRITE)],
            InvalidInput::ConflictingModes {
                key: "a".into(),
                first: READ,
                second: WRITE,
            },
        ),
        (
            vec![("a", permits(2)), ("a", permits(3))],
            InvalidInput::ConflictingModes {
                key: "a".into(),
                first: permits(2),
                second: permits(3),
            },
        ),
        (
            vec![("a", READ), ("a", READ)],
            InvalidInput::DuplicateKey { key: "a".into() },
        ),
    ];
    for (keys, expected) in cases {
        let err = env
            .client
            .obtain_multi(keys.clone(), ms(1_000), &Options::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput(input) if *input == expected),
            "{keys:?}: {err}"
        );
    }
    assert_eq!(env.calls("evalsha").await + env.calls("eval").await, 0);
}

#[tokio::test]
async fn a_key_held_under_another_limit_or_mode_is_a_clear_error() {
    let env = Env::start().await;
    let held = env
        .client
        .obtain(("jobs", permits(3)), ms(10_000), &once())
        .await
        .unwrap();
    for (mode, message) in [
        (
            permits(4),
            "\"jobs\" is held as one of 3 permits, but was asked for as one of 4 permits",
        ),
        (
            READ,
            "\"jobs\" is held as one of 3 permits, but was asked for as shared",
        ),
    ] {
        let err = env
            .client
            .obtain_multi(
                [("free", WRITE), ("jobs", mode)],
                ms(1_000),
                &Options::default(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::ModeMismatch { key, held, requested }
                if key == "jobs" && *held == permits(3) && *requested == mode),
            "{err:?}"
        );
        assert!(err.to_string().contains(message), "{err}");
        assert!(!env.exists("free").await, "nothing is left behind");
    }
    held.release().await.unwrap();
    // With no holder left, the key takes any mode.
    let reader = env.client.obtain(("jobs", READ), ms(1_000), &once()).await;
    reader.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_set_that_this_library_did_not_write_is_still_a_wrong_type() {
    let env = Env::start().await;
    env.cmd::<i64>(&["ZADD", "scores", "1", "alice"]).await;
    for mode in [WRITE, READ, permits(2)] {
        let err = env
            .client
            .obtain(("scores", mode), ms(1_000), &once())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { key } if key == "scores"),
            "{mode}: {err:?}"
        );
    }
    let members: Vec<String> = env.cmd(&["ZRANGE", "scores", "0", "-1"]).await;
    assert_eq!(members, vec!["alice".to_owned()]);
}

#[tokio::test]
async fn a_permit_key_never_has_more_holders_than_its_limit() {
    let env = Env::start().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let options = Options::default()
        .retry(Retry::linear(ms(5)).jitter(Jitter::Full))
        .timeout(ms(120_000));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let client = env.other_client().await;
        let (inside, most, options) = (inside.clone(), most.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let permit = client
                    .obtain(("exports", permits(3)), ms(30_000), &options)
                    .await
                    .unwrap();
                let now = inside.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(ms(2)).await;
                inside.fetch_sub(1, SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(SeqCst);
    println!("at most {most} permit holders at once");
    assert!(most <= 3, "{most} holders of 3 permits");
    assert_eq!(most, 3, "the permits were never all used at once");
    assert_eq!(env.dbsize().await, 0);
}

/// 16 tasks over 3 keys, each lock reading some keys and writing others: a writer is never
/// beside any other holder of its key, no update is lost, and readers do overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_under_contention() {
    let env = Env::start().await;
    let keys = ["{rw}:0", "{rw}:1", "{rw}:2"];
    let state: Arc<Vec<KeyState>> = Arc::new((0..3).map(|_| KeyState::default()).collect());
    let options = Options::default()
        .retry(Retry::linear(ms(3)).jitter(Jitter::Full))
        .timeout(ms(120_000));
    let mut tasks = Vec::new();
    for task in 0..16usize {
        let client = env.other_client().await;
        let (state, options) = (state.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25usize {
                // Every lock writes one key and reads another, or reads two.
                let pick = (task + round) % 6;
                let request: Vec<(&str, Mode)> = match pick {
                    0..=2 => vec![(keys[pick], WRITE), (keys[(pick + 1) % 3], READ)],
                    _ => vec![(keys[pick - 3], READ), (keys[(pick - 2) % 3], READ)],
                };
                let lock = client
                    .obtain_multi(request.clone(), ms(30_000), &options)
                    .await
                    .unwrap();
                let entered: Vec<_> = request
                    .iter()
                    .map(|(key, mode)| {
                        let i = keys.iter().position(|k| k == key).unwrap();
                        state[i].enter(*mode == WRITE);
                        (i, *mode == WRITE)
                    })
                    .collect();
                for (i, writing) in &entered {
                    if *writing {
                        state[*i].write().await;
                    }
                }
                tokio::time::sleep(ms(1)).await;
                for (i, writing) in entered {
                    state[i].leave(writing);
                }
                lock.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let writes: u64 = state.iter().map(|s| s.counter.load(SeqCst)).sum();
    let most_readers = state.iter().map(|s| s.most_readers.load(SeqCst)).max();
    println!("most readers at once on one key: {most_readers:?}");
    for s in state.iter() {
        assert_eq!(
            s.violations.load(SeqCst),
            0,
            "a writer beside another holder"
        );
    }
    let expected = (0..16usize)
        .flat_map(|task| (0..25usize).map(move |round| (task + round) % 6))
        .filter(|pick| *pick <= 2)
        .count();
    assert_eq!(writes, expected as u64, "lost updates");
    assert!(most_readers.unwrap() > 1, "readers never overlapped");
    assert_eq!(env.dbsize().await, 0);
}

/// One key's holders as the test sees them.
#[derive(Default)]
struct KeyState {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    violations: AtomicUsize,
    counter: AtomicU64,
}

impl KeyState {
    fn enter(&self, writing: bool) {
        if writing {
            let writers = self.writers.fetch_add(1, SeqCst);
            if writers > 0 || self.readers.load(SeqCst) > 0 {
                self.violations.fetch_add(1, SeqCst);
            }
        } else {
            let readers = self.readers.fetch_add(1, SeqCst) + 1;
            self.most_readers.fetch_max(readers, SeqCst);
            if self.writers.load(SeqCst) > 0 {
                self.violations.fetch_add(1, SeqCst);
            }
        }
    }

    /// A non-atomic increment: two writers at once lose an update.
    async fn write(&self) {
        let read = self.counter.load(SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(read + 1, SeqCst);
    }

    fn leave(&self, writing: bool) {
        if writing {
            self.writers.fetch_sub(1, SeqCst);
        } else {
            self.readers.fetch_sub(1, SeqCst);
        }
    }
}

/// A reader that crashed (its lock dropped, never released) frees its share at its own TTL,
/// not at the TTL of a reader that stays.
#[tokio::test]
async fn a_crashed_holder_frees_its_share_at_its_own_ttl() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let staying = other
        .obtain(("doc", READ), ms(60_000), &once())
        .await
        .unwrap();
    let crashed = env
        .client
        .obtain(("doc", READ), ms(500), &once())
        .await
        .unwrap();
    drop(crashed);
    // A counted key with one permit, taken by a holder that crashes.
    let crashed = env
        .client
        .obtain(("job", permits(1)), ms(500), &once())
        .await
        .unwrap();
    drop(crashed);
    let start = Instant::now();
    let permit = other
        .obtain(("job", permits(1)), ms(10_000), &slow_polling())
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(waited < ms(10_000), "the permit came after {waited:?}");
    // Every touch removes expired holders: another reader finds one other holder.
    let reader = env
        .client
        .obtain(("doc", READ), ms(60_000), &once())
        .await
        .unwrap();
    let holders: i64 = env.cmd(&["ZCOUNT", "doc", "(-inf", "+inf"]).await;
    assert_eq!(holders, 2, "the crashed reader's share is gone");
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    staying.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// Writers first: once a writer waits, a new reader waits behind it, and the writer gets the
/// key when the readers that were there leave.
#[tokio::test]
async fn a_waiting_writer_keeps_new_readers_out() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let reader = env
        .client
        .obtain(("doc", READ), ms(60_000), &once())
        .await
        .unwrap();
    let writer = spawn_waiter(&other, "doc", WRITE, slow_polling());
    writer_waits(&env).await;
    let late = env.client.obtain(("doc", READ), ms(60_000), &once()).await;
    assert!(matches!(late, Err(Error::NotObtained { .. })), "{late:?}");
    // The reader's release wakes the writer (it polls once a minute).
    let released = Instant::now();
    reader.release().await.unwrap();
    let writer = woken(writer, released, "the writer").await;
    // A reader that waits now is woken by the writer's release.
    let reader = spawn_waiter(&env.client, "doc", READ, slow_polling());
    support::eventually(ms(10_000), "the writer's value marked", async || {
        env.get("doc").await.is_some_and(|v| v.starts_with('!'))
    })
    .await;
    let released = Instant::now();
    writer.release().await.unwrap();
    let reader = woken(reader, released, "the reader").await;
    reader.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
}

/// A writer is not starved by readers that keep coming: it gets the key within twice the
/// readers' hold time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_a_stream_of_readers() {
    const HOLD: Duration = Duration::from_millis(1_000);
    let env = Env::start().await;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for _ in 0..16 {
        let client = env.other_client().await;
        let (stop, reads) = (stop.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            let options = Options::default()
                .retry(Retry::linear(ms(5)).jitter(Jitter::Full))
                .timeout(ms(60_000));
            while !stop.load(SeqCst) {
                let lock = client
                    .obtain(("doc", READ), ms(30_000), &options)
                    .await
                    .unwrap();
                reads.fetch_add(1, SeqCst);
                tokio::time::sleep(HOLD).await;
                lock.release().await.unwrap();
            }
        }));
    }
    // Readers overlap all the time: without writers first, a writer would never get in.
    support::eventually(ms(10_000), "readers reading", async || {
        reads.load(SeqCst) >= 16
    })
    .await;
    let writer = env.other_client().await;
    let start = Instant::now();
    let options = Options::default()
        .retry(Retry::linear(ms(5)))
        .timeout(ms(30_000));
    let lock = writer.obtain("doc", ms(10_000), &options).await.unwrap();
    let waited = start.elapsed();
    println!("the writer waited {waited:?} beside 16 looping readers holding {HOLD:?}");
    assert!(waited < 2 * HOLD, "the writer waited {waited:?}");
    stop.store(true, SeqCst);
    lock.release().await.unwrap();
    for reader in readers {
        tokio::time::timeout(ms(60_000), reader)
            .await
            .expect("a reader stops")
            .unwrap();
    }
}

#[tokio::test]
async fn a_permit_waiter_is_woken_when_a_permit_is_released() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let first = env
        .client
        .obtain(("job", permits(2)), ms(60_000), &once())
        .await
        .unwrap();
    let _second = env
        .client
        .obtain(("job", permits(2)), ms(60_000), &once())
        .await
        .unwrap();
    let waiter = spawn_waiter(&other, "job", permits(2), slow_polling());
    support::eventually(ms(10_000), "the waiter marked the key", async || {
        env.cmd::<Option<f64>>(&["ZSCORE", "job", "=w"])
            .await
            .is_some()
    })
    .await;
    let released = Instant::now();
    first.release().await.unwrap();
    let permit = woken(waiter, released, "the permit waiter").await;
    permit.release().await.unwrap();
}

#[tokio::test]
async fn shared_locks_refresh_reobtain_and_keep_alive_like_exclusive_ones() {
    let env = Env::start().await;
    let options = Options::default().token("reader-token");
    let lock = env
        .client
        .obtain(("doc", READ), ms(10_000), &options)
        .await
        .unwrap();
    // A re-obtain by token keeps the longer TTL and takes the new metadata.
    let again = env
        .client
        .obtain(("doc", READ), ms(2_000), &options.clone().metadata("m2"))
        .await
        .unwrap();
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left > ms(9_000), "{left:?}");
    let members: Vec<String> = env.cmd(&["ZRANGE", "doc", "0", "-1"]).await;
    assert_eq!(
        members,
        vec!["=s".to_owned(), "12:reader-tokenm2".to_owned()]
    );
    // A refresh to a shorter TTL shortens the share and the key.
    lock.refresh(ms(3_000), &Options::default()).await.unwrap();
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left <= ms(3_000), "{left:?}");
    let pttl: i64 = env.cmd(&["PTTL", "doc"]).await;
    assert!(pttl <= 3_000, "{pttl}");
    drop(again);

    // The watchdog keeps a short share alive past its TTL.
    let guard = lock.keep_alive_every(ms(100));
    let lost = guard.lost_signal();
    tokio::time::sleep(ms(700)).await;
    assert!(!lost.is_lost());
    let left = guard.ttl().await.unwrap().unwrap();
    assert!(left > ms(1_000), "{left:?}");
    guard.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);

    // with_lock takes modes too.
    let readers = env
        .client
        .with_lock(
            [("a", READ), ("b", WRITE)],
            ms(5_000),
            &Options::default(),
            |_| async { env.cmd::<String>(&["TYPE", "a"]).await },
        )
        .await
        .unwrap();
    assert_eq!(readers, "zset");
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn a_lost_share_is_not_held() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain(("doc", READ), ms(10_000), &once())
        .await
        .unwrap();
    let value = format!("{}:{}", lock.token().len(), lock.token());
    env.cmd::<i64>(&["ZREM", "doc", &value]).await;
    assert_eq!(lock.ttl().await.unwrap(), None);
    let refreshed = lock.refresh(ms(10_000), &Options::default()).await;
    assert!(matches!(refreshed, Err(Error::NotHeld)), "{refreshed:?}");
    let released = lock.release().await;
    assert!(matches!(released, Err(Error::NotHeld)), "{released:?}");
}

#[tokio::test]
async fn fencing_tokens_increase_across_a_mixed_lock() {
    let env = Env::start().await;
    let options = Options::default().fencing_key("{doc}:fence");
    let first = env
        .client
        .obtain_multi(
            [("{doc}:a", WRITE), ("{doc}:b", READ)],
            ms(10_000),
            &options,
        )
        .await
        .unwrap();
    let a = first.fencing_token().unwrap();
    first.release().await.unwrap();
    let second = env
        .client
        .obtain_multi(
            [("{doc}:a", WRITE), ("{doc}:b", READ)],
            ms(10_000),
            &options,
        )
        .await
        .unwrap();
    assert!(second.fencing_token().unwrap() > a);
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_plain_lock_on_a_shared_key_waits_like_any_writer() {
    let env = Env::start().await;
    let reader = env
        .client
        .obtain(("doc", READ), ms(300), &once())
        .await
        .unwrap();
    let blocked = env.client.obtain("doc", ms(10_000), &once()).await;
    assert!(
        matches!(blocked, Err(Error::NotObtained { .. })),
        "{blocked:?}"
    );
    // A plain multi-key lock too, and it leaves nothing behind.
    let blocked = env
        .client
        .obtain_multi(["free", "doc"], ms(10_000), &once())
        .await;
    assert!(
        matches!(blocked, Err(Error::NotObtained { .. })),
        "{blocked:?}"
    );
    assert!(!env.exists("free").await);
    drop(reader);
    // Once the reader's TTL ran out, the writer gets the key.
    let writer = env
        .client
        .obtain(
            "doc",
            ms(10_000),
            &Options::default().retry(Retry::linear(ms(20))),
        )
        .await
        .unwrap();
    writer.release().await.unwrap();
}

#[tokio::test]
async fn an_adopted_shared_lock_is_the_same_share() {
    let env = Env::start().await;
    let options = Options::default().token("shared-job");
    let lock = env
        .client
        .obtain_multi([("a", READ), ("b", permits(2))], ms(10_000), &options)
        .await
        .unwrap();
    let adopted = env
        .other_client()
        .await
        .adopt([("a", READ), ("b", permits(2))], ms(10_000), &options)
        .await
        .unwrap();
    assert_eq!(adopted.modes(), lock.modes());
    adopted.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0);
    drop(lock);
}

#[tokio::test]
async fn a_cancelled_shared_obtain_leaves_no_share_behind() {
    let env = Env::start().await;
    let options = once();
    let mut cancelled = 0;
    for _ in 0..20 {
        let mut obtain = std::pin::pin!(env.client.obtain(("doc", READ), ms(60_000), &options));
        // Polled once (the request goes out), then dropped.
        tokio::select! {
            biased;
            lock = &mut obtain => lock.unwrap().release().await.unwrap(),
            () = std::future::ready(()) => cancelled += 1,
        }
    }
    assert!(cancelled > 0);
    env.client.background_idle().await;
    let left: Vec<String> = env.cmd(&["ZRANGE", "doc", "0", "-1"]).await;
    assert!(left.len() <= 1, "{left:?}");
    let lock = env
        .client
        .obtain(("doc", READ), ms(60_000), &once())
        .await
        .unwrap();
    lock.release().await.unwrap();
    assert_eq!(env.dbsize().await, 0, "a cancelled obtain left its share");
}

#[tokio::test]
async fn a_fencing_counter_of_another_type_is_a_wrong_type_error_naming_it() {
    let env = Env::start().await;
    env.cmd::<i64>(&["HSET", "{doc}:fence", "f", "v"]).await;
    let options = Options::default().fencing_key("{doc}:fence");
    let err = env
        .client
        .obtain_multi(
            [("{doc}:a", WRITE), ("{doc}:b", READ)],
            ms(10_000),
            &options,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key } if key == "{doc}:fence"),
        "{err:?}"
    );
    assert!(!env.exists("{doc}:a").await && !env.exists("{doc}:b").await);
}

/// Lets waiters that were just started make their first attempts and go to sleep, so that
/// the release below finds them asleep (a waiter still trying finds the key free by itself:
/// the assertions hold either way, this only makes them bite).
async fn let_waiters_sleep() {
    tokio::time::sleep(ms(500)).await;
}

/// Several waiters of one client for shared keys, or permits, behind an exclusive holder of
/// another client: its one release lets every one of them in at once.
#[tokio::test]
async fn one_release_wakes_every_local_waiter_that_can_share() {
    let env = Env::start().await;
    let other = env.other_client().await;
    for mode in [READ, permits(3)] {
        let holder = other.obtain("doc", ms(20_000), &once()).await.unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| spawn_waiter(&env.client, "doc", mode, slow_polling()))
            .collect();
        support::eventually(ms(10_000), "the holder marked", async || {
            env.get("doc").await.is_some_and(|v| v.starts_with('!'))
        })
        .await;
        let_waiters_sleep().await;
        let released = Instant::now();
        holder.release().await.unwrap();
        for waiter in waiters {
            let lock = woken(waiter, released, &format!("{mode}: a waiter")).await;
            lock.release().await.unwrap();
        }
    }
}

/// A waiting writer and a reader queued behind it in one client; the readers they wait for
/// release one by one, the first from that same client: the last release lets the writer in.
#[tokio::test]
async fn the_last_readers_release_reaches_the_writer_behind_which_readers_queue() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let near = env
        .client
        .obtain(("doc", READ), ms(30_000), &once())
        .await
        .unwrap();
    let far = other
        .obtain(("doc", READ), ms(30_000), &once())
        .await
        .unwrap();
    let writer = spawn_waiter(&env.client, "doc", WRITE, slow_polling());
    writer_waits(&env).await;
    let reader = spawn_waiter(&env.client, "doc", READ, slow_polling());
    let_waiters_sleep().await;
    near.release().await.unwrap();
    let_waiters_sleep().await;
    let released = Instant::now();
    far.release().await.unwrap();
    let lock = woken(writer, released, "the writer").await;
    lock.release().await.unwrap();
    let (_, reader) = tokio::time::timeout(ms(30_000), reader)
        .await
        .unwrap()
        .unwrap();
    reader.release().await.unwrap();
}

/// The last live reader's release is announced also while a crashed reader's expired share
/// is still in the set.
#[tokio::test]
async fn the_last_live_readers_release_is_announced_beside_an_expired_share() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let staying = other
        .obtain(("doc", READ), ms(30_000), &once())
        .await
        .unwrap();
    let crashed = other.obtain(("doc", READ), ms(300), &once()).await.unwrap();
    let crashed_value = format!("22:{}", crashed.token());
    drop(crashed);
    let writer = spawn_waiter(&env.client, "doc", WRITE, slow_polling());
    support::eventually(ms(10_000), "the crashed share expired", async || {
        let score: Option<f64> = env.cmd(&["ZSCORE", "doc", &crashed_value]).await;
        let time: Vec<String> = env.cmd(&["TIME"]).await;
        let now = time[0].parse::<f64>().unwrap() * 1000.0;
        score.is_some_and(|score| score + 1000.0 < now)
    })
    .await;
    let released = Instant::now();
    staying.release().await.unwrap();
    let lock = woken(writer, released, "the writer").await;
    lock.release().await.unwrap();
}

/// Handles that share a token are one owner, as for exclusive keys: after a re-obtain by
/// the token with new metadata, the first handle (a random token) still refreshes, reads
/// and releases its shared and counted keys.
#[tokio::test]
async fn a_handle_keeps_its_share_after_a_reobtain_by_its_token_with_new_metadata() {
    let env = Env::start().await;
    for mode in [WRITE, READ, permits(2)] {
        let first = env
            .client
            .obtain(("doc", mode), ms(10_000), &once().metadata("m1"))
            .await
            .unwrap();
        let again = env
            .client
            .obtain(
                ("doc", mode),
                ms(10_000),
                &Options::default().token(first.token()).metadata("m2"),
            )
            .await
            .unwrap();
        assert!(first.ttl().await.unwrap().is_some(), "{mode}");
        first.refresh(ms(10_000), &once()).await.unwrap();
        first.release().await.unwrap();
        drop(again);
        assert_eq!(env.dbsize().await, 0, "{mode}");
    }
}

/// Adopting a key in another mode than it is held in is not holding it.
#[tokio::test]
async fn adopting_in_the_wrong_mode_is_not_held() {
    let env = Env::start().await;
    let options = Options::default().token("tok");
    let lock = env
        .client
        .obtain(("job", permits(1)), ms(10_000), &options)
        .await
        .unwrap();
    let adopted = env
        .client
        .adopt([("job", READ)], ms(10_000), &options)
        .await;
    assert!(matches!(adopted, Err(Error::NotHeld)), "{adopted:?}");
    let members: Vec<String> = env.cmd(&["ZRANGE", "job", "0", "-1"]).await;
    assert_eq!(members, vec!["=p1".to_owned(), "3:tok".to_owned()]);
    lock.release().await.unwrap();
}

/// A Redlock refresh that re-creates missing keys (on a master that restarted empty) either
/// re-creates all of them or changes nothing.
#[tokio::test]
async fn a_restoring_refresh_without_room_changes_nothing() {
    let env = Env::start().await;
    let eval = async |keys: &[&str], args: &[&str]| -> i64 {
        let mut cmd = lockset::redis::cmd("EVAL");
        let script = &support::scripts::MODES_REFRESH.source;
        cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
        cmd.query_async(&mut env.raw.clone()).await.unwrap()
    };
    // Someone else holds the one permit of P on this master.
    let other = ["obtain", "p1", "5:other", "0", "10000", "0", "0", "0"];
    let taken: Vec<Option<i64>> = {
        let mut cmd = lockset::redis::cmd("EVAL");
        let script = &support::scripts::MODES_OBTAIN.source;
        cmd.arg(script).arg(1).arg("P").arg(&other);
        cmd.query_async(&mut env.raw.clone()).await.unwrap()
    };
    assert_eq!(taken, vec![Some(1), None]);
    let restore = ["refresh", "x,p1", "4:mine", "0", "10000", "1"];
    assert_eq!(eval(&["E", "P"], &restore).await, 2);
    assert!(
        !env.exists("E").await,
        "a key was re-created by a refresh that reported 2"
    );
}

/// A guard's lost signal fires when its share is taken away (here: removed by hand), as for
/// an exclusive lock.
#[tokio::test]
async fn a_guard_on_a_share_signals_its_loss() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain(("doc", READ), ms(3_000), &once())
        .await
        .unwrap();
    let value = format!("22:{}", lock.token());
    let guard = lock.keep_alive_every(ms(100));
    let lost = guard.lost_signal();
    env.cmd::<i64>(&["ZREM", "doc", &value]).await;
    tokio::time::timeout(ms(10_000), lost.lost())
        .await
        .expect("the lost signal fired");
    assert!(guard.ttl().await.unwrap().is_none());
}

/// Two readers of one client that are between a failed attempt and their sleep when the
/// key is released (here: held up in the retry callback) are both let in, not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_between_attempt_and_sleep_still_hear_the_release() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let writer = other.obtain("doc", ms(20_000), &once()).await.unwrap();
    let stalled = Options::default()
        .retry(Retry::linear(ms(60_000)))
        .timeout(ms(120_000))
        .on_retry(|_| tokio::task::block_in_place(|| std::thread::sleep(ms(400))));
    let readers: Vec<_> = (0..2)
        .map(|_| spawn_waiter(&env.client, "doc", READ, stalled.clone()))
        .collect();
    // The readers' second attempts fail at about 400 ms; they stall until about 800 ms.
    tokio::time::sleep(ms(600)).await;
    let released = Instant::now();
    writer.release().await.unwrap();
    for reader in readers {
        drop(woken(reader, released, "a reader").await);
    }
}

/// A (barging) writer's live mark on a key that nobody holds any more keeps out every lock
/// that writes nothing, whatever mode it asks for; a lock that writes takes the key. (A fair
/// writer queues instead, and leaves the queue when it gives up: tests/fair_modes.rs.)
#[tokio::test]
async fn a_writers_mark_keeps_out_locks_that_write_nothing_in_any_mode() {
    let env = Env::start().await;
    let reader = env
        .client
        .obtain(("doc", READ), ms(10_000), &once())
        .await
        .unwrap();
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(200))
        .fair(false);
    let writer = env.client.obtain("doc", ms(30_000), &options).await;
    assert!(matches!(writer, Err(Error::DeadlineExceeded)), "{writer:?}");
    reader.release().await.unwrap();
    for mode in [READ, permits(2)] {
        let blocked = env.client.obtain(("doc", mode), ms(10_000), &once()).await;
        assert!(
            matches!(blocked, Err(Error::NotObtained { .. })),
            "{mode}: {blocked:?}"
        );
    }
    let writes = env
        .client
        .obtain_multi([("doc", permits(2)), ("other", WRITE)], ms(10_000), &once())
        .await;
    writes.unwrap().release().await.unwrap();
}

/// A token that holds a key in one mode and asks for it in another (a read lock upgraded to
/// a write lock by token, or the other way) would wait for itself until its own TTL: it is
/// told at once that the key is held in the other mode, and nothing changes.
#[tokio::test]
async fn a_token_asking_for_its_own_key_in_another_mode_is_told_so_at_once() {
    let env = Env::start().await;
    let options = Options::default()
        .token("job-7")
        .retry(Retry::linear(ms(20)))
        .timeout(ms(3_000));
    for (held, asked) in [(READ, WRITE), (WRITE, READ)] {
        let lock = env
            .client
            .obtain(("doc", held), ms(10_000), &options)
            .await
            .unwrap();
        let start = Instant::now();
        let err = env
            .client
            .obtain(("doc", asked), ms(10_000), &options)
            .await
            .unwrap_err();
        assert!(start.elapsed() < ms(1_000), "{:?}", start.elapsed());
        assert!(
            matches!(&err, Error::ModeMismatch { key, held: h, requested: r }
                if key == "doc" && *h == held && *r == asked),
            "{held:?} → {asked:?}: {err:?}"
        );
        assert!(!err.is_not_obtained(), "{err:?}");
        // The lock is as it was.
        assert!(lock.ttl().await.unwrap().is_some());
        lock.release().await.unwrap();
        assert_eq!(env.dbsize().await, 0);
    }
}
