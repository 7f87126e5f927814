//! Faults from a seeded schedule: servers paused (SIGSTOP) or killed and restarted empty,
//! connections stalled, dropped, cut or slowed in a TCP proxy, cluster slots migrated;
//! in a Sentinel deployment also replicas promoted on purpose, primaries cut off from
//! their replicas, and primaries restarted empty before the sentinels notice (see
//! `deployment.rs`).
//!
//! The whole schedule is drawn from the seed before the run starts, so a seed reproduces
//! it; a target (a server, a proxy) has at most one fault at a time, and every fault heals
//! itself when its time is up. A Sentinel deployment's servers take turns: one of its
//! faults at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::deployment::Deployment;
use super::record::History;
use super::workload::MAX_TTL;
use crate::support::proxy::Proxy;
use crate::support::{RedisServer, ms};

/// How long a killed server stays down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Never killed.
    Never,
    /// Longer than the longest TTL (antirez's delayed restart): every lock it held has
    /// expired everywhere by the time it is back, so forgetting them is harmless.
    Delayed,
    /// Back at once, empty: it forgets locks that are still valid.
    Immediate,
    /// Back empty, as a replica of the primary (a primary only once the sentinels promoted
    /// a replica in its place): it copies the locks from there.
    AsReplica,
}

/// How many kinds of fault there are (see [`Plan::weights`]).
pub const KINDS: usize = 10;

/// What the schedule may do to a topology, and how often.
#[derive(Clone, Debug)]
pub struct Plan {
    pub servers: usize,
    pub proxies: usize,
    pub restart: Restart,
    /// Cluster slots whose keys may be migrated to another node.
    pub slots: Vec<u16>,
    /// A Sentinel deployment: replicas may be promoted on purpose, the primary cut off from
    /// its replicas or restarted empty at once, and the servers' faults take turns with
    /// those (one at a time).
    pub failovers: bool,
    /// The time between two faults starting, in ms.
    pub gap_ms: (u64, u64),
    /// Relative weights: pause, restart, stall, latency, drop, cut, migrate, promote, cut
    /// off, fast restart.
    pub weights: [u32; KINDS],
    /// How many servers are down (paused or killed) from the start, before any client
    /// spoke to them, for a long stretch of the run (Redlock: a minority of its masters).
    pub down_at_start: usize,
}

impl Plan {
    /// The usual mix: every kind of fault the topology allows, a few per second.
    pub fn mixed(servers: usize, proxies: usize, restart: Restart, slots: Vec<u16>) -> Self {
        Self {
            servers,
            proxies,
            restart,
            slots,
            failovers: false,
            gap_ms: (100, 700),
            weights: [25, 15, 15, 15, 10, 10, 15, 0, 0, 0],
            down_at_start: 0,
        }
    }

    /// A Sentinel deployment of three data nodes, and `proxies` in front of its sentinels.
    pub fn failover(proxies: usize) -> Self {
        Self {
            failovers: true,
            weights: [15, 20, 10, 10, 10, 10, 0, 25, 20, 25],
            ..Self::mixed(3, proxies, Restart::AsReplica, Vec::new())
        }
    }
}

/// A fault. In a Sentinel deployment, server 0 is whichever data node is the primary when
/// the fault starts, servers 1 and 2 its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Pause {
        server: usize,
        for_: Duration,
    },
    Restart {
        server: usize,
        down: Duration,
    },
    Stall {
        proxy: usize,
        for_: Duration,
    },
    Latency {
        proxy: usize,
        latency: Duration,
        for_: Duration,
    },
    Drop {
        proxy: usize,
    },
    Cut {
        proxy: usize,
    },
    /// Moves a slot (with its keys) to the `shift`-th next node.
    Migrate {
        slot: u16,
        shift: usize,
    },
    /// `SENTINEL FAILOVER` on a sentinel: a replica promoted on purpose.
    Promote {
        sentinel: usize,
    },
    /// The primary's replication links stalled while its clients still reach it.
    CutOff {
        for_: Duration,
        then: AfterCutOff,
    },
    /// The primary killed (SIGKILL) and started again on its port `down` later, empty and
    /// still a primary, before the sentinels notice: its replicas resynchronize from the
    /// empty data set.
    FastRestart {
        down: Duration,
    },
}

/// What ends a cut-off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterCutOff {
    /// The links resume.
    Heal,
    /// A replica, behind by what the primary took meanwhile, is promoted.
    Promote,
    /// The primary is killed (and comes back as a replica).
    Kill,
}

/// The faults of a run, each with when it starts.
pub fn schedule(seed: u64, plan: &Plan, length: Duration) -> Vec<(Duration, Fault)> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xFA17);
    // When each server, then each proxy, then the lane (migrations, or a Sentinel
    // deployment's turns) is free again.
    let mut free = vec![Duration::ZERO; plan.servers + plan.proxies + 1];
    let mut faults = Vec::new();
    for (server, fault, busy) in down_at_start(&mut rng, plan, length) {
        free[server] = busy;
        faults.push((Duration::ZERO, fault));
    }
    let mut at = Duration::ZERO;
    loop {
        at += ms(rng.random_range(plan.gap_ms.0..=plan.gap_ms.1));
        if at >= length {
            return faults;
        }
        let Some(kind) = pick_kind(&mut rng, plan) else {
            return faults;
        };
        if let Some((fault, busy, targets)) = draw(&mut rng, plan, kind, &free, at) {
            for target in targets {
                free[target] = at + busy;
            }
            faults.push((at, fault));
        }
    }
}

/// The servers down from the start: each paused, or killed (when the plan restarts servers),
/// for a quarter to a half of the run (a killed one at least as long as a delayed restart
/// takes). Returns each with its fault and until when it is busy.
fn down_at_start(
    rng: &mut SmallRng,
    plan: &Plan,
    length: Duration,
) -> Vec<(usize, Fault, Duration)> {
    let mut servers: Vec<usize> = (0..plan.servers).collect();
    let mut down = Vec::new();
    for _ in 0..plan.down_at_start.min(plan.servers) {
        let server = servers.swap_remove(rng.random_range(0..servers.len()));
        let span = ms(rng.random_range(length.as_millis() / 4..=length.as_millis() / 2) as u64);
        let fault = match plan.restart {
            Restart::Never => Fault::Pause { server, for_: span },
            _ if rng.random_bool(0.5) => Fault::Pause { server, for_: span },
            _ => Fault::Restart {
                server,
                down: span.max(MAX_TTL + ms(100)),
            },
        };
        let busy = match &fault {
            Fault::Restart { down, .. } => *down + ms(300),
            _ => span + ms(50),
        };
        down.push((server, fault, busy));
    }
    down
}

/// Picks a kind of fault by weight among those the plan allows.
fn pick_kind(rng: &mut SmallRng, plan: &Plan) -> Option<usize> {
    let allowed = |kind: usize| match kind {
        0 => plan.servers > 0,
        1 => plan.restart != Restart::Never,
        2..=5 => plan.proxies > 0,
        6 => !plan.slots.is_empty(),
        _ => plan.failovers,
    };
    let weights: Vec<u32> = (0..KINDS)
        .map(|k| if allowed(k) { plan.weights[k] } else { 0 })
        .collect();
    let total: u32 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let mut pick = rng.random_range(0..total);
    weights.iter().position(|&w| {
        if pick < w {
            return true;
        }
        pick -= w;
        false
    })
}

/// Draws one fault of `kind` on a target that is free at `at`: the fault, how long its
/// targets stay busy, and which targets (servers first, then proxies, then migrations).
fn draw(
    rng: &mut SmallRng,
    plan: &Plan,
    kind: usize,
    free: &[Duration],
    at: Duration,
) -> Option<(Fault, Duration, Vec<usize>)> {
    // Half of a Sentinel deployment's node faults hit the primary (server 0).
    let free_server = |rng: &mut SmallRng| match plan.failovers && rng.random_bool(0.5) {
        true => Some(0),
        false => pick_free(rng, &free[..plan.servers], at),
    };
    let proxies = plan.servers..plan.servers + plan.proxies;
    let free_proxy = |rng: &mut SmallRng| pick_free(rng, &free[proxies.clone()], at);
    // Some faults outlast every TTL: a holder must learn that its lock ran out meanwhile.
    let span = |rng: &mut SmallRng, max: u64| ms(rng.random_range(20..=max));
    let settle = ms(50);
    // A Sentinel deployment's faults take turns; each waits until it is whole again.
    let lane = plan.servers + plan.proxies;
    if plan.failovers && matches!(kind, 0 | 1 | 7..) && free[lane] > at {
        return None;
    }
    let turn = |server: usize| match plan.failovers {
        true => vec![server, lane],
        false => vec![server],
    };
    let drawn = match kind {
        0 => {
            let server = free_server(rng)?;
            // Some pauses of a Sentinel deployment's primary last long enough for a failover.
            let for_ = match plan.failovers && rng.random_bool(0.3) {
                true => ms(rng.random_range(2_500..=4_000)),
                false => span(rng, 1_500),
            };
            let busy = for_ + if plan.failovers { ms(1_000) } else { settle };
            (Fault::Pause { server, for_ }, busy, turn(server))
        }
        1 => {
            let server = free_server(rng)?;
            let down = match plan.restart {
                Restart::Delayed => MAX_TTL + ms(rng.random_range(100..=400)),
                Restart::AsReplica => ms(rng.random_range(0..=1_500)),
                _ => ms(rng.random_range(0..=30)),
            };
            // Starting a server takes a while (a failover and a full copy longer); keep the
            // target busy for it.
            let busy = down + if plan.failovers { ms(2_500) } else { ms(300) };
            (Fault::Restart { server, down }, busy, turn(server))
        }
        2 => {
            let proxy = free_proxy(rng)?;
            let for_ = span(rng, 800);
            (
                Fault::Stall { proxy, for_ },
                for_ + settle,
                vec![plan.servers + proxy],
            )
        }
        3 => {
            let proxy = free_proxy(rng)?;
            let latency = ms(rng.random_range(2..=150));
            let for_ = ms(rng.random_range(100..=1_500));
            let fault = Fault::Latency {
                proxy,
                latency,
                for_,
            };
            (fault, for_ + settle, vec![plan.servers + proxy])
        }
        4 => {
            let proxy = free_proxy(rng)?;
            (Fault::Drop { proxy }, settle, vec![plan.servers + proxy])
        }
        5 => {
            let proxy = free_proxy(rng)?;
            (Fault::Cut { proxy }, settle, vec![plan.servers + proxy])
        }
        6 => {
            // One migration at a time. A paused node only makes it take longer (redis-cli
            // waits for it): a slot stuck half-way is a fault of its own.
            if free[lane] > at {
                return None;
            }
            let slot = plan.slots[rng.random_range(0..plan.slots.len())];
            let shift = rng.random_range(1..plan.servers.max(2));
            (Fault::Migrate { slot, shift }, ms(1_000), vec![lane])
        }
        7 => {
            let sentinel = rng.random_range(0..3);
            (Fault::Promote { sentinel }, ms(3_000), vec![lane])
        }
        8 => {
            let for_ = ms(rng.random_range(100..=1_500));
            let then = match rng.random_range(0..3) {
                0 => AfterCutOff::Heal,
                1 => AfterCutOff::Promote,
                _ => AfterCutOff::Kill,
            };
            (Fault::CutOff { for_, then }, for_ + ms(3_000), vec![lane])
        }
        _ => {
            // Back well within the sentinels' down-after (1 s): they never notice.
            let down = ms(rng.random_range(50..=150));
            (Fault::FastRestart { down }, ms(3_000), vec![lane])
        }
    };
    Some(drawn)
}

fn pick_free(rng: &mut SmallRng, free: &[Duration], at: Duration) -> Option<usize> {
    let candidates: Vec<usize> = (0..free.len()).filter(|&i| free[i] <= at).collect();
    (!candidates.is_empty()).then(|| candidates[rng.random_range(0..candidates.len())])
}

/// What faults act on.
pub struct Targets {
    pub servers: Servers,
    pub proxies: Vec<Arc<Proxy>>,
    /// One fault at a time per server.
    pub turns: Turns,
}

/// Turns on each server: a fault holds its server's turn from its start until it healed.
/// The schedule spaces faults on one server by an estimate of how long each takes, which a
/// loaded machine can exceed (a restart that outlasts it met a pause: the pause's resume
/// found no process).
#[derive(Default)]
pub struct Turns(Mutex<HashMap<usize, Arc<tokio::sync::Mutex<()>>>>);

impl Turns {
    async fn take(&self, server: usize) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(server)
            .or_default()
            .clone();
        turn.lock_owned().await
    }
}

/// The servers of a topology.
pub enum Servers {
    /// Independent servers (one, or the masters of a quorum): they can be killed.
    Plain(Vec<Arc<Mutex<RedisServer>>>),
    #[cfg(feature = "cluster")]
    Cluster(Arc<crate::support::cluster::Cluster>),
    /// A primary with replicas behind sentinels.
    Sentinel(Arc<Deployment>),
}

impl Servers {
    /// Runs `f` on server `i` on a blocking thread (signals, restarts and redis-cli block).
    async fn with<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce(&mut RedisServer) -> T + Send + 'static,
    ) -> T {
        let run = match self {
            Self::Plain(servers) => {
                let server = servers[i].clone();
                tokio::task::spawn_blocking(move || {
                    f(&mut server.lock().unwrap_or_else(PoisonError::into_inner))
                })
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => unreachable!("cluster nodes are reached through the cluster"),
            Self::Sentinel(_) => unreachable!("a deployment's nodes are reached through it"),
        };
        run.await.expect("fault task")
    }

    async fn pause(&self, i: usize, paused: bool) {
        #[cfg(feature = "cluster")]
        if let Self::Cluster(cluster) = self {
            let cluster = cluster.clone();
            let signal = move || match paused {
                true => cluster.nodes[i].pause(),
                false => cluster.nodes[i].resume(),
            };
            return tokio::task::spawn_blocking(signal).await.expect("signal");
        }
        self.with(i, move |server| match paused {
            true => server.pause(),
            false => server.resume(),
        })
        .await;
    }

    /// The keys left on every server, except fencing counters (which must outlive locks).
    pub async fn leftover_keys(&self) -> Vec<String> {
        let keys = match self {
            Self::Plain(servers) => {
                let mut keys = Vec::new();
                for server in servers {
                    let url = server.lock().unwrap_or_else(PoisonError::into_inner).url();
                    keys.extend(all_keys(&url).await);
                }
                keys
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(cluster) => (0..cluster.nodes.len())
                .flat_map(|i| {
                    let out = cluster.cli(i, &["KEYS", "*"]);
                    out.lines().map(str::to_owned).collect::<Vec<_>>()
                })
                .filter(|key| !key.is_empty())
                .collect(),
            Self::Sentinel(deployment) => deployment.keys().await,
        };
        keys.into_iter()
            .filter(|key| !key.ends_with(":fence"))
            .collect()
    }
}

/// Every key on the server at `url` (KEYS skips keys whose TTL has passed).
async fn all_keys(url: &str) -> Vec<String> {
    let client = lockset::redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to inspect keys");
    lockset::redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS")
}

/// Runs `schedule` from now until `until` (or until the history stops). The faults due at
/// once have begun when this returns (servers down from the start); the task it returns
/// ends when every fault it started has healed.
pub async fn inject(
    schedule: Vec<(Duration, Fault)>,
    targets: Arc<Targets>,
    history: Arc<History>,
    until: Instant,
) -> JoinHandle<()> {
    let start = Instant::now();
    let (now, later): (Vec<_>, Vec<_>) = schedule.into_iter().partition(|(at, _)| at.is_zero());
    let mut running = Vec::new();
    for (_, fault) in now {
        let (began, begun) = tokio::sync::oneshot::channel();
        let (targets, history) = (targets.clone(), history.clone());
        running.push(tokio::spawn(apply(fault, targets, history, Some(began))));
        let _ = begun.await;
    }
    tokio::spawn(async move {
        for (at, fault) in later {
            tokio::time::sleep_until(start + at).await;
            if Instant::now() >= until || history.stopped() {
                break;
            }
            let (targets, history) = (targets.clone(), history.clone());
            running.push(tokio::spawn(apply(fault, targets, history, None)));
        }
        for fault in running {
            fault.await.expect("fault task");
        }
    })
}

/// Applies one fault and heals it when its time is up; tells `began` once it is on.
async fn apply(
    fault: Fault,
    targets: Arc<Targets>,
    history: Arc<History>,
    began: Option<tokio::sync::oneshot::Sender<()>>,
) {
    if let Servers::Sentinel(deployment) = &targets.servers
        && matches!(
            fault,
            Fault::Pause { .. }
                | Fault::Restart { .. }
                | Fault::Promote { .. }
                | Fault::CutOff { .. }
                | Fault::FastRestart { .. }
        )
    {
        if let Some(began) = began {
            let _ = began.send(());
        }
        return deployment.apply(fault, &history).await;
    }
    let span = history.fault_started(describe(&fault));
    let began = move || {
        if let Some(began) = began {
            let _ = began.send(());
        }
    };
    match fault {
        Fault::Pause { server, for_ } => {
            let _turn = targets.turns.take(server).await;
            targets.servers.pause(server, true).await;
            began();
            tokio::time::sleep(for_).await;
            targets.servers.pause(server, false).await;
        }
        Fault::Restart { server, down } => {
            let _turn = targets.turns.take(server).await;
            targets.servers.with(server, RedisServer::stop).await;
            began();
            tokio::time::sleep(down).await;
            targets.servers.with(server, RedisServer::restart).await;
        }
        Fault::Stall { proxy, for_ } => {
            targets.proxies[proxy].stall(true);
            tokio::time::sleep(for_).await;
            targets.proxies[proxy].stall(false);
        }
        Fault::Latency {
            proxy,
            latency,
            for_,
        } => {
            // A proxy may have latency of its own (the single server's events proxy).
            let before = targets.proxies[proxy].latency();
            targets.proxies[proxy].set_latency(latency);
            tokio::time::sleep(for_).await;
            targets.proxies[proxy].set_latency(before);
        }
        Fault::Drop { proxy } => targets.proxies[proxy].drop_connections(),
        Fault::Cut { proxy } => targets.proxies[proxy].cut_next_reply(),
        Fault::Migrate { slot, shift } => migrate(&targets.servers, slot, shift).await,
        Fault::Promote { .. } | Fault::CutOff { .. } | Fault::FastRestart { .. } => {
            unreachable!("only a Sentinel deployment fails over")
        }
    }
    history.fault_ended(span);
}

/// One slot migration at a time, however long each takes: two at once of the same slot (the
/// schedule's lane only reserves a second for each) mix up their MIGRATING and IMPORTING
/// states and lose keys, which no operator does and no lock survives.
static MIGRATIONS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
async fn migrate(servers: &Servers, slot: u16, shift: usize) {
    let _one_at_a_time = MIGRATIONS.lock().await;
    #[cfg(feature = "cluster")]
    if let Servers::Cluster(cluster) = servers {
        let cluster = cluster.clone();
        let moved = move || match cluster.find_owner_of(slot) {
            Some(from) => {
                let to = (from + shift) % cluster.nodes.len();
                cluster.migrate_slot(slot, from, to);
            }
            // A migration that met a paused node can leave the slot claimed by nobody (an
            // operator's mistake, not the lock's): give it to a node, as an operator would.
            // Meanwhile the lock saw CLUSTERDOWN errors, which it must survive.
            None => cluster.end_migration(slot, shift % cluster.nodes.len()),
        };
        tokio::task::spawn_blocking(moved).await.expect("migrate");
    }
}

pub fn describe(fault: &Fault) -> String {
    match fault {
        Fault::Pause { server, for_ } => format!("server {server} paused for {for_:?}"),
        Fault::Restart { server, down } => {
            format!("server {server} killed, restarted empty after {down:?}")
        }
        Fault::Promote { sentinel } => format!("sentinel {sentinel} promotes a replica"),
        Fault::CutOff { for_, then } => {
            format!("the primary cut off from its replicas for {for_:?}, then {then:?}")
        }
        Fault::FastRestart { down } => {
            format!("the primary killed, restarted empty as a primary after {down:?}")
        }
        Fault::Stall { proxy, for_ } => format!("proxy {proxy} stalled for {for_:?}"),
        Fault::Latency {
            proxy,
            latency,
            for_,
        } => format!("proxy {proxy} +{latency:?} latency for {for_:?}"),
        Fault::Drop { proxy } => format!("proxy {proxy} dropped its connections"),
        Fault::Cut { proxy } => format!("proxy {proxy} cut a reply"),
        Fault::Migrate { slot, shift } => format!("slot {slot} migrated {shift} node(s) on"),
    }
}
