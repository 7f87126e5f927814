//! Private redis-server processes for tests and examples: each on a free loopback port,
//! with persistence off, stopped when dropped. Never touches a server it did not start.
//!
//! `LOCKSET_REDIS_SERVER` names the `redis-server` binary to run (default: the one on `PATH`),
//! so the suite runs against any version of Redis or Valkey; the command line client is taken
//! from beside it when there is one there (`valkey-cli` beside `valkey-server`).

#![allow(dead_code, unreachable_pub)]
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockset::redis;

/// How long a fresh server may take to answer PING.
const STARTUP: Duration = Duration::from_secs(20);

/// A redis-server child process, killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    /// Its private working folder, removed with it (cluster nodes keep their node file there).
    dir: Option<PathBuf>,
    /// Holds the port of a killed server (see [`RedisServer::kill`]).
    reserved: Option<Reserved>,
}

/// A killed server's port, held by a listener (SO_REUSEADDR, as the server's own, so that
/// the dead server's connections in TIME_WAIT do not stop it) that closes every connection
/// at once: to a client it is as dead as the server, yet no other server can start there.
/// (A socket that is bound but does not listen would refuse connections, but would not keep
/// a server that sets SO_REUSEADDR, as Redis does, from binding the port too.)
struct Reserved {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reserved {
    fn hold(port: u16) -> Option<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).ok()?;
        listener.set_nonblocking(true).ok()?;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = std::thread::spawn({
            let done = done.clone();
            move || {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => drop(stream),
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            }
        });
        Some(Self {
            done,
            thread: Some(thread),
        })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl RedisServer {
    /// Starts a server on a free 127.0.0.1 port and waits until it answers PING.
    ///
    /// # Panics
    ///
    /// When redis-server is not installed (with how to install it) or will not start.
    pub fn start() -> Self {
        // Another process may grab the free port between our probe and the server's bind;
        // then the server exits and we try the next free port.
        for _ in 0..10 {
            if let Some(server) = Self::try_start() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    fn try_start() -> Option<Self> {
        Self::try_start_on(free_port())
    }

    /// Kills the server and starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if let Some(mut server) = Self::try_start_on(self.port) {
                std::mem::swap(self, &mut server);
                // `server` is now the dead process; dropping it only reaps it.
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Starts a Redis Cluster node (cluster mode on, its node file in a private folder), not
    /// yet part of any cluster.
    pub fn start_cluster_node() -> Self {
        Self::start_cluster_node_with(&[])
    }

    /// As [`RedisServer::start_cluster_node`], with `extra` arguments.
    pub fn start_cluster_node_with(extra: &[&str]) -> Self {
        for _ in 0..10 {
            let port = free_port();
            // The cluster bus listens on port + 10000.
            if port > 55_000 {
                continue;
            }
            let path =
                std::env::temp_dir().join(format!("lockset-node-{}-{port}", std::process::id()));
            // A fresh node file: an old node's (same process id and port) would make this
            // node a member of that node's cluster.
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::create_dir_all(&path);
            let dir = path.to_string_lossy().into_owned();
            let mut cluster = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--dir",
                &dir,
            ];
            cluster.extend(extra);
            // The folder goes with the server, also one that did not start.
            if let Some(server) = Self::try_start_with(port, &cluster, Some(path)) {
                return server;
            }
        }
        panic!("no cluster node started on any of 10 free ports");
    }

    /// One try to start a server on a free port with `extra` arguments: `None` when it did
    /// not come up (the port was taken meanwhile, or the server refuses the arguments).
    pub fn try_start_with_args(extra: &[&str]) -> Option<Self> {
        Self::try_start_with(free_port(), extra, None)
    }

    fn try_start_on(port: u16) -> Option<Self> {
        Self::try_start_with(port, &[], None)
    }

    /// Starts a server with `extra` arguments (`--replicaof 127.0.0.1 PORT`, say) on a free
    /// port, or on `port` when given (a replaced server comes back where it was).
    pub fn start_with(port: Option<u16>, extra: &[&str]) -> Self {
        for _ in 0..50 {
            if let Some(server) = Self::try_start_with(port.unwrap_or_else(free_port), extra, None)
            {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server {extra:?} did not start");
    }

    /// Starts a sentinel (`redis-server FILE --sentinel`) on a free port, its configuration
    /// `config` in a private folder (sentinels rewrite their file).
    pub fn start_sentinel(config: &str) -> Self {
        for _ in 0..10 {
            let port = free_port();
            let path = std::env::temp_dir()
                .join(format!("lockset-sentinel-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("sentinel folder");
            let file = path.join("sentinel.conf");
            std::fs::write(&file, config).expect("sentinel config");
            let file = file.to_string_lossy().into_owned();
            let dir = path.to_string_lossy().into_owned();
            let args = [file.as_str(), "--sentinel", "--dir", &dir];
            if let Some(server) = Self::try_start_with(port, &args, Some(path)) {
                return server;
            }
        }
        panic!("no sentinel started on any of 10 free ports");
    }

    /// `dir`: the server's private folder, removed with it (the caller passes `--dir`);
    /// without one, the server gets a fresh folder of its own as its working folder. A
    /// configuration file, if any, leads `extra`.
    fn try_start_with(port: u16, extra: &[&str], dir: Option<PathBuf>) -> Option<Self> {
        let (file, extra) = match extra.first() {
            Some(first) if !first.starts_with("--") => (Some(*first), &extra[1..]),
            _ => (None, extra),
        };
        // Never the shared working folder: a replica's full sync writes dump.rdb there, and
        // every server loads a dump.rdb it finds at start (`--save ""` only stops saving),
        // so a fresh server would start with another test's keys.
        let (dir, working) = match dir {
            Some(dir) => (dir, Vec::new()),
            None => {
                let dir = private_dir(port);
                let working = vec!["--dir".to_owned(), dir.to_string_lossy().into_owned()];
                (dir, working)
            }
        };
        let child = Command::new(server_binary())
            .args(file)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(&working)
            .args(extra)
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run redis-server ({err}); install it with \
                     `apt-get update && apt-get install -y redis-server`"
                )
            });
        let mut server = Self {
            child,
            port,
            dir: Some(dir),
            reserved: None,
        };
        // Only a server told to want a password may answer NOAUTH as itself.
        let wants_password = file.is_some() || extra.contains(&"--requirepass");
        server.wait_ready(wants_password).then_some(server)
    }

    fn wait_ready(&mut self, wants_password: bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < STARTUP {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if ping(self.port) {
                return self.answers_as_itself(wants_password);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Whether the server answering on the port is this process: a server of another test
    /// may have taken the port first (tests run side by side in one process, and a restart
    /// reuses its port), and this one then fails to bind it and exits. A server that wants a
    /// password cannot be asked: it counts as itself only when this one was told to want one
    /// (`wants_password`); else it is another test's (one that set a password: a test failed
    /// with NOAUTH on a server it had just started).
    fn answers_as_itself(&self, wants_password: bool) -> bool {
        let info = cli(self.port, &["INFO", "server"]);
        match info
            .lines()
            .find_map(|line| line.trim().strip_prefix("process_id:"))
            .and_then(|pid| pid.parse::<u32>().ok())
        {
            Some(pid) => pid == self.child.id(),
            None => wants_password,
        }
    }

    /// The server's URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's private working folder, if it has one (cluster nodes do).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pauses the server process (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Kills the server at once (SIGKILL): nothing it has not sent on is kept. Its port
    /// stays taken until the server is dropped or [`RedisServer::release_port`] is called:
    /// sentinels and cluster nodes that knew it keep trying it, and would take over any
    /// other test's server that came up there (a sentinel makes it a replica of its own).
    pub fn kill(&mut self) {
        self.stop();
        self.reserved = Reserved::hold(self.port);
        assert!(
            self.reserved.is_some(),
            "port {} taken at once by another",
            self.port
        );
    }

    /// Lets the port of a killed server go, to start another one on it.
    pub fn release_port(&mut self) {
        self.reserved = None;
    }

    /// Whether the server process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the server and waits for it to exit.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Only a process of ours that still runs (a reaped pid may belong to someone else).
        if matches!(self.child.try_wait(), Ok(None)) {
            // A paused server must be woken to die promptly on some systems.
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            self.stop();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The URL in `REDIS_URL`, or a throwaway local server's (kept alive by the returned guard).
pub fn url_or_start() -> (String, Option<RedisServer>) {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    }
}

/// The `redis-server` to run: `LOCKSET_REDIS_SERVER`, or the one on `PATH`.
pub fn server_binary() -> std::path::PathBuf {
    match std::env::var_os("LOCKSET_REDIS_SERVER") {
        Some(path) if !path.is_empty() => path.into(),
        _ => "redis-server".into(),
    }
}

/// Whether `info`, a replica's `INFO replication`, says it loaded its primary's data and
/// follows its stream (`master_link_status:up`). Only then does it acknowledge writes: a
/// primary lists a replica as `state=online` sooner on Valkey 9, while the replica still
/// loads, and WAIT then counts none for about a second.
pub fn is_synced_replica(info: &str) -> bool {
    info.contains("role:slave") && info.contains("master_link_status:up")
}

/// Whether the replica at `port` is in sync: it says so (see [`is_synced_replica`]), and
/// its primary lists it `state=online`, as the library's count of replicas requires. Each
/// can come first: Valkey 9's primary lists a replica that still loads, Redis 7's replica
/// says `up` a moment before its primary has its first acknowledgement.
pub fn replica_in_sync(port: u16) -> bool {
    let info = cli(port, &["INFO", "replication"]);
    let primary_port = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("master_port:"))
        .and_then(|port| port.parse::<u16>().ok());
    is_synced_replica(&info)
        && primary_port.is_some_and(|primary| {
            let listed = format!("port={port},state=online");
            cli(primary, &["INFO", "replication"]).contains(&listed)
        })
}

/// The lock primitives the server at `port` has as commands, by its own word (`COMMAND
/// INFO`, `COMMAND DOCS`): what the library should find, asked independently of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Natives {
    /// Its compare-and-delete: `Some("delifeq")` (Valkey 9.0+), `Some("delex")` (Redis
    /// 8.4+), or `None`.
    pub delete: Option<&'static str>,
    /// Whether `SET` takes `IFEQ` (Valkey 8.1+, Redis 8.4+).
    pub set_ifeq: bool,
}

/// What the server at `port` has natively (see [`Natives`]).
pub fn natives(port: u16) -> Natives {
    let knows = |command: &str| !cli(port, &["COMMAND", "INFO", command]).trim().is_empty();
    let delete = ["delifeq", "delex"]
        .into_iter()
        .find(|command| knows(command));
    let docs = cli(port, &["COMMAND", "DOCS", "SET"]);
    Natives {
        delete,
        set_ifeq: docs.lines().any(|line| line.trim() == "IFEQ"),
    }
}

/// Runs a command on the server at `port` and returns what redis-cli would print for it
/// without a terminal: each value on a line of its own (arrays flattened, nil as an empty
/// line), an error reply as its text; nothing when the server cannot be reached.
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_as(port, None, args)
}

/// As [`cli`], logged in with `password` (the default user's) when given; like redis-cli, a
/// refused login is not fatal (the command runs as the default user).
///
/// A connection of its own rather than a redis-cli process: the tests poll servers often,
/// and starting redis-cli for each question took more CPU than everything else the failover
/// tests do (57% of it, measured with `perf record -a`).
pub fn cli_as(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return String::new();
    };
    let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return String::new();
    };
    if connection
        .set_read_timeout(Some(Duration::from_secs(30)))
        .is_err()
    {
        return String::new();
    }
    if let Some(password) = password {
        let _: redis::RedisResult<redis::Value> =
            redis::cmd("AUTH").arg(password).query(&mut connection);
    }
    let mut printed = String::new();
    match redis::cmd(args[0])
        .arg(&args[1..])
        .query::<redis::Value>(&mut connection)
    {
        Ok(value) => print_raw(&value, &mut printed),
        Err(err) => match (err.code(), err.detail()) {
            (Some(code), Some(detail)) => printed.push_str(&format!("{code} {detail}\n")),
            (Some(code), None) => printed.push_str(&format!("{code}\n")),
            _ => {}
        },
    }
    printed
}

/// Appends `value` as redis-cli prints it without a terminal.
fn print_raw(value: &redis::Value, out: &mut String) {
    use redis::Value;
    match value {
        Value::Nil => out.push('\n'),
        Value::Int(n) => out.push_str(&format!("{n}\n")),
        Value::BulkString(bytes) => {
            out.push_str(&String::from_utf8_lossy(bytes));
            out.push('\n');
        }
        Value::SimpleString(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Okay => out.push_str("OK\n"),
        Value::Array(values) | Value::Set(values) => {
            values.iter().for_each(|value| print_raw(value, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(key, value)| {
            print_raw(key, out);
            print_raw(value, out);
        }),
        Value::VerbatimString { text, .. } => {
            out.push_str(text);
            out.push('\n');
        }
        other => out.push_str(&format!("{other:?}\n")),
    }
}

/// The command line client beside [`server_binary`] (`valkey-cli` beside `valkey-server`,
/// `redis-cli` beside `redis-server`), else the `redis-cli` on `PATH` (a server package may
/// ship none; any recent one builds a cluster of any server).
pub fn cli_binary() -> std::path::PathBuf {
    let server = server_binary();
    let name = server
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("");
    let cli = match name.strip_suffix("-server") {
        Some(prefix) => format!("{prefix}-cli"),
        None => "redis-cli".to_owned(),
    };
    let beside = server.with_file_name(cli);
    if server
        .parent()
        .is_some_and(|dir| !dir.as_os_str().is_empty())
        && beside.exists()
    {
        beside
    } else {
        "redis-cli".into()
    }
}

/// A new, empty folder for a server on `port`: unique also when a server replaces another on
/// the same port (the old one's folder goes when it is dropped, maybe after the new one
/// started).
fn private_dir(port: u16) -> PathBuf {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("lockset-server-{}-{port}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("server folder");
    path
}

pub fn free_port() -> u16 {
    // Never the same port twice in one run: a test's server killed on purpose must stay
    // gone, and another test's fresh server on its port would answer the first test's
    // reconnecting clients as if it were theirs (a Redlock obtain with three of five
    // masters killed succeeded so, once, in CI).
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("find a free loopback port");
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// A loopback listener on a port [`free_port`] handed out: never a port another test's
/// server had, whose clients may still be reconnecting to it (a listener from the kernel's
/// `bind(0)` took such a port once in CI, and a test that asserts nothing connects saw them).
pub fn listen() -> TcpListener {
    loop {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", free_port())) {
            return listener;
        }
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 7];
    // A server that wants a password answers too: it is up.
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}
