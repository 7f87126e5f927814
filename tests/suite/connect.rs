//! Connecting with `Client::connect`: what cannot work fails at once, within redis-rs's
//! connection timeout (1 s), not after the connection manager's retries (about 9 s): a port
//! nobody listens on, a database the server lacks, a `rediss://` URL for a plain-text port.

use crate::support;

use std::time::Duration;

use lockset::Client;
use support::RedisServer;
use tokio::time::Instant;

/// How long a failed connect may take: the connection timeout, and a loaded machine's slack.
const AT_ONCE: Duration = Duration::from_millis(1_500);

#[tokio::test]
async fn a_port_nobody_listens_on_fails_within_a_second() {
    let port = support::server::free_port();
    let start = Instant::now();
    let err = Client::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}: {err}");
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
async fn a_database_the_server_lacks_fails_at_once_naming_it() {
    let server = RedisServer::start();
    let start = Instant::now();
    let err = Client::connect(&format!("{}99", server.url()))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(took < AT_ONCE, "{took:?}: {err}");
    assert!(err.to_string().contains("DB index"), "{err}");
    // A setting to fix, not a server to wait for.
    assert!(!err.is_unavailable(), "{err:?}");
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn rediss_to_a_plain_port_fails_at_once_naming_tls() {
    let server = RedisServer::start();
    let url = server.url().replacen("redis://", "rediss://", 1);
    let start = Instant::now();
    let err = Client::connect(&url).await.unwrap_err();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}: {err}");
    assert!(err.to_string().contains("is this a TLS port?"), "{err}");
    // No answer in time, as a TLS server that hangs would give: a timeout still.
    assert!(err.is_unavailable(), "{err:?}");
}
