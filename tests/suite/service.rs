//! `examples/service.rs` runs on each of the four topologies from a configuration file: the
//! same program, one `Client` type, the topology named only by the file.

use std::path::PathBuf;
use std::process::Command;

use crate::support::RedisServer;
#[cfg(feature = "cluster")]
use crate::support::cluster::Cluster;
use crate::support::sentinel::{Failover, MASTER};

/// The example's binary, built beside this test binary by `cargo test` (which builds the
/// examples too).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let binary = dir.join("examples").join("service");
    assert!(
        binary.exists(),
        "{} is missing: run the suite with `cargo test --all-features` (it builds the \
         examples), or `cargo build --all-features --example service` first",
        binary.display()
    );
    binary
}

/// Runs the example with `settings` as its configuration file; its output.
fn run_with(settings: &str) -> String {
    let file = std::env::temp_dir().join(format!(
        "lockset-service-{}-{}.toml",
        std::process::id(),
        crate::support::server::free_port()
    ));
    std::fs::write(&file, settings).expect("write the settings");
    let out = Command::new(example())
        .env("LOCKSET_CONFIG", &file)
        .env_remove("SERVICE_ADDR")
        .output()
        .expect("run the example");
    let _ = std::fs::remove_file(&file);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{settings}\n{text}");
    // Report 42 was asked for three times at once: each request either sent it or was told
    // to try later (at most one sends it; on a Redlock quorum, obtains racing without
    // retries can split the masters' votes so that none does). Report 7, asked for once,
    // was sent.
    let answers_42 = text.matches("GET /reports/42: 200 sent report 42").count()
        + text.matches("GET /reports/42: 409 busy").count();
    assert_eq!(answers_42, 3, "{text}");
    assert!(text.contains("200 sent report 7"), "{text}");
    assert!(
        !text.contains(": 500 ") && !text.contains(": 503 "),
        "{text}"
    );
    text
}

/// Generous timeouts (this suite runs hundreds of tests at once on two cores; the defaults,
/// 500 ms for a reply, are a production server's), then the locks' settings.
const LOCK: &str = "connect_timeout = \"5s\"\nresponse_timeout = \"5s\"\n[lock]\nttl = \"5s\"\nretry = { backoff = \"none\" }\n";

#[test]
fn on_one_server() {
    let server = RedisServer::start();
    let text = run_with(&format!("url = \"{}\"\n{LOCK}", server.url()));
    assert!(text.contains("topology: \"single\""), "{text}");
}

#[test]
fn on_a_redlock_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.url())).collect();
    // A generous per-master limit: this suite runs hundreds of tests at once on two cores,
    // where the default (5% of the 5 s TTL, 250 ms) timed a release out in CI.
    let text = run_with(&format!(
        "redlock = [{}]\nnode_timeout = \"1s\"\n{LOCK}",
        urls.join(", ")
    ));
    assert!(text.contains("topology: \"redlock\""), "{text}");
}

#[tokio::test]
async fn behind_sentinel() {
    let failover = Failover::start(1).await;
    let urls: Vec<String> = failover
        .sentinel_urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect();
    let settings = format!(
        "{LOCK}\n[sentinel]\nurls = [{}]\nmaster = \"{MASTER}\"\n",
        urls.join(", ")
    );
    let text = tokio::task::spawn_blocking(move || run_with(&settings))
        .await
        .unwrap();
    assert!(text.contains("topology: \"single\""), "{text}");
}

#[cfg(feature = "cluster")]
#[test]
fn on_a_cluster() {
    let cluster = Cluster::start();
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect();
    let text = run_with(&format!("cluster = [{}]\n{LOCK}", urls.join(", ")));
    assert!(text.contains("topology: \"cluster\""), "{text}");
}
