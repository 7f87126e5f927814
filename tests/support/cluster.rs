//! A private three-master Redis Cluster on loopback, for the cluster tests.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::RedisServer;

/// Three cluster nodes, every slot assigned, stopped when dropped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Starts three nodes, joins them with `redis-cli --cluster create`, and waits until
    /// every node reports `cluster_state:ok`. `redis-cli` waits for the nodes to agree with
    /// no bound of its own, and once in a long while never sees them agree: after 20 s it
    /// is stopped (it normally takes a few seconds; 60 s cost a whole suite run), and
    /// three new nodes are tried, as when it fails.
    pub fn start() -> Self {
        Self::start_with(0, &[])
    }

    /// Three masters with a replica each (`nodes[3..]`), quick to fail over: a master that
    /// does not answer for 1 s is failed, and its replica takes over.
    pub fn start_with_replicas() -> Self {
        let cluster = Self::start_with(
            1,
            &[
                "--cluster-node-timeout",
                "1000",
                "--repl-diskless-sync-delay",
                "0",
            ],
        );
        let start = Instant::now();
        // Each master lists its replica online (what a replicated client counts), each
        // replica is in sync.
        while !(0..6).all(|i| {
            let info = cluster.cli(i, &["INFO", "replication"]);
            (info.contains("role:master")
                && info.contains("connected_slaves:1")
                && info.contains(",state=online,"))
                || super::server::is_synced_replica(&info)
        }) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "replicas never synced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn start_with(replicas: usize, extra: &[&str]) -> Self {
        for _ in 0..3 {
            if let Some(cluster) = Self::try_start(replicas, extra) {
                return cluster;
            }
        }
        panic!("no cluster came up in three tries");
    }

    fn try_start(replicas: usize, extra: &[&str]) -> Option<Self> {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_cluster_node_with(extra))
            .collect();
        let mut create = Command::new(super::server::cli_binary());
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = create.spawn().expect("run redis-cli --cluster create");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                break status;
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("redis-cli --cluster create hung; trying new nodes");
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            // A node that came up with another cluster's node file, say: new nodes may do.
            eprintln!("redis-cli --cluster create failed ({status:?}); trying new nodes");
            return None;
        }
        let cluster = Self { nodes };
        let start = Instant::now();
        while !cluster
            .nodes
            .iter()
            .all(|node| cli(node.port(), &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Runs a command on node `i` with redis-cli and returns its raw output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        cli(self.nodes[i].port(), args)
    }

    /// `key`'s slot, as Redis computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.cli(0, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("slot")
    }

    /// The index of the node serving `slot`, asked until one says so (a node's answer can
    /// be missing for a moment on a loaded machine).
    pub fn owner_of(&self, slot: u16) -> usize {
        self.find_owner_of(slot)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    /// The index of the node serving `slot`, asked for 5 s; `None` when no node says so.
    pub fn find_owner_of(&self, slot: u16) -> Option<usize> {
        for _ in 0..100 {
            if let Some(owner) = self.try_owner_of(slot) {
                return Some(owner);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    fn try_owner_of(&self, slot: u16) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            let nodes = self.cli(i, &["CLUSTER", "NODES"]);
            let Some(me) = nodes.lines().find(|line| line.contains("myself")) else {
                return false;
            };
            me.split_whitespace()
                .skip(8)
                .any(|range| match range.split_once('-') {
                    Some((lo, hi)) => {
                        let (lo, hi): (u16, u16) =
                            (lo.parse().unwrap_or(1), hi.parse().unwrap_or(0));
                        (lo..=hi).contains(&slot)
                    }
                    None => range.parse() == Ok(slot),
                })
        })
    }

    /// Node `i`'s cluster id.
    pub fn node_id(&self, i: usize) -> String {
        self.cli(i, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Moves `slot` with its keys from node `from` to node `to`, as a resharding does.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to);
        loop {
            let keys = self.cli(
                from,
                &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"],
            );
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            self.move_keys(from, to, &keys);
        }
        self.end_migration(slot, to);
    }

    /// Marks `slot` as migrating from node `from` to node `to`: from now on, `from` serves
    /// the slot's keys it still has, and sends clients asking for others to `to` (ASK), or
    /// to try again later (TRYAGAIN) when one command's keys are split between the two.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        self.cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        self.cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    }

    /// Moves `keys` (of a migrating slot) from node `from` to node `to`.
    pub fn move_keys(&self, from: usize, to: usize, keys: &[&str]) {
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        let out = self.cli(from, &args);
        // NOKEY: the keys expired since they were listed (locks have TTLs).
        assert!(
            out.contains("OK") || out.contains("NOKEY"),
            "MIGRATE failed: {out}"
        );
    }

    /// Ends the migration of `slot`: every node says node `to` serves it.
    pub fn end_migration(&self, slot: u16, to: usize) {
        let (slot, to_id) = (slot.to_string(), self.node_id(to));
        for i in 0..self.nodes.len() {
            self.cli(i, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
    }

    /// How many times node `i` answered `error` (e.g. "TRYAGAIN", "ASK"), from INFO
    /// errorstats (Redis 6.2 and later).
    pub fn errors(&self, i: usize, error: &str) -> u64 {
        let prefix = format!("errorstat_{error}:count=");
        self.cli(i, &["INFO", "errorstats"])
            .lines()
            .find_map(|line| line.trim().strip_prefix(&prefix))
            .map_or(0, |n| n.trim().parse().expect("error count"))
    }
}

use super::server::cli;
