//! Locks across a failover: a primary with replicas behind three sentinels, primaries killed
//! with SIGKILL, replicas paused. The Sentinel client follows the primary, and with
//! replicated writes (the default of `Client::connect_sentinel`) a lock survives the loss of
//! the primary.

use crate::support;

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

    // Two replicas asked for, one connected: a state that passes (a replica restarting),
    // not bad input.
    let err = Client::connect_sentinel(failover.config(Replication::replicas(2)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acknowledged: 1,
                required: 2
            }
        ) && err.is_unavailable(),
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
            let port = support::server::free_port();
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

/// How a trial's primary dies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Death {
    /// Its process is killed (SIGKILL): what it sent its replicas still arrives.
    Killed,
    /// Its host crashes: the process is killed and what is still on the way to the
    /// replicas, which lag 1 ms behind (another zone), is lost with it.
    Crashed,
}

/// One trial of the principal scenario, on a fresh deployment: lock a key with replicated
/// writes and another without, let the primary die at once, wait for the promotion, and
/// see whether a second client can take each key. Returns (replicated lock lost, plain lock
/// lost).
async fn lock_then_lose_the_primary(death: Death) -> (bool, bool) {
    let mut failover = match death {
        Death::Killed => Failover::start(2).await,
        Death::Crashed => Failover::start_lagging(2, ms(1)).await,
    };
    // A generous WAIT: ten deployments at once on two loaded cores (a replica took longer
    // than the default 250 ms to acknowledge under a load of 14). What is measured is the
    // failover.
    let patient = Replication::replicas(1).timeout(ms(2_000));
    let replicated = Client::connect_sentinel(failover.config(patient))
        .await
        .unwrap();
    let plain = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    // Longer than any failover the test waits for (FAILOVER_WITHIN).
    let ttl = ms(120_000);
    let r_lock = replicated
        .obtain("r", ttl, &Options::default())
        .await
        .unwrap();
    let p_lock = plain.obtain("p", ttl, &Options::default()).await.unwrap();
    let old = failover.nodes[failover.primary()].port();
    failover.kill_primary();
    if death == Death::Crashed {
        for link in &failover.links {
            link.drop_connections();
        }
    }
    failover.wait_for_promotion(old).await;
    let prober = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    let lost = (
        taken_by_another(&prober, "r").await,
        taken_by_another(&prober, "p").await,
    );
    drop((r_lock, p_lock));
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_survives_its_primary_killed_at_once() {
    let trials: usize = std::env::var("LOCKSET_FAILOVER_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| support::repetitions(10, 50));
    // Several deployments at once, so that 50 failovers take half a minute, not four. Half
    // the primaries are killed, half crash.
    let at_once = 10;
    let mut lost = [(0, 0); 2];
    let mut done = 0;
    while done < trials {
        let round = at_once.min(trials - done);
        let runs: Vec<_> = (0..round)
            .map(|i| {
                let death = [Death::Killed, Death::Crashed][(done + i) % 2];
                (death, tokio::spawn(lock_then_lose_the_primary(death)))
            })
            .collect();
        for (death, run) in runs {
            let (r, p) = run.await.unwrap();
            let lost = &mut lost[usize::from(death == Death::Crashed)];
            lost.0 += usize::from(r);
            lost.1 += usize::from(p);
        }
        done += round;
    }
    let (killed, crashed) = (trials.div_ceil(2), trials / 2);
    println!(
        "the primary lost right after obtain, {trials} trials: killed ({killed}): {} \
         replicated and {} unreplicated locks lost; crashed with replicas 1 ms behind \
         ({crashed}): {} replicated and {} unreplicated locks lost",
        lost[0].0, lost[0].1, lost[1].0, lost[1].1
    );
    assert_eq!(
        lost[0].0 + lost[1].0,
        0,
        "a replicated lock was lost in a failover"
    );
}

/// Whether a second client can take `key` now (releasing it again): one attempt at a time,
/// tried again while Redis is unavailable (the client may still be finding the new
/// primary), for at most 10 s.
async fn taken_by_another<C>(client: &Client<C>, key: &str) -> bool
where
    C: lockset::redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let start = Instant::now();
    loop {
        match client.obtain(key, ms(60_000), &Options::default()).await {
            Ok(second) => {
                second.release().await.unwrap();
                return true;
            }
            Err(err) if err.is_not_obtained() => return false,
            Err(err) if err.is_unavailable() && start.elapsed() < ms(10_000) => {
                tokio::time::sleep(ms(50)).await;
            }
            Err(err) => panic!("{key}: {err:?}"),
        }
    }
}

/// A waiter of `key` on `client`, which polls only every 10 s (a release event must wake
/// it): when it got the lock.
fn wait_for(client: Client, key: &'static str) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(10_000)))
            .timeout(ms(60_000));
        let lock = client.obtain(key, ms(30_000), &options).await.unwrap();
        let got = Instant::now();
        lock.release().await.unwrap();
        got
    })
}

/// Kills the primary of `failover`, waits for the promotion, and releases `lock` as soon as
/// its client follows the new primary; returns when the release was sent.
async fn release_after_a_failover(failover: &mut Failover, lock: lockset::Lock) -> Instant {
    let old = failover.nodes[failover.primary()].port();
    failover.kill_primary();
    failover.wait_for_promotion(old).await;
    support::eventually(ms(10_000), "the holder follows the primary", async || {
        lock.ttl().await.is_ok()
    })
    .await;
    let released = Instant::now();
    lock.release().await.unwrap();
    released
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
    failover.stall_links().await;
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
    // Free: taken as soon as the new primary has a replica to acknowledge it.
    let until_replicated = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(15_000));
    let second = replicated
        .obtain("cut", ms(60_000), &until_replicated)
        .await
        .expect("the lock the failover lost is free");
    // The plain client's first request may still meet its connection to the dead primary
    // (broken pipe) before it follows the new one.
    support::eventually(ms(10_000), "the plain holder sees its loss", async || {
        doomed.ttl().await.is_ok_and(|left| left.is_none())
    })
    .await;
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_fails_obtains_within_their_deadline_and_leaves_nothing() {
    let failover = Failover::start(1).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    // The scripts loaded first: a script the server does not have yet costs a second
    // request, and so a second wait for the replica.
    client
        .obtain_multi(["{p}:a", "{p}:b"], ms(60_000), &Options::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    failover.nodes[1].pause();
    // The first deadline leaves room for the write's 250 ms wait and the removal of its
    // keys (an attempt cut while it waits for its replicas, with no attempt before it, has
    // an unknown outcome); the second cuts its last attempt.
    for (deadline, retry) in [
        (ms(600), Retry::NoRetry),
        (ms(1_000), Retry::linear(ms(50))),
    ] {
        let options = Options::default().retry(retry).timeout(deadline);
        let started = Instant::now();
        let err = client
            .obtain_multi(["{p}:a", "{p}:b"], ms(60_000), &options)
            .await
            .unwrap_err();
        let took = started.elapsed();
        // Said as what it is, also when the deadline cut an attempt that was waiting for
        // its replicas: not "no reply, outcome unknown".
        assert!(
            err.is_not_replicated() && err.is_unavailable(),
            "{deadline:?}: {err:?} after {took:?}"
        );
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

/// A replica that is connected but behind (here paused: its primary still lists it, with a
/// growing lag) is a passing state, not a setting to refuse: `replicated` accepts a count
/// the primary's connected replicas can meet, and each write's `WAIT` decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lags_when_the_client_starts_is_not_bad_input() {
    let (primary, replica) = support::primary_with_replica().await;
    replica.pause();
    support::eventually(ms(15_000), "the primary sees the replica lag", async || {
        let info = support::server::cli(primary.port(), &["INFO", "replication"]);
        info.lines()
            .filter_map(|line| line.split("lag=").nth(1))
            // Valkey lists more fields after the lag.
            .filter_map(|lag| lag.split(',').next())
            .any(|lag| lag.trim().parse::<u64>().is_ok_and(|lag| lag > 2))
    })
    .await;
    let client = Client::connect(&primary.url())
        .await
        .unwrap()
        .replicated(Replication::replicas(1).timeout(ms(100)))
        .await
        .expect("a lagging replica is still a replica");
    let err = client
        .obtain("lag", ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    replica.resume();
    support::eventually(
        ms(10_000),
        "obtains once the replica caught up",
        async || match client.obtain("lag", ms(10_000), &Options::default()).await {
            Ok(lock) => lock.release().await.is_ok(),
            Err(_) => false,
        },
    )
    .await;
}

/// A refresh the replica did not acknowledge was still applied on the primary: a process
/// that adopts the lock by its token must not believe the primary's longer TTL, which a
/// failover to the replica would not keep. On a replicated client, adopting writes the TTL
/// again and waits for the replicas: refused while they do not acknowledge, and then
/// believed only as far as they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopter_believes_no_longer_than_the_replicas_keep_the_lock() {
    let (primary, replica) = support::primary_with_replica().await;
    let replicated = async || {
        support::client_with_timeout(&primary.url(), ms(5_000))
            .await
            .replicated(Replication::replicas(1).timeout(ms(1_000)))
            .await
            .unwrap()
    };
    let token = "adopted-token-0123456789";
    let lock = replicated()
        .await
        .obtain("job", ms(3_000), &Options::default().token(token))
        .await
        .unwrap();
    replica.pause();
    let err = lock
        .refresh(ms(60_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    let adopter = replicated().await;
    let adopting = adopter
        .adopt(["job"], ms(3_000), &Options::default().token(token))
        .await;
    match adopting {
        Err(err) => assert!(err.is_not_replicated(), "{err:?}"),
        Ok(adopted) => {
            let believed = adopted
                .valid_until()
                .saturating_duration_since(Instant::now());
            panic!("adopted while the replica held 3 s, believing {believed:?}");
        }
    }
    replica.resume();
    let adopted = adopter
        .adopt(["job"], ms(3_000), &Options::default().token(token))
        .await
        .expect("adopted once the replica acknowledges");
    let believed = adopted
        .valid_until()
        .saturating_duration_since(Instant::now());
    let on_the_replica: u64 = support::server::cli(replica.port(), &["PTTL", "job"])
        .trim()
        .parse()
        .unwrap();
    assert!(
        believed <= ms(on_the_replica + 50),
        "believes {believed:?}, the replica holds {on_the_replica} ms"
    );
    adopted.release().await.unwrap();
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
        waiters.push(wait_for(client, "busy"));
    }
    // Both wait (queued, listening) before the failover.
    support::eventually(ms(10_000), "two queued waiters", async || {
        let queued: i64 = raw(&failover, 0)
            .await
            .zcard("busy{busy}:lockset:queue")
            .await
            .unwrap();
        queued == 2
    })
    .await;
    // The holder follows the primary and releases there; the waiters hear it, although
    // they listened on the old primary: no sleeping out a 10 s retry or the TTL.
    let released = release_after_a_failover(&mut failover, lock).await;
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

/// The first scenario on a Redis Cluster whose shards have a replica each: lock keys of one
/// shard with replicated writes and without, kill the shard's master, and once its replica
/// took over, try every key from a second client. Each shard once.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_survives_a_cluster_shard_failover() {
    use support::cluster::Cluster;

    let mut cluster = Cluster::start_with_replicas();
    let seeds = cluster.urls();
    // A shard may fail over on its own while the machine is loaded (1 s node timeout), and
    // its new primary has no replica in sync for a moment: a client asking for one is
    // told so then (NotReplicated, worth retrying), so it connects again until every shard
    // has one.
    let connect = async |replication: Replication| {
        let started = Instant::now();
        loop {
            let client = Client::connect_cluster(seeds.clone()).await.unwrap();
            match client.replicated(replication).await {
                Ok(client) => break client,
                Err(err) if err.is_not_replicated() && started.elapsed() < ms(30_000) => {
                    tokio::time::sleep(ms(100)).await;
                }
                Err(err) => panic!("{err:?}"),
            }
        }
    };
    let replicated = connect(Replication::replicas(1)).await;
    let plain = connect(Replication::none()).await;
    let masters: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| cluster.cli(i, &["ROLE"]).starts_with("master"))
        .collect();
    assert_eq!(masters.len(), 3);
    let (mut lost_replicated, mut lost_plain, mut locks) = (0, 0, 0);
    for master in masters {
        // Five keys of each kind in this master's slots.
        let keys: Vec<String> = (0..)
            .map(|n| format!("{{t{n}}}"))
            .filter(|key| cluster.owner_of(lockset::slot_number(key)) == master)
            .take(10)
            .collect();
        let ttl = ms(60_000);
        // The same passing state as at connect (a shard that failed over on its own has no
        // replica in sync for a moment): retried, as a service would.
        let patient = Options::default()
            .retry(Retry::linear(ms(100)))
            .timeout(ms(30_000));
        let mut held = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let client = if i < 5 { &replicated } else { &plain };
            held.push(client.obtain(key, ttl, &patient).await.unwrap());
        }
        let slot = lockset::slot_number(&keys[0]);
        cluster.nodes[master].kill();
        let start = Instant::now();
        while cluster
            .find_owner_of(slot)
            .is_none_or(|owner| owner == master)
        {
            assert!(
                start.elapsed() < support::sentinel::FAILOVER_WITHIN,
                "no replica took over"
            );
            tokio::time::sleep(ms(50)).await;
        }
        // A second client, which learns the new slot map as it connects.
        let prober = connect(Replication::none()).await;
        for (i, key) in keys.iter().enumerate() {
            if taken_by_another(&prober, key).await {
                if i < 5 {
                    lost_replicated += 1;
                } else {
                    lost_plain += 1;
                }
            }
        }
        locks += 5;
        drop(held);
    }
    println!(
        "cluster shard failovers: {lost_replicated} of {locks} replicated locks lost, \
         {lost_plain} of {locks} without replication"
    );
    assert_eq!(lost_replicated, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_data_nodes_with_passwords() {
    use support::sentinel::{LOCK_PASSWORD, SENTINEL_PASSWORD};

    let mut failover = Failover::start_secured(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let waiter = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let lock = client
        .obtain("secret", ms(30_000), &Options::default())
        .await
        .unwrap();
    // A waiter listens (release events log in too), across a failover. Its first attempt
    // found the lock held before the primary goes (its subscription may still be under way):
    // an attempt the kill interrupts has an unknown outcome, and sleeps its strategy's delay.
    let waiting = wait_for(waiter.clone(), "secret");
    support::eventually(ms(10_000), "the waiter found the lock held", async || {
        waiter.release_channels_watched() == 1
    })
    .await;
    let released = release_after_a_failover(&mut failover, lock).await;
    let got = tokio::time::timeout(ms(10_000), waiting)
        .await
        .expect("the waiter slept through the release")
        .unwrap();
    let woken = got.duration_since(released);
    assert!(woken < ms(3_000), "woken {woken:?} after the release");

    // Wrong passwords are clear errors, at once: no retrying until a deadline.
    let started = Instant::now();
    let wrong = failover
        .config(Replication::none())
        .password(format!("{LOCK_PASSWORD}-not"));
    let err = Client::connect_sentinel(wrong).await.unwrap_err();
    assert!(!err.is_unavailable(), "{err:?}");
    assert!(
        err.to_string().contains("WRONGPASS") || err.to_string().contains("auth"),
        "{err}"
    );
    let urls: Vec<String> = failover
        .sentinel_urls()
        .iter()
        .map(|url| url.replace(SENTINEL_PASSWORD, "nope"))
        .collect();
    let err = Client::connect_sentinel(SentinelConfig::new(urls, MASTER).unwrap())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("WRONGPASS") || err.to_string().contains("auth"),
        "{err}"
    );
    assert!(started.elapsed() < ms(3_000), "{:?}", started.elapsed());
}

/// Fencing tokens keep growing across a failover to a replica whose counter is behind (it
/// missed the last tokens) and whose clock is behind the old primary's (played here by an
/// old primary whose counter, as its clock would, ran an hour ahead): the Sentinel
/// configuration epoch, which every failover raises, leads the new primary's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_growing_across_a_failover_to_a_replica_behind() {
    let mut failover = Failover::start_with_a_successor().await;
    let client = Client::connect_sentinel(failover.config(Replication::replicas(1)))
        .await
        .unwrap();
    let fenced = Options::default().fencing();
    let first = client.obtain("fenced", ms(10_000), &fenced).await.unwrap();
    let low = first.fencing_token().unwrap();
    first.release().await.unwrap();
    // The successor misses what follows (its link holds it back, then drops it).
    failover.stall_link(0).await;
    let mut primary = raw(&failover, 0).await;
    let ahead = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
        + 3_600_000_000;
    let _: () = primary.set("{fenced}:fence", ahead).await.unwrap();
    let last = client.obtain("fenced", ms(10_000), &fenced).await.unwrap();
    let high = last.fencing_token().unwrap();
    assert!(high > ahead && low < high);
    last.release().await.unwrap();
    let old = failover.nodes[0].port();
    failover.kill_primary();
    failover.links[0].drop_connections();
    let promoted = failover.wait_for_promotion(old).await;
    assert_eq!(
        promoted, 2,
        "the replica that missed the last tokens took over"
    );
    let behind: u64 = raw(&failover, 2).await.get("{fenced}:fence").await.unwrap();
    assert!(behind < high, "the new primary's counter is behind");
    let next = tokio::time::timeout(
        ms(10_000),
        client.obtain(
            "fenced",
            ms(10_000),
            &fenced.clone().retry(Retry::linear(ms(50))),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let token = next.fencing_token().unwrap();
    assert!(token > high, "{token} after {high}: tokens went back");
    next.release().await.unwrap();
}

/// Redlock over masters that each have a replica: `replicated` on the quorum makes every
/// master's share wait for its replica, and a master whose replica is paused counts as a
/// master that failed; the majority still decides, without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_replicated_masters() {
    use lockset::QuorumConfig;
    use support::RedisServer;

    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(None, &["--repl-diskless-sync-delay", "0"]))
        .collect();
    let replicas: Vec<RedisServer> = masters
        .iter()
        .map(|m| {
            RedisServer::start_with(None, &["--replicaof", "127.0.0.1", &m.port().to_string()])
        })
        .collect();
    for replica in &replicas {
        support::eventually(ms(10_000), "replica in sync", async || {
            support::server::replica_in_sync(replica.port())
        })
        .await;
    }
    // Replies within 2 s (redis-rs's default is 500 ms): a loaded machine, not the subject.
    let mut nodes = Vec::new();
    for master in &masters {
        nodes.push(support::client_with_timeout(&master.url(), ms(2_000)).await);
    }
    // A replica may take longer than the default 250 ms on a loaded machine; the paused one
    // would hold an obtain up for all of this 2 s, which the bound below rules out. Each
    // master's answer, its WAIT included, may take as long (the default limit is 500 ms).
    let config = QuorumConfig::default().node_timeout(ms(3_000));
    let redlock = Client::quorum(nodes, config)
        .unwrap()
        .replicated(Replication::replicas(1).timeout(ms(2_000)))
        .await
        .unwrap();
    let lock = redlock
        .obtain("q", ms(10_000), &Options::default())
        .await
        .unwrap();
    lock.release().await.unwrap();
    redlock.background_idle().await;

    replicas[0].pause();
    let started = Instant::now();
    let lock = redlock
        .obtain("q", ms(10_000), &Options::default())
        .await
        .expect("two of three masters replicated it");
    // The paused replica's master holds up nothing: the other two decide.
    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    for (i, replica) in replicas.iter().enumerate().skip(1) {
        let value = support::server::cli(replica.port(), &["GET", "q"]);
        assert!(!value.trim().is_empty(), "replica {i} misses the lock");
    }
    lock.release().await.unwrap();
    replicas[0].resume();
    tokio::time::timeout(ms(5_000), redlock.background_idle())
        .await
        .unwrap();
    // Master 0's share was removed again once its replica did not acknowledge it.
    assert!(support::server::cli(masters[0].port(), &["EXISTS", "q"]).starts_with('0'));
}

/// A promotion on purpose (`SENTINEL FAILOVER`) while a client obtains as fast as it can
/// through the old primary: every lock it was told it obtained (one replica acknowledged
/// it) must be on the new primary.
///
/// With one replica of two acknowledging, this lost 300-400 locks a failover (debug build):
/// the sentinel first turns the chosen replica into a primary, and only up to a second
/// later (its next `INFO`) points the other replica at it. Meanwhile the old primary is
/// still a primary, the client still writes to it, and the other replica, still its
/// replica, acknowledges; pointed at the new primary, it resynchronizes in full and drops
/// those writes. The default, every replica in sync, loses none: the promoted replica stops
/// acknowledging the moment it is promoted, and the count never shrinks while the sentinels
/// name a new primary or epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_keeps_every_replicated_lock() {
    let failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::all()))
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
    let reply = failover.ask_sentinel(
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

/// Every replica in sync, the default: a replica that dies stops locks for a few seconds
/// (its acknowledgements are missing), not for good, and after a failover the new primary's
/// replicas count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_replicas_follow_a_deployment_that_loses_a_replica_or_its_primary() {
    let mut failover = Failover::start(2).await;
    let client = Client::connect_sentinel(failover.config(Replication::all()))
        .await
        .unwrap();
    let lock = client
        .obtain("a", ms(10_000), &Options::default())
        .await
        .unwrap();
    for replica in 1..3 {
        assert!(has(&failover, replica, "a").await, "replica {replica}");
    }
    lock.release().await.unwrap();
    let retrying = Options::default()
        .retry(Retry::linear(ms(100)))
        .timeout(ms(20_000));
    // A replica dies: locks wait for the other one, after a few seconds at most.
    failover.nodes[2].kill();
    let started = Instant::now();
    let lock = client.obtain("b", ms(10_000), &retrying).await.unwrap();
    assert!(started.elapsed() < ms(10_000), "{:?}", started.elapsed());
    assert!(has(&failover, 1, "b").await);
    lock.release().await.unwrap();
    // The primary dies too: the one replica left is promoted, with no replica of its own;
    // locks fail (nothing could keep them) until a replica is back.
    failover.restore(2).await;
    let old = failover.nodes[0].port();
    failover.kill_primary();
    let promoted = failover.wait_for_promotion(old).await;
    let started = Instant::now();
    let lock = client.obtain("c", ms(10_000), &retrying).await.unwrap();
    assert!(started.elapsed() < ms(15_000), "{:?}", started.elapsed());
    let replica = 3 - promoted;
    assert!(
        has(&failover, replica, "c").await,
        "the new primary's replica has it"
    );
    lock.release().await.unwrap();
}

#[tokio::test]
async fn replicated_writes_check_their_settings_before_anything_is_written() {
    let env = support::Env::start().await;
    // No replica: too few to replicate to, with the count the primary reports (a state
    // that may pass: a replica restarting), not bad input.
    let err = env
        .other_client()
        .await
        .replicated(Replication::replicas(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acknowledged: 0,
                required: 1
            }
        ) && err.is_not_replicated(),
        "{err:?}"
    );
    let err = env
        .other_client()
        .await
        .replicated(Replication::all())
        .await
        .unwrap_err();
    assert!(err.is_not_replicated(), "{err:?}");
    // WAITAOF where the server has it (Redis 7.2+, Valkey), else a clear refusal.
    let knows_waitaof = env
        .cmd::<Vec<lockset::redis::Value>>(&["COMMAND", "INFO", "WAITAOF"])
        .await
        .first()
        .is_some_and(|info| *info != lockset::redis::Value::Nil);
    let aof = env
        .other_client()
        .await
        .replicated(Replication::replicas(0).append_only(true))
        .await;
    match knows_waitaof {
        true => assert!(aof.is_ok(), "{aof:?}"),
        false => assert!(matches!(
            aof,
            Err(Error::InvalidInput(InvalidInput::NoWaitAof))
        )),
    }
    // Nothing waits for nothing: none is always accepted, and set once.
    let client = env
        .other_client()
        .await
        .replicated(Replication::none())
        .await
        .unwrap();
    let err = client
        .replicated(Replication::replicas(2))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput(InvalidInput::ReplicationAlreadySet)
    ));
    assert_eq!(env.dbsize().await, 0);
}

/// One sentinel given twice is one voice: with the third sentinel down it is no majority of
/// three, so no primary is followed on its word alone (a sentinel that watches another
/// server under the master's name, given twice, split a lock across two servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_given_twice_counts_once() {
    let failover = Failover::start(1).await;
    let one = failover.sentinel_urls()[0].clone();
    let down = format!("redis://127.0.0.1:{}/", support::server::free_port());
    let config = SentinelConfig::new([one.clone(), one, down], MASTER)
        .unwrap()
        .connection_timeout(ms(500))
        .response_timeout(ms(500))
        .replication(Replication::none());
    let started = Instant::now();
    let err = Client::connect_sentinel(config).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("counted once"), "{err}");
    assert!(started.elapsed() < ms(3_000), "{:?}", started.elapsed());
}

/// Two of three sentinels that do not know the master (rebuilt without their configuration,
/// or being given `SENTINEL MONITOR`) while the third names the primary: no majority, a
/// state of the deployment, not a master name nobody knows. Connecting fails as unavailable
/// (it was `InvalidInput::UnknownMaster`, which the command line took for bad usage, exit
/// 64, and never retried); once they know the master again, it connects and locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_forgot_the_master_are_a_passing_state() {
    let failover = Failover::start(1).await;
    let primary = failover.named_primary();
    let forgetful: Vec<u16> = failover.sentinels[1..].iter().map(|s| s.port()).collect();
    for port in &forgetful {
        let removed = failover.ask_sentinel(*port, &["SENTINEL", "REMOVE", MASTER]);
        assert!(removed.contains("OK"), "{removed}");
    }
    let config = || failover.config(Replication::none());
    let started = Instant::now();
    let err = Client::connect_sentinel(config()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(!matches!(err, lockset::Error::InvalidInput(_)), "{err:?}");
    assert!(started.elapsed() < ms(3_000), "{:?}", started.elapsed());
    let port = primary.to_string();
    for sentinel in &forgetful {
        let monitor = ["SENTINEL", "MONITOR", MASTER, "127.0.0.1", &port, "2"];
        let added = failover.ask_sentinel(*sentinel, &monitor);
        assert!(added.contains("OK"), "{added}");
    }
    let client = Client::connect_sentinel(config()).await.unwrap();
    let lock = client
        .obtain("{s}:forgot", ms(10_000), &Options::default())
        .await
        .unwrap();
    lock.release().await.unwrap();
}
