//! Obtain a lock, check its TTL, refresh it, release it.
//!
//! Run with `cargo run --example quickstart`. Uses `REDIS_URL` when set; otherwise starts
//! a throwaway local redis-server. Over TLS: `REDIS_URL=rediss://HOST:PORT/ cargo run
//! --features tls --example quickstart`, with `LOCKSET_TLS_CA_CERT=ca.pem` for a server whose
//! certificate a private CA signed (as for the `lockset` command).

#[path = "../tests/support/server.rs"]
mod server;

use std::time::Duration;

use lockset::{Client, Options};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // An error is shown as its message (who holds the key, for how long), not as the
    // `Debug` form a `main` returning `Result` prints.
    match quickstart().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("quickstart: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn quickstart() -> Result<(), lockset::Error> {
    let (url, _server) = server::url_or_start();
    let client = connect(&url).await?;

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

/// A client for `url`, trusting the CA in `LOCKSET_TLS_CA_CERT` when that is set.
#[cfg(feature = "tls")]
async fn connect(url: &str) -> Result<Client, lockset::Error> {
    match std::env::var_os("LOCKSET_TLS_CA_CERT") {
        Some(ca) => Client::connect_with_tls(url, &lockset::Tls::new().ca_file(ca)?).await,
        None => Client::connect(url).await,
    }
}

/// A client for `url` (`rediss://` URLs need the `tls` feature).
#[cfg(not(feature = "tls"))]
async fn connect(url: &str) -> Result<Client, lockset::Error> {
    Client::connect(url).await
}
