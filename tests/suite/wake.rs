//! Waiting well: waiters wake when the lock is released instead of polling.

use crate::support;

use std::time::Duration;

use lockset::{Options, Retry, release_channel};
use support::{Env, eventually, ms};
use tokio::time::{Instant, timeout};

/// How long a hand-over through a release event may take on a loaded machine: far below the
/// minute that [`slow_polling`] waits, so only the event path passes.
const HAND_OVER: Duration = Duration::from_millis(1_500);

/// Options whose polling alone would wait a minute between attempts.
fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(60)))
        .timeout(Duration::from_secs(600))
}

#[tokio::test]
async fn a_release_wakes_the_waiter_long_before_its_next_poll() {
    let env = Env::start().await;
    let holder = env.other_client().await;
    let held = holder
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let client = env.client.clone();
        async move { client.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(Duration::from_secs(30), "condition", async || {
        env.client.release_channels_watched() == 1
    })
    .await;
    held.release().await.unwrap();
    let lock = timeout(HAND_OVER, waiter)
        .await
        .expect("woken by the release");
    lock.unwrap().unwrap().release().await.unwrap();
    // Nobody waits any more: the channel is unsubscribed, here and on the server.
    assert_eq!(env.client.release_channels_watched(), 0);
    let channel = release_channel("job");
    eventually(Duration::from_secs(30), "condition", async || {
        let subscribers: (String, i64) = env.cmd(&["PUBSUB", "NUMSUB", channel]).await;
        subscribers.1 == 0
    })
    .await;
}

#[tokio::test]
async fn a_release_of_one_key_of_a_set_wakes_the_set_waiter() {
    let env = Env::start().await;
    let holder = env.other_client().await;
    let held = holder
        .obtain("{s}:b", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let client = env.client.clone();
        async move {
            client
                .obtain_multi(["{s}:a", "{s}:b", "{s}:c"], ms(60_000), &slow_polling())
                .await
        }
    });
    eventually(Duration::from_secs(30), "condition", async || {
        env.client.release_channels_watched() == 1
    })
    .await;
    held.release().await.unwrap();
    let lock = timeout(HAND_OVER, waiter).await.expect("woken");
    assert_eq!(lock.unwrap().unwrap().keys().len(), 3);
}

#[tokio::test]
async fn the_holders_expiry_wakes_the_waiter_without_an_event() {
    let env = Env::start().await;
    let holder = env.other_client().await;
    // A multi-key obtain learns the holder's TTL from the script.
    let _held = holder
        .obtain_multi(["{e}:a", "{e}:b"], ms(300), &Options::default())
        .await
        .unwrap();
    let lock = timeout(
        ms(300) + HAND_OVER,
        env.client
            .obtain_multi(["{e}:a", "{e}:b"], ms(60_000), &slow_polling()),
    )
    .await
    .expect("woken at the holder's expiry");
    lock.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter_of_a_client_not_all() {
    const WAITERS: u64 = 10;
    const SET: [&str; 2] = ["{job}:a", "{job}:b"];
    let env = Env::start().await;
    env.load_scripts().await;
    let holder = env.other_client().await;
    let held = holder
        .obtain("{job}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let before = env.attempts().await;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let client = env.client.clone();
            tokio::spawn(async move {
                let lock = client
                    .obtain_multi(SET, ms(60_000), &slow_polling())
                    .await
                    .unwrap();
                lock.release().await.unwrap();
            })
        })
        .collect();
    // Each waiter tried, subscribed, and tried again: two attempts each.
    eventually(Duration::from_secs(30), "condition", async || {
        env.attempts().await - before == 2 * WAITERS
    })
    .await;
    held.release().await.unwrap();
    for waiter in waiters {
        timeout(HAND_OVER, waiter)
            .await
            .expect("handed over")
            .unwrap();
    }
    // Each release woke one waiter: about one more attempt per waiter. Waking all of them
    // each time would have cost 10 + 9 + ... + 1 = 55.
    // Every EVALSHA since is an attempt or one of the WAITERS + 1 releases.
    let after_release = env.attempts().await - before - 2 * WAITERS - (WAITERS + 1);
    eprintln!("{after_release} attempts for {WAITERS} hand-overs");
    assert!(
        after_release < 2 * WAITERS,
        "{after_release} attempts for {WAITERS} hand-overs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_subscriber_connection_loses_no_waiter_and_no_deadline() {
    let env = Env::start().await;
    let holder = env.other_client().await;
    let held = holder
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    // Waiters that poll only every minute: only a working (re)subscription wakes them.
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (client, options) = (env.client.clone(), slow_polling());
            tokio::spawn(async move {
                let lock = client.obtain("job", ms(60_000), &options).await.unwrap();
                lock.release().await.unwrap();
            })
        })
        .collect();
    let impatient = tokio::spawn({
        let client = env.client.clone();
        let options = Options::default()
            .retry(Retry::linear(ms(50)))
            .timeout(ms(500));
        async move {
            let start = Instant::now();
            let err = client
                .obtain("job", ms(60_000), &options)
                .await
                .unwrap_err();
            (err, start.elapsed())
        }
    });
    // Wait until the server itself sees the subscription, then kill that connection.
    let channel = release_channel("job");
    let subscribed = async || {
        let subscribers: (String, i64) = env.cmd(&["PUBSUB", "NUMSUB", channel]).await;
        subscribers.1 == 1
    };
    eventually(Duration::from_secs(30), "subscribed", subscribed).await;
    let killed: i64 = env.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    assert_eq!(killed, 1);
    // The subscriber reconnects and listens again for the waiters still waiting.
    eventually(Duration::from_secs(30), "subscribed again", subscribed).await;

    let (err, waited) = impatient.await.unwrap();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(waited < ms(500) + ms(1_500), "{waited:?}");

    // Each release wakes the next waiter: four hand-overs, each well within a second.
    held.release().await.unwrap();
    let released = Instant::now();
    for waiter in waiters {
        timeout(Duration::from_secs(30), waiter)
            .await
            .expect("handed over")
            .unwrap();
    }
    assert!(
        released.elapsed() < 4 * ms(1_500),
        "hand-overs took {:?}: woken by polling, not by events",
        released.elapsed()
    );
}
