//! Holding locks for long work: watchdog, lost signal, guards, with_lock, cancellation.

use crate::support;

use std::time::Duration;

use lockset::{Client, Error, Options};
use support::{Env, lost_by, ms};
use tokio::time::Instant;

fn opts() -> Options {
    Options::default()
}

/// Waits (bounded) until the client has no background task left.
async fn quiesce<C>(client: &Client<C>)
where
    C: lockset::redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    tokio::time::timeout(Duration::from_secs(30), client.background_idle())
        .await
        .expect("background tasks ended");
}

#[tokio::test]
async fn the_watchdog_keeps_a_300ms_lock_alive_through_3s_of_work() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let guard = env
        .client
        .obtain("job", ms(300), &opts())
        .await
        .unwrap()
        .keep_alive();
    let lost = guard.lost_signal();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(ms(250)).await; // the "work"
        assert!(!lost.is_lost());
        assert!(
            other
                .obtain("job", ms(300), &opts())
                .await
                .unwrap_err()
                .is_not_obtained()
        );
    }
    assert!(guard.ttl().await.unwrap().is_some());
    guard.release().await.unwrap();
    assert!(!env.exists("job").await);
    assert_eq!(env.client.background_tasks(), 0);
}

#[tokio::test]
async fn deleting_the_key_fires_the_lost_signal_at_the_next_refresh() {
    let env = Env::start().await;
    let guard = env
        .client
        .obtain("job", ms(300), &opts())
        .await
        .unwrap()
        .keep_alive();
    let lost = guard.lost_signal();
    env.cmd::<i64>(&["DEL", "job"]).await;
    // The next refresh (every 100 ms) finds the key gone.
    lost_by(&lost, Instant::now() + ms(100)).await;
    assert!(lost.is_lost());
    // The watchdog stopped by itself once it found the lock gone.
    quiesce(&env.client).await;
    assert!(matches!(guard.release().await, Err(Error::NotHeld)));
}

#[tokio::test]
async fn killing_the_server_fires_the_lost_signal_within_the_ttl() {
    let mut env = Env::start().await;
    let guard = env
        .client
        .obtain("job", ms(300), &opts())
        .await
        .unwrap()
        .keep_alive();
    let lost = guard.lost_signal();
    let killed = Instant::now();
    env.server.stop();
    // No refresh succeeds from here on: it fires when the last one's validity runs out,
    // within one TTL of the kill.
    let due = guard.valid_until();
    assert!(due <= killed + ms(300));
    lost_by(&lost, due).await;
    drop(guard);
    quiesce(&env.client).await;
}

#[tokio::test]
async fn dropping_a_guard_releases_the_lock() {
    let env = Env::start().await;
    let guard = env
        .client
        .obtain_multi(["a", "b"], ms(60_000), &opts())
        .await
        .unwrap()
        .into_guard();
    assert_eq!(env.dbsize().await, 2);
    drop(guard);
    quiesce(&env.client).await;
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn dropping_a_kept_alive_guard_stops_the_watchdog_and_releases() {
    let env = Env::start().await;
    let guard = env
        .client
        .obtain("job", ms(300), &opts())
        .await
        .unwrap()
        .keep_alive();
    let lost = guard.lost_signal();
    assert_eq!(env.client.background_tasks(), 1);
    drop(guard);
    quiesce(&env.client).await;
    assert!(!env.exists("job").await);
    assert!(
        lost.is_lost(),
        "a released lock counts as lost for the work"
    );
}

#[tokio::test]
async fn release_never_races_a_refresh_in_flight() {
    // Redisson #7272: a renewal that outlived unlock kept the lock forever.
    let env = Env::start().await;
    for i in 0..200 {
        let key = format!("job{i}");
        let guard = env.client.obtain(&key, ms(60_000), &opts()).await.unwrap();
        // Refresh as often as possible so that release meets a refresh in flight.
        let guard = guard.keep_alive_every(Duration::ZERO);
        for _ in 0..(i % 7) {
            tokio::task::yield_now().await;
        }
        guard.release().await.unwrap();
        assert_eq!(
            env.client.background_tasks(),
            0,
            "the watchdog outlived release"
        );
        assert!(!env.exists(&key).await);
    }
}

#[tokio::test]
async fn with_lock_runs_the_work_and_releases() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let output = env
        .client
        .with_lock(["a", "b"], ms(300), &opts(), |lost| async move {
            assert!(
                other
                    .obtain("a", ms(300), &opts())
                    .await
                    .unwrap_err()
                    .is_not_obtained()
            );
            tokio::time::sleep(ms(700)).await; // longer than the TTL
            assert!(!lost.is_lost());
            42
        })
        .await
        .unwrap();
    assert_eq!(output, 42);
    assert_eq!(env.dbsize().await, 0);
    assert_eq!(env.client.background_tasks(), 0);
}

#[tokio::test]
async fn with_lock_releases_when_the_work_fails() {
    let env = Env::start().await;
    let output: Result<(), &str> = env
        .client
        .with_lock(["a"], ms(10_000), &opts(), |_| async { Err("failed") })
        .await
        .unwrap();
    assert_eq!(output, Err("failed"));
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn with_lock_releases_when_the_work_panics() {
    let env = Env::start().await;
    let client = env.client.clone();
    let task = tokio::spawn(async move {
        client
            .with_lock(["a"], ms(60_000), &opts(), |_| async {
                panic!("work panicked")
            })
            .await
    });
    assert!(task.await.unwrap_err().is_panic());
    quiesce(&env.client).await;
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test]
async fn with_lock_work_can_stop_when_the_lock_is_lost() {
    let env = &Env::start().await;
    let outcome = env
        .client
        .with_lock(["job"], ms(300), &opts(), |lost| async move {
            env.cmd::<i64>(&["DEL", "job"]).await;
            tokio::select! {
                () = lost.lost() => "stopped",
                () = tokio::time::sleep(Duration::from_secs(30)) => "finished",
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome, "stopped");
    assert_eq!(env.client.background_tasks(), 0);
}

#[tokio::test]
async fn with_lock_does_not_run_the_work_when_not_obtained() {
    let env = Env::start().await;
    let _held = env.client.obtain("job", ms(60_000), &opts()).await.unwrap();
    let err = env
        .client
        .with_lock(["job"], ms(300), &opts(), |_| async {
            unreachable!("must not run")
        })
        .await
        .unwrap_err();
    assert!(err.is_not_obtained());
}

#[tokio::test]
async fn the_lost_signal_fires_on_release_and_on_a_failed_ttl_query() {
    let env = Env::start().await;
    let lock = env.client.obtain("a", ms(60_000), &opts()).await.unwrap();
    let lost = lock.lost_signal();
    assert!(!lost.is_lost());
    lock.release().await.unwrap();
    assert!(lost.is_lost(), "fires on release");

    let lock = env.client.obtain("b", ms(60_000), &opts()).await.unwrap();
    env.cmd::<i64>(&["DEL", "b"]).await;
    assert_eq!(lock.ttl().await.unwrap(), None);
    assert!(lock.lost_signal().is_lost());
}

#[tokio::test]
async fn the_lost_signal_fires_when_the_ttl_runs_out_without_a_watchdog() {
    let env = Env::start().await;
    let lock = env.client.obtain("a", ms(200), &opts()).await.unwrap();
    let lost = lock.lost_signal();
    lost_by(&lost, lock.valid_until()).await;
    assert!(Instant::now() >= lock.valid_until());
}

#[tokio::test]
async fn refresh_moves_the_validity_forward() {
    let env = Env::start().await;
    let lock = env.client.obtain("a", ms(1_000), &opts()).await.unwrap();
    let before = lock.valid_until();
    lock.refresh(ms(60_000), &opts()).await.unwrap();
    assert!(lock.valid_until() > before + ms(30_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_obtains_leave_no_lock_behind() {
    let env = Env::start().await;
    let mut completed = 0;
    for i in 0..1_000u64 {
        // Cancel at a varying point between "before sending" and "after the reply": after
        // a number of scheduler turns (timers are too coarse for this).
        let turns = (i * 7_919) % 400;
        let obtain = async {
            if i % 2 == 0 {
                env.client
                    .obtain(format!("k{i}"), ms(60_000), &opts())
                    .await
            } else {
                let keys = [format!("{{m{i}}}:a"), format!("{{m{i}}}:b")];
                env.client.obtain_multi(keys, ms(60_000), &opts()).await
            }
        };
        let cancel = async {
            for _ in 0..turns {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            biased;
            lock = obtain => {
                completed += 1;
                lock.unwrap().release().await.unwrap();
            }
            () = cancel => {}
        }
    }
    eprintln!("{completed} of 1000 obtains completed before cancellation");
    assert!(completed < 1_000, "no obtain was cancelled");
    quiesce(&env.client).await;
    // A round trip on the client's own connection, queued after every clean-up it sent.
    env.client
        .obtain("barrier", ms(1_000), &opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        env.dbsize().await,
        0,
        "{completed} of 1000 obtains completed"
    );
}

#[tokio::test]
async fn reobtain_by_token_nests_critical_sections() {
    let env = Env::start().await;
    let outer = env
        .client
        .obtain("account", ms(60_000), &opts())
        .await
        .unwrap();
    // A nested section of the same task re-obtains with the outer lock's token...
    let nested = opts().token(outer.token());
    let inner = env
        .client
        .obtain_multi(["account", "ledger"], ms(60_000), &nested)
        .await
        .unwrap();
    // ...and leaves the release to the outermost section.
    drop(inner);
    assert!(outer.ttl().await.unwrap().is_some());
    let everything = env
        .client
        .obtain_multi(["account", "ledger"], ms(60_000), &nested)
        .await
        .unwrap();
    everything.release().await.unwrap();
    assert!(matches!(outer.release().await, Err(Error::NotHeld)));
    assert_eq!(env.dbsize().await, 0);
}

/// A refresh slowed down by 200 ms of latency is surely in flight when the release is
/// asked for: the release must land after it, and nothing may bring the key back.
#[tokio::test]
async fn a_release_waits_for_a_slow_refresh_in_flight_and_nothing_comes_back() {
    let env = Env::start().await;
    let proxy = support::proxy::Proxy::start(env.server.port()).await;
    let client = support::client_with_timeout(&proxy.url(), ms(5_000)).await;
    let guard = client
        .obtain_multi(["a", "b"], ms(3_000), &opts())
        .await
        .unwrap()
        .keep_alive_every(ms(50));
    proxy.set_latency(ms(200));
    // The watchdog's next refresh reaches the proxy: it is in flight.
    let sent = proxy.requests() + 1;
    proxy.wait_for(support::proxy::Proxy::requests, sent).await;
    let refreshes = env.calls("evalsha").await;
    guard.release().await.unwrap();
    assert!(
        env.calls("evalsha").await >= refreshes + 2,
        "the refresh and then the release ran"
    );
    assert_eq!(
        client.background_tasks(),
        0,
        "the watchdog outlived release"
    );
    assert_eq!(env.dbsize().await, 0);
    // Nothing in flight can bring the keys back.
    proxy.set_latency(Duration::ZERO);
    tokio::time::sleep(ms(500)).await;
    assert_eq!(env.dbsize().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_release_waits_for_slow_refreshes_in_flight_and_nothing_comes_back() {
    let servers: Vec<support::RedisServer> =
        (0..3).map(|_| support::RedisServer::start()).collect();
    let mut proxies = Vec::new();
    let mut nodes = Vec::new();
    for server in &servers {
        let proxy = support::proxy::Proxy::start(server.port()).await;
        nodes.push(support::client_with_timeout(&proxy.url(), ms(5_000)).await);
        proxies.push(proxy);
    }
    let redlock = lockset::Client::quorum(nodes, lockset::QuorumConfig::default()).unwrap();
    // A 30 s TTL: the per-node limit (5%, 1.5 s) covers a release queued behind a refresh
    // at 200 ms each way.
    let guard = redlock
        .obtain_multi(["a", "b"], ms(30_000), &opts())
        .await
        .unwrap()
        .keep_alive_every(ms(50));
    for proxy in &proxies {
        proxy.set_latency(ms(200));
    }
    for proxy in &proxies {
        let sent = proxy.requests() + 1;
        proxy.wait_for(support::proxy::Proxy::requests, sent).await;
    }
    guard.release().await.unwrap();
    // The release returned once a majority deleted; the slowest master's delete, and
    // nothing else (the watchdog stopped first), finishes in the background.
    tokio::time::timeout(ms(5_000), redlock.background_idle())
        .await
        .expect("the watchdog outlived release");
    for proxy in &proxies {
        proxy.set_latency(Duration::ZERO);
    }
    tokio::time::sleep(ms(500)).await;
    for server in &servers {
        let mut conn = support::connect(server).await;
        let size: i64 = lockset::redis::cmd("DBSIZE")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(size, 0, "a master kept the lock");
    }
}
