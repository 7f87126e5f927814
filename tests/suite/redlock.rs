//! Redlock over five independent masters, with faults: killed, paused and restarted masters.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{
    Client, Error, InvalidInput, Jitter, Mode, NodeFailure, Options, QuorumConfig, QuorumOp, Retry,
};
use support::masters::{Cycles, Masters};
use support::{Exclusion, ms};
use tokio::time::Instant;

fn config() -> QuorumConfig {
    // Generous for a loaded machine (300 ms timed out with twelve tests at a time on two
    // cores); the faults below are far longer.
    QuorumConfig::default().node_timeout(ms(1_000))
}

#[tokio::test]
async fn all_masters_up_obtain_refresh_release() {
    let m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain_multi(["{r}:a", "{r}:b"], ms(10_000), &Options::default())
        .await
        .unwrap();
    let ours = Some(format!("22:{}", lock.token()));
    // Obtain returns once a majority agreed (the others may still be on their way, or have
    // been abandoned): a majority holds both keys now.
    let mut holding = 0;
    for i in 0..5 {
        if m.get(i, "{r}:a").await == ours && m.get(i, "{r}:b").await == ours {
            holding += 1;
        }
    }
    assert!(holding >= 3, "only {holding} masters hold the lock");
    let valid_for = lock.valid_until() - Instant::now();
    assert!(
        valid_for > ms(5_000) && valid_for < ms(10_000),
        "{valid_for:?}"
    );
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(
        left <= valid_for + ms(100),
        "TTL reports the remaining validity: {left:?}"
    );

    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    assert!(lock.valid_until() - Instant::now() > ms(30_000));

    // Somebody else cannot have it meanwhile.
    let err = m
        .redlock
        .obtain("{r}:b", ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");

    lock.release().await.unwrap();
    // A release returns once a majority deleted the keys; the rest follow in the background.
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5]);
}

#[tokio::test]
async fn multi_key_sets_are_all_or_nothing_on_each_master() {
    let m = Masters::start(config()).await;
    // Masters 0 and 1 have "b" held by someone else: a minority.
    for i in [0, 1] {
        m.nodes[i]
            .obtain("b", ms(60_000), &Options::default())
            .await
            .unwrap();
    }
    let lock = m
        .redlock
        .obtain_multi(["a", "b", "c"], ms(10_000), &Options::default())
        .await
        .unwrap();
    for i in [0, 1] {
        assert_eq!(
            m.get(i, "a").await,
            None,
            "master {i} locked part of the set"
        );
        assert_eq!(
            m.get(i, "c").await,
            None,
            "master {i} locked part of the set"
        );
    }
    for i in 2..5 {
        assert_eq!(m.get(i, "a").await, Some(format!("22:{}", lock.token())));
    }
    lock.release().await.unwrap();

    // With "b" held on a majority, nothing is left anywhere.
    m.nodes[2]
        .obtain("b", ms(60_000), &Options::default())
        .await
        .unwrap();
    let err = m
        .redlock
        .obtain_multi(["a", "b", "c"], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    assert_eq!(m.dbsizes(0..5).await, vec![1, 1, 1, 0, 0]);
}

#[tokio::test]
async fn two_masters_killed_still_work() {
    let mut m = Masters::start(config()).await;
    m.servers[0].stop();
    m.servers[3].stop();
    let lock = m
        .redlock
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    lock.refresh(ms(10_000), &Options::default()).await.unwrap();
    lock.release().await.unwrap();
    assert_eq!(m.dbsizes([1, 2, 4]).await, vec![0; 3]);
}

#[tokio::test]
async fn three_masters_killed_is_unavailable_and_leaves_nothing_on_the_survivors() {
    let mut m = Masters::start(config()).await;
    for i in [0, 2, 4] {
        m.servers[i].stop();
    }
    let err = m
        .redlock
        .obtain_multi(["a", "b"], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_unavailable() && !err.is_not_obtained(), "{err:?}");
    match &err {
        Error::Quorum {
            op,
            succeeded,
            needed,
            failures,
            ..
        } => {
            // Decided as soon as three masters failed, maybe before the survivors answered.
            assert_eq!((*op, *needed), (QuorumOp::Obtain, 3));
            assert!(*succeeded <= 2);
            let failed: Vec<usize> = failures.iter().map(|(node, _)| *node).collect();
            for dead in [0, 2, 4] {
                assert!(failed.contains(&dead), "{failed:?}");
            }
            assert!(
                failures
                    .iter()
                    .all(|(_, f)| !matches!(f, NodeFailure::Refused))
            );
        }
        other => panic!("expected a quorum error, got {other:?}"),
    }
    assert!(err.to_string().contains("master 2"), "{err}");
    assert_eq!(m.dbsizes([1, 3]).await, vec![0, 0]);
}

#[tokio::test]
async fn a_paused_master_does_not_hold_up_obtain() {
    let node_timeout = Duration::from_secs(5);
    let m = Masters::start(QuorumConfig::default().node_timeout(node_timeout)).await;
    // Load the scripts everywhere first, so that nothing waits for a NOSCRIPT round trip.
    m.redlock
        .obtain("warm", ms(10_000), &Options::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    m.servers[2].pause();
    let start = Instant::now();
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await;
    let took = start.elapsed();
    m.servers[2].resume();
    let lock = lock.unwrap();
    // Decided by the four live masters, not by the paused one's recovery or its time limit.
    assert!(took < node_timeout, "obtain took {took:?}");
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_master_restarted_empty_is_re_established_by_refresh() {
    let mut m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    // The restart may take the lock from one master only, not from one of just three.
    m.spread(&lock).await;
    m.servers[1].restart();
    assert_eq!(m.get(1, "job").await, None);
    // Let the node's connection notice the restart and reconnect.
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(10_000));
    lock.refresh(ms(30_000), &options).await.unwrap();
    let restored = async || m.get(1, "job").await;
    let start = Instant::now();
    while restored().await.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "never re-established"
        );
        lock.refresh(ms(30_000), &options).await.unwrap();
    }
    assert_eq!(m.get(1, "job").await, Some(format!("22:{}", lock.token())));
}

#[tokio::test]
async fn refresh_with_metadata_replaces_it_on_the_masters() {
    let mut m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain_multi(
            ["{r}:a", "{r}:b"],
            ms(10_000),
            &Options::default().metadata("old"),
        )
        .await
        .unwrap();
    m.spread(&lock).await;
    // A master restarted empty gets the lock back with the new metadata.
    m.servers[4].restart();
    let new = Options::default()
        .metadata("new")
        .retry(Retry::linear(ms(50)))
        .timeout(ms(10_000));
    lock.refresh(ms(30_000), &new).await.unwrap();
    assert_eq!(lock.metadata(), "new");
    let value = format!("22:{}new", lock.token());
    // (The restarted master's connection may fail once while it reconnects.)
    support::eventually(ms(20_000), "the new metadata on every master", async || {
        lock.refresh(ms(30_000), &new).await.unwrap();
        m.holding(&["{r}:a", "{r}:b"], &value).await == 5
    })
    .await;
    lock.release().await.unwrap();
}

#[tokio::test]
async fn refresh_reports_loss_when_the_majority_is_gone() {
    let mut m = Masters::start(config()).await;
    let lock = m
        .redlock
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    // The obtain returned once a majority agreed; its parts on slower masters run on, and
    // one sent late would lock a master restarted below (local CI, under load: the thief
    // found the lock there for its whole 10 s).
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("the obtain's writes done within 10 s");
    // Three masters lose the lock (restarted empty) and someone else takes it there.
    for i in [0, 1, 2] {
        m.servers[i].restart();
    }
    let thief = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(10_000));
    for i in [0, 1, 2] {
        m.nodes[i].obtain("job", ms(30_000), &thief).await.unwrap();
    }
    let err = lock
        .refresh(ms(30_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(lock.ttl().await.unwrap(), None);
}

#[tokio::test]
async fn tiny_ttls_never_panic_and_are_not_obtained() {
    let m = Masters::start(config()).await;
    for ttl in [ms(1), ms(2), Duration::from_micros(1_500)] {
        // The drift allowance alone (ttl × 0.01 + 2 ms) uses up such a TTL.
        let err = m
            .redlock
            .obtain("job", ttl, &Options::default())
            .await
            .unwrap_err();
        assert!(err.is_not_obtained(), "{ttl:?}: {err:?}");
    }
    // Just above it, either outcome is fine; nothing may panic or wrap. (A TTL query of a
    // lock that expired meanwhile may find masters slow on a loaded machine: an error then.)
    for ttl in [ms(3), ms(5)] {
        if let Ok(lock) = m.redlock.obtain("job", ttl, &Options::default()).await {
            if let Err(err) = lock.ttl().await {
                assert!(err.is_unavailable() || err.is_not_held(), "{err:?}");
            }
            let _ = lock.release().await;
        }
    }
}

#[tokio::test]
async fn quorums_refuse_bad_setups() {
    let m = Masters::start(config()).await;
    let err = Client::<ConnectionManager>::quorum([], config()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::NoNodes)),
        "{err:?}"
    );
    let err = Client::quorum([m.redlock.clone()], config()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::NestedQuorum)),
        "{err:?}"
    );
    let err = Client::quorum(
        m.nodes.clone(),
        QuorumConfig::default().drift_factor(f64::NAN),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::DriftFactor { .. })),
        "{err:?}"
    );
    let err = m
        .redlock
        .obtain("job", ms(10_000), &Options::default().fencing())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::FencingWithQuorum)),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_one_master_paused_at_a_time_never_breaks_exclusion() {
    const TASKS: usize = 16;
    // Each round a release may miss the paused master's majority and leave the key to expire:
    // the rounds wait out TTLs, a tenth of them by default.
    let rounds = support::repetitions(10, 100);
    let m = Arc::new(Masters::start(QuorumConfig::default().node_timeout(ms(50))).await);
    let shared = Arc::new(Exclusion::default());
    let options = Options::default()
        .retry(Retry::linear(ms(5)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(120));

    let done = Arc::new(AtomicUsize::new(0));
    let pauser = tokio::spawn({
        let (m, done) = (m.clone(), done.clone());
        async move {
            let mut round = 0;
            while done.load(Ordering::SeqCst) < TASKS {
                let victim = (round * 3) % 5;
                m.servers[victim].pause();
                tokio::time::sleep(ms(100)).await;
                m.servers[victim].resume();
                tokio::time::sleep(ms(30)).await;
                round += 1;
            }
            round
        }
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (m, options) = (m.clone(), options.clone());
            let (shared, done) = (shared.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let lock = m
                        .redlock
                        .obtain("shared", ms(2_000), &options)
                        .await
                        .unwrap();
                    shared.critical_section().await;
                    // A release that misses a majority (a paused master) leaves the rest to expire.
                    let _ = lock.release().await;
                }
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let pauses = pauser.await.unwrap();
    shared.assert_exclusive((TASKS * rounds) as u64);
    assert!(pauses > 0);
}

/// Shared and counted keys over a quorum: readers share a majority, a writer is refused,
/// permits count per master, and a master restarted empty gets the share back by refresh.
#[tokio::test]
async fn modes_over_a_quorum() {
    use lockset::Mode;
    let mut m = Masters::start(config()).await;
    let once = Options::default();
    let keys = [
        ("{q}:doc", Mode::Shared),
        ("{q}:job", Mode::Permit { limit: 2 }),
    ];
    let reader = m
        .redlock
        .obtain_multi(keys, ms(30_000), &once)
        .await
        .unwrap();
    let other = m
        .redlock
        .obtain_multi(keys, ms(30_000), &once)
        .await
        .unwrap();
    let err = m
        .redlock
        .obtain("{q}:doc", ms(30_000), &once)
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    let err = m
        .redlock
        .obtain(("{q}:job", Mode::Permit { limit: 2 }), ms(30_000), &once)
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    other.release().await.unwrap();

    // 2 permits need 4 of 5 masters: the restart below may take the lock from one only.
    m.spread(&reader).await;
    m.servers[1].restart();
    let value = format!("22:{}", reader.token());
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(10_000));
    let start = Instant::now();
    loop {
        reader.refresh(ms(30_000), &options).await.unwrap();
        let score: Option<f64> = m.cmd(1, &["ZSCORE", "{q}:doc", &value]).await;
        if score.is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "never re-established"
        );
    }
    reader.release().await.unwrap();
    m.redlock.background_idle().await;
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5]);
}

/// A key with `limit` permits needs more than a majority: with 2 permits on 5 masters, a
/// plain majority would let three holders in ({0,1,2}, {2,3,4}, {0,1,3} fill no master past
/// 2), so each holder needs 4. One permit, and shared keys, need a majority.
#[tokio::test]
async fn permits_over_a_quorum_need_as_many_masters_as_their_limit_asks() {
    use lockset::Mode;
    let mut m = Masters::start(config()).await;
    m.servers[3].stop();
    m.servers[4].stop();
    let options = Options::default();
    let err = m
        .redlock
        .obtain(("two", Mode::Permit { limit: 2 }), ms(30_000), &options)
        .await
        .unwrap_err();
    // Decided as soon as two masters failed, maybe before the others answered.
    assert!(
        matches!(
            &err,
            Error::Quorum {
                needed: 4,
                succeeded: ..=3,
                ..
            }
        ),
        "{err:?}"
    );
    for mode in [Mode::Permit { limit: 1 }, Mode::Shared] {
        let lock = m.redlock.obtain(("one", mode), ms(30_000), &options).await;
        lock.unwrap().release().await.unwrap();
    }
}

/// Lock cycles timed with masters down: 10 s locks give each master 500 ms per operation
/// (5% of the TTL), and the majority that is up must decide every obtain and release in a
/// few milliseconds, never that limit. Generous bounds for a loaded machine, below it: the
/// slowest once read 259 ms (the Redlock tests alone, twelve at a time, five servers each),
/// so it is 400 ms, still short of the 500 ms a wait for the down master would take.
const CYCLES: usize = 9;
const MEDIAN: Duration = Duration::from_millis(50);
const SLOWEST: Duration = Duration::from_millis(400);

/// Waits for `m`'s background tasks (bounded), then for a probe lock on every master: each
/// master answers it only after everything queued before it (what a paused master ran once
/// resumed). Then none of the masters `up` may hold any key.
async fn assert_left_clean(m: &Masters, up: &[usize]) {
    let probe = m
        .redlock
        .obtain("probe", ms(10_000), &Options::default())
        .await
        .unwrap();
    if up.len() == 5 {
        m.spread(&probe).await;
    }
    probe.release().await.unwrap();
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .unwrap();
    assert_eq!(
        m.dbsizes(up.iter().copied()).await,
        vec![0; up.len()],
        "a late write outlived its release"
    );
}

#[tokio::test]
async fn a_master_paused_from_the_start_holds_up_nothing() {
    let m = Masters::start(QuorumConfig::default()).await;
    // Before the client ever heard from it: not even its run id is known.
    m.servers[2].pause();
    let cycles = Cycles::run(&m.redlock, "job", CYCLES).await;
    m.servers[2].resume();
    cycles.assert_within(MEDIAN, SLOWEST);
    // Its queued obtains ran once it resumed, each before that lock's release there.
    assert_left_clean(&m, &[0, 1, 2, 3, 4]).await;
}

#[tokio::test]
async fn two_masters_killed_from_the_start_hold_up_nothing_either() {
    let mut m = Masters::start(QuorumConfig::default()).await;
    m.servers[0].stop();
    m.servers[3].stop();
    let cycles = Cycles::run(&m.redlock, "job", CYCLES).await;
    cycles.assert_within(MEDIAN, SLOWEST);
    assert_left_clean(&m, &[1, 2, 4]).await;
}

#[tokio::test]
async fn a_master_paused_after_warm_up_holds_up_nothing() {
    let m = Masters::start(QuorumConfig::default()).await;
    // Every master answered, scripts loaded, run ids known; and every master has deleted the
    // last warm-up lock (a release returns at a majority: had master 4 been one of it, two
    // masters still deleting would make the first obtain wait for the paused one's answer,
    // which happened in CI at twelve tests at a time).
    Cycles::run(&m.redlock, "job", 3).await;
    tokio::time::timeout(ms(10_000), m.redlock.background_idle())
        .await
        .expect("background tasks");
    m.servers[4].pause();
    let cycles = Cycles::run(&m.redlock, "job", CYCLES).await;
    m.servers[4].resume();
    cycles.assert_within(MEDIAN, SLOWEST);
    assert_left_clean(&m, &[0, 1, 2, 3, 4]).await;
}

#[tokio::test]
async fn a_master_that_comes_back_holds_up_nothing_and_takes_part_again() {
    let mut m = Masters::start(QuorumConfig::default()).await;
    m.servers[1].stop();
    let down = Cycles::run(&m.redlock, "job", CYCLES).await;
    down.assert_within(MEDIAN, SLOWEST);
    // Back empty (no lock it held is still valid: every one was released).
    m.servers[1].restart();
    let back = Cycles::run(&m.redlock, "job", CYCLES).await;
    back.assert_within(MEDIAN, SLOWEST);
    // Its client reconnects, and it holds locks again.
    assert_left_clean(&m, &[0, 1, 2, 3, 4]).await;
}

/// Right after a refresh, masters whose refresh is still on its way answer a TTL query with
/// the old TTL. Here two masters need a second round trip for the refresh (their script
/// cache was flushed) over a slow link, and the fast masters that decided the refresh are
/// slow to answer the query: `ttl()` must still report what a majority holds, the new TTL.
#[tokio::test]
async fn ttl_right_after_a_refresh_reports_the_new_ttl() {
    use support::proxy::Proxy;
    let servers: Vec<support::RedisServer> =
        (0..5).map(|_| support::RedisServer::start()).collect();
    let mut proxies = Vec::new();
    let mut nodes = Vec::new();
    for server in &servers {
        let proxy = Proxy::start(server.port()).await;
        nodes.push(support::client_with_timeout(&proxy.url(), ms(10_000)).await);
        proxies.push(proxy);
    }
    let redlock = Client::quorum(nodes, QuorumConfig::default().node_timeout(ms(5_000))).unwrap();
    let pttl = &support::scripts::PTTL.source;
    for run in 0..10 {
        let lock = redlock
            .obtain(format!("job{run}"), ms(10_000), &Options::default())
            .await
            .unwrap();
        assert!(lock.ttl().await.unwrap().unwrap() <= ms(10_000));
        for i in [3, 4] {
            let mut conn = support::connect(&servers[i]).await;
            let _: () = lockset::redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: String = lockset::redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(pttl)
                .query_async(&mut conn)
                .await
                .unwrap();
            proxies[i].set_latency(ms(30));
        }
        lock.refresh(ms(20_000), &Options::default()).await.unwrap();
        for i in [0, 1] {
            proxies[i].set_latency(ms(300));
        }
        let left = lock.ttl().await.unwrap().unwrap();
        for proxy in &proxies {
            proxy.set_latency(Duration::ZERO);
        }
        assert!(
            left > ms(15_000),
            "run {run}: ttl() reported {left:?} after refresh(20 s)"
        );
        lock.release().await.unwrap();
    }
}

/// A master paused under load (SIGSTOP) and resumed keeps no lock that was released on the
/// others: once it missed a deadline, nothing more is queued to it (operations fail fast
/// there), the releases owed to it are remembered and sent once a probe finds it answering,
/// ahead of anything else. Background tasks stay few meanwhile (each operation's share for
/// the paused master ends at once), and are all done after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_paused_under_load_keeps_no_released_lock_once_resumed() {
    const WORKERS: usize = 16;
    let m = Masters::start(QuorumConfig::default()).await;
    // The default per-node limit: 5% of the TTL, 500 ms. From 2 s into the pause on, the
    // master has long missed it.
    let (ttl, settled) = (ms(10_000), ms(2_000));
    let report =
        support::masters::pause_under_load(&m, 2, ms(6_000), WORKERS, ttl, settled, ms(1_000))
            .await;
    println!("{report:?}");
    assert!(report.cycles > 0, "{report:?}");
    assert!(
        report.cleared_after.is_some(),
        "the resumed master still held released locks 1 s after its resume: {report:?}"
    );
    // Once the master missed its deadline, each worker has at most two operations' tasks
    // under way, one per master each: a release returns at a majority, and its last
    // master's part finishes beside the next obtain (the median: a live master that misses
    // a deadline on a loaded machine has every task wait out one per-node limit). Before,
    // every operation's task for the paused master waited out the limit.
    assert!(
        report.tasks[2] <= WORKERS * 10,
        "background tasks during the pause: {report:?}"
    );
    assert_eq!(report.tasks[3], 0, "{report:?}");
    assert_eq!(m.dbsizes(0..5).await, vec![0; 5], "{report:?}");
}

/// A TTL within the drift allowance (ttl × 0.01 + 2 ms) can never give a valid lock: obtain
/// says "not obtained" before anything is sent, whatever the masters do. (It used to send
/// the attempt, and on a loaded machine an attempt that outlived the TTL-long deadline by
/// its 100 ms grace was cut off as an unknown outcome.) Here every master is paused.
#[tokio::test]
async fn tiny_ttls_are_not_obtained_before_anything_is_sent() {
    let m = Masters::start(config()).await;
    for i in 0..5 {
        m.servers[i].pause();
    }
    for ttl in [ms(1), ms(2), Duration::from_micros(1_500)] {
        let start = Instant::now();
        let answer = m.redlock.obtain("job", ttl, &Options::default()).await;
        let took = start.elapsed();
        let err = answer.unwrap_err();
        assert!(err.is_not_obtained(), "{ttl:?}: {err:?}");
        assert!(took < ms(50), "{ttl:?}: {took:?}");
    }
    for i in 0..5 {
        m.servers[i].resume();
    }
    assert_eq!(m.redlock.background_tasks(), 0);
}

/// A key the masters hold in a mode that never goes with the one asked for: the same
/// `ModeMismatch` as on one server, at once, not a quorum failure (`is_unavailable`) tried
/// again until the deadline.
#[tokio::test]
async fn a_mode_mismatch_on_the_masters_is_a_mode_mismatch_at_once() {
    let m = Masters::start(config()).await;
    let permits = Mode::Permit { limit: 3 };
    let held = m
        .redlock
        .obtain(("jobs", permits), ms(10_000), &Options::default())
        .await
        .unwrap();
    let start = Instant::now();
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(3_000));
    let err = m
        .redlock
        .obtain(("jobs", Mode::Shared), ms(10_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(&err, Error::ModeMismatch { key, held, requested }
            if key == "jobs" && *held == permits && *requested == Mode::Shared),
        "{err:?}"
    );
    assert!(!err.is_unavailable(), "{err:?}");
    assert!(
        took < ms(2_000),
        "not retried to the 3 s deadline: {took:?}"
    );
    held.release().await.unwrap();
}

/// A mode mismatch on a minority of the masters (a leftover permit on one of five) is one
/// master refusing, not the end: with a rival holding the key on two others, the obtain
/// waits like any other, and gets the lock once the rival releases.
#[tokio::test]
async fn a_mode_mismatch_on_a_minority_is_waited_out_like_a_holder() {
    let m = Masters::start(config()).await;
    let leftover = m.nodes[0]
        .obtain(
            ("jobs", Mode::Permit { limit: 3 }),
            ms(10_000),
            &Options::default(),
        )
        .await
        .unwrap();
    let mut rival = Vec::new();
    for i in [1, 2] {
        rival.push(
            m.nodes[i]
                .obtain("jobs", ms(10_000), &Options::default())
                .await
                .unwrap(),
        );
    }
    let released = tokio::spawn(async move {
        tokio::time::sleep(ms(300)).await;
        for lock in rival {
            lock.release().await.unwrap();
        }
    });
    let start = Instant::now();
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(3_000));
    let shared = m
        .redlock
        .obtain(("jobs", Mode::Shared), ms(10_000), &options)
        .await;
    let took = start.elapsed();
    released.await.unwrap();
    let shared = shared.unwrap();
    assert!(
        took >= ms(250) && took < ms(1_500),
        "obtained once the rival released: {took:?}"
    );
    shared.release().await.unwrap();
    leftover.release().await.unwrap();
}

/// Permits held on three masters of five: a shared obtain is refused there, a majority, and
/// that mismatch is final at once, as on one server.
#[tokio::test]
async fn a_mode_mismatch_on_a_majority_ends_the_obtain_at_once() {
    let m = Masters::start(config()).await;
    let permits = Mode::Permit { limit: 3 };
    let mut held = Vec::new();
    for i in [0, 1, 2] {
        held.push(
            m.nodes[i]
                .obtain(("jobs", permits), ms(10_000), &Options::default())
                .await
                .unwrap(),
        );
    }
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(3_000));
    let start = Instant::now();
    let err = m
        .redlock
        .obtain(("jobs", Mode::Shared), ms(10_000), &options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ModeMismatch { .. }), "{err:?}");
    assert!(start.elapsed() < ms(1_500), "{:?}", start.elapsed());
    for lock in held {
        lock.release().await.unwrap();
    }
}

/// A TTL within the drift allowance (ttl × 0.01 + 2 ms) can make no valid lock: the obtain
/// ends at once, nothing sent and nothing retried, and its message ends with what it says
/// (no dangling separator for failures there were none of).
#[tokio::test]
async fn a_ttl_within_the_drift_allowance_ends_at_once() {
    let m = Masters::start(config()).await;
    let patient = Options::default()
        .retry(Retry::linear(ms(1)))
        .timeout(ms(2_000));
    let start = Instant::now();
    let err = m
        .redlock
        .obtain("short", ms(2), &patient)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(
            err,
            Error::Quorum {
                expired: true,
                succeeded: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.to_string().ends_with(": "), "{err}");
    assert!(took < ms(100), "retried for {took:?}");
    for i in 0..5 {
        assert_eq!(m.get(i, "short").await, None, "master {i}");
    }
}
