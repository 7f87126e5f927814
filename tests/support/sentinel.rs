//! A private primary with replicas, watched by three sentinels, on loopback: for failover
//! tests. Sentinels notice a dead primary after 1 s and promote the replica with the most
//! data; a killed server can come back as a replica of the new primary.

use std::path::Path;
use std::time::Duration;

use lockset::{Replication, SentinelConfig};
use tokio::time::Instant;

use super::RedisServer;
use super::proxy::Proxy;
use super::server::{cli_as, is_synced_replica};

/// The name the sentinels know the primary by.
pub const MASTER: &str = "locks";

/// Data nodes (one primary, the rest replicas) and three sentinels. Which data node is the
/// primary changes with each failover.
pub struct Failover {
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    /// The proxies the first replicas replicate through, when they lag.
    pub links: Vec<Proxy>,
    /// The node behind each link, by index.
    linked: Vec<usize>,
    /// [`Failover::stall_link`] raised the sentinels' `failover-timeout`.
    configs_held: std::sync::atomic::AtomicBool,
    /// Passwords are required (see [`Failover::start_secured`]).
    secured: bool,
}

/// With [`Failover::start_secured`]: the data nodes' ACL user for lock clients, its
/// password, and the sentinels' password.
pub const LOCK_USER: &str = "locker";
pub const LOCK_PASSWORD: &str = "lock-secret";
pub const SENTINEL_PASSWORD: &str = "sentinel-secret";
/// The data nodes' default user's password (replication and the sentinels use it).
const ADMIN_PASSWORD: &str = "admin-secret";

/// How long a failover may take on a loaded machine before a test gives up.
pub const FAILOVER_WITHIN: Duration = Duration::from_secs(60);

impl Failover {
    /// A primary, `replicas` replicas of it (all in sync), and three sentinels that know
    /// them all and each other.
    pub async fn start(replicas: usize) -> Self {
        Self::start_lagging(replicas, Duration::ZERO).await
    }

    /// As [`Failover::start`], with the replicas replicating through proxies that delay
    /// every chunk by `lag` (as a replica in another zone would), until a failover points
    /// them elsewhere.
    pub async fn start_lagging(replicas: usize, lag: Duration) -> Self {
        Self::launch(replicas, lag, false).await
    }

    /// As [`Failover::start`], with passwords everywhere: lock clients log in to the data
    /// nodes as [`LOCK_USER`] with [`LOCK_PASSWORD`], and to the sentinels with
    /// [`SENTINEL_PASSWORD`].
    pub async fn start_secured(replicas: usize) -> Self {
        Self::launch(replicas, Duration::ZERO, true).await
    }

    /// A primary and two replicas: the first never promoted (`replica-priority 0`), the
    /// second replicating through a proxy (`links[0]`), so a test can make it miss writes
    /// and then be the one promoted.
    pub async fn start_with_a_successor() -> Self {
        let replicas = [
            Replica {
                link: None,
                never_promoted: true,
            },
            Replica {
                link: Some(Duration::ZERO),
                never_promoted: false,
            },
        ];
        Self::launch_with(&replicas, false).await
    }

    async fn launch(replicas: usize, lag: Duration, secured: bool) -> Self {
        let replica = Replica {
            link: (!lag.is_zero()).then_some(lag),
            never_promoted: false,
        };
        Self::launch_with(&vec![replica; replicas], secured).await
    }

    async fn launch_with(replicas: &[Replica], secured: bool) -> Self {
        let args = data_node_args(secured);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let primary = RedisServer::start_with(None, &args);
        let mut nodes = vec![primary];
        let mut links = Vec::new();
        let mut linked = Vec::new();
        for replica in replicas {
            let mut upstream = nodes[0].port();
            if let Some(lag) = replica.link {
                let link = Proxy::start(upstream).await;
                link.set_latency(lag);
                upstream = link.port();
                links.push(link);
                linked.push(nodes.len());
            }
            let mut node = start_replica(None, upstream, secured);
            if replica.never_promoted {
                node = never_promote(node, secured);
            }
            nodes.push(node);
        }
        let config = sentinel_config(nodes[0].port(), secured);
        let sentinels = (0..3)
            .map(|_| RedisServer::start_sentinel(&config))
            .collect();
        let failover = Self {
            nodes,
            sentinels,
            links,
            linked,
            configs_held: Default::default(),
            secured,
        };
        failover.wait_healthy().await;
        failover
    }

    /// The sentinels' URLs (with their password, when secured).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| match self.secured {
                true => format!(
                    "redis://:{SENTINEL_PASSWORD}@127.0.0.1:{}/",
                    sentinel.port()
                ),
                false => sentinel.url(),
            })
            .collect()
    }

    /// A client configuration for this deployment, with `replication` (and the lock user's
    /// login, when secured).
    pub fn config(&self, replication: Replication) -> SentinelConfig {
        // Generous timeouts: ten deployments start at once in the kill trials, and under a
        // load of 14 on two cores a sentinel took longer than the default 500 ms to answer
        // (connect failed in 2 of 10 runs). What the tests time is the failover, not these.
        let config = SentinelConfig::new(self.sentinel_urls(), MASTER)
            .expect("sentinel config")
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .replication(replication);
        match self.secured {
            true => config.username(LOCK_USER).password(LOCK_PASSWORD),
            false => config,
        }
    }

    /// The port of the node the first sentinel names as primary.
    pub fn named_primary(&self) -> u16 {
        self.named_by(self.sentinels[0].port())
    }

    /// The port of the node the sentinel at `port` names as primary (0: none).
    fn named_by(&self, port: u16) -> u16 {
        let reply = self.ask_sentinel(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
        reply
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The index of the data node that is the primary now (by its own `ROLE`).
    pub fn primary(&self) -> usize {
        self.nodes
            .iter()
            .position(|node| self.role(node.port()) == "master")
            .expect("no primary")
    }

    /// Kills the primary with SIGKILL and returns its index.
    pub fn kill_primary(&mut self) -> usize {
        let primary = self.primary();
        self.nodes[primary].kill();
        // Set back before the sentinels see it down (1 s): a failover times out with it.
        if self
            .configs_held
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.set_failover_timeout(FAILOVER_TIMEOUT);
        }
        primary
    }

    /// Waits until every sentinel names a primary other than `old_port`, and that node says
    /// it is the primary; returns its index.
    pub async fn wait_for_promotion(&self, old_port: u16) -> usize {
        match self.promotion(old_port, FAILOVER_WITHIN).await {
            Ok(index) => index,
            Err(named) => {
                panic!("no promotion within {FAILOVER_WITHIN:?} (sentinels name {named:?})")
            }
        }
    }

    /// As [`Failover::wait_for_promotion`], for at most `within`; else what the sentinels
    /// name (a failover the sentinels gave up, say: no replica was good enough).
    pub async fn promotion(&self, old_port: u16, within: Duration) -> Result<usize, Vec<u16>> {
        let start = Instant::now();
        loop {
            let named: Vec<u16> = self
                .sentinels
                .iter()
                .map(|sentinel| self.named_by(sentinel.port()))
                .collect();
            if let Some(&port) = named.first()
                && port != old_port
                && named.iter().all(|&p| p == port)
                && self.role(port) == "master"
                && let Some(index) = self.nodes.iter().position(|n| n.port() == port)
            {
                return Ok(index);
            }
            if start.elapsed() >= within {
                return Err(named);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the killed node `index` again, empty, as a replica of the current primary
    /// (the sentinels would make it one anyway), and waits until the deployment is whole.
    pub async fn restore(&mut self, index: usize) {
        let primary = self.nodes[self.primary()].port();
        let port = self.nodes[index].port();
        self.nodes[index].release_port();
        self.nodes[index] = start_replica(Some(port), primary, self.secured);
        self.wait_healthy().await;
    }

    /// Waits until the primary has every other node as an online replica, and every
    /// sentinel names it, knows each replica and the other sentinels, and sees it up.
    pub async fn wait_healthy(&self) {
        let start = Instant::now();
        let replicas = self.nodes.len() - 1;
        loop {
            if self.is_healthy(replicas) {
                return;
            }
            assert!(
                start.elapsed() < FAILOVER_WITHIN * 2,
                "the deployment did not become whole"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn is_healthy(&self, replicas: usize) -> bool {
        let Some(primary) = self
            .nodes
            .iter()
            .find(|node| self.role(node.port()) == "master")
        else {
            return false;
        };
        let info = self.ask_node(primary.port(), &["INFO", "replication"]);
        let online = info.matches("state=online").count();
        online == replicas
            && self.nodes.iter().all(|node| {
                node.port() == primary.port()
                    || is_synced_replica(&self.ask_node(node.port(), &["INFO", "replication"]))
            })
            && self.sentinels.iter().all(|sentinel| {
                let master =
                    fields(&self.ask_sentinel(sentinel.port(), &["SENTINEL", "MASTER", MASTER]));
                let get = |name: &str| master.get(name).map_or("", String::as_str).to_owned();
                get("port") == primary.port().to_string()
                    && get("flags") == "master"
                    && get("num-slaves") == replicas.to_string()
                    && get("num-other-sentinels") == (self.sentinels.len() - 1).to_string()
                    && self.replicas_known_up(sentinel.port(), replicas)
            })
    }

    /// Whether the sentinel at `port` sees `replicas` replicas, none of them down.
    fn replicas_known_up(&self, port: u16, replicas: usize) -> bool {
        let listed = self.ask_sentinel(port, &["SENTINEL", "REPLICAS", MASTER]);
        let flags: Vec<&str> = listed
            .lines()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|pair| pair[0] == "flags")
            .map(|pair| pair[1])
            .collect();
        flags.len() == replicas && flags.iter().all(|f| *f == "slave")
    }
}

/// A sentinel's configuration: quick to notice a dead primary (1 s) and to try again.
/// The sentinels' `failover-timeout`, in milliseconds: short, so that a failover that
/// stalls is retried soon.
const FAILOVER_TIMEOUT: &str = "3000";

/// The sentinels' `failover-timeout` while a test keeps a replica behind a stalled link
/// (see [`Failover::stall_link`]).
const HELD_FAILOVER_TIMEOUT: &str = "60000";

fn sentinel_config(primary: u16, secured: bool) -> String {
    let mut config = format!(
        "sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {MASTER} 1000\n\
         sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT}\n\
         sentinel parallel-syncs {MASTER} 2\n"
    );
    if secured {
        config += &format!(
            "sentinel auth-pass {MASTER} {ADMIN_PASSWORD}\nrequirepass {SENTINEL_PASSWORD}\n"
        );
    }
    config
}

/// The arguments of every data node: none waits for more replicas before it sends one its
/// data (Redis 7 waits 5 s by default), since any may become the primary; when secured,
/// passwords, and an ACL user for lock clients.
fn data_node_args(secured: bool) -> Vec<String> {
    let mut args: Vec<String> = ["--repl-diskless-sync-delay", "0"].map(String::from).into();
    if secured {
        let password = format!(">{LOCK_PASSWORD}");
        for arg in [
            "--requirepass",
            ADMIN_PASSWORD,
            "--masterauth",
            ADMIN_PASSWORD,
            "--user",
            LOCK_USER,
            "on",
            &password,
            "~*",
            "&*",
            "+@all",
        ] {
            args.push(arg.to_owned());
        }
    }
    args
}

impl Drop for Failover {
    /// The sentinels go first: they would take over a server of another test that came up
    /// on a port of this deployment's (making it a replica of theirs).
    fn drop(&mut self) {
        self.sentinels.clear();
    }
}

/// How one replica of a deployment is set up.
#[derive(Clone, Copy)]
struct Replica {
    /// Replicates through a proxy that delays each chunk by this much.
    link: Option<Duration>,
    /// `replica-priority 0`: the sentinels never promote it.
    never_promoted: bool,
}

/// `replica` with `replica-priority 0`, set before any sentinel looks at it.
fn never_promote(replica: RedisServer, secured: bool) -> RedisServer {
    let password = secured.then_some(ADMIN_PASSWORD);
    super::server::cli_as(
        replica.port(),
        password,
        &["CONFIG", "SET", "replica-priority", "0"],
    );
    replica
}

/// A replica of the server at `primary` port, on `port` or a free one.
fn start_replica(port: Option<u16>, primary: u16, secured: bool) -> RedisServer {
    let mut args = vec![
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        primary.to_string(),
    ];
    args.extend(data_node_args(secured));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_with(port, &args)
}

impl Failover {
    /// Stalls link `i` (see [`Proxy::stall`]) with its replica behind it, and keeps it
    /// there until the primary is killed ([`Failover::kill_primary`]).
    ///
    /// A sentinel "fixes" a replica that names another address for its primary than the
    /// sentinel knows (`+fix-slave-config`): at its next look at the replica (every 10 s)
    /// once that configuration is older than `failover-timeout` (3 s here), about 20 s
    /// after the deployment started, or sooner. From then on the replica replicates straight
    /// from the primary, and stalling its link cuts nothing; under load, set-up alone takes
    /// that long (seen in CI: a write "replicated" with every link stalled). So the
    /// sentinels' `failover-timeout` is raised to a minute here (no fix for a minute), and
    /// set back when the primary is killed, before any sentinel could start a failover.
    /// A replica fixed already is put behind its link again first.
    pub async fn stall_link(&self, i: usize) {
        self.set_failover_timeout(HELD_FAILOVER_TIMEOUT);
        self.configs_held
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let replica = self.nodes[self.linked[i]].port();
        let through = self.links[i].port();
        let behind = |info: &str| {
            info.lines()
                .any(|line| line.trim() == format!("master_port:{through}"))
        };
        let info = || self.ask_node(replica, &["INFO", "replication"]);
        if !behind(&info()) {
            let port = through.to_string();
            self.ask_node(replica, &["REPLICAOF", "127.0.0.1", &port]);
            let start = Instant::now();
            loop {
                let now = info();
                if behind(&now) && is_synced_replica(&now) {
                    break;
                }
                assert!(
                    start.elapsed() < FAILOVER_WITHIN,
                    "replica {replica} not back behind its link: {now}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.links[i].stall(true);
    }

    /// Gives every failover a minute (`failover-timeout`), and counts nothing down before
    /// 30 s (`down-after-milliseconds`; a failover then has to be asked for): a sentinel
    /// leading one waits for the replicas it reconfigures before it announces the switch,
    /// for a replica that does not answer 10 s (it skips one it counts down).
    pub fn slow_failovers(&self) {
        self.set_failover_timeout(HELD_FAILOVER_TIMEOUT);
        self.set_on_sentinels("down-after-milliseconds", "30000");
    }

    /// Sets every sentinel's `failover-timeout` for the primary.
    fn set_failover_timeout(&self, millis: &str) {
        self.set_on_sentinels("failover-timeout", millis);
    }

    /// Sets `option` of the primary to `value` on every sentinel (`SENTINEL SET`).
    fn set_on_sentinels(&self, option: &str, value: &str) {
        for sentinel in &self.sentinels {
            let reply =
                self.ask_sentinel(sentinel.port(), &["SENTINEL", "SET", MASTER, option, value]);
            assert_eq!(reply.trim(), "OK", "SENTINEL SET {option}: {reply}");
        }
    }

    /// Stalls every link (see [`Failover::stall_link`]).
    pub async fn stall_links(&self) {
        for i in 0..self.links.len() {
            self.stall_link(i).await;
        }
    }

    /// Runs a command on the data node at `port` (redis-cli's output).
    pub fn ask_node(&self, port: u16, args: &[&str]) -> String {
        cli_as(port, self.secured.then_some(ADMIN_PASSWORD), args)
    }

    /// Runs a command on the sentinel at `port` (redis-cli's output).
    pub fn ask_sentinel(&self, port: u16, args: &[&str]) -> String {
        cli_as(port, self.secured.then_some(SENTINEL_PASSWORD), args)
    }

    /// A data node's role by its own `ROLE` ("master", "slave"); empty when it does not
    /// answer.
    pub fn role(&self, port: u16) -> String {
        let role = self.ask_node(port, &["ROLE"]);
        role.lines().next().unwrap_or("").to_owned()
    }
}

/// redis-cli's output of a flat list of names and values, as a map.
fn fields(output: &str) -> std::collections::HashMap<String, String> {
    output
        .lines()
        .collect::<Vec<_>>()
        .chunks(2)
        .filter_map(|pair| Some((pair.first()?.to_string(), pair.get(1)?.to_string())))
        .collect()
}

impl Failover {
    /// Kills the primary (SIGKILL) and starts it again on the same port `after` later,
    /// empty and still a primary (no persistence), before the sentinels notice: its replicas
    /// resynchronize from the empty data set. Returns its index.
    pub async fn restart_primary_empty(&mut self, after: Duration) -> usize {
        self.restart_primary(after, None).await
    }

    /// Saves the primary's data set now (`SAVE`), for [`Failover::restart_primary_from_snapshot`].
    pub fn snapshot_primary(&self) {
        let port = self.nodes[self.primary()].port();
        assert_eq!(self.ask_node(port, &["SAVE"]).trim(), "OK", "SAVE");
    }

    /// As [`Failover::restart_primary_empty`], but the new process loads the snapshot the
    /// primary saved last ([`Failover::snapshot_primary`]): a node restarted with `save`
    /// persistence, or with the file of an old replica sync, has a data set older than the
    /// locks it granted since (and says it was a replica: its `second_repl_offset` is the
    /// snapshot's, not -1).
    pub async fn restart_primary_from_snapshot(&mut self, after: Duration) -> usize {
        let primary = self.primary();
        let dir = self.nodes[primary].dir().expect("the primary's folder");
        let kept = std::env::temp_dir().join(format!(
            "lockset-snapshot-{}-{}",
            std::process::id(),
            self.nodes[primary].port()
        ));
        let _ = std::fs::remove_dir_all(&kept);
        std::fs::create_dir_all(&kept).expect("snapshot folder");
        std::fs::copy(dir.join("dump.rdb"), kept.join("dump.rdb")).expect("the snapshot");
        self.restart_primary(after, Some(&kept)).await
    }

    /// Kills the primary and starts it again on its port `after` later, loading the
    /// snapshot in `snapshot`'s folder if any. Returns its index.
    async fn restart_primary(&mut self, after: Duration, snapshot: Option<&Path>) -> usize {
        let primary = self.primary();
        let port = self.nodes[primary].port();
        self.nodes[primary].kill();
        tokio::time::sleep(after).await;
        self.nodes[primary].release_port();
        let mut args = data_node_args(self.secured);
        if let Some(folder) = snapshot {
            // After the server's own `--dir`: the last one given counts.
            args.extend(["--dir".to_owned(), folder.to_string_lossy().into_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.nodes[primary] = RedisServer::start_with(Some(port), &args);
        primary
    }

    /// Waits until the primary lists every other data node as an online replica (after a
    /// restart: resynchronized from it).
    pub async fn replicas_online(&self) {
        let start = Instant::now();
        let replicas = self.nodes.len() - 1;
        loop {
            let primary = self.nodes[self.primary()].port();
            let info = self.ask_node(primary, &["INFO", "replication"]);
            if info.matches("state=online").count() == replicas {
                return;
            }
            assert!(
                start.elapsed() < FAILOVER_WITHIN,
                "replicas not back: {info}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every sentinel has been up for `at_least` (a deployment whose primary
    /// restarts after that is one the sentinels knew before).
    pub async fn sentinels_up_for(&self, at_least: Duration) {
        for sentinel in &self.sentinels {
            loop {
                let info = self.ask_sentinel(sentinel.port(), &["INFO", "server"]);
                let up: u64 = info
                    .lines()
                    .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0);
                if up >= at_least.as_secs() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Starts a planned failover (`SENTINEL FAILOVER`) through the first sentinel.
    pub fn fail_over_on_purpose(&self) {
        let reply = self.ask_sentinel(self.sentinels[0].port(), &["SENTINEL", "FAILOVER", MASTER]);
        assert_eq!(reply.trim(), "OK", "SENTINEL FAILOVER: {reply}");
    }

    /// The configuration epoch the first sentinel has for the primary.
    pub fn epoch(&self) -> u64 {
        let master =
            fields(&self.ask_sentinel(self.sentinels[0].port(), &["SENTINEL", "MASTER", MASTER]));
        master
            .get("config-epoch")
            .and_then(|epoch| epoch.parse().ok())
            .unwrap_or(0)
    }
}
