//! Redlock: one lock over five independent Redis masters, surviving the loss of two.
//!
//! Run with `cargo run --example redlock`. Uses the comma-separated URLs in `REDLOCK_URLS`
//! when set; otherwise starts five throwaway local redis-servers.

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Options, QuorumConfig};

#[tokio::main]
async fn main() -> Result<(), lockset::Error> {
    let mut servers = Vec::new();
    let urls: Vec<String> = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.is_empty() => urls.split(',').map(str::to_owned).collect(),
        _ => {
            servers = (0..5).map(|_| server::RedisServer::start()).collect();
            servers.iter().map(server::RedisServer::url).collect()
        }
    };
    // A minority of the masters may be down now: they join once they answer.
    let redlock = Client::connect_quorum(&urls, QuorumConfig::default()).await?;
    let ttl = Duration::from_secs(10);

    let lock = redlock
        .obtain_multi(["{report}:a", "{report}:b"], ttl, &Options::default())
        .await?;
    let valid_for = lock.valid_until() - tokio::time::Instant::now();
    println!(
        "obtained on a majority of {} masters, valid for {valid_for:?}",
        urls.len()
    );

    if servers.len() == 5 {
        // Two masters die: a majority (3 of 5) still holds the lock.
        servers[0].stop();
        servers[1].stop();
        println!("two masters killed");
    }
    lock.refresh(ttl, &Options::default()).await?;
    println!("refreshed on the survivors; {:?} left", lock.ttl().await?);
    lock.release().await?;
    println!("released");

    if servers.len() == 5 {
        // A third one dies: no majority, no lock.
        servers[2].stop();
        let err = redlock
            .obtain("{report}:a", ttl, &Options::default())
            .await
            .expect_err("only two of five masters are left");
        println!("with three masters down: {err}");
    }
    Ok(())
}
