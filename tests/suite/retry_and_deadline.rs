//! Retry strategies and deadlines around obtain and refresh.

use crate::support;

use std::time::Duration;

use lockset::redis::aio::MultiplexedConnection;
use lockset::{Client, Error, Options, Retry};
use support::{Env, connect_with_timeout, ms};
use tokio::time::Instant;

/// A lock held by someone else for a long time.
async fn hold(
    env: &Env,
    key: &str,
) -> lockset::Lock<impl lockset::redis::aio::ConnectionLike + Clone + Send + Sync + 'static> {
    env.other_client()
        .await
        .obtain(key, ms(60_000), &Options::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn retry_succeeds_once_the_holder_expires() {
    let env = Env::start().await;
    env.client
        .obtain("job", ms(1_000), &Options::default())
        .await
        .unwrap();
    let retries = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = retries.clone();
    let options = Options::default()
        .retry(Retry::linear(ms(20)))
        .timeout(Duration::from_secs(30))
        .on_retry(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    let start = Instant::now();
    env.client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap();
    // It had to retry until the holder's 1 s ran out (counted the same on every version).
    assert!(retries.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(start.elapsed() >= ms(900), "{:?}", start.elapsed());
}

/// The keys of a lock whose every attempt is one EVALSHA; the first is held by `hold`.
const SET: [&str; 2] = ["{job}:a", "{job}:b"];

#[tokio::test]
async fn limit_retry_makes_n_plus_one_attempts_then_not_obtained() {
    let env = Env::start().await;
    env.load_scripts().await;
    let _held = hold(&env, SET[0]).await;
    let before = env.attempts().await;
    // Barging: a fair waiter's delays count time waited, not attempts (tests/fair.rs).
    let options = Options::default()
        .retry(Retry::linear(ms(1)).limit(3))
        .timeout(Duration::from_secs(30))
        .fair(false);
    let err = env
        .client
        .obtain_multi(SET, ms(10_000), &options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotObtained { .. }), "{err:?}");
    assert_eq!(env.attempts().await - before, 4);
}

/// A fair waiter whose one retry was the recheck after it subscribed waits out that retry's
/// delay, then gives up without a third attempt (one version made one more at its end).
#[tokio::test]
async fn a_recheck_that_was_the_last_retry_is_followed_by_its_wait_not_another_attempt() {
    let env = Env::start().await;
    env.load_scripts().await;
    let _held = hold(&env, SET[0]).await;
    let options = Options::default()
        .retry(Retry::intervals([ms(300)]))
        .timeout(ms(10_000));
    let before = env.attempts().await;
    let start = Instant::now();
    let err = env
        .client
        .obtain_multi(SET, ms(10_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(err.is_not_obtained(), "{err:?}");
    assert_eq!(env.attempts().await - before, 2, "after {took:?}");
    // It waited out the delay its recheck took, and no longer.
    assert!(
        took >= ms(290) && took < ms(5_000),
        "gave up after {took:?}"
    );
}

#[tokio::test]
async fn retry_state_is_fresh_for_every_call_and_task() {
    let env = Env::start().await;
    env.load_scripts().await;
    let _held = hold(&env, SET[0]).await;
    let options = Options::default()
        .retry(Retry::linear(ms(1)).limit(2))
        .timeout(Duration::from_secs(30));
    let before = env.attempts().await;
    for _ in 0..3 {
        assert!(
            env.client
                .obtain_multi(SET, ms(10_000), &options)
                .await
                .is_err()
        );
    }
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let (client, options) = (env.client.clone(), options.clone());
            tokio::spawn(async move { client.obtain_multi(SET, ms(10_000), &options).await })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap_err().is_not_obtained());
    }
    assert_eq!(env.attempts().await - before, 8 * 3);
}

#[tokio::test]
async fn timeout_ends_retries_with_deadline_exceeded() {
    let env = Env::start().await;
    let _held = hold(&env, "job").await;
    let options = Options::default()
        .retry(Retry::linear(ms(10)))
        .timeout(ms(300));
    let start = Instant::now();
    let err = env
        .client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded), "{err:?}");
    assert!(err.is_not_obtained() && err.is_deadline_exceeded());
    within_deadline(start, ms(300));
    assert!(
        env.calls("set").await >= 3,
        "it retried before the deadline"
    );
}

#[tokio::test]
async fn without_a_timeout_obtain_gives_up_after_the_ttl() {
    let env = Env::start().await;
    let _held = hold(&env, "job").await;
    let options = Options::default().retry(Retry::linear(ms(10)));
    let start = Instant::now();
    let err = env
        .client
        .obtain("job", ms(300), &options)
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    within_deadline(start, ms(300));
}

/// An obtain that started at `start` with a deadline `after` it gave up near the deadline:
/// not before its last retry (10 ms before it), and not long after it.
fn within_deadline(start: Instant, after: Duration) {
    let took = start.elapsed();
    assert!(took >= after - ms(20), "gave up early, after {took:?}");
    assert!(took < after + ms(1_500), "gave up late, after {took:?}");
}

#[tokio::test]
async fn a_deadline_in_the_past_still_tries_once() {
    let env = Env::start().await;
    let options = Options::default()
        .retry(Retry::linear(ms(10)))
        .deadline(Instant::now());
    // The one try has 100 ms for its reply; on a loaded machine it may take longer, and
    // its outcome is then unknown (but it was sent: the key is there).
    let tried_once = |outcome: &lockset::Result<lockset::Lock<_>>| match outcome {
        Ok(_) => true,
        Err(Error::UnknownOutcome(_)) => false,
        Err(err) => panic!("{err:?}"),
    };
    let first = env.client.obtain("free", ms(10_000), &options).await;
    if !tried_once(&first) {
        support::eventually(ms(5_000), "the try reached the server", async || {
            env.cmd::<i64>(&["EXISTS", "free"]).await == 1
        })
        .await;
    }
    let err = env
        .client
        .obtain("free", ms(10_000), &options)
        .await
        .unwrap_err();
    assert!(
        err.is_deadline_exceeded() || matches!(err, Error::UnknownOutcome(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_retry_longer_than_the_deadline_is_not_slept() {
    let env = Env::start().await;
    // Held beyond the deadline: the holder's expiry cannot wake the waiter in time either.
    let _held = env
        .other_client()
        .await
        .obtain("job", Duration::from_secs(7_200), &Options::default())
        .await
        .unwrap();
    // A polling client: nothing but the retry could wake it before the deadline.
    let polling = Client::new(support::connect(&env.server).await);
    let options = Options::default()
        .retry(Retry::linear(Duration::from_secs(3_600)))
        .timeout(Duration::from_secs(1_800));
    let start = Instant::now();
    let err = polling
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(start.elapsed() < ms(1_500), "{:?}", start.elapsed());
}

#[tokio::test]
async fn a_release_before_the_deadline_wakes_a_waiter_whose_retry_lies_beyond_it() {
    let env = Env::start().await;
    let held = hold(&env, "job").await;
    let options = Options::default()
        .retry(Retry::linear(Duration::from_secs(3_600)))
        .timeout(Duration::from_secs(60));
    let (obtained, ()) = tokio::join!(env.client.obtain("job", ms(60_000), &options), async {
        // Release once the waiter listens.
        support::eventually(ms(10_000), "the waiter listens", async || {
            env.client.release_channels_watched() > 0
        })
        .await;
        held.release().await.unwrap();
    });
    obtained.unwrap();
    assert_eq!(env.client.release_channels_watched(), 0);
}

#[tokio::test]
async fn obtain_can_be_wrapped_in_a_tokio_timeout() {
    let env = Env::start().await;
    let _held = hold(&env, "job").await;
    let options = Options::default()
        .retry(Retry::linear(ms(10)))
        .timeout(Duration::from_secs(3_600));
    let outcome =
        tokio::time::timeout(ms(200), env.client.obtain("job", ms(60_000), &options)).await;
    assert!(outcome.is_err(), "the outer timeout fires first");
    // Cancelled: no task left behind, no subscription kept, only the holder's key.
    support::eventually(ms(5_000), "clean-up done", async || {
        env.client.background_tasks() == 0 && env.client.release_channels_watched() == 0
    })
    .await;
    assert_eq!(env.dbsize().await, 1);
    assert!(env.get("job").await.unwrap().contains(_held.token()));
}

#[tokio::test]
async fn refresh_of_a_lost_lock_fails_at_once_despite_retries() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    lock.refresh(ms(10_000), &Options::default()).await.unwrap(); // loads the script
    env.cmd::<i64>(&["DEL", "job"]).await;
    let before = env.calls("evalsha").await;
    let options = Options::default().retry(Retry::linear(ms(10)).limit(50));
    let err = lock.refresh(ms(10_000), &options).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld), "{err:?}");
    assert_eq!(env.calls("evalsha").await - before, 1);
}

#[tokio::test]
async fn a_timed_out_obtain_reports_an_unknown_outcome_and_leaves_no_lock() {
    let env = Env::start().await;
    let conn = connect_with_timeout(&env.server, ms(200)).await;
    let client = Client::new(conn.clone());

    env.server.pause();
    let err = client
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap_err();
    env.server.resume();
    assert!(matches!(err, Error::UnknownOutcome(_)), "{err:?}");

    // The obtain and its clean-up were queued on this connection while the server slept;
    // a PING on the same connection answers only after both ran.
    let _: String = lockset::redis::cmd("PING")
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert!(
        !env.exists("job").await,
        "the timed-out obtain left its lock behind"
    );
}

#[tokio::test]
async fn a_timed_out_obtain_is_retried_and_then_succeeds() {
    let env = Env::start().await;
    let client = Client::new(connect_with_timeout(&env.server, ms(200)).await);
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(Duration::from_secs(30));
    env.server.pause();
    // The server stalls for a while (the fault), then comes back.
    let (obtained, ()) = tokio::join!(client.obtain("job", ms(60_000), &options), async {
        tokio::time::sleep(ms(700)).await;
        env.server.resume();
    });
    let lock = obtained.unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    lock.release().await.unwrap();
    assert!(!env.exists("job").await);
}

/// A client of `env`'s server whose connection times a reply out after `bound`, and which
/// is told so.
async fn answering_within(env: &Env, bound: Duration) -> Client<MultiplexedConnection> {
    Client::new(connect_with_timeout(&env.server, bound).await)
        .connection_answers_within(bound)
        .unwrap()
}

/// A client told its connection's bound on one request arms no timer while its deadline is
/// further away than that, and still ends every obtain at its deadline: one further away
/// than the bound (the connection wakes it until the deadline is near), and one nearer
/// (the timer is armed at once, before the connection's own timeout).
#[tokio::test]
async fn an_answer_bound_keeps_every_deadline_against_a_paused_server() {
    let env = Env::start().await;
    let client = answering_within(&env, ms(200)).await;
    env.server.pause();
    // Each bound: at least the deadline less one retry delay (a retry that would come after
    // the deadline is not waited for), at most the deadline and a little more.
    for (timeout, at_least, at_most) in
        [(ms(1_000), ms(900), ms(1_150)), (ms(120), ms(120), ms(190))]
    {
        let options = Options::default()
            .retry(Retry::linear(ms(50)))
            .timeout(timeout);
        let start = Instant::now();
        let err = client
            .obtain("job", ms(60_000), &options)
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(
            err.is_unavailable() || matches!(err, Error::UnknownOutcome(_)),
            "{err:?}"
        );
        assert!(
            took >= at_least && took < at_most,
            "a deadline of {timeout:?} ended after {took:?}"
        );
    }
    env.server.resume();
}

/// Every wait of an attempt is one of its own requests, so an answer bound keeps deadlines
/// also while the client still learns what the server runs: an obtain that came after
/// others waited behind their questions (each up to a response timeout) and ended 1,962 ms
/// into a 1 s deadline (a review's probe).
#[tokio::test]
async fn an_answer_bound_keeps_the_deadline_of_an_obtain_behind_others_still_asking() {
    let env = Env::start().await;
    let client = answering_within(&env, ms(500)).await;
    env.server.pause();
    let long = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(Duration::from_secs(20));
    let before: Vec<_> = (0..4)
        .map(|i| {
            let (client, long) = (client.clone(), long.clone());
            tokio::spawn(
                async move { client.obtain(format!("early:{i}"), ms(60_000), &long).await },
            )
        })
        .collect();
    tokio::task::yield_now().await;
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(1_000));
    let start = Instant::now();
    let err = client
        .obtain("job", ms(60_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(took < ms(1_150), "a deadline of 1 s ended after {took:?}");
    for task in before {
        task.abort();
    }
    env.server.resume();
}

/// A primary that refuses writes for want of replicas (`min-replicas-to-write`, a replica
/// paused or lagging: `NOREPLICAS`) is a state of the deployment that passes: an obtain
/// retries it within its deadline, and locks once the replicas are back (it failed at once
/// with the server's error, which `lockset run --wait` did not wait out either). Nothing ran:
/// the server refuses such a write before it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_short_of_replicas_is_waited_out_within_the_deadline() {
    let server = support::RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let short = ["CONFIG", "SET", "min-replicas-to-write", "1"];
    assert!(support::server::cli(server.port(), &short).contains("OK"));
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(1_000));
    for keys in [vec!["job"], vec!["a", "b"]] {
        let start = Instant::now();
        let err = client
            .obtain_multi(keys.clone(), ms(10_000), &options)
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(err.is_unavailable(), "{keys:?}: {err:?}");
        assert!(
            took >= ms(950) && took < ms(1_500),
            "{keys:?}: after {took:?}"
        );
    }
    let back = tokio::spawn(async move {
        tokio::time::sleep(ms(400)).await;
        let enough = ["CONFIG", "SET", "min-replicas-to-write", "0"];
        assert!(support::server::cli(server.port(), &enough).contains("OK"));
        server
    });
    let start = Instant::now();
    let lock = client
        .obtain("job", ms(10_000), &options.clone().timeout(ms(3_000)))
        .await
        .expect("locked once the replicas are back");
    let took = start.elapsed();
    assert!(took >= ms(400) && took < ms(1_500), "locked after {took:?}");
    lock.release().await.unwrap();
    drop(back.await.unwrap());
}

/// A queued (fair) waiter looks once more at its deadline, for a lock handed to it whose
/// notice never came. That look can only turn giving up into success: a server that stalls
/// at the deadline cuts it after its grace, and the waiter still ends with
/// `DeadlineExceeded` (it ended with `UnknownOutcome`, `is_unavailable`, exit 69 instead of
/// 75), within the deadline plus the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiters_last_look_stalled_at_its_deadline_still_ends_not_obtained() {
    let server = support::RedisServer::start();
    let holder = Client::connect(&server.url()).await.unwrap();
    let waiter = Client::connect(&server.url()).await.unwrap();
    let lock = holder
        .obtain("job", ms(20_000), &Options::default())
        .await
        .unwrap();
    let options = Options::default()
        .retry(Retry::linear(ms(100)))
        .timeout(ms(1_000));
    let start = Instant::now();
    let waiting = tokio::spawn(async move { waiter.obtain("job", ms(10_000), &options).await });
    tokio::time::sleep(ms(600)).await;
    let pause = ["CLIENT", "PAUSE", "1500", "ALL"];
    assert!(support::server::cli(server.port(), &pause).contains("OK"));
    let err = waiting.await.unwrap().unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::DeadlineExceeded), "{err:?}");
    assert!(
        took >= ms(1_000) && took < ms(1_600),
        "ended after {took:?}"
    );
    tokio::time::sleep(ms(1_200)).await;
    lock.release().await.unwrap();
}
