//! One attempt against one Redis server: run a command or script and say what happened.
//!
//! This layer knows the scripts, the value encoding and the reply shapes; it knows nothing
//! about retries or deadlines (see `policy`).

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
use crate::model::request::{Claim, Ticket, Try};
use crate::server::native::{self, Natives};
use crate::server::replication::{Acks, Address, Promotable, Replicas, Replicated, Replication};
use crate::server::scripts::{self, Lua};

/// What one obtain attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Obtain {
    /// Every key is ours; with the fencing token minted, when one was asked for.
    Obtained { fence: Option<u64> },
    /// Another owner holds `keys[key]`; its remaining TTL when known (`None`: unknown or
    /// no expiry).
    Held {
        ttl: Option<Duration>,
        key: usize,
        /// This (fair) attempt has a place in the keys' queues.
        queued: bool,
    },
}

/// What an operation on a held lock found: every key ours (and the operation done), or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding<T> {
    /// Every key was ours.
    Ours(T),
    /// No key is another owner's, but some are missing (expired, or the server restarted
    /// empty). Nothing was changed.
    Missing,
    /// Some key holds another owner's value, or another type. Nothing was changed.
    Foreign,
}

impl<T> Holding<T> {
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
    /// The command `release.lua` announces releases with.
    announce: &'static str,
    /// How many times a script had to be sent whole after a NOSCRIPT reply: the command then
    /// ran again behind whatever was queued after it.
    reloads: AtomicU64,
    /// How many replicas must acknowledge a lock write (see `replication.rs`); set once.
    replicated: OnceLock<Arc<Replicated>>,
    /// The deployment that names the primary behind the connection (Sentinel), when there
    /// is one: its epoch leads fencing tokens (see `lua/fence.lua`), its replicas count for
    /// [`Replication::all`], and it says whether a restarted primary may grant locks.
    deployment: OnceLock<Arc<dyn Deployment>>,
    /// The compare-and-delete and compare-and-set commands the server has (see `native.rs`).
    natives: Natives,
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
    /// A store on a Redis Cluster: releases are announced with sharded pub/sub (SPUBLISH,
    /// PUBLISH before Redis 7), which stays within the key's shard instead of going to every
    /// node.
    #[cfg(feature = "cluster")]
    pub(crate) fn new_cluster(conn: C) -> Self {
        Self {
            announce: "SPUBLISH",
            ..Self::new(conn)
        }
    }

    pub(crate) fn new(conn: C) -> Self {
        Self {
            conn,
            set_nx_get: AtomicBool::new(true),
            reloads: AtomicU64::new(0),
            replicated: OnceLock::new(),
            deployment: OnceLock::new(),
            natives: Natives::new(),
            // A standalone server: plain pub/sub. (redis-rs subscribes to sharded channels
            // only over cluster connections, and a single server gains nothing from them.)
            announce: scripts::PUBLISH,
        }
    }

    /// Tries once to lock every key of `claim`, incrementing its fencing counter on
    /// success. With `how.mark_holder`, a held key's value is marked so that its holder's
    /// release announces itself, and the holder's TTL is learned (the caller is about to
    /// wait): a single key is still tried without a script first, since a waiter is
    /// usually woken because the key was just released. With `how.holder_ttl`, a single
    /// key found held by the script-free path is asked for its TTL (a second round trip,
    /// only when held).
    pub(crate) async fn obtain(&self, claim: &Claim<'_>, how: Try) -> Result<Obtain> {
        // Behind a deployment the primary is found first, and must admit the lock (one that
        // restarted empty grants nothing for a while); the obtain counts only if that is
        // still the primary after the write (see below).
        let admitted = match self.deployment.get() {
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
        if let (Obtain::Obtained { .. }, Some(acks)) = (outcome, acks) {
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

    /// Follows `deployment` (set once): fencing tokens are led by its epoch, replicated
    /// writes wait for the replicas it could promote, and a restarted primary grants no lock
    /// while it says so.
    pub(crate) fn follow(&self, deployment: Arc<dyn Deployment>) {
        let _ = self.deployment.set(deployment);
    }

    /// The epoch fencing tokens are led by now: 0 when none is known.
    fn epoch(&self) -> u64 {
        self.primary_epoch().unwrap_or(0).min(MAX_FENCE_EPOCH)
    }

    /// The configuration epoch of the primary behind the connection, when it is known.
    fn primary_epoch(&self) -> Option<u64> {
        self.deployment
            .get()
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
            .get()
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
        if let Some(promotable) = self.deployment.get().and_then(|d| d.promotable()) {
            replicated.follow(promotable);
            replicated.saw(replicas);
        }
        Arc::new(replicated)
    }

    /// Makes writes to this server count only once `replicated` is met (see
    /// `replication.rs`): every later lock write waits for its acknowledgements. Set once;
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
        let deployment = self.deployment.get().cloned().filter(|_| short);
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

    /// Whether this is a Redis Cluster connection.
    fn is_cluster(&self) -> bool {
        self.announce != scripts::PUBLISH
    }

    async fn obtain_plain(&self, claim: &Claim<'_>, how: Try) -> Result<Written<Obtain>> {
        // A fair waiter goes by script: it queues, or takes what was handed or reserved to it.
        let queue = claim.ticket.filter(|_| how.queue);
        if queue.is_none()
            && claim.counter.is_none()
            && let [key] = claim.keys
            && self.set_nx_get.load(Ordering::Relaxed)
            && let Some((outcome, acks)) = self.obtain_one(key, claim).await?
        {
            match outcome {
                Obtain::Held { .. } if how.mark_holder => {}
                Obtain::Held { .. } if how.holder_ttl => {
                    let held = Obtain::Held {
                        ttl: self.key_ttl(key).await?,
                        key: 0,
                        queued: false,
                    };
                    return Ok((held, acks));
                }
                outcome => return Ok((outcome, acks)),
            }
        }
        Box::pin(self.obtain_by_script(claim, how.mark_holder || queue.is_some(), queue)).await
    }

    /// Tries once to lock every key of `claim` in its mode, by `lua/modes_obtain.lua`.
    async fn obtain_by_modes(
        &self,
        claim: &Claim<'_>,
        modes: &Modes,
        how: Try,
    ) -> Result<Written<Obtain>> {
        // A fair waiter queues with its keys' modes (see `lua/queue.lua`).
        let queue = claim.ticket.filter(|_| how.queue);
        let rest = (
            claim.ttl.millis,
            self.fence_arg(claim),
            u8::from(how.mark_holder || queue.is_some()),
            u8::from(how.retries),
            queue.map(queue_args),
        );
        let args = mode_args("obtain", modes, claim, rest);
        let (reply, acks) = self
            .write(&scripts::MODES_OBTAIN, claim.keys, claim.counter, args)
            .await?;
        if let Value::Array(items) = &reply
            && let [Value::Int(scripts::MODE_MISMATCH), Value::Int(index), held] = items.as_slice()
        {
            return Err(mode_mismatch(claim.keys, modes, *index, held));
        }
        Ok((parse_obtain_reply(reply)?, acks))
    }

    /// The scripts' fencing argument: 0 without a counter, else the epoch plus one.
    fn fence_arg(&self, claim: &Claim<'_>) -> u64 {
        claim.counter.map_or(0, |_| self.epoch() + 1)
    }

    /// What is left of `key`'s TTL, as the script reports a holder's: `None` without an
    /// expiry, zero when the key is gone (its holder just released it).
    async fn key_ttl(&self, key: &str) -> Result<Option<Duration>> {
        let left: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match left {
            -1 => None,
            left => Some(Duration::from_millis(u64::try_from(left).unwrap_or(0))),
        })
    }

    /// One key, no script: `SET key value NX PX ttl GET` either sets the key (reply nil) or
    /// returns the holder's value. Returns `None` when the script must decide: the key
    /// already holds our own token, or the server does not know this form of SET.
    async fn obtain_one(&self, key: &str, claim: &Claim<'_>) -> Result<Option<Written<Obtain>>> {
        let mut set = Cmd::with_capacity(7, 32 + key.len() + claim.value.len());
        set.arg("SET")
            .arg(key)
            .arg(claim.value)
            .arg("NX")
            .arg("PX")
            .arg(claim.ttl.millis)
            .arg("GET");
        let reply: RedisResult<(Option<Vec<u8>>, _)> = self.query(set, true).await;
        match reply {
            Ok((None, acks)) => Ok(Some((Obtain::Obtained { fence: None }, acks))),
            // Held by ourselves: re-obtain by script, which also keeps the longer TTL.
            Ok((Some(holder), _)) if claim.owner.owns(&holder) => Ok(None),
            Ok((Some(_), acks)) => Ok(Some((
                Obtain::Held {
                    ttl: None,
                    key: 0,
                    queued: false,
                },
                acks,
            ))),
            Err(err) if err.code() == Some("WRONGTYPE") => Err(Error::WrongType {
                key: key.to_owned(),
            }),
            Err(err) if classify::is_syntax_error(&err) => {
                tracing::debug!("server rejects SET NX GET; obtaining single keys by script");
                self.set_nx_get.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(err) => Err(err.into()),
        }
    }

    async fn obtain_by_script(
        &self,
        claim: &Claim<'_>,
        mark_holder: bool,
        queue: Option<&Ticket>,
    ) -> Result<Written<Obtain>> {
        // The fencing counter, if any, goes last in KEYS, flagged by ARGV[3]. The flags and
        // the queue are left out when all are off: the common case, one argument less each.
        let counted = claim.counter.is_some();
        let rest = (counted || mark_holder || queue.is_some()).then(|| {
            (
                self.fence_arg(claim),
                u8::from(mark_holder),
                queue.map(queue_args),
            )
        });
        let args = (claim.value, claim.ttl.millis, rest);
        let (reply, acks) = self
            .write(&scripts::OBTAIN, claim.keys, claim.counter, args)
            .await?;
        Ok((parse_obtain_reply(reply)?, acks))
    }

    /// The smallest remaining TTL across the keys, if they are ours. A lock held without
    /// expiry reports `Duration::MAX`.
    pub(crate) async fn pttl(&self, claim: &Claim<'_>) -> Result<Holding<Duration>> {
        let left: i64 = match claim.modes {
            Some(modes) => {
                let args = mode_args("pttl", modes, claim, &[] as &[&str]);
                self.invoke(&scripts::MODES_PTTL, claim.keys, None, args)
                    .await?
            }
            None => {
                self.invoke(&scripts::PTTL, claim.keys, None, claim.value)
                    .await?
            }
        };
        Ok(match left {
            scripts::PTTL_NOT_HELD => Holding::Foreign,
            scripts::PTTL_MISSING => Holding::Missing,
            scripts::PTTL_PERSISTENT => Holding::Ours(Duration::MAX),
            ms => Holding::Ours(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        })
    }

    /// Extends every key to the claim's TTL, only if every key is ours. With `restore`,
    /// missing keys are re-created with the claim's value (Redlock, once a majority is known
    /// to hold the lock, on a master that restarted empty). With `rewrite`, the keys are
    /// given the claim's value (the metadata changed); without, the values stay as they are.
    /// When writes are replicated, an extension too few replicas acknowledged fails with
    /// [`Error::NotReplicated`]: it may have run on the primary, but a failover could undo
    /// it.
    pub(crate) async fn refresh(
        &self,
        claim: &Claim<'_>,
        restore: bool,
        rewrite: bool,
    ) -> Result<Holding<()>> {
        // The rewrite flag goes only with a rewrite: the common path has one argument less.
        let rewrite = rewrite.then_some(1);
        let (done, acks): (i64, _) = match claim.modes {
            Some(modes) => {
                let rest = (claim.ttl.millis, u8::from(restore), rewrite);
                let args = mode_args("refresh", modes, claim, rest);
                self.write(&scripts::MODES_REFRESH, claim.keys, None, args)
                    .await?
            }
            None => match self.extend_natively(claim, rewrite.is_some()).await? {
                Some(acks) => (scripts::DONE, acks),
                None => {
                    let restore = match rewrite {
                        Some(_) => Some(u8::from(restore)),
                        None => restore.then_some(1),
                    };
                    let args = (claim.value, claim.ttl.millis, restore, rewrite);
                    self.write(&scripts::REFRESH, claim.keys, None, args)
                        .await?
                }
            },
        };
        if done == scripts::DONE
            && let Some(short) = acks.and_then(|acks| self.shortfall(&acks))
        {
            return Err(short);
        }
        Ok(Holding::from_reply(done, ()))
    }

    /// A single key extended by the server's own compare-and-set (see `native.rs`), when it
    /// holds exactly the claim's value (no waiter's mark, the same metadata) and no rewrite
    /// is asked for: what `refresh.lua` would do then, in one command, followed by the wait
    /// for replicas as the script's write is. `Some(acks)` when extended; `None` when the
    /// script must decide (the server has no such command, or the key holds anything else).
    async fn extend_natively(
        &self,
        claim: &Claim<'_>,
        rewrite: bool,
    ) -> Result<Option<Option<Acks>>> {
        let [key] = claim.keys else {
            return Ok(None);
        };
        if rewrite {
            return Ok(None);
        }
        let natives = self.natives().await?;
        let Some(cmd) = natives.extend_if_equal(key, claim.value, claim.ttl.millis) else {
            return Ok(None);
        };
        match self.query::<Value>(cmd, true).await {
            Ok((Value::Nil, _)) => Ok(None),
            Ok((_, acks)) => Ok(Some(acks)),
            Err(err) => self.after_native(err).map(|()| None),
        }
    }

    /// A single key deleted by the server's own compare-and-delete (see `native.rs`), when it
    /// holds exactly the claim's value: what `release.lua` does then, in one command (nobody
    /// marked the key, so there is nothing to announce or hand on). True when deleted; false
    /// when the script must decide (the server has no such command, or the key holds
    /// anything else).
    async fn delete_natively(&self, key: &str, value: &str) -> Result<bool> {
        let Some(cmd) = self.natives().await?.delete_if_equal(key, value) else {
            return Ok(false);
        };
        match cmd.query_async::<i64>(&mut self.conn.clone()).await {
            Ok(deleted) => Ok(deleted == 1),
            Err(err) => self.after_native(err).map(|()| false),
        }
    }

    /// What the server has natively, asked once per connection and primary.
    async fn natives(&self) -> Result<native::Found> {
        Ok(self.natives.found(&self.conn, self.primary_epoch()).await?)
    }

    /// A native command failed with `err`: the script decides instead (`Ok`), unless the
    /// connection failed. A server that refuses the command as such gets scripts from now on;
    /// any other error reply (WRONGTYPE, OOM) is the script's to judge.
    fn after_native(&self, err: RedisError) -> Result<()> {
        if err.code().is_none() {
            return Err(err.into());
        }
        if classify::refuses_command_form(&err) {
            self.natives.give_up(&err);
        }
        Ok(())
    }

    /// Deletes every key, only if every key is ours. With a payload, announces the release
    /// of each key that somebody waits for.
    pub(crate) async fn release(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
    ) -> Result<Holding<()>> {
        // A fair waiter that gives up leaves its queues by the script. A release whose
        // payload names it may have a waiter of this client handed the lock as soon as it
        // is queued (see `Lock::release_once`): it is one command, so that the waiter's next
        // attempt runs behind the delete; a native delete that finds the waiter's mark (or
        // asking what the server has, first) would leave a gap before the script.
        let named = payload.is_some_and(|payload| !payload.is_empty());
        if !named
            && claim.modes.is_none()
            && claim.ticket.is_none()
            && let [key] = claim.keys
            && self.delete_natively(key, claim.value).await?
        {
            return Ok(Holding::Ours(()));
        }
        self.release_sent(claim, payload, Sending::ByHash, false)
            .await
    }

    /// As [`Store::release`], by script alone: for a Redlock quorum's masters. A release there
    /// is one command per master, so that a waiter of the same client, woken by another
    /// master's announcement, sends its next attempt to this master behind the delete (one
    /// connection answers in order). A native delete that finds a waiter's mark would leave
    /// that gap before its script, and the waiter would find the lock still held there.
    pub(crate) async fn release_by_script(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
    ) -> Result<Holding<()>> {
        self.release_sent(claim, payload, Sending::ByHash, false)
            .await
    }

    /// Releases as [`Store::release`] does; with `only_leave`, a fair waiter leaves its
    /// queues and nothing else changes.
    async fn release_sent(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
        sending: Sending,
        only_leave: bool,
    ) -> Result<Holding<()>> {
        let only_leave = u8::from(only_leave);
        let announce = if payload.is_some() { self.announce } else { "" };
        let payload = payload.unwrap_or("");
        // A fair waiter that gives up leaves its queues by the same script.
        let leaving = claim.ticket.map_or("", |ticket| ticket.id.as_str());
        let done: i64 = match claim.modes {
            Some(modes) => {
                let rest = (announce, payload, self.announce, leaving, only_leave);
                let args = mode_args("release", modes, claim, rest);
                self.send(
                    &scripts::MODES_RELEASE,
                    claim.keys,
                    None,
                    args,
                    sending,
                    false,
                )
                .await?
                .0
            }
            None => {
                // The common case is the script's default, and then goes without the rest:
                // five arguments cost the server more than the GET and DEL the script runs.
                // (`announce` is PUBLISH only when `self.announce` is.)
                let common =
                    announce == scripts::PUBLISH && payload.is_empty() && leaving.is_empty();
                let rest =
                    (!common).then_some((announce, payload, leaving, self.announce, only_leave));
                self.send(
                    &scripts::RELEASE,
                    claim.keys,
                    None,
                    (claim.value, rest),
                    sending,
                    false,
                )
                .await?
                .0
            }
        };
        Ok(Holding::from_reply(done, ()))
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

    /// Like [`Store::release`], but sends the script's source with EVAL. For clean-up after
    /// an obtain with an unknown outcome: if the server is stalled, this queues behind the
    /// obtain and must not depend on a NOSCRIPT fallback that nobody will be waiting to run.
    /// Keys that somebody waits for are announced: the waiter marked them meanwhile.
    pub(crate) async fn release_by_eval(&self, claim: &Claim<'_>) -> Result<Holding<()>> {
        self.release_sent(claim, Some(""), Sending::Whole, false)
            .await
    }

    /// A release owed to a Redlock master that stopped answering, sent once it answers
    /// again (see `health.rs`): by hash (its sender awaits the reload after NOSCRIPT), and
    /// announced to the keys' waiters, as [`Store::release_by_eval`] is.
    pub(crate) async fn release_owed(&self, claim: &Claim<'_>) -> Result<Holding<()>> {
        self.release_sent(claim, Some(""), Sending::ByHash, false)
            .await
    }

    /// Whether the server answers: `PING`, answered after everything sent before it on the
    /// connection.
    pub(crate) async fn ping(&self) -> Result<()> {
        let _: Value = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The clean-up after an obtain whose caller went away or got no reply, sent as
    /// [`Store::release_by_eval`] is: a random token releases its keys and leaves its
    /// queues; a caller's own token only leaves its queues, since the keys it holds may be
    /// an outer lock's (a re-obtain by the same token), which nothing but its holder may
    /// release. What a release handed it meanwhile expires with its TTL, or is made its own
    /// by the next obtain by that token.
    pub(crate) async fn clean_up(&self, claim: &Claim<'_>) -> Result<()> {
        let only_leave = claim.owner.is_custom();
        self.release_sent(claim, Some(""), Sending::Whole, only_leave)
            .await
            .map(drop)
    }

    /// Runs `script` by EVALSHA over `keys` (then `extra_key`, if any) with `args`; when the
    /// server answers NOSCRIPT, sends it whole by EVAL, which also caches it there.
    ///
    /// EVAL goes where the keys are, as EVALSHA does. (`ScriptInvocation::invoke_async`
    /// loads the script instead, which a cluster connection sends to every master: one
    /// stopped master would hold up every release on the others. It also copies every key
    /// and argument into a second command: this runs on every lock operation.)
    async fn invoke<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
    ) -> Result<T> {
        let (reply, _) = self
            .send(script, keys, extra_key, args, Sending::ByHash, false)
            .await?;
        Ok(reply)
    }

    /// Runs `script` as [`Store::invoke`] does, for a write that a lock counts on: when
    /// writes are replicated, the wait for its acknowledgements follows in the same request.
    async fn write<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
    ) -> Result<Written<T>> {
        self.send(script, keys, extra_key, args, Sending::ByHash, true)
            .await
    }

    /// Runs `script` as [`Store::invoke`] does, or sends it whole at once; `wait`: a write
    /// that waits for replicas when they are asked for.
    async fn send<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
        sending: Sending,
        wait: bool,
    ) -> Result<Written<T>> {
        let command = |verb: &str, script: &str| {
            let key_bytes: usize = keys.iter().map(String::len).sum();
            let mut cmd = Cmd::with_capacity(keys.len() + 8, key_bytes + script.len() + 128);
            cmd.arg(verb)
                .arg(script)
                .arg(keys.len() + usize::from(extra_key.is_some()))
                .arg(keys)
                .arg(extra_key)
                .arg(&args);
            cmd
        };
        // A script's own error names a line of the bundled script: the log says whose.
        let failed = |err: RedisError| {
            script.note_origin(&err);
            err
        };
        if sending == Sending::Whole {
            return Ok(self
                .query(command("EVAL", &script.source), wait)
                .await
                .map_err(failed)?);
        }
        match self.query(command("EVALSHA", &script.hash), wait).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(self
                    .query(command("EVAL", &script.source), wait)
                    .await
                    .map_err(|err| self.script_error(failed(err)))?)
            }
            reply => Ok(reply.map_err(|err| self.script_error(failed(err)))?),
        }
    }

    /// Sends `cmd`. With `wait`, when writes are replicated, the wait for replicas follows
    /// it in the same request, so on the same connection (see `replication.rs`), and its
    /// answer comes back beside the reply.
    async fn query<T: FromRedisValue>(&self, cmd: Cmd, wait: bool) -> RedisResult<Written<T>> {
        let mut conn = self.conn.clone();
        let Some(replicated) = self.replication().filter(|_| wait) else {
            return Ok((cmd.query_async(&mut conn).await?, None));
        };
        self.count_replicas_later(false);
        if let Some(promotable) = self.deployment.get().and_then(|d| d.promotable()) {
            replicated.follow(promotable);
        }
        // With every replica in sync asked for, the replicas the primary has right after the
        // wait come back too: one that caught up counts from the next write on. (A cluster
        // counts its shards apart from writes.)
        let look = replicated.settings().follows_replicas() && !self.is_cluster();
        let (mut pipe, mut required) = replicated.pipeline(cmd, look);
        // The write's own error (WRONGTYPE, NOSCRIPT, ...) is reported as it would be alone.
        pipe.ignore_errors();
        let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        if look
            && let Some(info) = replies
                .get(2)
                .and_then(|info| redis::from_redis_value_ref::<String>(info).ok())
        {
            let replicas = Replicas::parse(&info);
            replicated.saw(&replicas);
            // Judged by the replicas the primary listed right after its wait too: one the
            // deployment could not promote may have acknowledged in place of one it could
            // (see `Replicated::requirement`), the first write on a new primary included.
            required = required.max(replicated.requirement(&replicas));
        }
        let mut replies = replies.drain(..);
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "replicated write: missing replies",
            )));
        };
        let reply = T::from_redis_value(reply.extract_error()?)?;
        // An error instead of a count: nothing is known to be acknowledged.
        let acks = Acks::parse(&acks, required).unwrap_or(Acks {
            replicas: 0,
            local: false,
            required,
        });
        Ok((reply, Some(acks)))
    }
}

/// A fair waiter's queue arguments, as `obtain.lua` and `lua/modes_*.lua` take them: its lease,
/// id, turn, and the key it hears its hand-off on (Lua counts from 1).
fn queue_args(ticket: &Ticket) -> (u64, &str, u64, usize) {
    let listen = ticket.listen + 1;
    (ticket.lease.millis, ticket.id.as_str(), ticket.turn, listen)
}

/// A write's reply, and when writes are replicated, how many replicas acknowledged it.
type Written<T> = (T, Option<Acks>);

/// The replicas the primary behind `conn` has: from `INFO replication` (see
/// [`Replicas::parse`]); on a cluster, the fewest healthy replicas of any shard that serves
/// slots (`CLUSTER NODES`).
async fn replicas_now<C: ConnectionLike>(mut conn: C, cluster: bool) -> RedisResult<Replicas> {
    if cluster {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await?;
        return Ok(Replicas::counted(fewest_replicas_per_shard(&nodes)));
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await?;
    Ok(Replicas::parse(&info))
}

/// How a script goes to the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// By its hash (EVALSHA), sent whole only when the server does not have it.
    ByHash,
    /// Whole (EVAL), never depending on a second round trip.
    Whole,
}

/// The fewest healthy replicas any primary that serves slots has, from `CLUSTER NODES`:
/// lines of `id address flags primary ping pong epoch link-state slots...`.
fn fewest_replicas_per_shard(nodes: &str) -> u32 {
    let nodes: Vec<Vec<&str>> = nodes
        .lines()
        .map(|line| line.split(' ').collect())
        .filter(|fields: &Vec<&str>| fields.len() >= 8)
        .collect();
    let healthy = |fields: &[&str]| {
        fields[7] == "connected" && !fields[2].split(',').any(|flag| flag.starts_with("fail"))
    };
    nodes
        .iter()
        .filter(|fields| fields[2].contains("master") && fields.len() > 8 && healthy(fields))
        .map(|primary| {
            let replicas = nodes
                .iter()
                .filter(|fields| fields[3] == primary[0] && healthy(fields))
                .count();
            u32::try_from(replicas).unwrap_or(u32::MAX)
        })
        .min()
        .unwrap_or(0)
}

/// The arguments of the `lua/modes_*.lua` script for operation `op` for `claim`, followed by the operation's
/// own (`rest`).
fn mode_args<'a, T: ToRedisArgs>(
    op: &'static str,
    modes: &'a Modes,
    claim: &Claim<'a>,
    rest: T,
) -> impl ToRedisArgs + use<'a, T> {
    (
        op,
        modes.encoded(),
        claim.value,
        u8::from(claim.owner.is_custom()),
        rest,
    )
}

/// The error for `modes_obtain.lua`'s reply that `keys[index - 1]` is held as `held`.
fn mode_mismatch(keys: &[String], modes: &Modes, index: i64, held: &Value) -> Error {
    let index = usize::try_from(index - 1).unwrap_or(0);
    let held: String = redis::from_redis_value_ref(held).unwrap_or_default();
    Error::ModeMismatch {
        key: keys.get(index).cloned().unwrap_or_default(),
        held: Mode::from_code(&held).unwrap_or(Mode::Shared),
        requested: modes.list().get(index).copied().unwrap_or(Mode::Shared),
    }
}

fn parse_obtain_reply(reply: Value) -> Result<Obtain> {
    let unexpected = |reply: &Value| {
        Error::Redis(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply from obtain.lua",
            format!("{reply:?}"),
        )))
    };
    let Value::Array(items) = &reply else {
        return Err(unexpected(&reply));
    };
    match items.as_slice() {
        // Lua's false arrives as nil (no fencing).
        [Value::Int(scripts::OBTAINED)] | [Value::Int(scripts::OBTAINED), Value::Nil] => {
            Ok(Obtain::Obtained { fence: None })
        }
        // The token, as a decimal string (the script refuses counters below 1).
        [
            Value::Int(scripts::OBTAINED),
            fence @ (Value::BulkString(_) | Value::Int(_)),
        ] => Ok(Obtain::Obtained {
            fence: redis::from_redis_value_ref::<u64>(fence).ok(),
        }),
        [
            Value::Int(scripts::HELD),
            Value::Int(ms),
            Value::Int(index),
            queued @ ..,
        ] => {
            Ok(Obtain::Held {
                ttl: u64::try_from(*ms).ok().map(Duration::from_millis),
                // Lua counts from 1.
                key: usize::try_from(*index - 1).unwrap_or(0),
                // A fourth element: the attempt queued.
                queued: !queued.is_empty(),
            })
        }
        [Value::Int(scripts::WRONG_TYPE), key] => Err(Error::WrongType {
            key: redis::from_redis_value_ref(key).unwrap_or_default(),
        }),
        _ => Err(unexpected(&reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
