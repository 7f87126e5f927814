//! `lockset status` shows the queue: the holder, then every waiter in order with its
//! metadata, time waited and lease left; `--json` the same; `--watch` as a line log when
//! stdout is not a terminal; per master on a Redlock quorum. It only reads.
#![cfg(feature = "cli")]

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::RedisServer;

/// A `lockset` process for `urls`, with no Redis settings from the environment.
fn lockset(urls: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockset"));
    command
        .env_remove("LOCKSET_REDIS")
        .env_remove("REDIS_URL")
        .env_remove("LOCKSET_SENTINEL")
        .env_remove("LOCKSET_MASTER");
    for url in urls {
        command.args(["--redis", url]);
    }
    command
}

/// Runs `command` to its end: (exit code, stdout).
fn finish(command: &mut Command) -> (Option<i32>, String) {
    let out = command.stdin(Stdio::null()).output().expect("lockset runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn status_json(urls: &[String], keys: &[&str]) -> serde_json::Value {
    let (code, stdout) = finish(lockset(urls).args(["status", "--json"]).args(keys));
    assert_eq!(code, Some(0), "{stdout}");
    serde_json::from_str(&stdout).expect("status --json is JSON")
}

/// A `lockset run` that waits for `key` (fair waiting: it queues), as `metadata`.
fn waiter(urls: &[String], key: &str, metadata: &str) -> Killed {
    let child = lockset(urls)
        .args([
            "run",
            "--wait",
            "60s",
            "--ttl",
            "10s",
            "--metadata",
            metadata,
        ])
        .args([key, "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("lockset runs");
    Killed(child)
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `status --json` of `key` lists `n` waiters; returns that status.
fn until_waiting(urls: &[String], key: &str, n: usize) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let status = status_json(urls, &[key]);
        if status["keys"][0]["waiters"].as_array().map(Vec::len) == Some(n) {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{n} waiters: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn status_shows_the_holder_then_the_waiters_in_order() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let (code, token) =
        finish(lockset(&urls).args(["acquire", "--ttl", "60s", "--metadata", "holder-1", "job"]));
    assert_eq!(code, Some(0));
    let _first = waiter(&urls, "job", "waiter-A");
    until_waiting(&urls, "job", 1);
    std::thread::sleep(Duration::from_millis(100));
    let _second = waiter(&urls, "job", "waiter-B");
    let status = until_waiting(&urls, "job", 2);

    let key = &status["keys"][0];
    assert_eq!(key["metadata"], "holder-1", "{status}");
    let waiters = key["waiters"].as_array().unwrap();
    assert_eq!(waiters[0]["metadata"], "waiter-A", "{status}");
    assert_eq!(waiters[1]["metadata"], "waiter-B", "{status}");
    let waited = |i: usize| waiters[i]["waited_ms"].as_u64().unwrap();
    assert!(waited(0) >= waited(1) + 100, "first come first: {status}");
    for waiter in waiters {
        let lease = waiter["lease_ms"].as_u64().unwrap();
        // Its lease: 1.5 × the 10 s TTL, renewed every third.
        assert!(lease > 0 && lease <= 15_000, "{status}");
        assert_eq!(waiter["keys"], serde_json::json!(["job"]), "{status}");
        assert_eq!(waiter["node"], 0, "{status}");
    }
    assert!(
        !status.to_string().contains(token.trim()),
        "never the token"
    );

    let (code, text) = finish(lockset(&urls).args(["status", "job"]));
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("\"job\" is held by \"holder-1\""),
        "{text}"
    );
    assert!(lines[1].starts_with("  1. \"waiter-A\" waiting "), "{text}");
    assert!(lines[1].contains("lease"), "{text}");
    assert!(lines[2].starts_with("  2. \"waiter-B\" waiting "), "{text}");

    // It only reads: the queue and the holder are as they were.
    let again = until_waiting(&urls, "job", 2);
    assert_eq!(again["keys"][0]["metadata"], "holder-1");
}

#[test]
fn watch_logs_a_round_per_interval_when_stdout_is_not_a_terminal() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let (code, _) = finish(lockset(&urls).args(["acquire", "--metadata", "holder-1", "job"]));
    assert_eq!(code, Some(0));
    let _waiting = waiter(&urls, "job", "waiter-A");
    until_waiting(&urls, "job", 1);
    let mut watch = lockset(&urls)
        .args(["status", "--watch=100ms", "job"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("lockset runs");
    std::thread::sleep(Duration::from_millis(1_000));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let stamps = text.lines().filter(|line| !line.starts_with(' ')).count();
    assert!(stamps >= 2, "rounds: {text}");
    assert!(!text.contains('\x1b'), "no redrawing into a pipe: {text:?}");
    let rounds: Vec<&str> = text.split_inclusive('\n').collect();
    assert!(
        rounds
            .iter()
            .any(|line| line.starts_with("    1. \"waiter-A\" waiting")),
        "{text}"
    );

    // `--watch 2s KEY` would look at a key named "2s": bad usage.
    let (code, _) = finish(lockset(&urls).args(["status", "--watch", "2s", "job"]));
    assert_eq!(code, Some(64));
}

/// `--json --watch` into a pipe: JSON lines, each round one object with its time (a time
/// stamp line of its own, and the object indented under it, broke every JSON-lines reader).
#[test]
fn watch_with_json_writes_one_object_a_line() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let (code, _) = finish(lockset(&urls).args(["acquire", "--metadata", "holder-1", "job"]));
    assert_eq!(code, Some(0));
    let mut watch = lockset(&urls)
        .args(["status", "--json", "--watch=100ms", "job"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("lockset runs");
    std::thread::sleep(Duration::from_millis(700));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The last line may be cut by the kill.
    let lines: Vec<&str> = text.lines().collect();
    let whole = &lines[..lines.len().saturating_sub(1)];
    assert!(whole.len() >= 2, "rounds: {text}");
    for line in whole {
        let round: serde_json::Value = serde_json::from_str(line).expect("a JSON object a line");
        assert_eq!(round["keys"][0]["metadata"], "holder-1", "{line}");
        assert!(
            round["time"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{line}"
        );
    }
}

/// `--watch` into a pipe whose reader leaves (`lockset status --watch job | head -3`): the
/// watch ends quietly with 0, as the pipe's other commands do, within a round or two (it
/// exited 71 saying "cannot print the status: Broken pipe").
#[test]
fn watch_ends_quietly_when_its_reader_leaves() {
    use std::io::{BufRead as _, BufReader};

    let server = RedisServer::start();
    let urls = [server.url()];
    let mut watch = lockset(&urls)
        .args(["status", "--watch=50ms", "job"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockset runs");
    let mut reader = BufReader::new(watch.stdout.take().expect("stdout"));
    let mut first = String::new();
    reader.read_line(&mut first).expect("a first line");
    assert!(!first.is_empty(), "the watch printed");
    let left = Instant::now();
    drop(reader);
    let out = watch.wait_with_output().expect("lockset ends");
    let took = left.elapsed();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_millis(3_000),
        "ended {took:?} after the reader left"
    );
}

#[test]
fn a_redlock_quorum_shows_each_masters_queue() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    // Held on the second master alone, with a waiter queued there (a single-server client
    // of that master: a quorum's waiters never queue).
    let second = [urls[1].clone()];
    let (code, _) = finish(lockset(&second).args(["acquire", "--metadata", "holder-1", "job"]));
    assert_eq!(code, Some(0));
    let _waiting = waiter(&second, "job", "waiter-A");
    until_waiting(&second, "job", 1);

    let status = status_json(&urls, &["job"]);
    let key = &status["keys"][0];
    assert_eq!(key["held_on"], 1, "{status}");
    let waiters = key["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{status}");
    assert_eq!(waiters[0]["metadata"], "waiter-A", "{status}");
    assert_eq!(waiters[0]["node"], 1, "{status}");
    let (_, text) = finish(lockset(&urls).args(["status", "job"]));
    assert!(
        text.contains("  master 2: 1. \"waiter-A\" waiting"),
        "{text}"
    );
}

/// Holds `key` in `mode` as `metadata` for `ttl`, through the library (the command line
/// takes keys exclusively only).
async fn hold(
    client: &lockset::Client<lockset::redis::aio::ConnectionManager>,
    key: &str,
    mode: lockset::Mode,
    metadata: &str,
    ttl: Duration,
) -> lockset::Lock<lockset::redis::aio::ConnectionManager> {
    let options = lockset::Options::default().metadata(metadata);
    client
        .obtain((key, mode), ttl, &options)
        .await
        .expect("obtained")
}

#[tokio::test]
async fn status_lists_every_holder_of_a_shared_and_of_a_counted_key() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let client = lockset::Client::connect(&server.url()).await.unwrap();
    let shared = lockset::Mode::Shared;
    let permits = lockset::Mode::Permit { limit: 3 };
    let _a = hold(&client, "doc", shared, "reader-a", Duration::from_secs(30)).await;
    let _b = hold(&client, "doc", shared, "reader-b", Duration::from_secs(60)).await;
    let _c = hold(
        &client,
        "exports",
        permits,
        "export-1",
        Duration::from_secs(40),
    )
    .await;
    let _d = hold(&client, "exports", permits, "", Duration::from_secs(50)).await;
    let tokens = [_a.token(), _b.token(), _c.token(), _d.token()].map(str::to_owned);

    let (code, text) = finish(lockset(&urls).args(["status", "doc", "exports"]));
    assert_eq!(code, Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(!text.contains("zset"), "{text}");
    assert!(
        lines[0].starts_with(r#""doc" is held shared by 2 holders: "reader-a" ("#),
        "{text}"
    );
    assert!(lines[0].contains(r#"s left), "reader-b" ("#), "{text}");
    assert!(
        lines[1].starts_with(r#""exports" is held as 2 of 3 permits: "export-1" ("#),
        "{text}"
    );
    assert!(lines[1].contains("a holder without metadata ("), "{text}");

    let status = status_json(&urls, &["doc", "exports"]);
    let doc = &status["keys"][0];
    assert_eq!(doc["state"], "held", "{status}");
    assert_eq!(doc["mode"], "shared", "{status}");
    assert_eq!(doc["held_on"], 1, "{status}");
    let holders = doc["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{status}");
    assert_eq!(holders[0]["metadata"], "reader-a", "{status}");
    assert_eq!(holders[1]["metadata"], "reader-b", "{status}");
    let left = |holder: &serde_json::Value| holder["ttl_ms"].as_u64().unwrap();
    assert!(
        left(&holders[0]) <= 30_000 && left(&holders[0]) > 20_000,
        "{status}"
    );
    assert!(left(&holders[1]) > 50_000, "{status}");
    // The key lasts as long as its last holder.
    assert!(doc["ttl_ms"].as_u64().unwrap() > 50_000, "{status}");
    let exports = &status["keys"][1];
    assert_eq!(exports["state"], "held", "{status}");
    assert_eq!(exports["mode"], "permits", "{status}");
    assert_eq!(exports["limit"], 3, "{status}");
    let holders = exports["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{status}");
    assert_eq!(holders[0]["metadata"], "export-1", "{status}");
    assert_eq!(holders[1]["metadata"], "", "{status}");
    for token in &tokens {
        assert!(
            !status.to_string().contains(token.as_str()),
            "never a token"
        );
        assert!(!text.contains(token.as_str()), "never a token");
    }
}
