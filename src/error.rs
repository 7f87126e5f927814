//! The one error type of this crate.

use std::time::Duration;

/// What went wrong with a lock operation.
///
/// Match on the variants you care about; the helper methods group the ones that mean the
/// same thing to most callers (see [`Error::is_not_obtained`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by someone else, and the retry strategy gave up.
    ///
    /// [`Lock::refresh`](crate::Lock::refresh) also returns this when the lock was lost,
    /// as bsm/redislock does.
    #[error("lock not obtained: held by another owner")]
    NotObtained,

    /// The lock is held by someone else, and obtain gave up because its deadline passed
    /// (an explicit timeout or deadline, or by default the lock's TTL).
    ///
    /// [`Error::is_not_obtained`] is true for this variant as well.
    #[error("lock not obtained: deadline passed while it was held by another owner")]
    DeadlineExceeded,

    /// The lock is not held by us any more: it expired, or another owner replaced it.
    #[error("lock not held: it expired or was taken over")]
    NotHeld,

    /// A key holds a value that is not a string (a list, a hash, ...), so it cannot be a lock.
    /// Nothing was changed.
    #[error("key {key:?} holds a non-string value and cannot be used as a lock")]
    WrongType {
        /// The offending key.
        key: String,
    },

    /// The input was rejected before anything was sent to Redis.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),

    /// Redis did not answer while obtaining: the connection's response timeout passed, or
    /// the connection dropped before the reply arrived.
    ///
    /// The script may still have run, so the outcome is unknown. Before returning this
    /// error the client released the keys by the attempt's token (best effort, random tokens
    /// only); whatever is left expires with the TTL.
    #[error("obtain got no reply from Redis ({0}); the outcome is unknown")]
    UnknownOutcome(#[source] redis::RedisError),

    /// Redis returned an error, or the connection failed.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),

    /// A Redlock operation did not reach a majority of the masters (see
    /// [`Client::quorum`](crate::Client::quorum)). [`Error::is_not_obtained`] is true for a
    /// failed obtain or refresh, [`Error::is_not_held`] for a failed release.
    #[error("{op}: {succeeded} of {nodes} masters agreed, {needed} needed{}: {}",
        if *expired { " but the validity ran out" } else { "" },
        describe(failures))]
    Quorum {
        /// The operation.
        op: QuorumOp,
        /// How many masters agreed.
        succeeded: usize,
        /// How many make a majority.
        needed: usize,
        /// How many masters there are.
        nodes: usize,
        /// A majority agreed, but too late: the validity (TTL − elapsed − drift) ran out.
        expired: bool,
        /// Each master that did not agree (by index), and why.
        failures: Vec<(usize, NodeFailure)>,
    },
}

/// A Redlock operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuorumOp {
    /// Obtain.
    Obtain,
    /// Refresh.
    Refresh,
    /// Release.
    Release,
}

impl std::fmt::Display for QuorumOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Obtain => "obtain",
            Self::Refresh => "refresh",
            Self::Release => "release",
        })
    }
}

/// Why one Redlock master did not agree.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum NodeFailure {
    /// The lock is held by another owner there (obtain), or is not ours there (refresh,
    /// release).
    Refused,
    /// No answer within the per-node time limit.
    TimedOut(Duration),
    /// A key holds a non-string value there.
    WrongType(String),
    /// A Redis or connection error.
    Redis(redis::RedisError),
}

impl NodeFailure {
    pub(crate) fn wrong_type_key(&self) -> Option<&str> {
        match self {
            Self::WrongType(key) => Some(key),
            _ => None,
        }
    }
}

impl From<Error> for NodeFailure {
    fn from(err: Error) -> Self {
        match err {
            Error::Redis(err) | Error::UnknownOutcome(err) => Self::Redis(err),
            Error::WrongType { key } => Self::WrongType(key),
            other => Self::Redis(redis::RedisError::from((
                redis::ErrorKind::Client,
                "unexpected node error",
                other.to_string(),
            ))),
        }
    }
}

impl std::fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused => f.write_str("held by another owner or not ours"),
            Self::TimedOut(limit) => write!(f, "no answer within {limit:?}"),
            Self::WrongType(key) => write!(f, "key {key:?} holds a non-string value"),
            Self::Redis(err) => write!(f, "{err}"),
        }
    }
}

fn describe_slots(keys: &[(String, u16)]) -> String {
    let parts: Vec<String> = keys
        .iter()
        .map(|(key, slot)| format!("{key:?} is in slot {slot}"))
        .collect();
    parts.join(", ")
}

fn describe(failures: &[(usize, NodeFailure)]) -> String {
    let parts: Vec<String> = failures
        .iter()
        .map(|(node, failure)| format!("master {node}: {failure}"))
        .collect();
    parts.join("; ")
}

impl Error {
    /// True when the lock was not obtained because somebody else holds it, whether the
    /// retry strategy or the deadline ended the wait.
    pub fn is_not_obtained(&self) -> bool {
        matches!(
            self,
            Self::NotObtained
                | Self::DeadlineExceeded
                | Self::Quorum {
                    op: QuorumOp::Obtain | QuorumOp::Refresh,
                    ..
                }
        )
    }

    /// True when obtain gave up because its deadline passed.
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self, Self::DeadlineExceeded)
    }

    /// True when the lock is no longer ours ([`Error::NotHeld`]).
    pub fn is_not_held(&self) -> bool {
        matches!(
            self,
            Self::NotHeld
                | Self::Quorum {
                    op: QuorumOp::Release,
                    ..
                }
        )
    }
}

/// Input rejected before anything was sent to Redis.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The key set is empty.
    #[error("invalid input: the key set is empty")]
    NoKeys,
    /// A key is the empty string.
    #[error("invalid input: key #{index} is empty")]
    EmptyKey {
        /// Position of the key in the given set.
        index: usize,
    },
    /// The same key appears twice in one set.
    #[error("invalid input: key {key:?} appears more than once")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// More keys than [`MAX_KEYS`](crate::MAX_KEYS).
    #[error("invalid input: {count} keys, at most {max} are allowed")]
    TooManyKeys {
        /// How many keys were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The TTL is zero or shorter than one millisecond.
    #[error("invalid input: TTL {ttl:?} is shorter than 1 ms")]
    TtlTooShort {
        /// The TTL that was given.
        ttl: Duration,
    },
    /// The TTL is longer than [`MAX_TTL`](crate::MAX_TTL).
    #[error("invalid input: TTL {ttl:?} is longer than the maximum {max:?}")]
    TtlTooLong {
        /// The TTL that was given.
        ttl: Duration,
        /// The limit.
        max: Duration,
    },
    /// No fencing counter key can be derived from the lock's first key (see
    /// [`fencing_key_for`](crate::fencing_key_for)); name one with
    /// [`Options::fencing_key`](crate::Options::fencing_key).
    #[error(
        "invalid input: no fencing counter key can be derived from {key:?}; set one with Options::fencing_key"
    )]
    NoFencingKey {
        /// The lock's first key.
        key: String,
    },
    /// On a Redis Cluster, every key of one lock (and the fencing counter derived from or
    /// given for it) must hash to one slot. Give the keys a common hash tag: only the part
    /// between the first `{` and the next `}` is hashed, so `{user42}:cart` and
    /// `{user42}:wallet` share a slot.
    #[error(
        "invalid input: on a cluster all keys of a lock must hash to one slot, but {}; \
         give them a common hash tag such as {{user42}}:cart and {{user42}}:wallet",
        describe_slots(keys)
    )]
    CrossSlot {
        /// Each key with its hash slot.
        keys: Vec<(String, u16)>,
    },
    /// A Redlock quorum needs at least one master.
    #[error("invalid input: a quorum needs at least one master")]
    NoNodes,
    /// The Redlock drift factor must be a number in [0, 1).
    #[error("invalid input: drift factor {factor} is not in [0, 1)")]
    DriftFactor {
        /// The factor that was given.
        factor: f64,
    },
    /// A node of a Redlock quorum must be a single-server client.
    #[error("invalid input: a quorum's nodes must be single-server clients")]
    NestedQuorum,
    /// Fencing tokens need one counter; a Redlock quorum has one per master, which do not
    /// agree. Redlock gives no fencing guarantee on its own.
    #[error("invalid input: fencing tokens are not available with a Redlock quorum")]
    FencingWithQuorum,
    /// A custom token is the empty string.
    #[error("invalid input: the custom token is empty")]
    EmptyToken,
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
