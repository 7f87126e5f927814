//! Replicated writes: a lock counts as obtained, refreshed or handed on only once enough
//! replicas acknowledged its writes, so that a failover to one of them keeps it.
//!
//! Replication from a primary to its replicas is asynchronous: a lock written to the primary
//! and not yet copied is gone when a replica is promoted, and a second client then obtains
//! it. `WAIT n timeout` blocks until `n` replicas acknowledged every write **of the
//! connection it is sent on** (or the timeout passed) and says how many did. So it is sent
//! right behind the write, **in the same request** (a two-command pipeline): a connection
//! that reconnected between two requests would otherwise answer for a connection that wrote
//! nothing, at once, with every replica.
//!
//! **Invariant.** An obtain or refresh whose write fewer than `n` replicas acknowledged is
//! not reported done: an obtain removes its keys again (best effort) and fails with
//! [`Error::NotReplicated`](crate::Error::NotReplicated); a refresh fails the same way and
//! leaves the holder's validity where the last replicated write put it (capped by the
//! refresh, as any refresh whose outcome is unknown). A fair waiter handed a lock by a
//! release does not take the notice as the lock: its next attempt makes the keys its own,
//! and waits for that write, which the replicas apply after the hand-off (a replica applies
//! the primary's writes in order).
//!
//! **How many.** A fixed count, or every replica the primary has in sync
//! ([`Replication::all`], the default of a Sentinel client). A failover may promote any
//! replica that is in sync, and in a promotion on purpose (`SENTINEL FAILOVER`) or a
//! partition the old primary goes on taking writes for a while, which only the replicas that
//! were not promoted acknowledge: only every replica keeps every lock. With `all`, the count
//! follows the deployment, so that losing a replica or the primary does not stop every lock
//! for good: the replicas online whose last acknowledgement is at most 2 s old (at least
//! one) are counted with every write (`INFO replication` rides in its request, after the
//! `WAIT`; on a cluster every 5 s), where the count may only grow, and after a write fell
//! short, where it may shrink, but only once the sentinels confirm that the primary is still
//! theirs at the same epoch and none of the replicas it lost says it is a primary (a
//! promotion under way also makes the old primary's replicas fewer). Behind Sentinel it
//! never goes below the replicas the sentinels could promote ([`Replicated::follow`]).
//!
//! `WAIT` is not consensus: a replica that did not acknowledge can still be promoted (when
//! the ones that did are down too), and then the lock is lost as without it.

mod replicas;

pub(crate) use replicas::{Acks, Replicas};

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Pipeline};
use tokio::time::Instant;

use crate::error::Error;
use crate::model::invalid::InvalidInput;
use crate::rt::lock;

/// How many replicas must acknowledge a lock's writes before the lock counts as obtained or
/// refreshed (see [`Client::replicated`](crate::Client::replicated)).
///
/// See the guide: [failover](crate::guide::failover).
///
/// The default of a Sentinel client ([`SentinelConfig`](crate::SentinelConfig)) is
/// [`Replication::all`], within 250 ms: every replica the primary has in sync, so that
/// whichever a failover promotes has the lock, also in a promotion on purpose or a partition,
/// where the old primary takes writes for a while that only the replicas not promoted see.
/// A fixed count below that survives a primary that dies (the replica with the most data is
/// promoted), but not those; `Replication::none()` waits for none.
///
/// ```
/// use std::time::Duration;
/// use lockset::Replication;
///
/// let two = Replication::replicas(2).timeout(Duration::from_millis(100));
/// assert_eq!(two.replicas_needed(), Some(2));
/// assert_eq!(Replication::all().replicas_needed(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replication {
    /// `None`: every replica in sync (see [`Replication::all`]).
    replicas: Option<u32>,
    timeout: Duration,
    /// WAITAOF: also wait until the writes are in the append-only files (the primary's own
    /// too, when true).
    aof: Option<bool>,
}

impl Replication {
    /// How long a write waits for its acknowledgements by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

    /// Every lock write waits until `replicas` replicas acknowledged it, for at most
    /// [`Replication::DEFAULT_TIMEOUT`]. While fewer are connected, every lock fails.
    #[must_use]
    pub fn replicas(replicas: u32) -> Self {
        Self {
            replicas: Some(replicas),
            timeout: Self::DEFAULT_TIMEOUT,
            aof: None,
        }
    }

    /// Every lock write waits until every replica the primary has in sync acknowledged it
    /// (at least one), for at most [`Replication::DEFAULT_TIMEOUT`]: the default of a
    /// Sentinel client.
    ///
    /// The count follows the deployment: replicas that are online and acknowledged within
    /// the last 2 s, counted when the client is made and with every write (then it only
    /// grows: a replica that caught up counts at once), and after a write too few
    /// acknowledged (then it may shrink, once the sentinels confirm that the primary is still
    /// the one they name, at the same epoch, and no replica it lost says it is a primary: a
    /// promotion under way takes a replica from the old primary too). So a replica that died
    /// stops locks for a few seconds, not for good, and after a failover the new primary's
    /// replicas count. Each replicated write then also reads `INFO replication`.
    ///
    /// Behind Sentinel, the count is never below the replicas the sentinels could promote
    /// (not flagged down, answering them): during a planned failover the old primary lists
    /// one replica fewer (the one being promoted) and would otherwise count a write that
    /// replica never saw; each new lookup of the primary starts the count again from them.
    #[must_use]
    pub fn all() -> Self {
        Self {
            replicas: None,
            ..Self::replicas(0)
        }
    }

    /// No write waits for replicas (the default of [`Client::connect`](crate::Client::connect)).
    #[must_use]
    pub fn none() -> Self {
        Self::replicas(0)
    }

    /// How long a write waits for its acknowledgements at most. Defaults to 250 ms. Keep it
    /// below the connection's response timeout (redis-rs's default: 500 ms), or an obtain
    /// whose replicas are slow ends with an unknown outcome instead of
    /// [`Error::NotReplicated`](crate::Error::NotReplicated).
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// Waits with `WAITAOF` instead of `WAIT`: until the replicas (and, with `local`, the
    /// primary itself) wrote the lock to their append-only file, with `appendfsync` as
    /// configured there. Needs Redis 7.2 or Valkey, with `appendonly yes` on every server
    /// counted; [`Client::replicated`](crate::Client::replicated) checks that the server
    /// knows the command.
    #[must_use]
    pub fn append_only(self, local: bool) -> Self {
        Self {
            aof: Some(local),
            ..self
        }
    }

    /// How many replicas must acknowledge each write; `None` for every replica in sync
    /// ([`Replication::all`]).
    pub fn replicas_needed(&self) -> Option<u32> {
        self.replicas
    }

    /// Whether writes wait for replicas (or the append-only file) at all.
    pub(crate) fn is_on(&self) -> bool {
        self.replicas != Some(0) || self.aof == Some(true)
    }

    /// Whether the count follows the deployment ([`Replication::all`]).
    pub(crate) fn follows_replicas(&self) -> bool {
        self.replicas.is_none()
    }

    /// Whether this waits with `WAITAOF`.
    pub(crate) fn uses_aof(&self) -> bool {
        self.aof.is_some()
    }

    /// Checks the settings, before anything is sent.
    pub(crate) fn check(&self) -> Result<(), InvalidInput> {
        // `WAIT n 0` blocks for ever.
        if self.is_on() && self.timeout_millis() == 0 {
            return Err(InvalidInput::ZeroReplicationTimeout);
        }
        Ok(())
    }

    fn timeout_millis(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// `write` followed, in one request, by the command that waits for `needed` replicas
    /// to acknowledge it.
    fn pipeline(&self, write: Cmd, needed: u32) -> Pipeline {
        let mut pipe = Pipeline::with_capacity(2);
        pipe.add_command(write);
        match self.aof {
            None => pipe.cmd("WAIT").arg(needed),
            Some(local) => pipe.cmd("WAITAOF").arg(u8::from(local)).arg(needed),
        };
        pipe.arg(self.timeout_millis());
        pipe
    }
}

/// How often the replicas are counted again, with [`Replication::all`].
const RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// A replica's address, as its primary lists it.
pub(crate) type Address = (String, u16);

/// What a deployment that names its primary (Sentinel) says of the replicas: those it
/// could promote, for the primary of one lookup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Promotable {
    /// Changes with every lookup of the primary (a new one, or the same one connected
    /// again).
    pub(crate) generation: u64,
    /// The replicas that could be promoted: every one must acknowledge a write.
    pub(crate) replicas: Arc<[Address]>,
}

impl Promotable {
    /// How many replicas could be promoted.
    fn count(&self) -> u32 {
        u32::try_from(self.replicas.len()).unwrap_or(u32::MAX)
    }
}

/// One server's replicated writes: the settings, and how many replicas they wait for now.
#[derive(Debug)]
pub(crate) struct Replicated {
    settings: Replication,
    /// The count asked for; with [`Replication::all`], at least the replicas in sync when
    /// last seen, and at least one.
    needed: AtomicU32,
    /// With [`Replication::all`]: every replica the primary listed since the count last
    /// shrank. One of them missing, or not in sync, may be a replica being promoted: the
    /// count only shrinks once none of them is a primary.
    known: Mutex<Vec<Address>>,
    /// When the replicas were last counted ([`Replication::all`]).
    counted: Mutex<Instant>,
    /// The lookup of the primary the count is for, and the replicas the deployment could
    /// promote then: the count never goes below them (see [`Replicated::follow`]).
    promotable: Mutex<Option<Promotable>>,
    /// A count runs now.
    counting: AtomicBool,
}

impl Replicated {
    /// Replicated writes per `settings` on a primary with `replicas`.
    pub(crate) fn new(settings: Replication, replicas: &Replicas) -> Self {
        let in_sync = replicas.in_sync;
        Self {
            settings,
            needed: AtomicU32::new(settings.replicas.unwrap_or(in_sync.max(1))),
            known: Mutex::new(replicas.listed.clone()),
            counted: Mutex::new(Instant::now()),
            promotable: Mutex::new(None),
            counting: AtomicBool::new(false),
        }
    }

    /// The deployment names a primary whose promotable replicas are `now` (before every
    /// write, with [`Replication::all`]): the count never goes below them, since a write
    /// one of them misses is lost if that one is promoted; during a planned failover the
    /// old primary lists one replica fewer (the one being promoted), the sentinels do not.
    /// A new lookup (a failover, a reconnect) starts the count again from them: the
    /// replicas the old primary had mean nothing to the new one, and one of them may be
    /// the new primary itself.
    pub(crate) fn follow(&self, now: Promotable) {
        if !self.settings.follows_replicas() {
            return;
        }
        let mut promotable = lock(&self.promotable);
        let count = now.count();
        match &*promotable {
            Some(before) if before.generation != now.generation => {
                let was = self.needed.swap(count.max(1), Ordering::Relaxed);
                lock(&self.known).clear();
                if was != count.max(1) {
                    tracing::info!(
                        before = was,
                        now = count.max(1),
                        "a new primary: locks wait for the replicas the sentinels could promote"
                    );
                }
            }
            // The primary the count was made on: it only grows.
            _ => {
                self.needed.fetch_max(count, Ordering::Relaxed);
            }
        }
        *promotable = Some(now);
    }

    /// How many acknowledgements a write needs on a primary that lists `replicas`, behind a
    /// deployment that names the replicas it could promote: every replica in either. `WAIT`
    /// counts acknowledgements from any replica, so one the sentinels do not count (a
    /// reporting replica, one just added) could stand in for a promotable one that is gone
    /// (being promoted, in a planned failover): only a count of both together makes sure
    /// every promotable one acknowledged. 0 without a deployment.
    pub(crate) fn requirement(&self, replicas: &Replicas) -> u32 {
        let promotable = lock(&self.promotable);
        let Some(promotable) = promotable.as_ref() else {
            return 0;
        };
        let extra = replicas
            .listed
            .iter()
            .filter(|listed| !promotable.replicas.contains(listed))
            .count();
        u32::try_from(extra + promotable.replicas.len()).unwrap_or(u32::MAX)
    }

    pub(crate) fn settings(&self) -> &Replication {
        &self.settings
    }

    /// How many replicas writes wait for now.
    pub(crate) fn needed(&self) -> u32 {
        self.needed.load(Ordering::Relaxed)
    }

    /// `write` followed, in one request, by the wait for its acknowledgements; with
    /// `look`, then `INFO replication`, to see the replicas the primary has right after
    /// (see [`Replicated::saw`]). Also the count it waits for, which its acknowledgements
    /// are judged by (see [`Acks::parse`]), whatever the count is by then.
    pub(crate) fn pipeline(&self, write: Cmd, look: bool) -> (Pipeline, u32) {
        let needed = self.needed();
        let mut pipe = self.settings.pipeline(write, needed);
        if look {
            pipe.cmd("INFO").arg("replication");
        }
        (pipe, needed)
    }

    /// The primary has `replicas` now ([`Replication::all`]): the count needed grows to
    /// the replicas in sync at once (a replica that just caught up may be promoted next),
    /// and every replica listed is remembered.
    pub(crate) fn saw(&self, replicas: &Replicas) {
        if !self.settings.follows_replicas() {
            return;
        }
        let needed = replicas.in_sync.max(self.requirement(replicas));
        self.needed.fetch_max(needed, Ordering::Relaxed);
        let mut known = lock(&self.known);
        for address in &replicas.listed {
            if !known.contains(address) {
                known.push(address.clone());
            }
        }
    }

    /// Whether the reply of the waiting command counts enough acknowledgements; the error
    /// to report when not.
    pub(crate) fn check(&self, acks: &Acks) -> Result<(), Error> {
        let local = self.settings.aof != Some(true) || acks.local;
        if acks.replicas >= acks.required && local {
            return Ok(());
        }
        Err(Error::NotReplicated {
            acknowledged: acks.replicas,
            required: acks.required,
        })
    }

    /// Whether the replicas are to be counted now ([`Replication::all`]): after a write
    /// fell short (`short`), or when the last count is [`RECOUNT_EVERY`] old; never two
    /// counts at once. True hands the count to the caller, who reports it to
    /// [`Replicated::counted`].
    pub(crate) fn start_count(&self, short: bool) -> bool {
        if !self.settings.follows_replicas() {
            return false;
        }
        let due = short || lock(&self.counted).elapsed() >= RECOUNT_EVERY;
        due && !self.counting.swap(true, Ordering::AcqRel)
    }

    /// The replicas once listed that `now` does not have in sync: any may be one being
    /// promoted.
    pub(crate) fn missing(&self, now: &Replicas) -> Vec<Address> {
        lock(&self.known)
            .iter()
            .filter(|known| !now.synced.contains(known))
            .cloned()
            .collect()
    }

    /// A count ended: the primary has `replicas` (`None`: unknown). The count needed grows
    /// to the replicas in sync; it shrinks to them (never below one, nor below the replicas the
    /// deployment could promote) only with
    /// `may_shrink`: a write fell short, on a primary confirmed as the deployment's, whose
    /// missing replicas are none of them a primary.
    pub(crate) fn counted(&self, replicas: Option<&Replicas>, may_shrink: bool) {
        if let Some(replicas) = replicas {
            let in_sync = replicas.in_sync.max(self.requirement(replicas)).max(1);
            if may_shrink {
                let before = self.needed.swap(in_sync, Ordering::Relaxed);
                *lock(&self.known) = replicas.listed.clone();
                if in_sync < before {
                    tracing::info!(
                        before,
                        now = in_sync,
                        "fewer replicas in sync: locks wait for fewer"
                    );
                }
            } else {
                self.saw(replicas);
            }
        }
        *lock(&self.counted) = Instant::now();
        self.counting.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_follows_the_write_in_one_request() {
        let mut write = redis::cmd("SET");
        write.arg("k").arg("v");
        let pipe = Replication::replicas(2)
            .timeout(Duration::from_millis(80))
            .pipeline(write, 2);
        let sent = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert!(sent.starts_with("*3\r\n$3\r\nSET\r\n"), "{sent:?}");
        assert!(
            sent.ends_with("*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$2\r\n80\r\n"),
            "{sent:?}"
        );
    }

    #[test]
    fn waitaof_asks_for_the_local_file_when_told() {
        let pipe = Replication::replicas(1)
            .append_only(true)
            .pipeline(redis::cmd("PING"), 1);
        let sent = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert!(sent.contains("WAITAOF\r\n$1\r\n1\r\n$1\r\n1\r\n$3\r\n250\r\n"));
    }

    fn synced(ports: &[u16]) -> Replicas {
        let listed: Vec<Address> = ports.iter().map(|p| ("127.0.0.1".to_owned(), *p)).collect();
        Replicas {
            in_sync: u32::try_from(ports.len()).unwrap(),
            synced: listed.clone(),
            listed,
        }
    }

    #[test]
    fn acknowledgements_are_counted() {
        let one = Replicated::new(Replication::replicas(1), &synced(&[1, 2, 3, 4, 5]));
        let wait = |n| Acks::parse(&redis::Value::Int(n), one.needed()).unwrap();
        assert!(one.check(&wait(0)).unwrap_err().is_not_replicated());
        assert!(one.check(&wait(1)).is_ok());
        assert!(one.check(&wait(2)).is_ok());
        let aof = Replicated::new(Replication::replicas(1).append_only(true), &synced(&[1]));
        let waitaof = |local, n| {
            Acks::parse(
                &redis::Value::Array(vec![redis::Value::Int(local), redis::Value::Int(n)]),
                aof.needed(),
            )
            .unwrap()
        };
        assert!(aof.check(&waitaof(0, 1)).is_err());
        assert!(aof.check(&waitaof(1, 1)).is_ok());
        assert!(aof.check(&waitaof(1, 0)).is_err());
    }

    /// With `all()`, a write's own look at the replicas (INFO after its WAIT) may count a
    /// replica that just caught up: the write is judged by the count it waited for (it
    /// failed with 1 of 2 although its WAIT 1 was met), the replica counts from the next
    /// write on.
    #[test]
    fn a_write_is_judged_by_the_count_it_waited_for() {
        let all = Replicated::new(Replication::all(), &synced(&[1]));
        let (_, required) = all.pipeline(redis::cmd("SET"), true);
        assert_eq!(required, 1);
        all.saw(&synced(&[1, 2]));
        let acks = Acks::parse(&redis::Value::Int(1), required).unwrap();
        assert!(all.check(&acks).is_ok());
        let (_, next) = all.pipeline(redis::cmd("SET"), true);
        assert_eq!(
            next, 2,
            "the replica that caught up counts from the next write on"
        );
    }

    #[test]
    fn all_follows_the_replicas_grows_freely_and_shrinks_only_when_told() {
        let all = Replicated::new(Replication::all(), &synced(&[1, 2]));
        assert_eq!(all.needed(), 2);
        // Not due yet; a short write is.
        assert!(!all.start_count(false));
        assert!(all.start_count(true));
        assert!(!all.start_count(true), "one count at a time");
        all.counted(Some(&synced(&[1])), false);
        assert_eq!(all.needed(), 2, "a count that may not shrink never does");
        assert_eq!(all.missing(&synced(&[1])), [("127.0.0.1".to_owned(), 2)]);
        assert!(all.start_count(true));
        all.counted(Some(&synced(&[1])), true);
        assert_eq!(all.needed(), 1);
        assert!(
            all.missing(&synced(&[1])).is_empty(),
            "forgotten once it shrank"
        );
        assert!(all.start_count(true));
        all.counted(Some(&synced(&[])), true);
        assert_eq!(all.needed(), 1, "never below one");
        // A replica seen in sync counts at once.
        all.saw(&synced(&[1, 2, 3]));
        assert_eq!(all.needed(), 3);
        // A fixed count never counts.
        let fixed = Replicated::new(Replication::replicas(2), &synced(&[1, 2, 3, 4, 5]));
        assert!(!fixed.start_count(true));
        assert_eq!(fixed.needed(), 2);
    }

    fn promotable(generation: u64, ports: &[u16]) -> Promotable {
        let replicas: Vec<Address> = ports.iter().map(|p| ("127.0.0.1".to_owned(), *p)).collect();
        Promotable {
            generation,
            replicas: replicas.into(),
        }
    }

    /// A planned failover with a replica the sentinels do not count (a reporting replica,
    /// or one just added): the sentinels could promote 1 and 2, 1 is being promoted, the
    /// old primary lists 2 and 9. Two acknowledgements (from 2 and 9) would not mean 1 had
    /// the write: every replica in either list must acknowledge.
    #[test]
    fn a_replica_the_sentinels_do_not_count_never_stands_in_for_one_they_could_promote() {
        let all = Replicated::new(Replication::all(), &synced(&[2, 9]));
        all.follow(promotable(1, &[1, 2]));
        let listed = synced(&[2, 9]);
        assert_eq!(all.requirement(&listed), 3);
        all.saw(&listed);
        assert_eq!(all.needed(), 3);
        // A fixed count is the caller's choice.
        let fixed = Replicated::new(Replication::replicas(1), &synced(&[2, 9]));
        fixed.follow(promotable(1, &[1, 2]));
        fixed.saw(&listed);
        assert_eq!(fixed.requirement(&listed), 0);
        assert_eq!(fixed.needed(), 1);
        // A new primary starts again from what the sentinels could promote for it.
        all.follow(promotable(2, &[2]));
        assert_eq!(all.needed(), 1);
        assert_eq!(all.requirement(&synced(&[2])), 1);
    }

    #[test]
    fn replicas_in_sync_are_online_and_recent() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=7001,state=online,offset=100,lag=0\r\n\
            slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=7003,state=online,offset=90,lag=7\r\n\
            slave3:ip=127.0.0.1,port=7004,state=online,offset=100,lag=2\r\n\
            master_repl_offset:100\r\n";
        let replicas = Replicas::parse(info);
        assert_eq!(replicas.in_sync, 2);
        let port = |r: &[Address]| r.iter().map(|a| a.1).collect::<Vec<_>>();
        assert_eq!(port(&replicas.synced), [7001, 7004]);
        assert_eq!(port(&replicas.listed), [7001, 7002, 7003, 7004]);
        assert_eq!(
            Replicas::parse("role:master\r\nconnected_slaves:0\r\n").in_sync,
            0
        );
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        let zero = Replication::replicas(1).timeout(Duration::ZERO);
        assert_eq!(zero.check(), Err(InvalidInput::ZeroReplicationTimeout));
        assert_eq!(Replication::none().timeout(Duration::ZERO).check(), Ok(()));
    }
}
