//! Lock several keys at once, all or nothing.
//!
//! Run with `cargo run --example multi_key`. Uses `REDIS_URL` when set; otherwise starts a
//! throwaway local redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Options};

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = Client::connect(&url).await?;
    let ttl = Duration::from_secs(10);
    let options = Options::default();

    // A common hash tag keeps the keys in one slot, so this also works on a cluster.
    let transfer = client
        .obtain_multi(["{user42}:cart", "{user42}:wallet"], ttl, &options)
        .await?;
    println!("locked {:?}", transfer.keys());

    // An overlapping set fails as a whole and touches none of its keys.
    let err = client
        .obtain_multi(["{user42}:wallet", "{user42}:profile"], ttl, &options)
        .await
        .expect_err("the wallet is held");
    println!("overlapping set refused: {err}");

    // A disjoint set is independent.
    let profile = client.obtain("{user42}:profile", ttl, &options).await?;
    println!("locked {:?} too", profile.keys());

    transfer.release().await?;
    profile.release().await?;
    println!("released both");
    Ok(())
}
