//! One attempt against one Redis server: run a command or script and say what happened.
//!
//! This layer knows the scripts, the value encoding and the reply shapes; it knows nothing
//! about retries or deadlines (see `policy`).

mod held;
mod obtain;
mod send;

use obtain::mode_args;
use send::{Sending, Written, replicas_now};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, ToRedisArgs, Value};

use crate::error::classify;
use crate::error::{Error, Result};
use crate::model::mode::{Mode, Modes};
use crate::model::request::{Claim, Held, IfHeld, Ticket};
use crate::model::value::{holder_metadata, shown_metadata};
use crate::server::native::{self, Natives};
use crate::server::replication::{Acks, Address, Promotable, Replicas, Replicated, Replication};
use crate::server::scripts::{self, Lua};

/// What one obtain attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Obtain {
    /// Every key is ours; with the fencing token minted, when one was asked for.
    Obtained { fence: Option<u64> },
    /// Another owner holds a key.
    Held(Held),
}

/// What an operation on a held lock found: every key ours (and the operation done), or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ownership<T> {
    /// Every key was ours.
    Ours(T),
    /// No key is another owner's, but some are missing (expired, or the server restarted
    /// empty). Nothing was changed.
    Missing,
    /// Some key holds another owner's value, or another type. Nothing was changed.
    Foreign,
}

impl<T> Ownership<T> {
    /// The result when every key was ours.
    pub(crate) fn ours(self) -> Option<T> {
        match self {
            Self::Ours(value) => Some(value),
            Self::Missing | Self::Foreign => None,
        }
    }

    fn from_reply(reply: i64, ours: T) -> Self {
        match reply {
            scripts::DONE => Self::Ours(ours),
            scripts::MISSING => Self::Missing,
            _ => Self::Foreign,
        }
    }
}

/// A connection to one Redis server, plus what we learned about that server.
pub(crate) struct Store<C> {
    conn: C,
    /// False once the server rejected `SET .. NX GET` (Redis before 7.0).
    set_nx_get: AtomicBool,
    /// A single server or a cluster.
    flavor: Flavor,
    /// How many times a script had to be sent whole after a NOSCRIPT reply: the command then
    /// ran again behind whatever was queued after it.
    reloads: AtomicU64,
    /// How many replicas must acknowledge a lock write (see `server/replication/`); set once,
    /// by [`Client::replicated`](crate::Client::replicated) after the client is made.
    replicated: OnceLock<Arc<Replicated>>,
    /// The deployment that names the primary behind the connection (Sentinel), when there
    /// is one: its epoch leads fencing tokens (see `lua/fence.lua`), its replicas count for
    /// [`Replication::all`], and it says whether a restarted primary may grant locks.
    deployment: Option<Arc<dyn Deployment>>,
    /// The compare-and-delete and compare-and-set commands the server has (see `native.rs`).
    natives: Natives,
}

/// What a store's connection reaches: one server (a primary Sentinel may name), or a Redis
/// Cluster, which routes commands by key and whose releases are announced within the key's
/// shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    Standalone,
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Cluster,
}

impl Flavor {
    /// The command `release.lua` announces releases with: sharded pub/sub on a cluster
    /// (SPUBLISH, PUBLISH before Redis 7), which stays within the key's shard instead of
    /// going to every node; plain pub/sub on one server (redis-rs subscribes to sharded
    /// channels only over cluster connections, and a single server gains nothing from them).
    const fn announce(self) -> &'static str {
        match self {
            Self::Standalone => scripts::PUBLISH,
            Self::Cluster => "SPUBLISH",
        }
    }
}

/// What a deployment that names the primary a connection sends to (Sentinel) tells the
/// store of it.
pub(crate) trait Deployment: Send + Sync {
    /// The primary's configuration epoch, when known.
    fn epoch(&self) -> Option<u64>;
    /// The primary's lookup, and how many replicas the deployment could promote.
    fn promotable(&self) -> Option<Promotable>;
    /// Finds the primary when none is known, and says whether it may grant a lock of `ttl`
    /// now (one that restarted empty may not); its lookup (see [`Promotable::generation`]).
    fn admits(&self, ttl: Duration) -> Pin<Box<dyn Future<Output = RedisResult<u64>> + Send + '_>>;
    /// Whether the primary is still the one the deployment names, and none of `missing`
    /// (replicas it lists no more, or not in sync) is a primary now.
    fn confirm(&self, missing: Vec<Address>) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// The highest epoch fencing tokens are led by: `<epoch><16 digits>` stays below 2^63, the
/// largest value Redis can INCR.
const MAX_FENCE_EPOCH: u64 = 900;

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store<C> {
    /// A store on one server, or on a Redis Cluster, as `flavor` says.
    pub(crate) fn new(conn: C, flavor: Flavor) -> Self {
        Self {
            conn,
            flavor,
            set_nx_get: AtomicBool::new(true),
            reloads: AtomicU64::new(0),
            replicated: OnceLock::new(),
            deployment: None,
            natives: Natives::new(),
        }
    }

    /// A store on the primary `deployment` names (Sentinel): fencing tokens are led by its
    /// epoch, replicated writes wait for the replicas it could promote, and a restarted
    /// primary grants no lock while it says so.
    pub(crate) fn following(conn: C, deployment: Arc<dyn Deployment>) -> Self {
        Self {
            deployment: Some(deployment),
            ..Self::new(conn, Flavor::Standalone)
        }
    }

    /// Tries once to lock every key of `claim`, incrementing its fencing counter on
    /// success. With `how.mark_holder`, a held key's value is marked so that its holder's
    /// release announces itself, and the holder's TTL is learned (the caller is about to
    /// wait): a single key is still tried without a script first, since a waiter is
    /// usually woken because the key was just released. With `how.holder_ttl`, a single
    /// key found held by the script-free path is asked for its TTL (a second round trip,
    /// only when held).
    pub(crate) async fn obtain(&self, claim: &Claim<'_>, how: IfHeld) -> Result<Obtain> {
        // Behind a deployment the primary is found first, and must admit the lock (one that
        // restarted empty grants nothing for a while); the obtain counts only if that is
        // still the primary after the write (see below).
        let admitted = match self.deployment.as_ref() {
            Some(deployment) => Some(deployment.admits(claim.ttl.duration).await?),
            None => None,
        };
        // Whatever path this obtain takes, releasing, refreshing or asking the TTL may need a
        // script: a server that refuses them gets nothing written.
        self.check_scripts(claim.keys.first().map(String::as_str))
            .await?;
        // The script paths' futures are boxed: every caller's future would otherwise carry
        // (and copy, each time it moves) room for them, also on the common path without.
        let written = if let Some(modes) = claim.modes {
            Box::pin(self.obtain_by_modes(claim, modes, how)).await
        } else {
            match self.obtain_plain(claim, how).await {
                // Maybe a key that locks with modes hold shared or as permits: only their
                // script knows (one more round trip, only for such keys).
                Err(Error::WrongType { key }) if claim.keys.contains(&key) => {
                    let modes = Modes::exclusive(claim.keys.len());
                    Box::pin(self.obtain_by_modes(claim, &modes, how)).await
                }
                outcome => outcome,
            }
        };
        let (outcome, acks) = written?;
        if let (Obtain::Obtained { .. }, Some(acks)) = (&outcome, acks) {
            Box::pin(self.keep_if_replicated(claim, acks)).await?;
        }
        if matches!(outcome, Obtain::Obtained { .. })
            && admitted.is_some()
            && admitted != self.lookup()
        {
            return Box::pin(self.undo_moved(claim)).await;
        }
        Ok(outcome)
    }

    /// [`Error::ScriptsRefused`] unless the server runs this client's scripts (asked once per
    /// connection and primary while it does; `key`, on a cluster, says which node to ask).
    pub(crate) async fn check_scripts(&self, key: Option<&str>) -> Result<()> {
        let key = key.filter(|_| self.is_cluster());
        let epoch = self.primary_epoch();
        match self.natives.scripts(&self.conn, epoch, key).await? {
            true => Ok(()),
            false => Err(Error::ScriptsRefused),
        }
    }

    /// A script's error: [`Error::ScriptsRefused`] when the server refuses to run scripts as
    /// such (the ACL user lost them since an obtain checked, or they were renamed away): the
    /// next obtain asks again before it writes.
    fn script_error(&self, err: RedisError) -> Error {
        if !classify::refuses_command(&err) {
            return err.into();
        }
        self.natives.forget_scripts();
        let err = crate::error::redact(err);
        tracing::warn!(%err, "the server refuses this client's scripts");
        Error::ScriptsRefused
    }

    /// The epoch fencing tokens are led by now: 0 when none is known.
    fn epoch(&self) -> u64 {
        self.primary_epoch().unwrap_or(0).min(MAX_FENCE_EPOCH)
    }

    /// The configuration epoch of the primary behind the connection, when it is known.
    fn primary_epoch(&self) -> Option<u64> {
        self.deployment
            .as_ref()
            .and_then(|deployment| deployment.epoch())
    }

    /// A fenced obtain ran on a new primary that the connection found while the obtain was
    /// on its way: the primary that admitted it is not the one that took it. That one may
    /// have restarted empty (and must grant nothing for a while), and a fencing token it
    /// minted under the old primary's epoch may be below one the old primary minted (the new
    /// one's counter and clock may both be behind). The lock is given back, and the attempt
    /// counts as failed on the way, to be tried again on the new primary.
    async fn undo_moved(&self, claim: &Claim<'_>) -> Result<Obtain> {
        if !claim.owner.is_custom()
            && let Err(err) = self.release(claim, Some("")).await
        {
            tracing::warn!(%err, "giving back a lock taken by a primary found on the way failed; it expires with its TTL");
        }
        Err(Error::Redis(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "the primary changed while the obtain was on its way",
        ))))
    }

    /// The deployment's current lookup of the primary, when there is a deployment.
    fn lookup(&self) -> Option<u64> {
        self.deployment
            .as_ref()
            .and_then(|deployment| deployment.promotable())
            .map(|promotable| promotable.generation)
    }

    /// How writes to this server would be replicated per `replication`, on a primary with
    /// `replicas` now (and, behind a deployment, the replicas it could promote).
    pub(crate) fn plan_replication(
        &self,
        replication: Replication,
        replicas: &Replicas,
    ) -> Arc<Replicated> {
        let replicated = Replicated::new(replication, replicas);
        if let Some(promotable) = self.deployment.as_ref().and_then(|d| d.promotable()) {
            replicated.follow(promotable);
            replicated.saw(replicas);
        }
        Arc::new(replicated)
    }

    /// Makes writes to this server count only once `replicated` is met (see
    /// `server/replication/`): every later lock write waits for its acknowledgements. Set once;
    /// false when it was set already.
    pub(crate) fn replicate(&self, replicated: Arc<Replicated>) -> bool {
        self.replicated.set(replicated).is_ok()
    }

    /// The replication set for this server, if any (also one that waits for nothing).
    pub(crate) fn replication_set(&self) -> Option<&Replication> {
        self.replicated
            .get()
            .map(|replicated| replicated.settings())
    }

    /// The replication lock writes wait for, when they wait at all.
    pub(crate) fn replication(&self) -> Option<&Arc<Replicated>> {
        self.replicated
            .get()
            .filter(|replicated| replicated.settings().is_on())
    }

    /// An obtain wrote the claim's keys and `acks` answered for the write: when too few
    /// replicas acknowledged it, the keys are removed again (best effort) and the obtain
    /// fails, since a failover could lose the lock.
    async fn keep_if_replicated(&self, claim: &Claim<'_>, acks: Acks) -> Result<()> {
        let Some(short) = self.shortfall(&acks) else {
            return Ok(());
        };
        tracing::debug!(%short, "obtain not replicated in time; removing its keys");
        // A custom token may have held these keys before (an outer lock): they are left to
        // expire, as after an unknown outcome.
        if !claim.owner.is_custom()
            && let Err(err) = self.release(claim, Some("")).await
        {
            tracing::warn!(%err, "removing the keys of an obtain that was not replicated failed; they expire with their TTL");
        }
        Err(short)
    }

    /// The error for a write `acks` acknowledged too few times, if it was; then, with
    /// [`Replication::all`], the replicas are counted again.
    fn shortfall(&self, acks: &Acks) -> Option<Error> {
        let short = self.replication()?.check(acks).err()?;
        self.count_replicas_later(true);
        Some(short)
    }

    /// Counts the replicas in sync again, in the background, when due (see
    /// [`Replicated::start_count`]); after a write fell short (`short`), the count may
    /// shrink, once the primary is confirmed as the deployment's.
    fn count_replicas_later(&self, short: bool) {
        let Some(replicated) = self.replication().filter(|r| r.start_count(short)) else {
            return;
        };
        let replicated = replicated.clone();
        let (conn, cluster) = (self.conn.clone(), self.is_cluster());
        let deployment = self.deployment.as_ref().cloned().filter(|_| short);
        let count = async move {
            let now = replicas_now(conn, cluster).await.ok();
            let confirmed = match (&deployment, &now) {
                (Some(deployment), Some(now)) => deployment.confirm(replicated.missing(now)).await,
                (None, _) => true,
                (_, None) => false,
            };
            replicated.counted(now.as_ref(), short && confirmed);
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(count);
        } else if let Some(replicated) = self.replication() {
            replicated.counted(None, false);
        }
    }

    /// Whether this is one server's connection as it is: no cluster, no deployment that
    /// finds the primary behind it (only then is every request's time its connection's).
    pub(crate) fn is_direct(&self) -> bool {
        !self.is_cluster() && self.deployment.is_none()
    }

    /// Whether this is a Redis Cluster connection.
    fn is_cluster(&self) -> bool {
        self.flavor == Flavor::Cluster
    }

    /// How many times a script ran only when sent again whole (NOSCRIPT), so far.
    pub(crate) fn script_reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// The server's run id, which tells two servers apart whatever their addresses.
    pub(crate) async fn run_id(&self) -> Result<String> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn.clone())
            .await?;
        let run_id = info
            .lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .unwrap_or_default();
        Ok(run_id.trim().to_owned())
    }

    /// The replicas the primary behind this connection has (see [`Replicas`]); on a
    /// cluster, the fewest in sync of any shard that serves slots.
    pub(crate) async fn replicas(&self) -> Result<Replicas> {
        Ok(replicas_now(self.conn.clone(), self.is_cluster()).await?)
    }

    /// Whether the server knows `command` (`COMMAND INFO` answers nil for one it does not).
    pub(crate) async fn knows(&self, command: &str) -> Result<bool> {
        let info: Vec<Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(info.first().is_some_and(|info| *info != Value::Nil))
    }

    /// Whether the server answers: `PING`, answered after everything sent before it on the
    /// connection.
    pub(crate) async fn ping(&self) -> Result<()> {
        let _: Value = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::send::fewest_replicas_per_shard;

    #[test]
    fn cluster_nodes_give_the_fewest_healthy_replicas_of_a_shard() {
        let nodes = "\
a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8000
b 127.0.0.1:7001@17001 master - 0 0 2 connected 8001-16383
c 127.0.0.1:7002@17002 slave a 0 0 1 connected
d 127.0.0.1:7003@17003 slave b 0 0 2 connected
e 127.0.0.1:7004@17004 slave,fail b 0 0 2 disconnected
f 127.0.0.1:7005@17005 slave a 0 0 1 connected
g 127.0.0.1:7006@17006 master - 0 0 3 connected
";
        // a has c and f; b has d (e failed); g serves no slots.
        assert_eq!(fewest_replicas_per_shard(nodes), 1);
        assert_eq!(fewest_replicas_per_shard(""), 0);
    }
}
