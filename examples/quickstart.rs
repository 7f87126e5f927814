//! Obtain a lock, check its TTL, refresh it, release it.
//!
//! Run with `cargo run --example quickstart`. Uses `REDIS_URL` when set; otherwise starts
//! a throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Options};

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url).await?;

    let options = Options::default().metadata("quickstart");
    let lock = client
        .obtain("quickstart:report", Duration::from_secs(10), &options)
        .await?;
    println!("obtained {:?} (metadata {:?})", lock.key(), lock.metadata());

    // Someone else trying now is turned away.
    let err = client
        .obtain(
            "quickstart:report",
            Duration::from_secs(10),
            &Options::default(),
        )
        .await
        .expect_err("the key is held");
    println!("a second obtain fails: {err}");

    let left = lock.ttl().await?.expect("still held");
    println!("time left: {left:?}");

    lock.refresh(Duration::from_secs(30), &Options::default())
        .await?;
    println!(
        "after refresh: {:?}",
        lock.ttl().await?.expect("still held")
    );

    lock.release().await?;
    println!("released");
    Ok(())
}
