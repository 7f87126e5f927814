mod support;

use std::time::Duration;

use lockset::{Mode, Options, Retry};
use support::{Env, ms};
use tokio::time::Instant;

const READ: Mode = Mode::Shared;

fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(ms(60_000)))
        .timeout(ms(120_000))
}

/// A local writer with a short critical section is woken together with local readers; its
/// release comes while the readers' attempts are in flight: one stored Notify permit.
#[tokio::test]
async fn readers_in_flight_during_a_local_writers_release() {
    let env = Env::start().await;
    for round in 0..10 {
        eprintln!("round {round}");
        one_round(&env).await;
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_in_flight_mt() {
    let env = Env::start().await;
    for round in 0..10 {
        eprintln!("round {round}");
        one_round(&env).await;
    }
}

async fn one_round(env: &Env) {
    let other = env.other_client().await;
    let holder = other
        .obtain("doc", ms(20_000), &Options::default())
        .await
        .unwrap();
    let writer = tokio::spawn({
        let client = env.client.clone();
        async move {
            let lock = client
                .obtain("doc", ms(20_000), &slow_polling())
                .await
                .unwrap();
            lock.release().await.unwrap();
            Instant::now()
        }
    });
    tokio::time::sleep(ms(300)).await;
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let client = env.client.clone();
            tokio::spawn(async move {
                let lock = client
                    .obtain(("doc", READ), ms(20_000), &slow_polling())
                    .await;
                let at = Instant::now();
                lock.unwrap().release().await.unwrap();
                (at, ())
            })
        })
        .collect();
    tokio::time::sleep(ms(500)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let w = writer.await.unwrap();
    eprintln!("writer done after {:?}", w - released);
    if w - released > Duration::from_secs(5) {
        eprintln!("WRITER SLEPT");
    }
    let mut slow = 0;
    for r in readers {
        let (at, ()) = tokio::time::timeout(ms(40_000), r).await.unwrap().unwrap();
        let waited = at - released;
        eprintln!("reader after {waited:?}");
        if waited > Duration::from_secs(5) {
            slow += 1;
        }
    }
    assert_eq!(slow, 0, "readers slept through the writer's release");
}

/// Two local readers between attempts (their attempt saw the key held; they have not gone
/// back to sleep yet) when the holder's release is announced: `Channel::wake` calls
/// `notify_one` twice, but a `Notify` stores one permit, so one reader sleeps on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_readers_between_attempts_get_one_wake_up() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let holder = other
        .obtain("doc", ms(20_000), &Options::default())
        .await
        .unwrap();
    // The writer in the holder's client gets the key by local hand-over, ahead of the readers.
    let writer = tokio::spawn({
        let other = other.clone();
        async move {
            let lock = other
                .obtain("doc", ms(20_000), &slow_polling())
                .await
                .unwrap();
            tokio::time::sleep(ms(100)).await;
            lock.release().await.unwrap();
            Instant::now()
        }
    });
    tokio::time::sleep(ms(300)).await;
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let client = env.client.clone();
            // After a wake-up, the reader is slow to go back to sleep (a busy scheduler).
            let t0 = Instant::now();
            let options = slow_polling().on_retry(move |event| {
                eprintln!(
                    "{:?} retry attempt {} delay {:?} {:?}",
                    t0.elapsed(),
                    event.attempt,
                    event.delay,
                    std::thread::current().id()
                );
                if event.attempt >= 3 {
                    tokio::task::block_in_place(|| std::thread::sleep(ms(400)));
                }
            });
            tokio::spawn(async move {
                let lock = client.obtain(("doc", READ), ms(20_000), &options).await;
                let at = Instant::now();
                tokio::time::sleep(ms(8_000)).await;
                lock.unwrap().release().await.unwrap();
                at
            })
        })
        .collect();
    tokio::time::sleep(ms(500)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let w = writer.await.unwrap();
    eprintln!("writer done after {:?}", w - released);
    let mut slow = 0;
    for r in readers {
        let at = tokio::time::timeout(ms(40_000), r).await.unwrap().unwrap();
        eprintln!("reader after {:?}", at - released);
        if at - released > Duration::from_secs(5) {
            slow += 1;
        }
    }
    assert_eq!(slow, 0, "a reader slept through the writer's release");
}

async fn chain(env: &Env, mode: Mode, n: usize) -> usize {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let retries = Arc::new(AtomicUsize::new(0));
    let holder = env
        .client
        .obtain(("sem", mode), ms(20_000), &Options::default())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let client = env.client.clone();
            let r = retries.clone();
            let options = slow_polling().on_retry(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
            });
            tokio::spawn(async move {
                let lock = client
                    .obtain(("sem", mode), ms(20_000), &options)
                    .await
                    .unwrap();
                tokio::time::sleep(ms(20)).await;
                lock.release().await.unwrap();
            })
        })
        .collect();
    tokio::time::sleep(ms(500)).await;
    let before = retries.load(Ordering::SeqCst);
    let t = Instant::now();
    holder.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(ms(60_000), t).await.unwrap().unwrap();
    }
    let after = retries.load(Ordering::SeqCst) - before;
    eprintln!(
        "{mode}: {n} waiters, {after} failed attempts after the first release, {:?}",
        t.elapsed()
    );
    after
}

#[tokio::test]
async fn herd() {
    let env = Env::start().await;
    chain(&env, Mode::Exclusive, 20).await;
    chain(&env, Mode::Permit { limit: 1 }, 20).await;
    chain(&env, Mode::Permit { limit: 2 }, 20).await;
}
