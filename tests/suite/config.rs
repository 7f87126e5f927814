//! `Config`: a client's settings from a configuration file: round trips through TOML and
//! JSON with every field set, the flat retry form, typed errors before anything is sent,
//! and a client made from it on each topology.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockset::{
    Client, Config, Error, InvalidInput, Jitter, LockSettings, Options, Retry, SentinelSettings,
    TlsFiles, parse_value,
};

use crate::support::RedisServer;
use crate::support::ms;
use crate::support::sentinel::Failover;

/// What `server` stores at `key`.
async fn get(server: &RedisServer, key: &str) -> Option<String> {
    let mut conn = crate::support::connect(server).await;
    lockset::redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// A configuration with every field set (one of each kind: it cannot connect, it only
/// round-trips).
fn every_field() -> Config {
    Config {
        url: Some("redis://127.0.0.1:6379/".to_owned()),
        redlock: vec![
            "redis://10.0.0.1/".to_owned(),
            "redis://10.0.0.2/".to_owned(),
        ],
        cluster: vec!["redis://10.0.1.1:7000/".to_owned()],
        connect_timeout: Some(ms(750)),
        response_timeout: Some(ms(400)),
        connect_retries: Some(2),
        release_events: false,
        replicas: Some(1),
        replication_timeout: Some(ms(300)),
        node_timeout: Some(ms(200)),
        drift_factor: Some(0.02),
        sentinel: Some(SentinelSettings {
            urls: vec!["redis://10.0.2.1:26379/".to_owned()],
            master: "locks".to_owned(),
            username: Some("locker".to_owned()),
            password: Some("secret".to_owned()),
            db: 2,
        }),
        tls: Some(TlsFiles {
            ca_file: Some(PathBuf::from("/etc/redis/ca.pem")),
            cert_file: Some(PathBuf::from("/etc/redis/client.pem")),
            key_file: Some(PathBuf::from("/etc/redis/client.key")),
        }),
        lock: LockSettings {
            ttl: Duration::from_secs(30),
            retry: Retry::exponential(ms(10), ms(1_000))
                .jitter(Jitter::Full)
                .limit(5),
            timeout: Some(Duration::from_secs(5)),
            fair: false,
            metadata: Some("billing-worker".to_owned()),
            waiter_lease: Some(Duration::from_secs(4)),
            watchdog_interval: Some(Duration::from_secs(3)),
        },
    }
}

#[test]
fn every_field_round_trips_through_toml_and_json() {
    let config = every_field();
    let text = toml::to_string(&config).unwrap();
    assert_eq!(toml::from_str::<Config>(&text).unwrap(), config, "{text}");
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<Config>(&json).unwrap(),
        config,
        "{json}"
    );
    // The defaults too, and an empty file is the defaults.
    let text = toml::to_string(&Config::default()).unwrap();
    assert_eq!(toml::from_str::<Config>(&text).unwrap(), Config::default());
    assert_eq!(toml::from_str::<Config>("").unwrap(), Config::default());
}

#[test]
fn the_retry_is_written_flat() {
    let text = r#"
        url = "redis://127.0.0.1/"
        [lock]
        ttl = "30s"
        retry = { backoff = "exponential", min = "10ms", max = "1s", jitter = "full", retries = 5 }
    "#;
    let config: Config = toml::from_str(text).unwrap();
    assert_eq!(
        config.lock.retry,
        Retry::exponential(ms(10), ms(1_000))
            .jitter(Jitter::Full)
            .limit(5)
    );
    // Written back as one table, not nested strategies.
    let written = toml::to_string(&config).unwrap();
    assert!(
        written.contains("[lock.retry]\nbackoff = \"exponential\"\nmin = \"10ms\"\nmax = \"1s\"\njitter = \"full\"\nretries = 5\n"),
        "{written}"
    );
    for (retry, expected) in [
        (r#"{ backoff = "none" }"#, Retry::NoRetry),
        (
            r#"{ backoff = "linear", interval = "50ms" }"#,
            Retry::linear(ms(50)),
        ),
        (
            r#"{ backoff = "intervals", intervals = ["10ms", "1s"] }"#,
            Retry::intervals([ms(10), ms(1_000)]),
        ),
    ] {
        let config: Config = toml::from_str(&format!("[lock]\nretry = {retry}")).unwrap();
        assert_eq!(config.lock.retry, expected, "{retry}");
        let back: Config = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
        assert_eq!(back, config);
    }
}

#[test]
fn mistakes_in_a_file_are_named() {
    let cases = [
        (
            "[lock]\nretry = { backoff = \"exponential\", min = \"10ms\" }",
            "max",
        ),
        (
            "[lock]\nretry = { backoff = \"linear\", min = \"10ms\" }",
            "min",
        ),
        ("[lock]\nretry = { backoff = \"sometimes\" }", "sometimes"),
        ("urls = [\"redis://a/\"]", "urls"),
        ("connect_timeout = \"soon\"", "soon"),
    ];
    for (text, named) in cases {
        let err = toml::from_str::<Config>(text).unwrap_err().to_string();
        assert!(err.contains(named), "{text}: {err}");
    }
}

#[tokio::test]
async fn no_topology_or_two_is_invalid_input_before_anything_is_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let two = Config {
        redlock: vec![url.clone()],
        ..Config::url(&url)
    };
    for config in [Config::default(), two] {
        let start = Instant::now();
        let err = config.connect().await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput(InvalidInput::Config { .. })),
            "{err:?}"
        );
        assert!(start.elapsed() < ms(100), "{:?}", start.elapsed());
    }
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing was sent");
}

/// Every mistake that can be found without a server is found before anything is sent: a
/// setting the topology does not use, and the settings' own rules.
#[tokio::test]
async fn settings_the_topology_does_not_use_or_breaks_are_refused_before_sending() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let sentinel = || {
        Some(SentinelSettings {
            urls: vec![url.clone()],
            master: "locks".to_owned(),
            ..SentinelSettings::default()
        })
    };
    let cases = [
        (
            "a zero response timeout",
            Config {
                response_timeout: Some(ms(0)),
                ..Config::url(&url)
            },
        ),
        (
            "a zero connect timeout",
            Config {
                connect_timeout: Some(ms(0)),
                ..Config::url(&url)
            },
        ),
        (
            "node_timeout with url",
            Config {
                node_timeout: Some(ms(100)),
                ..Config::url(&url)
            },
        ),
        (
            "drift_factor with url",
            Config {
                drift_factor: Some(0.01),
                ..Config::url(&url)
            },
        ),
        (
            "node_timeout with a cluster",
            Config {
                cluster: vec![url.clone()],
                node_timeout: Some(ms(100)),
                ..Config::default()
            },
        ),
        (
            "connect_retries with a cluster",
            Config {
                cluster: vec![url.clone()],
                connect_retries: Some(0),
                ..Config::default()
            },
        ),
        (
            "connect_retries with sentinel",
            Config {
                sentinel: sentinel(),
                connect_retries: Some(2),
                ..Config::default()
            },
        ),
        (
            "replication_timeout without replicas",
            Config {
                replication_timeout: Some(ms(500)),
                ..Config::url(&url)
            },
        ),
        (
            "a drift factor out of range",
            Config {
                redlock: vec![url.clone()],
                drift_factor: Some(2.0),
                ..Config::default()
            },
        ),
        (
            "a zero node timeout",
            Config {
                redlock: vec![url.clone()],
                node_timeout: Some(ms(0)),
                ..Config::default()
            },
        ),
        (
            "a zero replication timeout",
            Config {
                replicas: Some(1),
                replication_timeout: Some(ms(0)),
                ..Config::url(&url)
            },
        ),
        (
            "a zero replication timeout behind Sentinel",
            Config {
                sentinel: sentinel(),
                replication_timeout: Some(ms(0)),
                ..Config::default()
            },
        ),
    ];
    for (what, config) in cases {
        let start = Instant::now();
        let err = config.connect().await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{what}: {err:?}");
        assert!(start.elapsed() < ms(100), "{what}: {:?}", start.elapsed());
    }
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing was sent");
}

#[test]
fn debug_shows_no_password() {
    let config = Config {
        sentinel: Some(SentinelSettings {
            urls: vec!["redis://:sentinel-secret@10.0.0.1:26379/".to_owned()],
            master: "locks".to_owned(),
            password: Some("data-secret".to_owned()),
            ..SentinelSettings::default()
        }),
        ..Config::url("redis://user:url-secret@10.0.0.2/")
    };
    let shown = format!("{config:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(
        shown.contains("redis://user:<redacted>@10.0.0.2/"),
        "{shown}"
    );
}

#[test]
fn a_retry_without_a_pause_is_refused_in_a_file() {
    for retry in [
        r#"{ backoff = "linear", interval = "0s" }"#,
        r#"{ backoff = "exponential", min = "0s", max = "0s" }"#,
        r#"{ backoff = "intervals", intervals = [] }"#,
    ] {
        let err = toml::from_str::<Config>(&format!("[lock]\nretry = {retry}")).unwrap_err();
        assert!(
            err.to_string().contains("retr") || err.to_string().contains("empty"),
            "{retry}: {err}"
        );
    }
}

/// A configured client on one server: the lock's defaults (metadata, retry, deadline) are
/// the obtain's options.
#[tokio::test]
async fn a_configured_client_locks_with_the_configured_defaults() {
    let server = RedisServer::start();
    let text = format!(
        r#"
        url = "{}"
        connect_timeout = "500ms"
        response_timeout = "2s"
        connect_retries = 1
        [lock]
        ttl = "5s"
        metadata = "billing-worker"
        timeout = "300ms"
        retry = {{ backoff = "linear", interval = "20ms" }}
    "#,
        server.url()
    );
    let config: Config = toml::from_str(&text).unwrap();
    let client = config.connect().await.unwrap();
    let lock = client
        .obtain("invoice", config.lock.ttl, &config.options())
        .await
        .unwrap();
    let value = get(&server, "invoice").await.unwrap();
    let (_, metadata) = parse_value(&value).unwrap();
    assert_eq!(metadata, "billing-worker");
    let start = Instant::now();
    let err = client
        .obtain("invoice", config.lock.ttl, &config.options())
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert!(err.is_not_obtained(), "{err:?}");
    assert!(
        waited >= ms(280) && waited < ms(1_000),
        "retried until the configured 300 ms timeout: {waited:?}"
    );
    lock.release().await.unwrap();
}

/// Connects as `config` says and obtains "report" once; `check` looks while it is held.
async fn lock_once(config: &Config, check: impl AsyncFnOnce(&Client)) {
    let client = config.connect().await.unwrap();
    let lock = client
        .obtain("report", ms(5_000), &Options::default())
        .await
        .unwrap();
    check(&client).await;
    lock.release().await.unwrap();
}

#[tokio::test]
async fn a_configured_redlock_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let config = Config {
        redlock: servers.iter().map(RedisServer::url).collect(),
        // Generous for a loaded machine (see `redlock.rs`'s `config`).
        node_timeout: Some(ms(1_000)),
        ..Config::default()
    };
    lock_once(&config, async |client| {
        // The obtain returned once a majority agreed; the last master's write may still be
        // on its way (it failed CI once, 2026-11-29), and lands with the client's background.
        let mut holding = 0;
        for server in &servers {
            holding += usize::from(get(server, "report").await.is_some());
        }
        assert!(holding >= 2, "on a majority at once: {holding} of 3");
        tokio::time::timeout(ms(10_000), client.background_idle())
            .await
            .expect("the last master's write done within 10 s");
        for server in &servers {
            assert!(get(server, "report").await.is_some(), "on every master");
        }
    })
    .await;
}

#[tokio::test]
async fn a_configured_sentinel_deployment() {
    let failover = Failover::start(1).await;
    let config = Config {
        sentinel: Some(SentinelSettings {
            urls: failover.sentinel_urls(),
            master: crate::support::sentinel::MASTER.to_owned(),
            ..SentinelSettings::default()
        }),
        connect_timeout: Some(ms(2_000)),
        response_timeout: Some(ms(2_000)),
        ..Config::default()
    };
    lock_once(&config, async |_| {}).await;
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn a_configured_cluster() {
    let cluster = crate::support::cluster::Cluster::start();
    let config = Config {
        cluster: cluster.urls(),
        ..Config::default()
    };
    lock_once(&config, async |_| {}).await;
}
