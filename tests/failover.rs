//! Locks across a failover: a primary with replicas behind three sentinels, primaries killed
//! with SIGKILL, replicas paused. The Sentinel client follows the primary, and with
//! replicated writes (the default of `Client::connect_sentinel`) a lock survives the loss of
//! the primary.

mod support;

use std::time::Duration;

use lockset::redis::AsyncCommands as _;
use lockset::{Client, Error, InvalidInput, Options, Replication, Retry, SentinelConfig};
use support::ms;
use support::sentinel::{Failover, MASTER};
use tokio::time::Instant;

/// A raw connection to data node `index` of `failover`.
async fn raw(failover: &Failover, index: usize) -> lockset::redis::aio::MultiplexedConnection {
    support::connect(&failover.nodes[index]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_through_sentinel_with_replicated_writes() {
    let failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(2)))
        .await
        .unwrap();
    let lock = client
        .obtain_multi(["{s}:a", "{s}:b"], ms(10_000), &Options::default())
        .await
        .unwrap();
    // Both replicas have it when obtain returns.
    for replica in 1..3 {
        let mut conn = raw(&failover, replica).await;
        let value: Option<String> = conn.get("{s}:a").await.unwrap();
        assert!(value.is_some(), "replica {replica} misses the lock");
    }
    assert!(lock.ttl().await.unwrap().is_some());
    lock.refresh(ms(20_000), &Options::default()).await.unwrap();
    lock.release().await.unwrap();
    let mut primary = raw(&failover, 0).await;
    let left: i64 = primary.exists(&["{s}:a", "{s}:b"]).await.unwrap();
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_settings_are_clear_errors_before_anything_is_written() {
    let failover = Failover::start(1).await;
    let mut primary = raw(&failover, 0).await;
    let writes = |info: String| {
        info.lines()
            .find_map(|line| line.strip_prefix("master_repl_offset:"))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let before = writes(
        lockset::redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut primary)
            .await
            .unwrap(),
    );

    let started = Instant::now();
    let unknown = SentinelConfig::new(failover.sentinel_urls(), "no-such-master").unwrap();
    let err = Client::connect_sentinel(unknown).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(InvalidInput::UnknownMaster { name }) if name == "no-such-master"),
        "{err:?}"
    );
    assert!(started.elapsed() < ms(2_000), "{:?}", started.elapsed());

    // Two replicas asked for, one connected.
    let err = Client::connect_sentinel(failover.config(Replication::replicas(2)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::NotEnoughReplicas {
                requested: 2,
                connected: 1
            })
        ),
        "{err:?}"
    );

    let zero = Replication::replicas(1).timeout(Duration::ZERO);
    let err = Client::connect_sentinel(failover.config(zero))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::ZeroReplicationTimeout)
        ),
        "{err:?}"
    );

    let err = SentinelConfig::new(Vec::<String>::new(), MASTER).unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput(InvalidInput::NoSentinels)
    ));

    // Sentinels nobody listens at: unavailable, at once.
    let nowhere: Vec<String> = (0..3)
        .map(|_| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            format!("redis://127.0.0.1:{port}/")
        })
        .collect();
    let started = Instant::now();
    let err = Client::connect_sentinel(SentinelConfig::new(nowhere, MASTER).unwrap())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(started.elapsed() < ms(2_000), "{:?}", started.elapsed());

    let after = writes(
        lockset::redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut primary)
            .await
            .unwrap(),
    );
    assert_eq!(before, after, "something was written");
}

/// One trial of the principal scenario, on a fresh deployment: lock a key with replicated
/// writes and another without, kill the primary at once, wait for the promotion, and see
/// whether a second client can take each key. Returns (replicated lock lost, plain lock
/// lost).
async fn kill_the_primary_after_locking() -> (bool, bool) {
    let mut failover = Failover::start(2).await;
    let replicated = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let plain = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    let prober = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    let ttl = ms(60_000);
    let r_lock = replicated
        .obtain("r", ttl, &Options::default())
        .await
        .unwrap();
    let p_lock = plain.obtain("p", ttl, &Options::default()).await.unwrap();
    let old = failover.nodes[failover.primary()].port();
    failover.kill_primary();
    failover.wait_for_promotion(old).await;
    // A lock still held makes the prober wait out this deadline; one that was lost is
    // taken at once.
    let probe = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(500));
    let mut lost = [false; 2];
    for (i, key) in ["r", "p"].into_iter().enumerate() {
        match prober.obtain(key, ttl, &probe).await {
            Ok(second) => lost[i] = second.release().await.is_ok(),
            Err(err) => assert!(err.is_not_obtained(), "{key}: {err:?}"),
        }
    }
    drop((r_lock, p_lock));
    (lost[0], lost[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_survives_its_primary_killed_at_once() {
    let trials: usize = std::env::var("LOCKSET_FAILOVER_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    // Several deployments at once, so that 50 failovers take half a minute, not four.
    let at_once = 10;
    let mut lost = (0, 0);
    let mut done = 0;
    while done < trials {
        let round = at_once.min(trials - done);
        let runs: Vec<_> = (0..round)
            .map(|_| tokio::spawn(kill_the_primary_after_locking()))
            .collect();
        for run in runs {
            let (r, p) = run.await.unwrap();
            lost.0 += usize::from(r);
            lost.1 += usize::from(p);
        }
        done += round;
    }
    println!(
        "primary killed right after obtain ({trials} trials): with 1 of 2 replicas \
         acknowledging, {} locks lost; without, {} lost",
        lost.0, lost.1
    );
    assert_eq!(lost.0, 0, "a replicated lock was lost in a failover");
}

/// Whether the node `index` of `failover` has `key`.
async fn has(failover: &Failover, index: usize, key: &str) -> bool {
    let found: i64 = raw(failover, index).await.exists(key).await.unwrap();
    found == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_its_replicas_loses_only_unreplicated_locks() {
    // The replicas replicate through proxies: stalling them cuts the primary off, while
    // clients still reach it (a partition on the primary's side).
    let mut failover = Failover::start_lagging(2, Duration::from_micros(1)).await;
    let replicated = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let plain = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    for link in &failover.links {
        link.stall(true);
    }
    let deadline = ms(1_000);
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(deadline);
    let started = Instant::now();
    let err = replicated
        .obtain("cut", ms(60_000), &options)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    // The deadline, and at most the grace an attempt on its way gets, and some slack.
    assert!(took < deadline + ms(400), "{took:?}");
    tokio::time::timeout(ms(5_000), replicated.background_idle())
        .await
        .unwrap();
    assert!(
        !has(&failover, 0, "cut").await,
        "the unreplicated obtain left its key"
    );

    // Without replication the same obtain succeeds, and the failover loses it.
    let doomed = plain.obtain("cut", ms(60_000), &options).await.unwrap();
    let old = failover.nodes[0].port();
    failover.kill_primary();
    for link in &failover.links {
        link.drop_connections();
    }
    let promoted = failover.wait_for_promotion(old).await;
    assert!(!has(&failover, promoted, "cut").await);
    let second = replicated
        .obtain("cut", ms(60_000), &options)
        .await
        .expect("the lock the failover lost is free at once");
    assert!(doomed.ttl().await.unwrap().is_none());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_fails_obtains_within_their_deadline_and_leaves_nothing() {
    let failover = Failover::start(1).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    failover.nodes[1].pause();
    for (deadline, retry) in [
        (ms(300), Retry::NoRetry),
        (ms(1_000), Retry::linear(ms(50))),
    ] {
        let options = Options::default().retry(retry).timeout(deadline);
        let started = Instant::now();
        let err = client
            .obtain_multi(["{p}:a", "{p}:b"], ms(60_000), &options)
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(
            took < deadline + ms(400),
            "{took:?} for a {deadline:?} deadline"
        );
    }
    tokio::time::timeout(ms(5_000), client.background_idle())
        .await
        .unwrap();
    for key in ["{p}:a", "{p}:b"] {
        assert!(!has(&failover, 0, key).await, "{key} left behind");
    }
    failover.nodes[1].resume();
    let lock = client
        .obtain_multi(["{p}:a", "{p}:b"], ms(60_000), &Options::default())
        .await
        .expect("obtains again once the replica is back");
    assert!(has(&failover, 1, "{p}:a").await);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_carries_on_across_a_failover() {
    let mut failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let ttl = ms(10_000);
    let guard = client
        .obtain("job", ttl, &Options::default())
        .await
        .unwrap()
        .keep_alive_every(ms(200));
    let lost = guard.lost_signal();
    let old = failover.nodes[0].port();
    failover.kill_primary();
    let promoted = failover.wait_for_promotion(old).await;
    // The watchdog refreshes on the new primary: the key's TTL is renewed there.
    support::eventually(ms(10_000), "a refresh on the new primary", async || {
        let left: i64 = raw(&failover, promoted).await.pttl("job").await.unwrap();
        left > 9_000
    })
    .await;
    assert!(!lost.is_lost(), "the lock was kept across the failover");
    guard.release().await.unwrap();
    assert!(!has(&failover, promoted, "job").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_failover_lost_fires_its_lost_signal() {
    let mut failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    let guard = client
        .obtain("gone", ms(10_000), &Options::default())
        .await
        .unwrap()
        .keep_alive_every(ms(200));
    let lost = guard.lost_signal();
    // The replicas miss the lock, as if replication had lagged behind.
    for replica in 1..3 {
        let mut conn = raw(&failover, replica).await;
        let _: () = lockset::redis::cmd("CONFIG")
            .arg(&["SET", "replica-read-only", "no"])
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: i64 = conn.del("gone").await.unwrap();
    }
    let old = failover.nodes[0].port();
    failover.kill_primary();
    failover.wait_for_promotion(old).await;
    let promoted = Instant::now();
    tokio::time::timeout(ms(5_000), lost.lost())
        .await
        .expect("the lost signal fires once a refresh finds the key gone");
    // A refresh every 200 ms finds it: no waiting for the TTL.
    assert!(promoted.elapsed() < ms(3_000), "{:?}", promoted.elapsed());
    assert!(guard.release().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_blocked_before_a_failover_are_woken_by_releases_after_it() {
    let mut failover = Failover::start(2).await;
    let holder = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let lock = holder
        .obtain("busy", ms(30_000), &Options::default())
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
            .await
            .unwrap();
        waiters.push(tokio::spawn(async move {
            let options = Options::default()
                .retry(Retry::linear(ms(10_000)))
                .timeout(ms(60_000));
            let lock = client.obtain("busy", ms(30_000), &options).await.unwrap();
            let got = Instant::now();
            lock.release().await.unwrap();
            got
        }));
    }
    // Both wait (queued, listening) before the failover.
    support::eventually(ms(10_000), "two queued waiters", async || {
        let queued: i64 = raw(&failover, 0)
            .await
            .zcard("{busy}:lockset:queue")
            .await
            .unwrap();
        queued == 2
    })
    .await;
    let old = failover.nodes[0].port();
    failover.kill_primary();
    failover.wait_for_promotion(old).await;
    // The holder follows the primary and releases there; the waiters hear it, although
    // they listened on the old primary: no sleeping out a 10 s retry or the TTL.
    support::eventually(ms(10_000), "the holder's release", async || {
        lock.ttl().await.is_ok()
    })
    .await;
    let released = Instant::now();
    lock.release().await.unwrap();
    for waiter in waiters {
        let got = tokio::time::timeout(ms(10_000), waiter)
            .await
            .expect("a waiter slept through the release")
            .unwrap();
        assert!(
            got.duration_since(released) < ms(3_000),
            "{:?}",
            got.duration_since(released)
        );
    }
}

/// A promotion on purpose (`SENTINEL FAILOVER`) while a client obtains as fast as it can
/// through the old primary: every lock it was told it obtained (one replica acknowledged
/// it) must be on the new primary.
///
/// Fails with the default of one replica of two, losing 300-400 locks a failover (debug
/// build): the sentinel first turns the chosen replica into a primary, and only up to a second later (its next `INFO`) points the
/// other replica at it. Meanwhile the old primary is still a primary, the client still
/// writes to it, and the other replica, still its replica, acknowledges; pointed at the new
/// primary, it resynchronizes in full and drops those writes. A kill loses nothing (the
/// old primary takes no writes after the promotion), and neither does `replicas(2)` here
/// (the promoted replica stops acknowledging the moment it is promoted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails: with one replica of two acknowledging, a manual failover loses locks (issue 26)"]
async fn a_manual_failover_keeps_every_replicated_lock() {
    let failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let (obtained, mut counts) = tokio::sync::watch::channel(Vec::<String>::new());
    let writer = tokio::spawn({
        let client = client.clone();
        async move {
            let options = Options::default().timeout(ms(300));
            for i in 0.. {
                let key = format!("m{i}");
                if client.obtain(&key, ms(60_000), &options).await.is_ok() {
                    obtained.send_modify(|keys| keys.push(key));
                }
                if obtained.is_closed() {
                    return;
                }
                tokio::time::sleep(ms(1)).await;
            }
        }
    });
    counts.wait_for(|keys| keys.len() >= 10).await.unwrap();
    let old = failover.nodes[0].port();
    let reply = support::server::cli(
        failover.sentinels[0].port(),
        &["SENTINEL", "FAILOVER", MASTER],
    );
    assert_eq!(reply.trim(), "OK");
    let promoted = failover.wait_for_promotion(old).await;
    // Once the old primary is a replica, the client surely writes to the new one.
    failover.wait_healthy().await;
    let before = counts.borrow_and_update().len();
    counts.wait_for(|keys| keys.len() > before).await.unwrap();
    let keys = counts.borrow().clone();
    drop(counts);
    writer.await.unwrap();
    let mut primary = raw(&failover, promoted).await;
    let mut lost = Vec::new();
    for key in &keys {
        let found: i64 = primary.exists(key).await.unwrap();
        if found == 0 {
            lost.push(key.as_str());
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} replicated locks lost in a manual failover: {:?} ...",
        lost.len(),
        keys.len(),
        &lost[..lost.len().min(5)]
    );
}
