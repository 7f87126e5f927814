//! Locks from synchronous code (feature `blocking`): no async runtime of yours, plain threads
//! that block, and a watchdog that keeps a lock alive while a thread does blocking work.
//!
//! Run with `cargo run --example blocking --features blocking`. Uses `REDIS_URL` when set;
//! otherwise starts a throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::Options;
use lockset::blocking::Client;

fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url)?;
    let ttl = Duration::from_millis(500);

    // Work longer than the TTL: the watchdog refreshes the lock on the client's own runtime
    // while this thread sleeps; the work checks the lost signal between steps.
    let options = Options::default().metadata("blocking-example");
    let steps = client.with_lock(["{index}:rebuild"], ttl, &options, |lost| {
        for step in 1..=5 {
            if lost.is_lost() {
                return Err("lock lost: stopped before finishing");
            }
            std::thread::sleep(Duration::from_millis(200));
            println!("  step {step}/5");
        }
        Ok(5)
    })?;
    println!("with_lock: {steps:?}");

    // Several threads, one client: each takes its turn at one key.
    let options = Options::default()
        .retry(lockset::Retry::linear(Duration::from_millis(10)))
        .timeout(Duration::from_secs(10));
    let threads: Vec<_> = (1..=3)
        .map(|worker| {
            let (client, options) = (client.clone(), options.clone());
            std::thread::spawn(move || -> Result<(), lockset::Error> {
                let lock = client.obtain("{index}:rebuild", ttl, &options)?;
                println!("worker {worker} holds the lock");
                std::thread::sleep(Duration::from_millis(50));
                lock.release()
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a worker panicked")?;
    }

    // A guard releases when dropped, also from a plain thread.
    let guard = client
        .obtain("{index}:rebuild", ttl, &Options::default())?
        .into_guard();
    drop(guard);
    client.wait_background(Duration::from_secs(2))?;
    let again = client.obtain("{index}:rebuild", ttl, &Options::default())?;
    again.release()?;
    println!("released on drop, obtained again");
    Ok(())
}
