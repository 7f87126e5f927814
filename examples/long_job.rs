//! Long work under a lock: the scoped helper keeps the lock alive with a watchdog and tells
//! the work when the lock is lost, so it can stop.
//!
//! Run with `cargo run --example long_job`. Uses `REDIS_URL` when set; otherwise starts a
//! throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::redis::AsyncCommands as _;
use lockset::{Client, LostSignal, Options};

/// Work that takes longer than the lock's TTL, in steps, stopping if the lock is lost.
async fn rebuild_index(lost: LostSignal, steps: u32) -> Result<u32, &'static str> {
    for step in 1..=steps {
        tokio::select! {
            () = lost.lost() => return Err("lock lost: stopped before finishing"),
            () = tokio::time::sleep(Duration::from_millis(200)) => println!("  step {step}/{steps}"),
        }
    }
    Ok(steps)
}

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url).await?;
    let ttl = Duration::from_millis(500);
    let options = Options::default().fencing();

    // 2 s of work under a 500 ms lock: the watchdog refreshes it every ~167 ms.
    println!("job 1: long work, lock kept alive");
    let outcome = client
        .with_lock(["index:rebuild"], ttl, &options, |lost| {
            rebuild_index(lost, 10)
        })
        .await?;
    println!("job 1 finished: {outcome:?}");

    // The same, but someone deletes the lock mid-way: the work is told and stops.
    println!("job 2: the lock is deleted by an operator half-way");
    let mut admin = lockset::redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let outcome = client
        .with_lock(["index:rebuild"], ttl, &options, |lost| async move {
            let work = rebuild_index(lost, 10);
            let sabotage = async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                let _: i64 = admin.del("index:rebuild").await.unwrap_or(0);
                std::future::pending::<()>().await
            };
            tokio::select! {
                outcome = work => outcome,
                () = sabotage => unreachable!(),
            }
        })
        .await?;
    println!("job 2 ended: {outcome:?}");
    Ok(())
}
