//! The `lockset` command line, as real processes against real redis-servers (feature `cli`).
#![cfg(feature = "cli")]

use crate::support;

use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockset::redis;
use support::RedisServer;
use support::cluster::Cluster;

/// The longest any single `lockset` process may run in these tests before it is killed
/// and the test fails (generous: a loaded 2-core machine).
const HANG: Duration = Duration::from_secs(60);

/// A `lockset` process for `urls`, with no Redis settings from the environment.
fn lockset(urls: &[String]) -> Command {
    lockset_via(&[], urls)
}

/// [`lockset`] started by `wrapper` (`nohup`, or a shell that sets something up and execs
/// its arguments), which gets the path of `lockset` and its arguments after its own.
///
/// Every signal starts at its default first (`env --default-signal`): lockset keeps a signal
/// that was ignored when it started ignored, and a test run started in the background by a
/// script (SIGINT and SIGQUIT ignored) or under nohup would otherwise pass that on to every
/// lockset here. What a test ignores on purpose, its wrapper ignores after that.
fn lockset_via(wrapper: &[&str], urls: &[String]) -> Command {
    let lockset = env!("CARGO_BIN_EXE_lockset");
    let mut command = Command::new("env");
    command.arg("--default-signal").args(wrapper).arg(lockset);
    command
        .env_remove("LOCKSET_REDIS")
        .env_remove("REDIS_URL")
        .env_remove("LOCKSET_SENTINEL")
        .env_remove("LOCKSET_MASTER")
        .env_remove("LOCKSET_TLS_CA_CERT")
        .env_remove("LOCKSET_TLS_CERT")
        .env_remove("LOCKSET_TLS_KEY")
        .env_remove("LOCKSET_RESTART_GRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for url in urls {
        command.args(["--redis", url]);
    }
    command
}

/// What a finished `lockset` said and how it exited.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `command` to the end (killing it after [`HANG`]).
fn finish(command: &mut Command) -> Finished {
    let start = Instant::now();
    let child = command.spawn().expect("start lockset");
    wait(child, start)
}

/// Waits for a started `lockset` (killing it after [`HANG`]).
fn wait(mut child: Child, start: Instant) -> Finished {
    while child.try_wait().expect("poll lockset").is_none() {
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("lockset still runs after {HANG:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = start.elapsed();
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("collect output");
    Finished {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        took,
    }
}

/// A raw connection for looking at keys.
fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .expect("connect")
}

fn exists(url: &str, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut raw(url))
        .expect("EXISTS")
        == 1
}

fn command_on(url: &str, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut raw(url)).expect("command")
}

/// Waits until `condition` holds (failing the test after a generous limit).
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < HANG, "{what}: not after {HANG:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private folder for files the commands write.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("lockset-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Self(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.0.join(name)).ok()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// `lockset acquire` with extra arguments; returns the token.
fn acquire(urls: &[String], args: &[&str]) -> String {
    let out = finish(lockset(urls).arg("acquire").args(args));
    assert_eq!(out.code, Some(0), "{out:?}");
    out.stdout.lines().next().expect("a token line").to_owned()
}

fn status_json(urls: &[String], keys: &[&str]) -> serde_json::Value {
    let out = finish(lockset(urls).args(["status", "--json"]).args(keys));
    assert_eq!(out.code, Some(0), "{out:?}");
    serde_json::from_str(&out.stdout).expect("status --json is JSON")
}

#[test]
fn concurrent_runs_never_overlap_and_lose_no_update() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("exclusion");
    let counter = scratch.path("counter");
    std::fs::write(&counter, "0").expect("counter file");
    // A non-atomic read–sleep–write, plus a marker that two holders at once would trip on.
    let script = format!(
        "mkdir {inside} || echo overlap >> {violations}; \
         n=$(cat {counter}); sleep 0.05; echo $((n + 1)) > {counter}; \
         rmdir {inside}",
        inside = scratch.path("inside"),
        violations = scratch.path("violations"),
    );
    let start = Instant::now();
    let runs: Vec<Child> = (0..8)
        .map(|_| {
            lockset(&urls)
                .args(["run", "--wait", "30s", "counter", "--", "sh", "-c", &script])
                .spawn()
                .expect("start lockset")
        })
        .collect();
    for run in runs {
        let out = wait(run, start);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    assert_eq!(scratch.read("counter").as_deref().map(str::trim), Some("8"));
    assert_eq!(scratch.read("violations"), None, "two holders at once");
    assert!(!exists(&urls[0], "counter"), "released after the last run");
}

#[test]
fn a_held_lock_fails_at_once_with_75_naming_key_holder_and_time_left() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(
        &urls,
        &[
            "--ttl",
            "60s",
            "--metadata",
            "backup@web-1",
            "free",
            "nightly",
        ],
    );
    let scratch = Scratch::new("conflict");
    let ran = scratch.path("ran");

    let out = finish(lockset(&urls).args(["run", "nightly", "--", "touch", &ran]));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        out.took < Duration::from_secs(10),
        "no waiting by default: {out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "one line: {out:?}");
    for part in ["\"nightly\"", "backup@web-1", "s left"] {
        assert!(out.stderr.contains(part), "{part} in {out:?}");
    }
    assert!(!out.stderr.contains(&token), "never the token: {out:?}");
    assert_eq!(scratch.read("ran"), None, "the command must not run");

    // Waiting takes the wait, then fails the same way; the code is configurable.
    let out = finish(lockset(&urls).args([
        "run",
        "--wait",
        "1s",
        "--conflict-exit-code",
        "3",
        "nightly",
        "--",
        "true",
    ]));
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.took >= Duration::from_secs(1), "{out:?}");
    // Not the holder's 60 s: the wait's 1 s, and the slack of a loaded machine.
    assert!(out.took < Duration::from_secs(8), "{out:?}");
    assert!(out.stderr.contains("within 1s"), "{out:?}");

    // Quiet: the status alone tells.
    let out = finish(lockset(&urls).args(["run", "-q", "nightly", "--", "true"]));
    assert_eq!((out.code, out.stderr.as_str()), (Some(75), ""), "{out:?}");
}

#[test]
fn a_waiting_run_starts_as_soon_as_the_holder_releases() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(&urls, &["--ttl", "60s", "--metadata", "first", "job"]);
    let start = Instant::now();
    let waiting = lockset(&urls)
        .args(["run", "-v", "--wait", "50s", "job", "--", "true"])
        .spawn()
        .expect("start lockset");
    std::thread::sleep(Duration::from_millis(1_000));
    let out = finish(lockset(&urls).args(["release", "--token", &token, "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = wait(waiting, start);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.took < Duration::from_secs(30),
        "woken by the release: {out:?}"
    );
    // Not a terminal: the waiting line is a log line, and only with -v.
    assert!(
        out.stderr
            .contains("waiting for \"job\" (held by \"first\""),
        "{out:?}"
    );
}

#[test]
fn a_wait_on_a_terminal_shows_a_spinner_and_clears_it_before_the_command_runs() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(&urls, &["--ttl", "60s", "--metadata", "first", "job"]);
    let releaser = std::thread::spawn({
        let urls = urls.clone();
        move || {
            std::thread::sleep(Duration::from_millis(1_500));
            finish(lockset(&urls).args(["release", "--token", &token, "job"]))
        }
    });
    // util-linux's script(1) gives lockset a pseudo-terminal and copies what it shows.
    let shown = format!(
        "{} --redis {} run --wait 50s job -- echo ran",
        env!("CARGO_BIN_EXE_lockset"),
        urls[0]
    );
    let out = finish(
        Command::new("script")
            .args(["-qfec", &shown, "/dev/null"])
            .env_remove("LOCKSET_REDIS")
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    assert_eq!(releaser.join().expect("releaser").code, Some(0));
    assert_eq!(out.code, Some(0), "{out:?}");
    let waiting = out
        .stdout
        .find("waiting for \"job\" (held by \"first\", ")
        .unwrap_or_else(|| panic!("no waiting line on the terminal: {out:?}"));
    let ran = out.stdout.find("ran").expect("the command ran");
    // A spinner redraws its line in place, and clears it before the command's output.
    let between = &out.stdout[waiting..ran];
    assert!(between.contains("\r\x1b[2K"), "no spinner: {out:?}");
    assert!(
        between.trim_end().ends_with("\x1b[2K"),
        "the spinner line stays: {out:?}"
    );
}

#[test]
fn the_commands_exit_status_passes_through() {
    let server = RedisServer::start();
    let urls = [server.url()];
    for (script, code) in [
        ("exit 0", 0),
        ("exit 7", 7),
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
        ("kill -INT $$", 128 + 2),
    ] {
        let out = finish(lockset(&urls).args(["run", "job", "--", "sh", "-c", script]));
        assert_eq!(out.code, Some(code), "{script}: {out:?}");
        assert_eq!(out.stderr, "", "{script}: {out:?}");
        assert!(!exists(&urls[0], "job"), "{script}: released");
    }
}

#[test]
fn the_command_gets_its_keys_and_fencing_token() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let print = "echo \"$LOCKSET_KEYS|${LOCKSET_FENCING_TOKEN-none}\"";
    let out = finish(lockset(&urls).args(["run", "a", "b", "--", "sh", "-c", print]));
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "a b|none\n"),
        "{out:?}"
    );
    let fenced = || {
        let out = finish(lockset(&urls).args(["run", "--fencing", "a", "--", "sh", "-c", print]));
        assert_eq!(out.code, Some(0), "{out:?}");
        let fence = out
            .stdout
            .trim()
            .strip_prefix("a|")
            .expect("keys")
            .to_owned();
        fence.parse::<u64>().expect("a number")
    };
    let first = fenced();
    assert!(fenced() > first, "fencing tokens grow");
}

#[test]
fn a_command_that_cannot_run_exits_127_or_126_and_releases() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let out = finish(lockset(&urls).args(["run", "job", "--", "/no/such/program"]));
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(out.stderr.contains("/no/such/program"), "{out:?}");
    let out = finish(lockset(&urls).args(["run", "job", "--", "/"]));
    assert_eq!(out.code, Some(126), "{out:?}");
    assert!(!exists(&urls[0], "job"), "released");
}

#[test]
fn a_lost_lock_stops_the_command_within_a_third_of_the_ttl_and_exits_70() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let ttl = Duration::from_secs(6);
    let run = lockset(&urls)
        .args(["run", "--ttl", "6s", "job", "--", "sleep", "60"])
        .spawn()
        .expect("start lockset");
    eventually("the lock is held", || exists(&urls[0], "job"));
    std::thread::sleep(Duration::from_millis(300));
    let deleted = Instant::now();
    command_on(&urls[0], &["DEL", "job"]);
    let out = wait(run, deleted);
    assert_eq!(out.code, Some(70), "{out:?}");
    assert!(out.stderr.contains("expired or was deleted"), "{out:?}");
    // The watchdog notices at its next refresh, every third of the TTL; one extra second
    // for a loaded machine. Well before the TTL itself would have run out.
    let bound = ttl / 3 + Duration::from_secs(1);
    assert!(
        out.took <= bound,
        "stopped after {:?}, bound {bound:?}",
        out.took
    );
}

#[test]
fn redis_unreachable_past_the_validity_stops_the_command_and_exits_70() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let run = lockset(&urls)
        .args(["run", "--ttl", "2s", "job", "--", "sleep", "60"])
        .spawn()
        .expect("start lockset");
    eventually("the lock is held", || exists(&urls[0], "job"));
    let paused = Instant::now();
    server.pause();
    let out = wait(run, paused);
    server.resume();
    assert_eq!(out.code, Some(70), "{out:?}");
    assert!(out.stderr.contains("validity ran out"), "{out:?}");
    // The validity is the TTL from the last refresh; generous for a loaded machine.
    assert!(out.took < Duration::from_secs(15), "{out:?}");
}

#[test]
fn a_command_ignoring_sigterm_gets_sigkill_after_kill_after() {
    let server = RedisServer::start();
    let urls = [server.url()];
    // SIG_IGN is inherited: neither the shell nor its sleep dies of SIGTERM.
    let run = lockset(&urls)
        .args(["run", "--ttl", "3s", "--kill-after", "1s", "job", "--"])
        .args(["sh", "-c", "trap '' TERM; sleep 60"])
        .spawn()
        .expect("start lockset");
    eventually("the lock is held", || exists(&urls[0], "job"));
    let taken = Instant::now();
    command_on(&urls[0], &["SET", "job", "5:otherintruder", "EX", "60"]);
    let out = wait(run, taken);
    assert_eq!(out.code, Some(70), "{out:?}");
    assert!(
        out.took >= Duration::from_secs(1),
        "SIGKILL after 1s: {out:?}"
    );
    for part in ["taken over", "intruder", "SIGKILL"] {
        assert!(out.stderr.contains(part), "{part} in {out:?}");
    }
    assert_eq!(
        command_on(&urls[0], &["GET", "job"]),
        redis::Value::BulkString(b"5:otherintruder".to_vec()),
        "the new holder's lock is untouched"
    );
}

#[test]
fn signals_are_forwarded_and_the_lock_released_after_the_command_exits() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("signals");
    for name in ["TERM", "INT", "HUP"] {
        let got = scratch.path(name);
        // The command takes a while to finish after the signal: the lock must outlive it.
        let script = format!(
            "trap 'echo {name} > {got}; sleep 1; exit 3' {name}; \
             while true; do sleep 0.05; done"
        );
        let start = Instant::now();
        let run = lockset(&urls)
            .args(["run", "job", "--", "sh", "-c", &script])
            .spawn()
            .expect("start lockset");
        eventually("the lock is held", || exists(&urls[0], "job"));
        // Give lockset time to install its handlers after obtaining.
        std::thread::sleep(Duration::from_millis(300));
        signal(run.id(), name);
        eventually("the command got the signal", || {
            scratch.read(name).is_some()
        });
        assert!(
            exists(&urls[0], "job"),
            "{name}: held while the command finishes"
        );
        let out = wait(run, start);
        assert_eq!(out.code, Some(3), "{name}: {out:?}");
        assert!(
            !exists(&urls[0], "job"),
            "{name}: released after the command exited"
        );
    }
    // A command that does not catch it dies of it: 128 + the signal number.
    let run = lockset(&urls)
        .args(["run", "job", "--", "sleep", "60"])
        .spawn()
        .expect("start lockset");
    eventually("the lock is held", || exists(&urls[0], "job"));
    std::thread::sleep(Duration::from_millis(300));
    signal(run.id(), "INT");
    let out = wait(run, Instant::now());
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(!exists(&urls[0], "job"), "released");
}

#[test]
fn a_signal_while_waiting_stops_the_wait_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(&urls, &["--ttl", "60s", "--metadata", "holder", "b"]);
    let waiting = lockset(&urls)
        .args(["run", "--wait", "50s", "a", "b", "--", "true"])
        .spawn()
        .expect("start lockset");
    std::thread::sleep(Duration::from_millis(1_000));
    signal(waiting.id(), "TERM");
    let out = wait(waiting, Instant::now());
    assert_eq!(out.code, Some(143), "{out:?}");
    assert!(!exists(&urls[0], "a"), "no half-made lock");
    let out = finish(lockset(&urls).args(["release", "--token", &token, "b"]));
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn kill_9_of_lockset_leaves_the_lock_to_expire_with_its_ttl() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("kill9");
    let pid_file = scratch.path("pid");
    let mut first = lockset(&urls)
        .args(["run", "--ttl", "2s", "job", "--", "sh", "-c"])
        .arg(format!("echo $$ > {pid_file}; exec sleep 60"))
        .spawn()
        .expect("start lockset");
    eventually("the command runs", || {
        scratch.read("pid").is_some_and(|pid| pid.ends_with('\n'))
    });
    first.kill().expect("kill -9 lockset");
    first.wait().expect("reap lockset");
    let left: i64 = redis::cmd("PTTL")
        .arg("job")
        .query(&mut raw(&urls[0]))
        .expect("PTTL");
    assert!(left > 0, "still held after kill -9, with its TTL: {left}");

    let out = finish(lockset(&urls).args(["run", "--wait", "30s", "job", "--", "true"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stderr, "", "waited silently: not a terminal, no -v");
    // Not before the TTL ran out (less the time it took to start the second run).
    let left = Duration::from_millis(left.unsigned_abs());
    let slack = Duration::from_millis(250);
    assert!(
        out.took + slack >= left,
        "proceeded after {:?}, {left:?} were left",
        out.took
    );

    // The orphaned command is ours to clean up.
    let pid = scratch.read("pid").expect("pid");
    signal(pid.trim().parse().expect("a pid"), "KILL");
}

#[test]
fn acquire_refresh_release_and_status_round_trip() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(
        &urls,
        &["--ttl", "10s", "--metadata", "deploy-42", "db", "cache"],
    );
    assert_eq!(token.len(), 22, "{token}");

    let status = status_json(&urls, &["db", "cache", "free"]);
    let keys = status["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 3);
    for key in &keys[..2] {
        assert_eq!(key["state"], "held", "{status}");
        assert_eq!(key["metadata"], "deploy-42", "{status}");
        let ttl = key["ttl_ms"].as_u64().expect("ttl_ms");
        assert!(ttl > 0 && ttl <= 10_000, "{status}");
    }
    assert_eq!(keys[2]["key"], "free");
    assert_eq!(keys[2]["state"], "free");
    assert!(!status.to_string().contains(&token), "never the token");
    let out = finish(lockset(&urls).args(["status", "db", "free"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("\"db\" is held by \"deploy-42\""),
        "{out:?}"
    );
    assert!(out.stdout.contains("\"free\" is free"), "{out:?}");

    // Refresh extends, keeps the metadata; a wrong token changes nothing.
    let out =
        finish(lockset(&urls).args(["refresh", "--token", &token, "--ttl", "100s", "db", "cache"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = status_json(&urls, &["db"]);
    assert!(
        status["keys"][0]["ttl_ms"].as_u64().expect("ttl") > 10_000,
        "{status}"
    );
    assert_eq!(status["keys"][0]["metadata"], "deploy-42", "{status}");
    // A shorter TTL shortens: refresh sets the TTL, as the library's does.
    let out =
        finish(lockset(&urls).args(["refresh", "--token", &token, "--ttl", "5s", "db", "cache"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = status_json(&urls, &["db", "cache"]);
    for key in status["keys"].as_array().expect("keys") {
        let ttl = key["ttl_ms"].as_u64().expect("ttl");
        assert!(ttl > 0 && ttl <= 5_000, "{status}");
    }
    for op in ["refresh", "release"] {
        let out = finish(lockset(&urls).args([op, "--token", "wrong", "db", "cache"]));
        assert_eq!(out.code, Some(70), "{op}: {out:?}");
        assert!(
            out.stderr.contains("not held by this token"),
            "{op}: {out:?}"
        );
    }
    assert!(exists(&urls[0], "db") && exists(&urls[0], "cache"));

    let out = finish(lockset(&urls).args(["release", "--token", &token, "db", "cache"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!exists(&urls[0], "db") && !exists(&urls[0], "cache"));
    // Gone: neither released again nor brought back by a refresh.
    for op in ["release", "refresh"] {
        let out = finish(lockset(&urls).args([op, "--token", &token, "db", "cache"]));
        assert_eq!(out.code, Some(70), "{op}: {out:?}");
    }
    assert!(
        !exists(&urls[0], "db"),
        "refresh must not re-create a lost lock"
    );

    // With --fencing, a second line carries the fencing token.
    let out = finish(lockset(&urls).args(["acquire", "--fencing", "db"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[1].parse::<u64>().is_ok(), "{out:?}");

    // Without --redis: LOCKSET_REDIS, then REDIS_URL.
    for variable in ["LOCKSET_REDIS", "REDIS_URL"] {
        let out = finish(lockset(&[]).env(variable, &urls[0]).args(["status", "db"]));
        assert_eq!(out.code, Some(0), "{variable}: {out:?}");
        assert!(out.stdout.contains("\"db\" is held"), "{variable}: {out:?}");
    }
}

#[test]
fn a_key_holding_another_type_exits_65() {
    let server = RedisServer::start();
    let urls = [server.url()];
    command_on(&urls[0], &["LPUSH", "job", "x"]);
    let out = finish(lockset(&urls).args(["run", "job", "--", "true"]));
    assert_eq!(out.code, Some(65), "{out:?}");
    let status = status_json(&urls, &["job"]);
    assert_eq!(status["keys"][0]["state"], "wrong_type", "{status}");
}

#[test]
fn redlock_over_three_servers() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let token = acquire(
        &urls,
        &["--ttl", "30s", "--metadata", "quorum-holder", "job"],
    );
    assert!(urls.iter().all(|url| exists(url, "job")), "on every master");
    let status = status_json(&urls, &["job"]);
    assert_eq!(status["keys"][0]["held_on"], 3, "{status}");
    assert_eq!(status["keys"][0]["nodes"], 3, "{status}");

    let out = finish(lockset(&urls).args(["run", "job", "--", "true"]));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.stderr.contains("quorum-holder"), "{out:?}");
    let out = finish(lockset(&urls).args(["refresh", "--token", &token, "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = finish(lockset(&urls).args(["release", "--token", &token, "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        urls.iter().all(|url| !exists(url, "job")),
        "released everywhere"
    );

    // A minority down: a majority still makes the lock, and the master down costs the
    // command a failed connection, not its background work's 2 s (as it did for a while).
    servers[2].stop();
    let out = finish(lockset(&urls).args(["run", "--ttl", "30s", "job", "--", "true"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains("unreachable"),
        "says which master is down: {out:?}"
    );
    assert!(!out.stderr.contains("unfinished"), "{out:?}");
    assert!(out.took < Duration::from_millis(1_500), "{out:?}");
    let out = finish(lockset(&urls).args(["run", "--fencing", "job", "--", "true"]));
    assert_eq!(out.code, Some(64), "no fencing with a quorum: {out:?}");

    // A majority down: unreachable.
    servers[1].stop();
    let out = finish(lockset(&urls).args(["run", "job", "--", "true"]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("majority"), "{out:?}");
}

#[test]
fn cluster_locks_with_hash_tags() {
    let cluster = Cluster::start();
    let urls = cluster.urls();
    let cluster_cmd = || {
        let mut command = lockset(&urls);
        command.arg("--cluster");
        command
    };
    let out = finish(
        cluster_cmd()
            .args(["run", "{deploy}:db", "{deploy}:cache", "--", "sh", "-c"])
            .arg("echo $LOCKSET_KEYS"),
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "{deploy}:db {deploy}:cache\n"),
        "{out:?}"
    );

    let out = finish(cluster_cmd().args(["acquire", "--metadata", "migrator", "{deploy}:db"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let token = out.stdout.trim().to_owned();
    let out = finish(cluster_cmd().args(["run", "{deploy}:db", "{deploy}:cache", "--", "true"]));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(out.stderr.contains("migrator"), "{out:?}");
    let out = finish(cluster_cmd().args(["status", "--json", "{deploy}:db", "other"]));
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(status["keys"][0]["state"], "held", "{status}");
    assert_eq!(status["keys"][1]["state"], "free", "{status}");
    let out = finish(cluster_cmd().args(["release", "--token", &token, "{deploy}:db"]));
    assert_eq!(out.code, Some(0), "{out:?}");

    let out = finish(cluster_cmd().args(["run", "db", "cache", "--", "true"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("slot"), "{out:?}");
}

#[test]
fn bad_input_exits_64_with_usage_and_sends_nothing() {
    // A listener that records any connection attempt.
    let listener = support::server::listen();
    listener.set_nonblocking(true).expect("non-blocking");
    let url = format!("redis://{}/", listener.local_addr().expect("address"));
    let urls = [url.clone()];
    let quorum = [url.clone(), url.clone(), url.clone()];
    let not_redis = ["http://not-redis/".to_owned()];
    let empty = [String::new()];
    let with_empty = [url.clone(), String::new()];
    let cases: Vec<(&[String], Vec<&str>)> = vec![
        (&urls, vec![]),
        (&urls, vec!["frobnicate"]),
        (&urls, vec!["run", "", "--", "true"]),
        (&urls, vec!["run", "a", "", "--", "true"]),
        (&urls, vec!["run", "a", "a", "--", "true"]),
        (&urls, vec!["run", "--ttl", "0", "a", "--", "true"]),
        (&urls, vec!["run", "--ttl", "0s", "a", "--", "true"]),
        (&urls, vec!["run", "--ttl", "-5s", "a", "--", "true"]),
        (&urls, vec!["run", "--ttl", "soon", "a", "--", "true"]),
        (&urls, vec!["run", "--wait", "-1s", "a", "--", "true"]),
        (&urls, vec!["run", "--wait", "10", "a", "--", "true"]),
        (&urls, vec!["run", "--kill-after", "-1s", "a", "--", "true"]),
        (
            &urls,
            vec!["run", "--conflict-exit-code", "300", "a", "--", "true"],
        ),
        (&urls, vec!["run", "a"]),
        (&urls, vec!["run", "a", "--"]),
        (&urls, vec!["run", "a", "--", ""]),
        (&urls, vec!["run", "--", "true"]),
        (&urls, vec!["run", "--fencing", "odd}key", "--", "true"]),
        (&urls, vec!["acquire"]),
        (&urls, vec!["acquire", "--ttl", "0", "a"]),
        (&urls, vec!["refresh", "a"]),
        (&urls, vec!["refresh", "--token", "", "a"]),
        (&urls, vec!["release", "--token", "t"]),
        (&urls, vec!["status"]),
        (
            &urls,
            vec!["--cluster", "run", "cart", "wallet", "--", "true"],
        ),
        (&quorum, vec!["run", "--fencing", "a", "--", "true"]),
        (&not_redis, vec!["run", "a", "--", "true"]),
        (
            &urls,
            vec!["run", "--conflict-exit-code", "-1", "a", "--", "true"],
        ),
        // An empty URL is a mistake (an unset variable), not a wish for the default.
        (&empty, vec!["run", "a", "--", "true"]),
        (&empty, vec!["status", "a"]),
        (&with_empty, vec!["status", "a"]),
    ];
    for (urls, args) in cases {
        // Where a fallback to REDIS_URL would go.
        let out = finish(lockset(urls).env("REDIS_URL", &url).args(&args));
        assert_eq!(out.code, Some(64), "{args:?}: {out:?}");
        assert!(out.stderr.contains("error:"), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("Usage:") || out.stderr.contains("--help"),
            "{args:?}: {out:?}"
        );
        assert_eq!(out.stdout, "", "{args:?}: {out:?}");
    }
    match listener.accept() {
        Err(err) if err.kind() == ErrorKind::WouldBlock => {}
        other => panic!("something was sent to Redis: {other:?}"),
    }
}

#[test]
fn unreachable_redis_exits_69() {
    // A port nobody listens on: bound, then closed.
    let port = support::server::free_port();
    let urls = [format!("redis://127.0.0.1:{port}/")];
    for args in [
        vec!["run", "a", "--", "true"],
        vec!["acquire", "a"],
        vec!["status", "a"],
        vec!["release", "--token", "t", "a"],
    ] {
        let out = finish(lockset(&urls).args(&args));
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("cannot reach Redis"),
            "{args:?}: {out:?}"
        );
    }
}

/// `--wait` covers a server that is not up yet: the connection is tried again while the wait
/// lasts, and a server that comes up within it serves the lock.
#[test]
fn wait_covers_a_server_that_comes_up_late() {
    let port = support::server::free_port();
    let urls = [format!("redis://127.0.0.1:{port}/")];
    let start = Instant::now();
    let child = lockset(&urls)
        .args(["acquire", "--wait", "20s", "late"])
        .spawn()
        .expect("start lockset");
    // The fault itself: nobody listens for the first half second of the wait.
    std::thread::sleep(Duration::from_millis(500));
    let _server = RedisServer::start_with(Some(port), &[]);
    let up = start.elapsed();
    let out = wait(child, start);
    assert_eq!(out.code, Some(0), "{out:?}");
    let after = out.took.saturating_sub(up);
    assert!(
        after < Duration::from_millis(2_000),
        "locked {after:?} after the server came up: {out:?}"
    );
}

/// `--wait` is one budget for the whole command: time spent reaching Redis comes off the
/// wait for the lock (a 4 s wait after a 2.5 s outage ended 6.5 s after the start).
#[test]
fn a_wait_counts_the_time_spent_reaching_redis() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let holder = acquire(&urls, &["--ttl", "60s", "--metadata", "other", "job"]);
    assert!(!holder.is_empty());
    server.pause();
    let start = Instant::now();
    let child = lockset(&urls)
        .args(["acquire", "--wait", "4s", "job"])
        .spawn()
        .expect("start lockset");
    // The fault itself: the server answers nothing for the first 2.5 s of the wait.
    std::thread::sleep(Duration::from_millis(2_500));
    server.resume();
    let out = wait(child, start);
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        out.took >= Duration::from_millis(3_800) && out.took < Duration::from_millis(5_300),
        "{out:?}"
    );
}

/// A refused login is a setting to fix, not a state that passes: 69 at once, also under
/// `--wait` (which waited out its whole length for a wrong password before).
#[test]
fn a_refused_login_is_not_waited_for() {
    let server = RedisServer::start();
    let user = ["ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all"];
    assert!(support::server::cli(server.port(), &user).contains("OK"));
    let urls = [format!("redis://locker:wrong@127.0.0.1:{}/", server.port())];
    let out = finish(lockset(&urls).args(["acquire", "--wait", "10s", "job"]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.took < Duration::from_millis(2_000), "{out:?}");
}

/// A server unreachable for the whole `--wait`: 69 when the wait ends, neither at once nor
/// long after.
#[test]
fn a_wait_for_an_unreachable_server_ends_with_the_wait() {
    let port = support::server::free_port();
    let urls = [format!("redis://127.0.0.1:{port}/")];
    for args in [
        vec!["acquire", "--wait", "1500ms", "a"],
        vec!["run", "--wait", "1500ms", "a", "--", "true"],
    ] {
        let out = finish(lockset(&urls).args(&args));
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        assert!(out.stderr.contains("cannot reach Redis"), "{out:?}");
        assert!(
            out.took >= Duration::from_millis(1_300) && out.took < Duration::from_millis(3_000),
            "{args:?}: {out:?}"
        );
    }
}

/// A paused Redlock master costs a command no more than the per-master limit: it goes on
/// with the majority once that is connected (it waited out the paused master's connection
/// attempt before: 3.7 s here), and before it exits lets the paused master's part run to
/// that limit (5 % of the 30 s TTL: 1.5 s), as after any operation.
#[test]
fn a_paused_redlock_master_costs_a_command_no_more_than_its_limit() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    servers[2].pause();
    let out = finish(lockset(&urls).args(["acquire", "--ttl", "30s", "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("has not answered yet"), "{out:?}");
    // The per-master limit, and a loaded machine's slack.
    assert!(out.took < Duration::from_millis(2_500), "{out:?}");
    servers[2].resume();
}

/// A Redlock master that refuses the login is a setting to fix, as for the library's
/// `Client::connect_quorum`: 69 at once, naming the master, nothing locked; never a master
/// "not answering yet" while the others lock.
#[test]
fn a_redlock_master_refusing_the_login_is_named_and_locks_nothing() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let port = servers[2].port();
    support::server::cli(port, &["CONFIG", "SET", "requirepass", "secret"]);
    // A wrong password, and none where the master wants one.
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}/"),
        format!("redis://127.0.0.1:{port}/"),
    ] {
        urls[2] = url;
        let out = finish(lockset(&urls).args(["acquire", "--ttl", "30s", "--wait", "5s", "job"]));
        assert_eq!(out.code, Some(69), "{out:?}");
        assert!(out.stderr.contains("refuses"), "{out:?}");
        assert!(out.stderr.contains(&format!("127.0.0.1:{port}")), "{out:?}");
        // A setting to fix: not waited for.
        assert!(out.took < Duration::from_millis(2_000), "{out:?}");
        assert!(
            servers[..2]
                .iter()
                .all(|server| !exists(&server.url(), "job"))
        );
    }
}

/// `status`, `refresh` and `release` read every key on every master at once: a paused one
/// costs them its read limit once, not a connection attempt per key.
#[test]
fn reading_keys_past_a_paused_redlock_master_costs_one_limit() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let keys = ["a", "b", "c", "d"];
    let token = acquire(&urls, &[&["--ttl", "60s"][..], &keys].concat());
    servers[2].pause();
    for op in ["status", "refresh", "release"] {
        let mut command = lockset(&urls);
        command.arg(op);
        if op != "status" {
            command.args(["--token", &token]);
        }
        if op == "refresh" {
            command.args(["--ttl", "10s"]);
        }
        let out = finish(command.args(keys));
        assert_eq!(out.code, Some(0), "{op}: {out:?}");
        // The read limit (1 s), the library's per-master limit for the refresh or the
        // release (5% of 10 s), and a loaded machine's slack.
        assert!(out.took < Duration::from_millis(2_500), "{op}: {out:?}");
    }
    servers[2].resume();
}

/// `rediss://` to a plain-text port: the handshake gets no answer, and the message asks
/// whether this is a TLS port, within a few seconds.
#[cfg(feature = "tls")]
#[test]
fn a_tls_url_to_a_plain_port_asks_whether_it_is_a_tls_port() {
    let server = RedisServer::start();
    let urls = [format!("rediss://127.0.0.1:{}/", server.port())];
    let start = Instant::now();
    let out = finish(lockset(&urls).args(["acquire", "a"]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("is this a TLS port?"), "{out:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn every_help_page_is_complete_on_its_own() {
    let help = |args: &[&str]| {
        let out = finish(lockset(&[]).args(args).arg("--help"));
        assert_eq!(out.code, Some(0), "{args:?}: {out:?}");
        out.stdout
    };
    let top = help(&[]);
    for sub in ["run", "acquire", "refresh", "release", "status"] {
        assert!(top.contains(sub), "{sub} in {top}");
    }
    for sub in ["run", "acquire", "refresh", "release", "status"] {
        let page = help(&[sub]);
        for part in [
            "Usage: lockset",
            "--redis",
            "--cluster",
            "Exit status:",
            "LOCKSET_REDIS",
        ] {
            assert!(page.contains(part), "{sub}: {part} in {page}");
        }
    }
    let run = help(&["run"]);
    for part in [
        "kill -9",
        "LOCKSET_KEYS",
        "LOCKSET_FENCING_TOKEN",
        "LOCKSET_KEYS_JSON",
        "SIGTSTP",
        "--key",
        "--kill-after",
        "--conflict-exit-code",
        "--wait",
        "--ttl",
        "--metadata",
        "--fencing",
        "SIGTERM",
    ] {
        assert!(run.contains(part), "run: {part} in {run}");
    }
    assert!(help(&["refresh"]).contains("--token"));
    assert!(help(&["status"]).contains("--json"));
}

/// The subcommands `lockset --help` lists, clap's own `help` aside: read from the program's
/// grammar, so that a subcommand added later is checked without editing a list here.
fn subcommands() -> Vec<String> {
    let top = finish(lockset(&[]).arg("--help"));
    assert_eq!(top.code, Some(0), "{top:?}");
    let (_, listed) = top
        .stdout
        .split_once("Commands:\n")
        .expect("a Commands section");
    let names: Vec<String> = listed
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    for known in ["run", "status", "man", "completions"] {
        assert!(
            names.iter().any(|name| name == known),
            "{known} in {names:?}"
        );
    }
    names
}

#[test]
fn man_writes_a_page_for_lockset_and_each_subcommand_saying_what_help_says() {
    let scratch = Scratch::new("man");
    let dir = scratch.path("share/man/man1");
    let out = finish(lockset(&[]).args(["man", &dir]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "", "the pages go to DIR only");
    let page = |name: &str| {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).expect(name);
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{name} is roff: {text}"
        );
        text
    };
    let top = page("lockset.1");
    assert!(top.contains("Exit status"), "{top}");
    let subs = subcommands();
    for sub in &subs {
        assert!(
            top.contains(&format!("lockset\\-{sub}")),
            "{sub} in lockset.1: {top}"
        );
        let own = page(&format!("lockset-{sub}.1"));
        let help = finish(lockset(&[]).args([sub, "--help"])).stdout;
        let first_line = help.lines().next().expect("a help text");
        let first_words: String = first_line
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            own.contains(&first_words),
            "{sub}: {first_words:?} in {own}"
        );
    }
    let written = std::fs::read_dir(&dir).expect("DIR").count();
    assert_eq!(
        written,
        subs.len() + 1,
        "lockset.1 and one page per subcommand"
    );
    assert!(page("lockset-run.1").contains("kill\\-after"));
}

#[test]
fn man_into_a_directory_it_cannot_create_exits_71_saying_so() {
    let scratch = Scratch::new("man-blocked");
    std::fs::write(scratch.path("file"), "").expect("a file");
    let out = finish(lockset(&[]).args(["man", &scratch.path("file/man1")]));
    assert_eq!(out.code, Some(71), "{out:?}");
    assert!(out.stderr.contains("cannot write the man pages"), "{out:?}");
}

#[test]
fn completions_for_bash_zsh_and_fish_complete_every_subcommand() {
    let subs = subcommands();
    for shell in ["bash", "zsh", "fish"] {
        let out = finish(lockset(&[]).args(["completions", shell]));
        assert_eq!(out.code, Some(0), "{shell}: {out:?}");
        assert!(out.stdout.len() > 1000, "{shell}: {}", out.stdout);
        for sub in subs.iter().chain(&["--redis".to_owned()]) {
            let sub = sub.trim_start_matches('-');
            assert!(out.stdout.contains(sub), "{shell}: {sub}");
        }
    }
    let scratch = Scratch::new("completions");
    let bash = finish(lockset(&[]).args(["completions", "bash"])).stdout;
    std::fs::write(scratch.path("lockset.bash"), bash).expect("write");
    let syntax = Command::new("bash")
        .args(["-n", &scratch.path("lockset.bash")])
        .status()
        .expect("bash");
    assert!(syntax.success(), "bash reads the script");
    let out = finish(lockset(&[]).args(["completions", "tcsh"]));
    assert_eq!(out.code, Some(64), "{out:?}");
}

#[test]
fn help_documents_man_and_completions() {
    let top = finish(lockset(&[]).arg("--help")).stdout;
    assert!(top.contains("man pages"), "{top}");
    assert!(top.contains("completion script"), "{top}");
    for sub in ["man", "completions"] {
        let page = finish(lockset(&[]).args([sub, "--help"])).stdout;
        for part in [
            "lockset man /usr/local/share/man/man1",
            "lockset completions bash >",
            "Exit status:",
        ] {
            assert!(page.contains(part), "{sub}: {part} in {page}");
        }
    }
}

#[test]
fn a_token_that_starts_with_a_hyphen_is_still_a_token() {
    // Tokens are URL-safe base64: one in 64 starts with '-'.
    let server = RedisServer::start();
    let urls = [server.url()];
    command_on(&urls[0], &["SET", "b", "4:-n4Xholder", "PX", "60000"]);
    let out = finish(lockset(&urls).args(["refresh", "--token", "-n4X", "--ttl", "30s", "b"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = finish(lockset(&urls).args(["release", "--token", "-n4X", "b"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!exists(&urls[0], "b"));
}

#[test]
fn a_quorum_command_leaves_its_work_done_on_a_slow_master_before_it_exits() {
    // The library returns once a majority answered and finishes the rest in the background;
    // a process that exits at that point would cut the slow master's share off.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let slow = runtime.block_on(support::proxy::Proxy::start(servers[2].port()));
    // Slow, yet well within the per-master limit (5% of the 30 s TTL): 200 ms a round trip.
    slow.set_latency(Duration::from_millis(100));
    let urls = [servers[0].url(), servers[1].url(), slow.url()];

    let token = acquire(&urls, &["--ttl", "30s", "job"]);
    let held: Vec<bool> = servers.iter().map(|s| exists(&s.url(), "job")).collect();
    assert_eq!(held, [true; 3], "acquire placed the lock on every master");

    let out = finish(lockset(&urls).args(["release", "--token", &token, "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let held: Vec<bool> = servers.iter().map(|s| exists(&s.url(), "job")).collect();
    assert_eq!(held, [false; 3], "release removed it from every master");
}

/// A process's state letter from `/proc/PID/stat`: `T` when stopped.
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// Whether a process is stopped, or will be before it runs its own code again: one in
/// uninterruptible sleep (dash waiting for a child it vforked, say) stops as it wakes.
fn stopped(pid: u32) -> bool {
    matches!(state(pid), 'T' | 'D')
}

/// Lines in a scratch file (0 when missing).
fn lines(scratch: &Scratch, name: &str) -> usize {
    scratch.read(name).map_or(0, |text| text.lines().count())
}

/// A command that appends a line to `tick` every 50 ms, `count` times (for ever with 0),
/// after writing its pid to `pid`.
fn ticking(scratch: &Scratch, count: u32) -> String {
    let more = match count {
        0 => "true".to_owned(),
        n => format!("[ $i -lt {n} ]"),
    };
    format!(
        "echo $$ > {pid}; i=0; while {more}; do echo $i >> {tick}; i=$((i + 1)); sleep 0.05; done",
        pid = scratch.path("pid"),
        tick = scratch.path("tick"),
    )
}

/// The pid the command of [`ticking`] wrote.
fn ticking_pid(scratch: &Scratch) -> u32 {
    eventually("the command wrote its pid", || {
        scratch.read("pid").is_some_and(|pid| pid.ends_with('\n'))
    });
    let pid = scratch.read("pid").expect("pid");
    pid.trim().parse().expect("a pid")
}

#[test]
fn ctrl_z_stops_the_command_with_lockset_and_a_lock_lost_meanwhile_never_lets_it_run_again() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("ctrl-z-lost");
    let run = lockset(&urls)
        .args([
            "run",
            "--ttl",
            "2s",
            "--kill-after",
            "30s",
            "job",
            "--",
            "sh",
            "-c",
        ])
        .arg(ticking(&scratch, 0))
        .spawn()
        .expect("start lockset");
    let command = ticking_pid(&scratch);
    eventually("the command ticks", || lines(&scratch, "tick") >= 3);

    // Ctrl-Z sends SIGTSTP to the terminal's foreground group: lockset's.
    signal(run.id(), "TSTP");
    eventually("lockset is stopped", || state(run.id()) == 'T');
    assert!(stopped(command), "the command was stopped before lockset");
    let ticks = lines(&scratch, "tick");

    // Nothing refreshes the lock now: it expires, and someone else may take it.
    eventually("the lock expired", || !exists(&urls[0], "job"));
    let other = finish(lockset(&urls).args(["run", "job", "--", "true"]));
    assert_eq!(
        other.code,
        Some(0),
        "another run holds it meanwhile: {other:?}"
    );
    assert_eq!(
        lines(&scratch, "tick"),
        ticks,
        "the command ran while stopped"
    );

    // `fg`: lockset finds the lock lost before letting the command go on.
    let continued = Instant::now();
    signal(run.id(), "CONT");
    let out = wait(run, continued);
    assert_eq!(out.code, Some(70), "{out:?}");
    for part in [
        "lock lost while lockset and the command were stopped",
        "\"job\"",
    ] {
        assert!(out.stderr.contains(part), "{part} in {out:?}");
    }
    // SIGTERM ended it (a stopped shell dies of it as it is continued), not SIGKILL.
    assert!(out.took < Duration::from_secs(20), "{out:?}");
    assert!(!out.stderr.contains("SIGKILL"), "{out:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lines(&scratch, "tick"),
        ticks,
        "the command ran after the lock's validity ran out"
    );
}

#[test]
fn a_stop_signal_then_sigcont_within_the_ttl_refreshes_and_continues_the_command() {
    let server = RedisServer::start();
    let urls = [server.url()];
    // Ctrl-Z; a read from, or (with `stty tostop`) a write to, the terminal in the background.
    for name in ["TSTP", "TTIN", "TTOU"] {
        let scratch = Scratch::new(&format!("stop-valid-{name}"));
        let start = Instant::now();
        let run = lockset(&urls)
            .args(["run", "--ttl", "6s", "job", "--", "sh", "-c"])
            .arg(ticking(&scratch, 30))
            .spawn()
            .expect("start lockset");
        let command = ticking_pid(&scratch);
        eventually("the command ticks", || lines(&scratch, "tick") >= 3);

        signal(run.id(), name);
        eventually("lockset is stopped", || state(run.id()) == 'T');
        assert!(
            stopped(command),
            "{name}: the command was stopped before lockset"
        );
        let ticks = lines(&scratch, "tick");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            lines(&scratch, "tick"),
            ticks,
            "{name}: the command ran while stopped"
        );
        let left = || -> i64 {
            redis::cmd("PTTL")
                .arg("job")
                .query(&mut raw(&urls[0]))
                .expect("PTTL")
        };
        let before = left();
        assert!(before > 0, "{name}: still held: {before}");

        // `fg` or `bg`.
        signal(run.id(), "CONT");
        eventually("the command goes on", || lines(&scratch, "tick") > ticks);
        assert!(left() > before, "{name}: refreshed on the way back");
        let out = wait(run, start);
        assert_eq!(out.code, Some(0), "{name}: {out:?}");
        assert_eq!(lines(&scratch, "tick"), 30, "{name}: {out:?}");
        assert!(!exists(&urls[0], "job"), "{name}: released");
    }
}

#[test]
fn ctrl_z_while_waiting_stops_lockset_and_fg_goes_on_waiting() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let token = acquire(&urls, &["--ttl", "60s", "--metadata", "first", "job"]);
    let start = Instant::now();
    let waiting = lockset(&urls)
        .args(["run", "--wait", "50s", "job", "--", "echo", "ran"])
        .spawn()
        .expect("start lockset");
    std::thread::sleep(Duration::from_millis(500));
    signal(waiting.id(), "TSTP");
    eventually("lockset is stopped", || state(waiting.id()) == 'T');
    let out = finish(lockset(&urls).args(["release", "--token", &token, "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    // (A fair waiter may be handed the lock meanwhile, for what is left of its lease.)
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(state(waiting.id()), 'T', "still stopped");
    signal(waiting.id(), "CONT");
    let out = wait(waiting, start);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "ran\n"),
        "{out:?}"
    );
}

#[test]
fn sigstop_cannot_be_caught_but_lockset_ends_the_command_once_continued() {
    // Like `kill -9`, `kill -STOP` of lockset alone is not covered: the command goes on while
    // nothing refreshes the lock (the command-line guide says so). Once continued, lockset finds the
    // lock lost and ends the command at once.
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("sigstop");
    let run = lockset(&urls)
        .args(["run", "--ttl", "2s", "job", "--", "sh", "-c"])
        .arg(ticking(&scratch, 0))
        .spawn()
        .expect("start lockset");
    let command = ticking_pid(&scratch);
    eventually("the command ticks", || lines(&scratch, "tick") >= 3);
    signal(run.id(), "STOP");
    eventually("lockset is stopped", || state(run.id()) == 'T');
    eventually("the lock expired", || !exists(&urls[0], "job"));
    assert_ne!(state(command), 'T', "only lockset was stopped");
    let continued = Instant::now();
    signal(run.id(), "CONT");
    let out = wait(run, continued);
    assert_eq!(out.code, Some(70), "{out:?}");
    assert!(out.took < Duration::from_secs(20), "{out:?}");
    let ticks = lines(&scratch, "tick");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&scratch, "tick"), ticks, "the command was ended");
}

#[test]
fn a_command_that_stops_itself_is_noticed_and_a_forwarded_signal_still_ends_it() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let scratch = Scratch::new("self-stop");
    for (name, code) in [("TERM", 143), ("INT", 130), ("HUP", 129)] {
        let stderr = std::fs::File::create(scratch.path("stderr")).expect("stderr file");
        let start = Instant::now();
        // A command that reads the terminal from the background is stopped the same way
        // (SIGTTIN), without a word.
        let run = lockset(&urls)
            .args(["run", "job", "--", "sh", "-c", "kill -STOP $$; echo ran on"])
            .stderr(stderr)
            .spawn()
            .expect("start lockset");
        eventually("lockset says the command is stopped", || {
            scratch
                .read("stderr")
                .is_some_and(|said| said.contains("the command is stopped by SIGSTOP"))
        });
        assert!(exists(&urls[0], "job"), "held while the command is stopped");
        let signalled = Instant::now();
        signal(run.id(), name);
        let out = wait(run, start);
        assert_eq!(out.code, Some(code), "{name}: {out:?}");
        assert_eq!(out.stdout, "", "{name}: it died of the signal: {out:?}");
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "{name}: ended at once"
        );
        assert!(!exists(&urls[0], "job"), "{name}: released");
    }
}

#[test]
fn signals_ignored_when_lockset_starts_stay_ignored_for_it_and_the_command() {
    let server = RedisServer::start();
    let urls = [server.url()];
    // nohup: SIGHUP ignored. The command outlives a hang-up, and finishes its work.
    let start = Instant::now();
    let run = lockset_via(&["nohup"], &urls)
        .args(["run", "job", "--", "sh", "-c", "sleep 1.5; echo done"])
        .spawn()
        .expect("start nohup lockset");
    eventually("the lock is held", || exists(&urls[0], "job"));
    signal(run.id(), "HUP");
    let out = wait(run, start);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "done\n"),
        "{out:?}"
    );

    // A background job of a script: SIGINT ignored, for lockset and for the command (a
    // shell cannot catch a signal ignored when it started, and does not die of it).
    let start = Instant::now();
    let run = lockset_via(&["sh", "-c", "trap '' INT; exec \"$0\" \"$@\""], &urls)
        .args(["run", "job", "--", "sh", "-c"])
        .arg("sleep 1.5; kill -INT $$; echo alive")
        .spawn()
        .expect("start lockset with SIGINT ignored");
    eventually("the lock is held", || exists(&urls[0], "job"));
    signal(run.id(), "INT");
    let out = wait(run, start);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "alive\n"),
        "{out:?}"
    );
    assert!(!exists(&urls[0], "job"), "released");
}

#[test]
fn a_background_run_under_stty_tostop_still_says_what_it_must_and_ends_on_a_signal() {
    // In the background of a terminal with `stty tostop`, a write to the terminal raises
    // SIGTTOU. lockset's own message about the stopped command must neither stop it alone
    // nor make it spin in the write, deaf to signals, while nothing refreshes the lock.
    let server = RedisServer::start();
    let urls = [server.url()];
    let shown = format!(
        "sh -c 'set -m; stty tostop; {lockset} --redis {url} run job -- sh -c \"kill -STOP \\$\\$\" & \
         sleep 1.5; kill -TERM $!; wait $!; echo exit $?'",
        lockset = env!("CARGO_BIN_EXE_lockset"),
        url = urls[0],
    );
    let out = finish(
        Command::new("script")
            .args(["-qfec", &shown, "/dev/null"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("the command is stopped by SIGSTOP"),
        "{out:?}"
    );
    assert!(out.stdout.contains("exit 143"), "{out:?}");
    assert!(out.took < Duration::from_secs(20), "{out:?}");
    assert!(!exists(&urls[0], "job"), "released");
}

#[test]
fn refresh_with_metadata_replaces_it_on_every_topology() {
    let single = RedisServer::start();
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let cluster = Cluster::start();
    let topologies: Vec<(Vec<String>, bool)> = vec![
        (vec![single.url()], false),
        (masters.iter().map(RedisServer::url).collect(), false),
        (cluster.urls(), true),
    ];
    for (urls, on_cluster) in topologies {
        let command = |args: &[&str]| {
            let mut command = lockset(&urls);
            if on_cluster {
                command.arg("--cluster");
            }
            command.args(args);
            command
        };
        let out = finish(&mut command(&[
            "acquire",
            "--metadata",
            "before",
            "{j}:a",
            "{j}:b",
        ]));
        assert_eq!(out.code, Some(0), "{out:?}");
        let token = out.stdout.trim().to_owned();
        let out = finish(&mut command(&[
            "refresh",
            "--token",
            &token,
            "--metadata",
            "after",
            "{j}:a",
            "{j}:b",
        ]));
        assert_eq!(out.code, Some(0), "{urls:?}: {out:?}");
        let out = finish(&mut command(&["status", "--json", "{j}:a", "{j}:b"]));
        let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        for key in status["keys"].as_array().expect("keys") {
            assert_eq!(key["metadata"], "after", "{urls:?}: {status}");
            assert_eq!(key["held_on"], key["nodes"], "{urls:?}: {status}");
        }
        // Without --metadata, a refresh keeps it.
        let out = finish(&mut command(&[
            "refresh", "--token", &token, "{j}:a", "{j}:b",
        ]));
        assert_eq!(out.code, Some(0), "{urls:?}: {out:?}");
        let out = finish(&mut command(&["status", "--json", "{j}:a"]));
        let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        assert_eq!(status["keys"][0]["metadata"], "after", "{urls:?}: {status}");
        let out = finish(&mut command(&[
            "release", "--token", &token, "{j}:a", "{j}:b",
        ]));
        assert_eq!(out.code, Some(0), "{urls:?}: {out:?}");
    }
}

#[test]
fn a_redlock_loss_says_lost_on_a_majority_or_names_the_other_holder_never_itself() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    for (intruder, says) in [(None, "majority"), (Some("5:otherintruder"), "intruder")] {
        let run = lockset(&urls)
            .args(["run", "--ttl", "3s", "--metadata", "this-run", "job", "--"])
            .args(["sleep", "60"])
            .spawn()
            .expect("start lockset");
        eventually("the lock is on every master", || {
            urls.iter().all(|url| exists(url, "job"))
        });
        let taken = Instant::now();
        for url in &urls[..2] {
            match intruder {
                None => command_on(url, &["DEL", "job"]),
                Some(value) => command_on(url, &["SET", "job", value, "EX", "60"]),
            };
        }
        let out = wait(run, taken);
        assert_eq!(out.code, Some(70), "{out:?}");
        let said = out
            .stderr
            .lines()
            .find(|line| line.starts_with("lockset: lock lost"))
            .unwrap_or_else(|| panic!("no loss line: {out:?}"));
        assert!(said.contains(says), "{says} in {said}");
        assert!(!said.contains("this-run"), "never itself: {said}");
        if intruder.is_none() {
            assert!(!said.contains("taken over"), "{said}");
        }
        for url in &urls {
            command_on(url, &["DEL", "job"]);
        }
    }
}

#[test]
fn conflict_exit_codes_out_of_range_say_so() {
    let out = finish(lockset(&[]).args(["run", "--conflict-exit-code", "-1", "a", "--", "true"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("0 to 255"), "{out:?}");
}

#[test]
fn metadata_is_quoted_wherever_it_is_shown() {
    let server = RedisServer::start();
    let urls = [server.url()];
    // Escape sequences, a carriage return and a line break: none may reach the terminal.
    let metadata = "evil\x1b[2J\r\nforged line";
    acquire(&urls, &["--ttl", "60s", "--metadata", metadata, "job"]);
    let quoted = r#"held by "evil\u{1b}[2J\r\nforged line""#;
    let out = finish(lockset(&urls).args(["status", "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(out.stdout.contains(quoted), "{out:?}");
    assert!(
        !out.stdout.contains('\x1b') && !out.stdout.contains('\r'),
        "{out:?}"
    );
    let out = finish(lockset(&urls).args(["run", "job", "--", "true"]));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(out.stderr.contains(quoted), "{out:?}");
    let out = finish(lockset(&urls).args(["run", "-v", "--wait", "1s", "job", "--", "true"]));
    assert_eq!(out.code, Some(75), "{out:?}");
    assert!(
        !out.stderr.contains('\x1b') && !out.stderr.contains('\r'),
        "{out:?}"
    );
    // JSON escapes it its own way.
    let status = status_json(&urls, &["job"]);
    assert_eq!(status["keys"][0]["metadata"], metadata, "{status}");
}

#[test]
fn refresh_and_release_of_a_key_of_another_type_exit_65() {
    let server = RedisServer::start();
    let urls = [server.url()];
    command_on(&urls[0], &["LPUSH", "job", "x"]);
    command_on(&urls[0], &["HSET", "other", "f", "v"]);
    for op in ["refresh", "release"] {
        let out = finish(lockset(&urls).args([op, "--token", "t", "job", "other"]));
        assert_eq!(out.code, Some(65), "{op}: {out:?}");
        assert!(out.stderr.contains("list"), "{op}: {out:?}");
    }
}

#[test]
fn a_database_out_of_range_is_bad_usage() {
    let server = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/99", server.port());
    for args in [vec!["run", "a", "--", "true"], vec!["status", "a"]] {
        let out = finish(lockset(std::slice::from_ref(&url)).args(&args));
        assert_eq!(out.code, Some(64), "{args:?}: {out:?}");
        assert!(out.stderr.contains("99"), "{args:?}: {out:?}");
    }
}

#[test]
fn a_cluster_node_without_cluster_says_to_use_it() {
    let cluster = Cluster::start();
    let first = cluster.urls()[0].clone();
    // A key whose slot another node serves.
    let key = (0..100)
        .map(|i| format!("job{i}"))
        .find(|key| cluster.owner_of(cluster.keyslot(key)) != 0)
        .expect("a key elsewhere");
    for args in [
        vec!["run", key.as_str(), "--", "true"],
        vec!["acquire", key.as_str()],
        vec!["status", key.as_str()],
    ] {
        let out = finish(lockset(std::slice::from_ref(&first)).args(&args));
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        assert!(out.stderr.contains("--cluster"), "{args:?}: {out:?}");
    }
}

#[test]
fn a_key_that_starts_with_a_hyphen_can_be_run_with_key() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let print = "echo \"$LOCKSET_KEYS\"";
    let out = finish(lockset(&urls).args(["run", "--key", "-k", "b", "--", "sh", "-c", print]));
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "-k b\n"),
        "{out:?}"
    );
    let out = finish(lockset(&urls).args(["acquire", "--", "-k"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = finish(lockset(&urls).args(["run", "--key=-k", "--", "true"]));
    assert_eq!(out.code, Some(75), "the same key: {out:?}");
}

#[test]
fn the_usage_line_does_not_make_redis_look_required_when_the_environment_sets_it() {
    let out = finish(
        lockset(&[])
            .env("LOCKSET_REDIS", "redis://127.0.0.1:1/")
            .arg("run"),
    );
    assert_eq!(out.code, Some(64), "{out:?}");
    let usage = out
        .stderr
        .lines()
        .find(|line| line.starts_with("Usage:"))
        .unwrap_or_else(|| panic!("no usage: {out:?}"));
    assert!(!usage.contains("--redis <URL>"), "{usage}");
}

#[test]
fn acquire_with_stdout_closed_fails_and_holds_nothing() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let out = finish(
        lockset_via(&["sh", "-c", "exec \"$0\" \"$@\" >&-"], &urls).args(["acquire", "job"]),
    );
    assert_eq!(out.code, Some(71), "{out:?}");
    assert!(out.stderr.contains("stdout"), "{out:?}");
    assert!(!exists(&urls[0], "job"), "nobody could release it");
}

#[test]
fn keys_with_spaces_reach_the_command_unambiguously_as_json() {
    let server = RedisServer::start();
    let urls = [server.url()];
    let print = "echo \"$LOCKSET_KEYS_JSON\"";
    let out = finish(lockset(&urls).args(["run", "a b", "c\"d", "--", "sh", "-c", print]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let keys: Vec<String> = serde_json::from_str(out.stdout.trim()).expect("a JSON array");
    assert_eq!(keys, ["a b", "c\"d"]);
}

/// `lockset` finding the primary of `failover` through its sentinels, with `extra` global
/// options.
fn lockset_sentinel(failover: &support::sentinel::Failover, master: &str) -> Command {
    let mut command = lockset(&[]);
    for url in failover.sentinel_urls() {
        command.args(["--sentinel", &url]);
    }
    command.args(["--master", master]);
    command
}

#[test]
fn every_subcommand_works_through_sentinel_and_across_a_failover() {
    use support::sentinel::{Failover, LOCK_PASSWORD, LOCK_USER, MASTER};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut failover = runtime.block_on(Failover::start_secured(2));
    // The data nodes' login and database ride on --master.
    let master = format!("redis://{LOCK_USER}:{LOCK_PASSWORD}@{MASTER}/0");
    let token = {
        let out = finish(lockset_sentinel(&failover, &master).args([
            "acquire",
            "--ttl",
            "60s",
            "--metadata",
            "nightly",
            "report",
        ]));
        assert_eq!(out.code, Some(0), "{out:?}");
        out.stdout.trim().to_owned()
    };
    // Replicated (one replica by default) before acquire returned.
    for replica in 1..3 {
        let value = failover.ask_node(failover.nodes[replica].port(), &["GET", "report"]);
        assert!(value.contains(&token), "replica {replica}: {value:?}");
    }
    let out = finish(lockset_sentinel(&failover, &master).args(["status", "--json", "report"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("\"nightly\""), "{out:?}");

    let old = failover.nodes[0].port();
    failover.kill_primary();
    runtime.block_on(failover.wait_for_promotion(old));
    for args in [
        vec!["refresh", "--token", &token, "--ttl", "60s", "report"],
        vec!["release", "--token", &token, "report"],
    ] {
        let out = finish(lockset_sentinel(&failover, &master).args(&args));
        assert_eq!(out.code, Some(0), "{args:?} after the failover: {out:?}");
    }
    let out = finish(lockset_sentinel(&failover, &master).args(["run", "report", "--", "true"]));
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn bad_sentinel_options_exit_64_before_anything_is_locked() {
    use support::sentinel::{Failover, LOCK_PASSWORD, LOCK_USER, MASTER};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failover = runtime.block_on(Failover::start_secured(1));
    let master = format!("redis://{LOCK_USER}:{LOCK_PASSWORD}@{MASTER}/0");
    let cases: Vec<(Command, &str)> = vec![
        (
            lockset_sentinel(&failover, "no-such-master"),
            "no sentinel knows a master named",
        ),
        (
            {
                let mut command = lockset(&[]);
                command.args(["--sentinel", &failover.sentinel_urls()[0]]);
                command
            },
            "--sentinel needs --master",
        ),
        (
            {
                let mut command = lockset(&[]);
                command.args(["--master", MASTER]);
                command
            },
            "--master names the primary",
        ),
        (
            {
                let mut command = lockset_sentinel(&failover, &master);
                command.args(["--redis", "redis://127.0.0.1/"]);
                command
            },
            "without --redis",
        ),
    ];
    for (mut command, says) in cases {
        let out = finish(command.args(["acquire", "k"]));
        assert_eq!(out.code, Some(64), "{out:?}");
        assert!(out.stderr.contains(says), "{says:?}: {out:?}");
    }
    // More replicas asked for than are connected is a state that passes (a replica
    // restarting), not bad usage: tried again within --wait, then "unavailable".
    let out = finish(lockset_sentinel(&failover, &master).args([
        "--replicas",
        "2",
        "acquire",
        "--wait",
        "1s",
        "k",
    ]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("too few replicas"), "{out:?}");
    // Tried again every 200 ms while another try fits before the end of --wait.
    assert!(
        out.took >= Duration::from_millis(700) && out.took < Duration::from_millis(5_000),
        "{out:?}"
    );
    let primary = failover.nodes[failover.primary()].port();
    assert_eq!(
        failover.ask_node(primary, &["DBSIZE"]).trim(),
        "0",
        "{}",
        failover.ask_node(primary, &["KEYS", "*"])
    );

    // No sentinel listening: unreachable.
    let port = support::server::free_port();
    let out = finish(lockset(&[]).args([
        "--sentinel",
        &format!("redis://127.0.0.1:{port}/"),
        "--master",
        MASTER,
        "status",
        "k",
    ]));
    assert_eq!(out.code, Some(69), "{out:?}");
}

/// Behind Sentinel as on one server: a refused login (the data nodes' or the sentinels')
/// is a setting to fix, 69 at once and not tried again within `--wait`; a database the
/// primary does not have is bad usage (64), as with `--redis`.
#[test]
fn refused_logins_behind_sentinel_are_not_waited_for() {
    use support::sentinel::{Failover, LOCK_USER, MASTER};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failover = runtime.block_on(Failover::start_secured(1));
    let wrong_sentinel: Vec<String> = failover
        .sentinel_urls()
        .iter()
        .map(|url| url.replacen("sentinel-secret", "wrong", 1))
        .collect();
    let mut wrong_sentinels = lockset(&[]);
    for url in &wrong_sentinel {
        wrong_sentinels.args(["--sentinel", url]);
    }
    wrong_sentinels.args(["--master", MASTER]);
    let cases = [
        (
            lockset_sentinel(&failover, &format!("redis://{LOCK_USER}:wrong@{MASTER}/0")),
            69,
        ),
        (wrong_sentinels, 69),
        // No login for data nodes that want one: NOAUTH, not "a failover under way".
        (lockset_sentinel(&failover, MASTER), 69),
    ];
    for (mut command, code) in cases {
        let out = finish(command.args(["acquire", "--wait", "5s", "k"]));
        assert_eq!(out.code, Some(code), "{out:?}");
        assert!(out.took < Duration::from_millis(2_000), "{out:?}");
    }
    let master = format!(
        "redis://{LOCK_USER}:{}@{MASTER}/99",
        support::sentinel::LOCK_PASSWORD
    );
    let out = finish(lockset_sentinel(&failover, &master).args(["acquire", "--wait", "5s", "k"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("database"), "{out:?}");
    assert!(out.took < Duration::from_millis(2_000), "{out:?}");
}

/// A comma inside a `--redis` password is part of it; commas that begin another URL still
/// separate the masters of `LOCKSET_REDIS` (and of one `--redis`).
#[test]
fn a_comma_in_a_password_is_not_a_separator() {
    let server = RedisServer::start_with(None, &["--requirepass", "p,w"]);
    let url = format!("redis://:p,w@127.0.0.1:{}/", server.port());
    let out = finish(lockset(&[url]).args(["acquire", "--ttl", "30s", "job"]));
    assert_eq!(out.code, Some(0), "{out:?}");

    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let out = finish(
        lockset(&[])
            .env("LOCKSET_REDIS", urls.join(","))
            .args(["acquire", "--ttl", "30s", "job"]),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(urls.iter().all(|url| exists(url, "job")), "on every master");
}

#[test]
fn replicas_apply_to_a_single_server_too() {
    let server = RedisServer::start();
    // A replica missing is a state that passes, not bad usage: "unavailable".
    let out = finish(lockset(&[server.url()]).args(["--replicas", "1", "acquire", "k"]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("only 0 of the 1 replicas"), "{out:?}");
    assert!(!exists(&server.url(), "k"));
}

/// Every subcommand over TLS (`rediss://`), trusting a private CA given by `--tls-ca-cert`
/// or `LOCKSET_TLS_CA_CERT`; an untrusted server exits 69 saying why, at once; TLS options
/// without a `rediss://` URL, or files that are not certificates, are bad usage (64).
#[test]
fn every_subcommand_works_over_tls_and_a_wrong_ca_exits_69() {
    use support::tls::{Certs, TlsServer};

    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, false, &[]) else {
        return support::tls::skip("every_subcommand_works_over_tls_and_a_wrong_ca_exits_69");
    };
    let urls = [server.url("")];
    let ca = certs.path("ca.pem");
    let ca = ca.to_str().expect("path");
    let with_ca = |args: &[&str]| {
        let mut command = lockset(&urls);
        command.args(["--tls-ca-cert", ca]).args(args);
        finish(&mut command)
    };
    let out = with_ca(&["acquire", "--ttl", "10s", "--metadata", "over-tls", "db"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let token = out.stdout.trim().to_owned();
    let out = with_ca(&["status", "db"]);
    assert!(
        out.stdout.contains("\"db\" is held by \"over-tls\""),
        "{out:?}"
    );
    let out = with_ca(&["refresh", "--token", &token, "--ttl", "20s", "db"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = with_ca(&["release", "--token", &token, "db"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = with_ca(&["run", "db", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    // The CA from the environment, the URL from REDIS_URL.
    let out = finish(
        lockset(&[])
            .env("REDIS_URL", &urls[0])
            .env("LOCKSET_TLS_CA_CERT", ca)
            .args(["status", "db"]),
    );
    assert!(out.stdout.contains("\"db\" is free"), "{out:?}");

    // Not trusted: the system's roots, or another CA.
    let other = certs.path("other-ca.pem");
    for args in [vec![], vec!["--tls-ca-cert", other.to_str().expect("path")]] {
        let out = finish(lockset(&urls).args(&args).args(["acquire", "db"]));
        assert_eq!(out.code, Some(69), "{args:?}: {out:?}");
        assert!(out.stderr.contains("certificate"), "{args:?}: {out:?}");
        assert!(out.stderr.contains("--tls-ca-cert"), "{args:?}: {out:?}");
        assert!(out.took < Duration::from_secs(5), "{args:?}: {out:?}");
    }
    // Bad usage, nothing sent.
    let plain = RedisServer::start();
    let out = finish(lockset(&[plain.url()]).args(["--tls-ca-cert", ca, "acquire", "db"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    let key = certs.path("ca.key");
    let out =
        finish(lockset(&urls).args(["--tls-ca-cert", key.to_str().expect("path"), "status", "db"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("certificate"), "{out:?}");
    let out = finish(lockset(&urls).args(["--tls-cert", ca, "status", "db"]));
    assert_eq!(out.code, Some(64), "--tls-cert without --tls-key: {out:?}");
}

/// Mutual TLS from the command line, and Sentinel over TLS: the sentinel and the primary
/// it names both reached over TLS.
#[test]
fn client_certificates_and_sentinel_over_tls() {
    use support::tls::{Certs, TlsServer};

    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, true, &[]) else {
        return support::tls::skip("client_certificates_and_sentinel_over_tls");
    };
    let path = |name: &str| certs.path(name).to_str().expect("path").to_owned();
    let urls = [server.url("")];
    let out = finish(lockset(&urls).args(["--tls-ca-cert", &path("ca.pem"), "status", "k"]));
    assert_eq!(out.code, Some(69), "no client certificate: {out:?}");
    let mutual = [
        "--tls-ca-cert",
        &path("ca.pem"),
        "--tls-cert",
        &path("client.pem"),
        "--tls-key",
        &path("client.key"),
    ];
    let out = finish(lockset(&urls).args(mutual).args(["run", "k", "--", "true"]));
    assert_eq!(out.code, Some(0), "{out:?}");

    let (_sentinel, sentinel_port) = server.sentinel(&certs, "m");
    let out = finish(
        lockset(&[])
            .args([
                "--sentinel",
                &format!("rediss://127.0.0.1:{sentinel_port}/"),
            ])
            .args(["--master", "m", "--replicas", "0"])
            .args(mutual)
            .args(["run", "k", "--", "true"]),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// `--wait` covers finding the primary: a run started just after the primary died (no
/// majority of the sentinels names a live primary yet, then too few replicas) waits and
/// gets the lock once the new primary is up, instead of exiting "unavailable" at once.
#[test]
fn a_run_started_during_a_failover_waits_for_the_new_primary() {
    use support::sentinel::{Failover, MASTER};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut failover = runtime.block_on(Failover::start(2));
    let started = Instant::now();
    failover.kill_primary();
    let out = finish(
        lockset_sentinel(&failover, MASTER).args(["run", "--wait", "30s", "job", "--", "true"]),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "{out:?}");
}

/// Sentinel settings the deployment refuses say what is wrong: a missing sentinel password
/// is a login refused (not "no sentinel knows the master"), and a `--sentinel` URL that is
/// a data node's says it is no sentinel.
#[test]
fn sentinel_login_and_address_mistakes_say_what_they_are() {
    use support::sentinel::{Failover, MASTER};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failover = runtime.block_on(Failover::start_secured(1));
    let mut command = lockset(&[]);
    for sentinel in &failover.sentinels {
        command.args(["--sentinel", &sentinel.url()]);
    }
    let out = finish(command.args(["--master", MASTER, "acquire", "k"]));
    assert_eq!(out.code, Some(69), "{out:?}");
    assert!(out.stderr.contains("refused the login"), "{out:?}");
    assert!(!out.stderr.contains("no sentinel knows"), "{out:?}");
    let plain = support::RedisServer::start();
    let node = plain.url();
    let out = finish(lockset(&[]).args(["--sentinel", &node, "--master", MASTER, "acquire", "k"]));
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("not a sentinel"), "{out:?}");
}

/// `lockset run job echo hi` reads every word as a key: the usage error says where the
/// command goes.
#[test]
fn a_run_without_the_double_dash_is_told_where_the_command_goes() {
    let out = finish(lockset(&[]).args(["run", "job3", "echo", "hi"]));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("put the command after `--`"), "{out:?}");
}

/// The issue's own reproduction of a planned failover, with real `lockset run` processes:
/// `SENTINEL FAILOVER`, then from the moment the chosen replica answers `ROLE master` a fresh
/// `lockset run --ttl 30s --fencing KEY -- <3 s section>` every 100 ms for 14 s (locks
/// work again about 10 s after the switch, once the old primary replicates the new one). Each
/// section writes when it starts and ends (the wall clock, in ns) to a file of its own; a
/// section the lock's loss cut short ends when its `lockset` exited. No two may overlap.
/// `LOCKSET_TORTURE_TRIALS` sets the trials (default 1).
#[test]
fn a_planned_failover_never_runs_two_lockset_runs_at_once() {
    use support::sentinel::{Failover, MASTER};

    let trials: usize = std::env::var("LOCKSET_TORTURE_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for trial in 0..trials {
        let failover = runtime.block_on(Failover::start(2));
        let dir =
            std::env::temp_dir().join(format!("lockset-planned-{}-{trial}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let old = failover.nodes[failover.primary()].port();
        failover.fail_over_on_purpose();
        while !failover
            .nodes
            .iter()
            .any(|node| node.port() != old && failover.role(node.port()) == "master")
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        let mut runs = Vec::new();
        while started.elapsed() < Duration::from_secs(14) {
            let file = dir.join(format!("run-{}", runs.len()));
            let section = format!(
                "echo start $(date +%s%N) >> {0}; sleep 3; echo end $(date +%s%N) >> {0}",
                file.display()
            );
            let child = lockset_sentinel(&failover, MASTER)
                .args(["run", "--ttl", "30s", "--fencing", "planned", "--"])
                .args(["sh", "-c", &section])
                .spawn()
                .expect("start lockset");
            runs.push((file, child));
            std::thread::sleep(Duration::from_millis(100));
        }
        let now_ns = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        };
        let mut sections = Vec::new();
        for (file, child) in runs {
            let finished = wait(child, Instant::now());
            let exited = now_ns();
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let stamp = |what: &str| {
                text.lines()
                    .find_map(|line| line.strip_prefix(what))
                    .and_then(|n| n.trim().parse::<u128>().ok())
            };
            if let Some(start) = stamp("start ") {
                let end = stamp("end ").unwrap_or(exited);
                sections.push((start, end, file.display().to_string(), finished.code));
            }
        }
        sections.sort();
        for pair in sections.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "trial {trial}: {:?} and {:?} overlapped for {} ms",
                pair[0],
                pair[1],
                (pair[0].1 - pair[1].0) / 1_000_000
            );
        }
        assert!(!sections.is_empty(), "trial {trial}: no run got the lock");
        eprintln!(
            "TORTURE lockset run processes, planned failover, trial {trial}: {} sections, 0 overlaps",
            sections.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A user without scripts: `acquire` and `run` lock nothing and exit 77 (EX_NOPERM) at once,
/// saying why (see `restricted::a_user_without_scripts_locks_nothing_and_is_told_why`).
#[test]
fn a_user_without_scripts_gets_exit_77_and_nothing_locked() {
    let server = RedisServer::start();
    let user = [
        "ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha",
    ];
    assert!(support::server::cli(server.port(), &user).contains("OK"));
    let urls = [format!("redis://locker:pw@127.0.0.1:{}/", server.port())];
    every_subcommand_is_refused_scripts(&urls, &server);
}

/// A user the ACL refuses a command lockset's scripts run (the server says so with `ERR`,
/// not `NOPERM`): 77 at once from a multi-key acquire and a waiting run, as an ACL refusal,
/// and nothing locked; before, 69 (and the keys were left without an expiry).
#[test]
fn a_command_refused_inside_a_script_gets_exit_77_and_nothing_locked() {
    let server = RedisServer::start();
    let user = [
        "ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-exists", "-pexpire",
    ];
    assert!(support::server::cli(server.port(), &user).contains("OK"));
    let urls = [format!("redis://locker:pw@127.0.0.1:{}/", server.port())];
    for args in [
        &["acquire", "--ttl", "30s", "a", "b"][..],
        &[
            "run", "--ttl", "30s", "--wait", "5s", "a", "b", "--", "true",
        ],
    ] {
        let out = finish(lockset(&urls).args(args));
        assert_eq!(out.code, Some(77), "{args:?}: {out:?}");
        assert!(out.stderr.contains("ACL"), "{args:?}: {out:?}");
        assert!(out.took < Duration::from_millis(2_000), "{args:?}: {out:?}");
        assert!(!exists(&server.url(), "a"), "{args:?}");
    }
}

/// Every subcommand on a server that refuses scripts: 77 at once, naming the scripting
/// command, nothing locked (reading the keys runs a script too: the same refusal).
fn every_subcommand_is_refused_scripts(urls: &[String], server: &RedisServer) {
    for args in [
        &["acquire", "--ttl", "30s", "job"][..],
        &["run", "--ttl", "30s", "--wait", "5s", "job", "--", "true"],
        &["status", "job"],
        &["refresh", "--token", "some-token", "job"],
        &["release", "--token", "some-token", "job"],
    ] {
        let out = finish(lockset(urls).args(args));
        assert_eq!(out.code, Some(77), "{args:?}: {out:?}");
        assert!(
            out.stderr.to_lowercase().contains("eval"),
            "{args:?}: {out:?}"
        );
        assert!(out.took < Duration::from_millis(2_000), "{args:?}: {out:?}");
        assert!(!exists(&server.url(), "job"), "{args:?}");
    }
}

/// A server with the scripting commands renamed away: every subcommand exits 77 at once,
/// as for a user refused them, never 69 (a state to wait out).
#[test]
fn a_server_without_scripting_commands_gets_exit_77_from_every_subcommand() {
    let server = RedisServer::start_with(
        None,
        &[
            "--rename-command",
            "EVAL",
            "EVAL-x",
            "--rename-command",
            "EVALSHA",
            "EVALSHA-x",
        ],
    );
    every_subcommand_is_refused_scripts(&[server.url()], &server);
}

/// A key outside the user's ACL key patterns: 77 (EX_NOPERM) at once, saying that the ACL
/// refuses it and where the rule a lock user needs is, never 69 ("unreachable"), and not
/// tried again under `--wait`.
#[test]
fn a_key_outside_the_users_acl_gets_exit_77_naming_the_acl() {
    let server = RedisServer::start();
    let user = [
        "ACL", "SETUSER", "locker", "on", ">pw", "~app:*", "&*", "+@all",
    ];
    assert!(support::server::cli(server.port(), &user).contains("OK"));
    let urls = [format!("redis://locker:pw@127.0.0.1:{}/", server.port())];
    let quorum: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for master in &quorum {
        assert!(support::server::cli(master.port(), &user).contains("OK"));
    }
    let masters: Vec<String> = quorum
        .iter()
        .map(|master| format!("redis://locker:pw@127.0.0.1:{}/", master.port()))
        .collect();
    for urls in [&urls[..], &masters] {
        for args in [
            &["acquire", "--ttl", "30s", "other:job"][..],
            &["run", "--wait", "5s", "other:job", "--", "true"],
            &["status", "other:job"],
            &["release", "--token", "t", "other:job"],
        ] {
            let out = finish(lockset(urls).args(args));
            assert_eq!(out.code, Some(77), "{args:?}: {out:?}");
            assert!(out.stderr.contains("ACL"), "{args:?}: {out:?}");
            assert!(out.took < Duration::from_millis(2_000), "{args:?}: {out:?}");
        }
    }
    for server in quorum.iter().chain([&server]) {
        assert!(!exists(&server.url(), "other:job"));
    }
}

/// `--shared` and `--permits N`: the library's modes from the shell.
#[path = "cli_modes.rs"]
mod modes;

/// A variable an option reads, set but empty or blank (a service file that leaves
/// `LOCKSET_SENTINEL=` behind), counts as unset: the command goes to `REDIS_URL` as it would
/// without it. Each exited 64 before ("--sentinel needs --master", "a --redis URL is
/// empty"). Not `LOCKSET_RESTART_GRACE`, a safety setting: empty, it is still bad usage.
#[test]
fn empty_variables_count_as_unset() {
    let server = RedisServer::start();
    for name in [
        "LOCKSET_REDIS",
        "LOCKSET_SENTINEL",
        "LOCKSET_MASTER",
        "LOCKSET_TLS_CA_CERT",
        "LOCKSET_TLS_CERT",
        "LOCKSET_TLS_KEY",
    ] {
        let out = finish(
            lockset(&[])
                .env(name, " ")
                .env("REDIS_URL", server.url())
                .args(["status", "job"]),
        );
        assert_eq!(out.code, Some(0), "{name}=: {out:?}");
    }
    // But a safety setting left empty is bad usage, not the shorter default.
    let out = finish(
        lockset(&[])
            .env("LOCKSET_RESTART_GRACE", "")
            .env("REDIS_URL", server.url())
            .args(["status", "job"]),
    );
    assert_eq!(out.code, Some(64), "{out:?}");
}

/// A user whose ACL names its lock keys exactly (`~ex:a`), not the queue names that begin
/// with them: it cannot wait fairly (the servers guide), but what it acquires it can see,
/// refresh and release. Reading a key read its queue too, which the ACL refuses: `status`,
/// `refresh` and `release` exited 77 and the lock stayed until its TTL. Now the queue is
/// reported unreadable and the rest goes on.
#[test]
fn a_user_limited_to_its_exact_keys_releases_what_it_acquired() {
    let server = RedisServer::start();
    let user = [
        "ACL", "SETUSER", "exact", "on", ">pw", "~ex:a", "&*", "+@all",
    ];
    assert!(support::server::cli(server.port(), &user).contains("OK"));
    let urls = [format!("redis://exact:pw@127.0.0.1:{}/", server.port())];
    let token = acquire(&urls, &["--ttl", "30s", "--metadata", "exact-1", "ex:a"]);
    let out = finish(lockset(&urls).args(["status", "ex:a"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("exact-1"), "{out:?}");
    assert!(out.stdout.contains("queue not readable"), "{out:?}");
    let status = status_json(&urls, &["ex:a"]);
    assert_eq!(status["keys"][0]["queue_readable"], false, "{status}");
    let out = finish(lockset(&urls).args(["refresh", "--token", &token, "--ttl", "60s", "ex:a"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = finish(lockset(&urls).args(["release", "--token", &token, "ex:a"]));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(!exists(&server.url(), "ex:a"));
}
