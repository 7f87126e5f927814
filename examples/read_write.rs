//! Read/write locks over a set of keys: write one order while reading the catalog and the
//! prices, all or nothing, beside other readers; a writer of the catalog waits for them.
//!
//! Run with `cargo run --example read_write`. Uses `REDIS_URL` when set; otherwise starts a
//! throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Mode, Options, Retry};

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url).await?;
    let ttl = Duration::from_secs(10);

    // Write order 42, read the catalog and the prices: one atomic obtain.
    let checkout = client
        .obtain_multi(
            [
                ("{shop}:order:42", Mode::Exclusive),
                ("{shop}:catalog", Mode::Shared),
                ("{shop}:prices", Mode::Shared),
            ],
            ttl,
            &Options::default(),
        )
        .await?;
    println!(
        "checkout holds {:?} as {:?}",
        checkout.keys(),
        checkout.modes()
    );

    // Another reader of the catalog gets in at once.
    let browse = client
        .obtain(("{shop}:catalog", Mode::Shared), ttl, &Options::default())
        .await?;
    println!("a second reader of the catalog is in");

    // A writer of the catalog waits for both readers; it is woken by the last release.
    let writer = tokio::spawn({
        let client = client.clone();
        async move {
            let options = Options::default()
                .retry(Retry::linear(Duration::from_secs(5)))
                .timeout(Duration::from_secs(30));
            client.obtain("{shop}:catalog", ttl, &options).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // While the writer waits, a new reader that writes nothing waits behind it.
    let late = client
        .obtain(("{shop}:catalog", Mode::Shared), ttl, &Options::default())
        .await;
    println!(
        "a new reader while the writer waits: {}",
        late.err().map_or("in".into(), |e| e.to_string())
    );

    checkout.release().await?;
    browse.release().await?;
    let update = writer.await.expect("the writer task")?;
    println!("the catalog writer is in, alone");
    update.release().await?;
    Ok(())
}
