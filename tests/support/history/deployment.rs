//! The Sentinel topology's servers under faults: a primary with two replicas behind three
//! sentinels ([`Failover`]), whose nodes are paused and killed (and come back empty, as
//! replicas), whose replicas are promoted on purpose, whose primary is cut off from its
//! replicas while its clients still reach it, and whose primary is restarted empty before
//! the sentinels notice (its replicas then drop what they copied).
//!
//! These faults take turns: one at a time, each waiting until the deployment is whole
//! again (every sentinel names the primary, which has both replicas online) before the next
//! may start, so that at most one node is down or paused at once. A fault that finds
//! another one's turn under way is skipped. Everything that blocks (signals, starting
//! servers, redis-cli) runs on a blocking thread: the clients under test keep both runtime
//! workers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::faults::{AfterCutOff, Fault, describe};
use super::record::History;
use crate::support::proxy::Proxy;
use crate::support::sentinel::{FAILOVER_WITHIN, Failover, MASTER};
use crate::support::server::cli;

/// A Sentinel deployment, and whose turn it is.
pub struct Deployment {
    failover: Arc<Mutex<Failover>>,
    turn: tokio::sync::Mutex<()>,
}

impl Deployment {
    /// `failover`, whole, under faults from now on.
    pub fn new(failover: Failover) -> Self {
        Self {
            failover: Arc::new(Mutex::new(failover)),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Applies `fault` (a pause, a kill, a promotion, a cut-off, a fast restart) when no
    /// other fault has the deployment, and records it with what came of it; returns when
    /// the deployment is whole again.
    pub async fn apply(&self, fault: Fault, history: &History) {
        let Ok(_turn) = self.turn.try_lock() else {
            return;
        };
        let span = history.fault_started(describe(&fault));
        let before = self.blocking(|f, _| (primary_port(f), epoch(f))).await;
        let outcome = self
            .blocking(move |f, runtime| match fault {
                Fault::Pause { server, for_ } => pause(f, runtime, server, for_),
                Fault::Restart { server, down } => kill(f, runtime, server, down),
                Fault::Promote { sentinel } => promote(f, runtime, sentinel),
                Fault::CutOff { for_, then } => cut_off(f, runtime, for_, then),
                Fault::FastRestart { down } => restart_empty(f, runtime, down),
                other => unreachable!("not a fault of the deployment: {other:?}"),
            })
            .await;
        let after = self.blocking(|f, _| (primary_port(f), epoch(f))).await;
        let mut note = outcome;
        for _ in before.1..after.1 {
            history.failed_over();
        }
        if after != before {
            note.push(format!(
                "primary {} -> {}, epoch {} -> {}",
                before.0, after.0, before.1, after.1
            ));
        }
        history.fault_ended_with(span, &note.join(", "));
    }

    /// Every key on every data node.
    pub async fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .blocking(|f, _| {
                f.nodes
                    .iter()
                    .flat_map(|node| {
                        let listed = cli(node.port(), &["KEYS", "*"]);
                        listed.lines().map(str::to_owned).collect::<Vec<_>>()
                    })
                    .filter(|key| !key.is_empty())
                    .collect()
            })
            .await;
        keys.sort();
        keys.dedup();
        keys
    }

    /// Runs `op` on a blocking thread, with the runtime's handle to await there.
    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Failover, &Handle) -> T + Send + 'static,
    ) -> T {
        let failover = self.failover.clone();
        let runtime = Handle::current();
        tokio::task::spawn_blocking(move || {
            let mut failover = failover.lock().unwrap_or_else(PoisonError::into_inner);
            op(&mut failover, &runtime)
        })
        .await
        .expect("a deployment fault panicked")
    }
}

/// The data node a fault's `server` names: 0 is the primary then, 1 and 2 its replicas.
fn node(f: &Failover, server: usize) -> usize {
    let primary = f.primary();
    match server {
        0 => primary,
        n => (0..f.nodes.len())
            .filter(|&i| i != primary)
            .nth(n - 1)
            .expect("two replicas"),
    }
}

fn primary_port(f: &Failover) -> u16 {
    f.nodes[f.primary()].port()
}

/// Pauses a node for `for_`. A primary paused long enough is replaced by the sentinels; it
/// resumes as a primary all the same, with the writes its clients queued meanwhile.
fn pause(f: &mut Failover, runtime: &Handle, server: usize, for_: Duration) -> Vec<String> {
    let i = node(f, server);
    f.nodes[i].pause();
    std::thread::sleep(for_);
    f.nodes[i].resume();
    settle(f, runtime)
}

/// Kills a node with SIGKILL and brings it back empty, as a replica, after `down` (a primary
/// only once the sentinels promoted a replica in its place).
fn kill(f: &mut Failover, runtime: &Handle, server: usize, down: Duration) -> Vec<String> {
    let start = Instant::now();
    let i = node(f, server);
    let old = f.nodes[i].port();
    let was_primary = i == f.primary();
    f.nodes[i].kill();
    let mut notes = Vec::new();
    if was_primary {
        runtime.block_on(f.wait_for_promotion(old));
        notes.push(format!("promoted after {:.1?}", start.elapsed()));
    }
    std::thread::sleep(down.saturating_sub(start.elapsed()));
    let ports = Ports::of(f);
    let demoted = runtime.block_on(while_demoting(&ports, f.restore(i)));
    notes.extend(demoted);
    notes.push(format!("back as a replica after {:.1?}", start.elapsed()));
    notes
}

/// Kills the primary with SIGKILL and starts it again on its port `down` later, empty and
/// still a primary, before the sentinels notice (see [`Failover::restart_primary_empty`]):
/// its replicas resynchronize from it and drop every lock they copied. A restart slow
/// enough for the sentinels to notice ends as a pause long enough for a failover does.
fn restart_empty(f: &mut Failover, runtime: &Handle, down: Duration) -> Vec<String> {
    let start = Instant::now();
    runtime.block_on(f.restart_primary_empty(down));
    let mut notes = vec![format!("up again after {:.1?}", start.elapsed())];
    notes.extend(settle(f, runtime));
    notes
}

/// `SENTINEL FAILOVER` on sentinel `sentinel`: a replica promoted on purpose, while the old
/// primary still takes its clients' writes until they learn of it.
fn promote(f: &mut Failover, runtime: &Handle, sentinel: usize) -> Vec<String> {
    let old = primary_port(f);
    let reply = cli(
        f.sentinels[sentinel].port(),
        &["SENTINEL", "FAILOVER", MASTER],
    );
    if reply.trim() != "OK" {
        return vec![format!("refused: {}", reply.trim())];
    }
    let start = Instant::now();
    // A failover the sentinels accept may still be given up (no replica good enough after
    // an earlier fault, on a loaded machine): then nothing changed.
    let mut notes = match runtime.block_on(f.promotion(old, FAILOVER_WITHIN)) {
        Ok(_) => vec![format!("promoted after {:.1?}", start.elapsed())],
        Err(named) => vec![format!(
            "not promoted in {FAILOVER_WITHIN:?}: the sentinels name {named:?}"
        )],
    };
    notes.extend(settle(f, runtime));
    notes
}

/// Cuts the primary off from its replicas for `for_` (their replication links, through
/// proxies put in for it, stall) while its clients still reach it, then heals, promotes a
/// replica (which lacks what the primary took meanwhile) or kills the primary.
fn cut_off(f: &mut Failover, runtime: &Handle, for_: Duration, then: AfterCutOff) -> Vec<String> {
    let primary = primary_port(f);
    let replicas: Vec<u16> = (1..f.nodes.len())
        .map(|n| f.nodes[node(f, n)].port())
        .collect();
    let links: Vec<Proxy> = replicas
        .iter()
        .map(|_| runtime.block_on(Proxy::start(primary)))
        .collect();
    for (replica, link) in replicas.iter().zip(&links) {
        replicate_from(*replica, link.port());
    }
    let linked = wait_until(Duration::from_secs(5), || {
        replicas
            .iter()
            .zip(&links)
            .all(|(replica, link)| follows(*replica, link.port()))
    });
    let mut notes = Vec::new();
    if !linked {
        notes.push("the links did not come up in 5 s".to_owned());
    }
    for link in &links {
        link.stall(true);
    }
    std::thread::sleep(for_);
    notes.extend(match then {
        AfterCutOff::Heal => Vec::new(),
        AfterCutOff::Promote => promote(f, runtime, 0),
        AfterCutOff::Kill => kill(f, runtime, 0, Duration::ZERO),
    });
    for link in &links {
        link.stall(false);
    }
    // Replicas the sentinels did not point elsewhere replicate directly again.
    let primary = primary_port(f);
    for (replica, link) in replicas.iter().zip(&links) {
        if follows(*replica, link.port()) {
            replicate_from(*replica, primary);
        }
    }
    notes.extend(settle(f, runtime));
    notes
}

/// Waits until the deployment is whole again (see [`while_demoting`]).
fn settle(f: &Failover, runtime: &Handle) -> Vec<String> {
    let start = Instant::now();
    let mut notes = runtime.block_on(while_demoting(&Ports::of(f), f.wait_healthy()));
    if start.elapsed() > Duration::from_secs(1) {
        notes.push(format!("whole again after {:.1?}", start.elapsed()));
    }
    notes
}

/// The ports of a deployment's data nodes and sentinels (a node brought back keeps its
/// port).
struct Ports {
    nodes: Vec<u16>,
    sentinels: Vec<u16>,
}

impl Ports {
    fn of(f: &Failover) -> Self {
        Self {
            nodes: f.nodes.iter().map(|node| node.port()).collect(),
            sentinels: f.sentinels.iter().map(|node| node.port()).collect(),
        }
    }
}

/// Runs `whole` (a wait until the deployment is whole again) and meanwhile makes a primary
/// the sentinels replaced (while it was paused, or by a promotion) a replica of the new one
/// as soon as they all agree on it: the sentinels do that themselves only 8-10 s later.
/// Returns what it did.
async fn while_demoting(ports: &Ports, whole: impl Future<Output = ()>) -> Vec<String> {
    let mut notes = Vec::new();
    tokio::pin!(whole);
    loop {
        tokio::select! {
            () = &mut whole => return notes,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let Some(named) = agreed_primary(ports).filter(|&port| claims_primary(port)) else {
            continue;
        };
        for &port in &ports.nodes {
            if port != named && claims_primary(port) {
                replicate_from(port, named);
                notes.push(format!("old primary {port} made a replica"));
            }
        }
    }
}

/// The primary every sentinel names, if they agree.
fn agreed_primary(ports: &Ports) -> Option<u16> {
    let named: Vec<Option<u16>> = ports
        .sentinels
        .iter()
        .map(|&sentinel| {
            let reply = cli(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
            reply
                .lines()
                .nth(1)
                .and_then(|port| port.trim().parse().ok())
        })
        .collect();
    named
        .iter()
        .all(|port| *port == named[0])
        .then_some(named[0])
        .flatten()
}

/// The highest configuration epoch a sentinel knows: it grows by one with each failover.
fn epoch(f: &Failover) -> u64 {
    f.sentinels
        .iter()
        .filter_map(|sentinel| {
            let reply = cli(sentinel.port(), &["SENTINEL", "MASTER", MASTER]);
            let lines: Vec<&str> = reply.lines().collect();
            lines
                .windows(2)
                .find(|pair| pair[0] == "config-epoch")
                .and_then(|pair| pair[1].trim().parse().ok())
        })
        .max()
        .unwrap_or(0)
}

fn replicate_from(replica: u16, primary: u16) {
    cli(replica, &["REPLICAOF", "127.0.0.1", &primary.to_string()]);
}

/// Whether the node at `port` answers `ROLE` as a primary.
fn claims_primary(port: u16) -> bool {
    cli(port, &["ROLE"]).lines().next() == Some("master")
}

/// Whether the node at `port` replicates from `primary` with its link up.
fn follows(port: u16, primary: u16) -> bool {
    let info = cli(port, &["INFO", "replication"]);
    let has = |line: &str| info.lines().any(|l| l.trim() == line);
    has(&format!("master_port:{primary}")) && has("master_link_status:up")
}

/// Checks `done` every 20 ms until it holds (true) or `within` passed (false).
fn wait_until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
