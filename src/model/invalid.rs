//! Input rejected before anything is sent to Redis: what was wrong, in one typed value.

use std::time::Duration;

use crate::model::mode::Mode;

/// Input rejected before anything was sent to Redis.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The key set is empty.
    #[error("invalid input: the key set is empty")]
    NoKeys,
    /// A [`Config`](crate::Config) that cannot make a client: no topology or more than one,
    /// TLS files without the `tls` feature, a cluster without the `cluster` feature.
    #[error("invalid configuration: {reason}")]
    Config {
        /// What is wrong, naming the setting.
        reason: String,
    },
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
    /// A key named like lockset's waiter queues (it contains `:lockset:queue`): a string
    /// there would break the hand-off of the key the queue belongs to.
    #[error(
        "invalid input: key {key:?} contains \":lockset:queue\", which names lockset's waiter queues"
    )]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// More metadata than [`MAX_METADATA`](crate::MAX_METADATA) bytes.
    #[error("invalid input: {len} bytes of metadata, at most {max} are allowed")]
    MetadataTooLong {
        /// How many bytes were given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More metadata over all keys of a lock (keys × metadata) than
    /// [`MAX_LOCK_METADATA`](crate::MAX_LOCK_METADATA) bytes.
    #[error(
        "invalid input: {keys} keys of {len} bytes of metadata each, at most {max} bytes over all keys are allowed"
    )]
    LockMetadataTooLarge {
        /// How many keys the lock has.
        keys: usize,
        /// How many bytes of metadata each stores.
        len: usize,
        /// The limit.
        max: usize,
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
    /// [`Options::fencing_key`](crate::Options::fencing_key) names the empty string.
    #[error("invalid input: the fencing counter key is empty")]
    EmptyFencingKey,
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
    /// The fencing counter is one of the lock's own keys: the lock would overwrite it, and
    /// its release delete it, so tokens would start over.
    #[error("invalid input: the fencing counter {key:?} is one of the lock's keys")]
    FencingKeyIsLocked {
        /// The counter key.
        key: String,
    },
    /// Two nodes of a Redlock quorum are the same server (the same client, the same
    /// address, or, found when the masters first answer, the same run id): a majority would
    /// count it twice.
    #[error("invalid input: masters {first} and {second} of the quorum are the same server")]
    DuplicateNode {
        /// The position of the first of the two in the quorum.
        first: usize,
        /// The position of the second.
        second: usize,
    },
    /// A Redlock quorum's per-node time limit is zero: no master could ever answer.
    #[error("invalid input: a quorum's node timeout must not be zero")]
    ZeroNodeTimeout,
    /// Release events are listened to over one server's pub/sub connection: on a Redlock
    /// quorum each master's own client listens (make them with
    /// [`Client::connect`](crate::Client::connect)), and a cluster client is not a single
    /// server.
    #[error("invalid input: release events need a single-server client")]
    ReleaseEventsNeedOneServer,
    /// Fencing tokens need one counter; a Redlock quorum has one per master, which do not
    /// agree. Redlock gives no fencing guarantee on its own.
    #[error("invalid input: fencing tokens are not available with a Redlock quorum")]
    FencingWithQuorum,
    /// A custom token is the empty string.
    #[error("invalid input: the custom token is empty")]
    EmptyToken,
    /// A permit's limit is zero: nobody could ever hold the key.
    #[error("invalid input: key {key:?} asks for one of 0 permits")]
    ZeroLimit {
        /// The key.
        key: String,
    },
    /// One key is asked for twice, in two different modes (shared and exclusive, or two
    /// different permit limits).
    #[error("invalid input: key {key:?} is asked for both as {first} and as {second}")]
    ConflictingModes {
        /// The key.
        key: String,
        /// The mode asked for first.
        first: Mode,
        /// The mode asked for next.
        second: Mode,
    },
    /// [`Client::adopt`](crate::Client::adopt) needs the token of the lock to adopt.
    #[error("invalid input: adopting a lock needs its token (Options::token)")]
    TokenRequired,
    /// A [`Replication`](crate::Replication) that waits for replicas with a zero timeout:
    /// `WAIT` would block for ever.
    #[error("invalid input: replicated writes need a timeout above zero")]
    ZeroReplicationTimeout,
    /// [`Client::connection_answers_within`](crate::Client::connection_answers_within) with
    /// a zero bound: no request could ever be answered.
    #[error("invalid input: a connection's bound on one request must be above zero")]
    ZeroAnswerBound,
    /// [`Client::connection_answers_within`](crate::Client::connection_answers_within) on a
    /// client whose requests do not go straight to one connection (a Redlock quorum, a
    /// cluster, a Sentinel deployment): their time is not the connection's alone.
    #[error("invalid input: an answer bound applies to a client of one server's own connection")]
    AnswerBoundNeedsOneConnection,
    /// More replicas asked for than the primary has connected. No longer returned: a
    /// replica shortfall passes (a replica restarting, a failover), so it is reported as
    /// [`Error::NotReplicated`](crate::Error::NotReplicated), which is worth retrying. Kept
    /// so that code matching it still compiles.
    #[error(
        "invalid input: {requested} replicas must acknowledge each write, but the primary has {connected} connected"
    )]
    NotEnoughReplicas {
        /// How many replicas [`Replication`](crate::Replication) asks for.
        requested: u32,
        /// How many replicas the primary reports connected (the fewest of any shard, on a
        /// cluster).
        connected: u32,
    },
    /// [`Client::replicated`](crate::Client::replicated) was called before, with other
    /// settings: they are set once per client (and its clones).
    #[error("invalid input: this client's replication is set already, to other settings")]
    ReplicationAlreadySet,
    /// `WAITAOF` asked for, but the server does not know it (before Redis 7.2).
    #[error("invalid input: the server has no WAITAOF (Redis 7.2 or Valkey needed)")]
    NoWaitAof,
    /// TLS settings that cannot work: a certificate or key file that cannot be read, or
    /// holds no certificate or key (see `Tls`, feature `tls`).
    #[error("invalid input: TLS: {reason}")]
    Tls {
        /// What is wrong, naming the file.
        reason: String,
    },
    /// A Sentinel client without sentinels.
    #[error("invalid input: a Sentinel client needs at least one sentinel")]
    NoSentinels,
    /// No sentinel monitors a master of this name: a majority of them (or every one that
    /// answered) do not know it, and none names a primary. (Some that do not know it while
    /// another names a primary are a state of the deployment: `is_unavailable()`, retried.)
    #[error("invalid input: no sentinel knows a master named {name:?}")]
    UnknownMaster {
        /// The master name asked for.
        name: String,
    },
}

fn describe_slots(keys: &[(String, u16)]) -> String {
    let parts: Vec<String> = keys
        .iter()
        .map(|(key, slot)| format!("{key:?} is in slot {slot}"))
        .collect();
    parts.join(", ")
}
