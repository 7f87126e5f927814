//! Retry strategies and deadlines: wait for a busy lock, or give up in time.
//!
//! Run with `cargo run --example retry`. Uses `REDIS_URL` when set; otherwise starts a
//! throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Jitter, Options, Retry};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url).await?;

    // Someone holds the lock for 500 ms.
    let _busy = client
        .obtain("retry:job", Duration::from_millis(500), &Options::default())
        .await?;

    // Exponential backoff with full jitter, at most 20 retries, for at most 2 seconds.
    let patient = Options::default()
        .retry(
            Retry::exponential(Duration::from_millis(10), Duration::from_millis(200))
                .jitter(Jitter::Full)
                .limit(20),
        )
        .timeout(Duration::from_secs(2));
    let start = Instant::now();
    let lock = client
        .obtain("retry:job", Duration::from_secs(5), &patient)
        .await?;
    println!(
        "obtained after {:?}, once the holder's TTL ran out",
        start.elapsed()
    );

    // Too impatient: the deadline passes while the lock is held.
    let impatient = Options::default()
        .retry(Retry::linear(Duration::from_millis(50)))
        .timeout(Duration::from_millis(300));
    let err = client
        .obtain("retry:job", Duration::from_secs(5), &impatient)
        .await
        .expect_err("held for 5 s");
    println!(
        "gave up: {err} (not obtained: {}, deadline: {})",
        err.is_not_obtained(),
        err.is_deadline_exceeded()
    );

    // The same policy, from a config file.
    let from_config: Retry = serde_json::from_str(
        r#"{"limit": {"retries": 3, "strategy": {"linear": {"interval": "100ms"}}}}"#,
    )
    .expect("valid retry policy");
    println!("from config: {from_config:?}");

    lock.release().await?;
    Ok(())
}
