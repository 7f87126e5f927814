//! Logging in: a password alone (the default user's) or an ACL user and password, given in
//! the URL, for the lock connection and the release events alike. A wrong password is a
//! clear error, never retried until a deadline: at connect (at once, on one server and a
//! cluster), for an obtain without a login (NOAUTH, at once), and when the password changed
//! under a connected client, on one server and a Redlock quorum: the obtain ends with the
//! refusal as soon as redis-rs's `ConnectionManager` gives up reconnecting (it tries 6 times
//! whatever the error, about 9 s here), long before a 30 s deadline.

use crate::support;

use lockset::{Client, Options, QuorumConfig, Retry};
use support::{RedisServer, ms};
use tokio::time::Instant;

/// An obtain that would retry for 30 s if it took the error for a passing one.
fn patient() -> Options {
    Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(30_000))
}

/// Well before [`patient`]'s deadline, and after the reconnection redis-rs's connection
/// manager tries, whatever failed (6 times with growing pauses: about 9 s).
const REFUSED_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// A refused login: not "held by another", not "unavailable", and said as such.
fn assert_refused(err: &lockset::Error) {
    assert!(!err.is_not_obtained() && !err.is_not_held(), "{err:?}");
    let said = err.to_string();
    assert!(
        said.contains("WRONGPASS")
            || said.contains("authentication failed")
            || said.contains("NOAUTH"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_or_an_acl_user_in_the_url_locks_and_wakes_waiters() {
    let server = RedisServer::start_with(None, &["--requirepass", "s3cret"]);
    let port = server.port();
    // An ACL user with every key and channel (Redis 7 gives new users no channel).
    let user = [
        "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all",
    ];
    assert!(support::server::cli_as(port, Some("s3cret"), &user).contains("OK"));

    for login in [":s3cret@", "app:app-pw@"] {
        let url = format!("redis://{login}127.0.0.1:{port}/");
        let holder = Client::connect(&url).await.unwrap();
        let client = Client::connect(&url).await.unwrap();
        support::a_release_wakes(&holder, &client, "k").await;
    }

    for login in [":wrong@", "app:wrong@", "nobody:s3cret@"] {
        let url = format!("redis://{login}127.0.0.1:{port}/");
        let started = Instant::now();
        let err = Client::connect(&url).await.unwrap_err();
        assert!(
            started.elapsed() < ms(2_000),
            "{login}: {:?}",
            started.elapsed()
        );
        assert_refused(&err);
    }
    // No login at all: the server lets the connection in and refuses every command.
    let client = Client::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap();
    let started = Instant::now();
    let err = client.obtain("k", ms(1_000), &patient()).await.unwrap_err();
    assert!(started.elapsed() < ms(2_000), "{:?}", started.elapsed());
    assert_refused(&err);
}

/// The password changes while a client is connected: its next obtain reconnects, is refused,
/// and says so at once instead of retrying until its 10 s deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_under_a_connected_client_fails_at_once() {
    let server = RedisServer::start_with(None, &["--requirepass", "old"]);
    let url = format!("redis://:old@127.0.0.1:{}/", server.port());
    let client = Client::connect(&url).await.unwrap();
    client.obtain("k", ms(1_000), &patient()).await.unwrap();
    rotate_password(server.port(), "old", "new");

    let started = Instant::now();
    let err = client
        .obtain("k2", ms(1_000), &patient())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );
    assert_refused(&err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_refused_by_a_majority_fails_at_once() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(None, &["--requirepass", "old"]))
        .collect();
    let mut masters = Vec::new();
    for server in &servers {
        let url = format!("redis://:old@127.0.0.1:{}/", server.port());
        masters.push(Client::connect(&url).await.unwrap());
    }
    let redlock = Client::quorum(masters, QuorumConfig::default()).unwrap();
    redlock.obtain("q", ms(5_000), &patient()).await.unwrap();
    // One master refusing is a master down: the other two still decide.
    rotate_password(servers[0].port(), "old", "new");
    let lock = redlock.obtain("q1", ms(5_000), &patient()).await.unwrap();
    lock.release().await.unwrap();
    // Two refusing: no majority can be had until the setting is fixed.
    rotate_password(servers[1].port(), "old", "new");
    let started = Instant::now();
    let err = redlock
        .obtain("q2", ms(5_000), &patient())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}: {err:?}",
        started.elapsed()
    );
    assert!(matches!(err, lockset::Error::Quorum { .. }), "{err:?}");
    assert!(
        format!("{err:?}").contains("WRONGPASS") || format!("{err:?}").contains("uthentication"),
        "{err:?}"
    );
}

/// A cluster whose nodes want a password: locks and release events with it in the seed URLs;
/// a wrong one fails the connect at once. (A password changed under a connected cluster
/// client is not told apart: redis-rs's cluster connection then answers "No connections
/// found" while it reconnects in the background, and an obtain retries that until its
/// deadline.)
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_password_locks_and_refuses_a_wrong_one_at_once() {
    let cluster = support::cluster::Cluster::start();
    for node in &cluster.nodes {
        support::server::cli(node.port(), &["CONFIG", "SET", "requirepass", "pw"]);
    }
    let urls = |password: &str| -> Vec<String> {
        cluster
            .nodes
            .iter()
            .map(|node| format!("redis://:{password}@127.0.0.1:{}/", node.port()))
            .collect()
    };
    let client = Client::connect_cluster(urls("pw")).await.unwrap();
    support::a_release_wakes(&client, &client, "{c}:a").await;

    let started = Instant::now();
    let err = Client::connect_cluster(urls("wrong")).await.unwrap_err();
    assert!(
        started.elapsed() < ms(3_000),
        "{:?}: {err:?}",
        started.elapsed()
    );
    assert_refused(&err);
    for node in &cluster.nodes {
        support::server::cli_as(
            node.port(),
            Some("pw"),
            &["CONFIG", "SET", "requirepass", ""],
        );
    }
}

/// Sets the default user's password from `old` to `new` on the server at `port`, and drops
/// every client's connection: they must log in again.
fn rotate_password(port: u16, old: &str, new: &str) {
    let said = support::server::cli_as(port, Some(old), &["CONFIG", "SET", "requirepass", new]);
    assert!(said.contains("OK"), "{said}");
    support::server::cli_as(
        port,
        Some(new),
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    );
}

/// A server whose scripts are renamed away (`rename-command`) would answer a script with
/// "unknown command", echoing its arguments: the lock's value, token included. An obtain
/// finds out before it writes (see `restricted.rs`), and its error shows neither token nor
/// metadata; the redaction of echoed values is unit-tested in `error.rs`.
#[tokio::test]
async fn a_server_error_that_echoes_the_arguments_never_shows_the_token() {
    let renamed = [
        "--rename-command",
        "EVALSHA",
        "",
        "--rename-command",
        "EVAL",
        "",
    ];
    let server = RedisServer::start_with(None, &renamed);
    let client = Client::connect(&server.url()).await.unwrap();
    let options = Options::default()
        .metadata("meta-marker")
        .token("token-marker");
    let err = client.obtain("k", ms(10_000), &options).await.unwrap_err();
    assert!(err.is_scripts_refused(), "{err:?}");
    let (shown, debug) = (err.to_string(), format!("{err:?}"));
    for marker in ["meta-marker", "token-marker"] {
        assert!(
            !shown.contains(marker) && !debug.contains(marker),
            "{shown} / {debug}"
        );
    }
}
