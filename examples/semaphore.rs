//! A semaphore: at most 3 exports at once, across every process that uses the key. Each
//! permit expires on its own, so a crashed exporter frees its permit at its TTL.
//!
//! Run with `cargo run --example semaphore`. Uses `REDIS_URL` when set; otherwise starts a
//! throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockset::{Client, Mode, Options, Retry};

const EXPORTS: Mode = Mode::Permit { limit: 3 };

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for job in 0..8 {
        // One client per job, as separate processes would have.
        let client = Client::connect(&url).await?;
        let (running, most) = (running.clone(), most.clone());
        jobs.push(tokio::spawn(async move {
            let options = Options::default()
                .retry(Retry::linear(Duration::from_secs(1)))
                .timeout(Duration::from_secs(60))
                .metadata(format!("export-{job}"));
            client
                .with_lock(
                    [("exports", EXPORTS)],
                    Duration::from_secs(10),
                    &options,
                    |_lost| async {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        println!("export {job} runs ({now} at once)");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                    },
                )
                .await
        }));
    }
    for job in jobs {
        job.await.expect("a job")?;
    }
    println!(
        "8 exports done, at most {} at once",
        most.load(Ordering::SeqCst)
    );
    Ok(())
}
