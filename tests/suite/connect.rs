//! Connecting with `Client::connect`: what cannot work fails at once, within redis-rs's
//! connection timeout (1 s), not after the connection manager's retries (about 9 s): a port
//! nobody listens on, a database the server lacks, a `rediss://` URL for a plain-text port.

use crate::support;

use std::time::Duration;

use lockset::{Client, Config, Options, QuorumConfig};
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

/// The ways a service makes a Redlock client from URLs: `Client::connect_quorum`, and a
/// `Config` naming `redlock`.
async fn connect_quorum(urls: &[String]) -> Result<Client, lockset::Error> {
    let quorum = QuorumConfig::default().node_timeout(Duration::from_secs(1));
    Client::connect_quorum(urls, quorum).await
}

async fn configured_quorum(urls: &[String]) -> Result<Client, lockset::Error> {
    let config = Config {
        redlock: urls.to_vec(),
        node_timeout: Some(Duration::from_secs(1)),
        ..Config::default()
    };
    config.connect().await
}

/// A minority of masters down when a service starts (one resetting connections, one paused)
/// costs nothing: the client connects and locks as fast as with every master up, not after
/// the connection manager's retries (16 s for the paused one); a master that answers again
/// joins the locks from then on.
#[tokio::test]
async fn a_quorum_connects_and_locks_with_a_minority_of_masters_down_at_the_start() {
    for way in 0..2 {
        let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        servers[3].kill();
        servers[4].pause();
        let start = Instant::now();
        let client = match way {
            0 => connect_quorum(&urls).await,
            _ => configured_quorum(&urls).await,
        }
        .expect("a majority of the masters is up");
        let lock = client
            .obtain("job", Duration::from_secs(10), &Options::default())
            .await
            .expect("a majority takes the lock");
        let took = start.elapsed();
        assert!(
            took < AT_ONCE,
            "way {way}: connected and locked in {took:?}"
        );
        lock.release().await.expect("release");

        servers[4].resume();
        let lock = client
            .obtain("again", Duration::from_secs(10), &Options::default())
            .await
            .expect("obtain");
        tokio::time::timeout(Duration::from_secs(10), client.background_idle())
            .await
            .expect("every master's part done within 10 s");
        let held: String = support::server::cli(servers[4].port(), &["GET", "again"]);
        assert!(
            held.contains(lock.token()),
            "way {way}: the resumed master has the lock: {held:?}"
        );
        lock.release().await.expect("release");
    }
}

/// With a majority of the masters refusing connections, no client is made: the error says
/// so, at once.
#[tokio::test]
async fn a_quorum_without_a_majority_up_fails_at_once_saying_so() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    // Stopped, their ports free: connections are refused (a killed test server's port stays
    // held, which resets them instead).
    servers[1].stop();
    servers[2].stop();
    for (way, err) in refused_both_ways(&urls).await {
        assert!(err.is_unavailable(), "way {way}: {err:?}");
        assert!(err.to_string().contains("majority"), "way {way}: {err}");
    }
}

/// Connecting a quorum of `urls` both ways, each refused at once: the errors, by way.
async fn refused_both_ways(urls: &[String]) -> Vec<(usize, lockset::Error)> {
    let mut refused = Vec::new();
    for way in 0..2 {
        let start = Instant::now();
        let err = match way {
            0 => connect_quorum(urls).await,
            _ => configured_quorum(urls).await,
        }
        .unwrap_err();
        let took = start.elapsed();
        assert!(took < AT_ONCE, "way {way}: {took:?}: {err}");
        refused.push((way, err));
    }
    refused
}

/// A master that asks for a password none was given (`NOAUTH`) is a setting to fix, as a
/// wrong password is: no client, at once, rather than a quorum that silently runs without
/// it on every operation. (A single server's client is told at its first operation:
/// `auth::a_password_or_an_acl_user_in_the_url_locks_and_wakes_waiters`.)
#[tokio::test]
async fn a_server_wanting_a_password_none_was_given_fails_the_connect() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    support::server::cli(
        servers[2].port(),
        &["CONFIG", "SET", "requirepass", "secret"],
    );
    for (way, err) in refused_both_ways(&urls).await {
        assert!(err.to_string().contains("NOAUTH"), "way {way}: {err}");
        assert!(!err.is_unavailable(), "way {way}: {err:?}");
    }
}

/// A `rediss://` master that gives no TLS handshake in time (a host powered off, or cut
/// off) is down, as one refusing connections is: not a setting to fix. With no majority
/// left, the connect is unavailable (worth retrying), not refused for good.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_tls_master_that_never_answers_is_down_not_misconfigured() {
    let server = RedisServer::start();
    let silent: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut urls = vec![server.url()];
    for listener in &silent {
        urls.push(format!("rediss://{}/", listener.local_addr().unwrap()));
    }
    let start = Instant::now();
    let err = connect_quorum(&urls).await.unwrap_err();
    let took = start.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("majority"), "{err}");
    // The connection timeout (1 s), and a loaded machine's slack.
    assert!(took < Duration::from_millis(2_500), "{took:?}");
}
