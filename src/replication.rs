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
//! `WAIT` is not consensus: a replica that did not acknowledge can still be promoted (when
//! the ones that did are down too), and then the lock is lost as without it.

use std::time::Duration;

use redis::{Cmd, Pipeline};

use crate::error::InvalidInput;

/// How many replicas must acknowledge a lock's writes before the lock counts as obtained or
/// refreshed (see [`Client::replicated`](crate::Client::replicated)).
///
/// The default of a Sentinel client ([`SentinelConfig`](crate::SentinelConfig)) is one
/// replica within 250 ms: a failover promotes the replica with the most data, so one
/// acknowledgement survives the loss of the primary alone. Ask for every replica to survive
/// the loss of the primary together with a replica; `Replication::none()` for none.
///
/// ```
/// use std::time::Duration;
/// use lockset::Replication;
///
/// let two = Replication::replicas(2).timeout(Duration::from_millis(100));
/// assert_eq!(two.replicas_needed(), 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replication {
    replicas: u32,
    timeout: Duration,
    /// WAITAOF: also wait until the writes are in the append-only files (the primary's own
    /// too, when true).
    aof: Option<bool>,
}

impl Replication {
    /// How long a write waits for its acknowledgements by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

    /// Every lock write waits until `replicas` replicas acknowledged it, for at most
    /// [`Replication::DEFAULT_TIMEOUT`].
    #[must_use]
    pub fn replicas(replicas: u32) -> Self {
        Self {
            replicas,
            timeout: Self::DEFAULT_TIMEOUT,
            aof: None,
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

    /// How many replicas must acknowledge each write.
    pub fn replicas_needed(&self) -> u32 {
        self.replicas
    }

    /// Whether writes wait for replicas (or the append-only file) at all.
    pub(crate) fn is_on(&self) -> bool {
        self.replicas > 0 || self.aof == Some(true)
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

    /// `write` followed, in one request, by the command that waits for its
    /// acknowledgements.
    pub(crate) fn pipeline(&self, write: Cmd) -> Pipeline {
        let mut pipe = Pipeline::with_capacity(2);
        pipe.add_command(write);
        match self.aof {
            None => pipe.cmd("WAIT").arg(self.replicas),
            Some(local) => pipe.cmd("WAITAOF").arg(u8::from(local)).arg(self.replicas),
        };
        pipe.arg(self.timeout_millis());
        pipe
    }

    /// Whether the reply of the waiting command counts enough acknowledgements.
    pub(crate) fn acknowledged(&self, reply: &Acks) -> bool {
        reply.replicas >= self.replicas && (self.aof != Some(true) || reply.local)
    }
}

/// What the waiting command answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acks {
    /// How many replicas acknowledged.
    pub(crate) replicas: u32,
    /// `WAITAOF` only: the primary's own append-only file has the writes.
    pub(crate) local: bool,
}

impl Acks {
    /// Reads the reply of `WAIT` (a number) or `WAITAOF` (`[local, replicas]`).
    pub(crate) fn parse(reply: &redis::Value) -> Option<Self> {
        let count = |value: &redis::Value| match value {
            redis::Value::Int(n) => u32::try_from(*n).ok(),
            _ => None,
        };
        match reply {
            redis::Value::Array(items) => match items.as_slice() {
                [local, replicas] => Some(Self {
                    replicas: count(replicas)?,
                    local: count(local)? > 0,
                }),
                _ => None,
            },
            other => Some(Self {
                replicas: count(other)?,
                local: false,
            }),
        }
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
            .pipeline(write);
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
            .pipeline(redis::cmd("PING"));
        let sent = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert!(sent.contains("WAITAOF\r\n$1\r\n1\r\n$1\r\n1\r\n$3\r\n250\r\n"));
    }

    #[test]
    fn acknowledgements_are_counted() {
        let one = Replication::replicas(1);
        let wait = |n| Acks::parse(&redis::Value::Int(n)).unwrap();
        assert!(!one.acknowledged(&wait(0)));
        assert!(one.acknowledged(&wait(1)));
        assert!(one.acknowledged(&wait(2)));
        let aof = Replication::replicas(1).append_only(true);
        let waitaof = |local, n| {
            Acks::parse(&redis::Value::Array(vec![
                redis::Value::Int(local),
                redis::Value::Int(n),
            ]))
            .unwrap()
        };
        assert!(!aof.acknowledged(&waitaof(0, 1)));
        assert!(aof.acknowledged(&waitaof(1, 1)));
        assert!(!aof.acknowledged(&waitaof(1, 0)));
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        let zero = Replication::replicas(1).timeout(Duration::ZERO);
        assert_eq!(zero.check(), Err(InvalidInput::ZeroReplicationTimeout));
        assert_eq!(Replication::none().timeout(Duration::ZERO).check(), Ok(()));
    }
}
