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
