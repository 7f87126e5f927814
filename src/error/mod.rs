//! The one error type of this crate.

use std::time::Duration;

use crate::mode::Mode;

/// What went wrong with a lock operation.
///
/// See the guide: [errors and what to do](crate::guide::errors).
///
/// Match on the variants you care about; three helper methods group the ones that mean the
/// same thing to most callers, by what a caller does next:
///
/// | helper | meaning | what to do |
/// |---|---|---|
/// | [`Error::is_not_obtained`] | somebody else holds the lock (on a quorum: on some master) | try later |
/// | [`Error::is_not_held`] | the lock is not ours any more | stop the work it protects |
/// | [`Error::is_unavailable`] | Redis could not be reached, did not answer in time, or too few replicas acknowledged a write | alert, retry, or fail over |
///
/// At most one of them is true. Invalid input, a wrong-typed key, a server that refuses the
/// scripts ([`Error::is_scripts_refused`]) and other Redis errors (for example a fencing
/// counter that is not an integer) answer none of them: settings to fix.
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

    /// A call of the blocking API (`lockset::blocking`, feature `blocking`) from
    /// inside an async runtime (a task, `block_on`, or a `spawn_blocking` thread), where it
    /// would block the runtime's thread or panic: use the async [`Client`](crate::Client)
    /// there. Nothing was sent.
    #[error(
        "the blocking API was called from inside an async runtime: use the async Client there (nothing was sent)"
    )]
    InsideAsyncRuntime,

    /// The input was rejected before anything was sent to Redis.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),

    /// No intact reply came while obtaining: the connection's response timeout passed, the
    /// connection dropped, the reply was cut off, or the obtain's deadline passed while an
    /// attempt still waited for Redis.
    ///
    /// The script may still have run, so the outcome is unknown. The client releases the
    /// keys by the attempt's token in the background (best effort, random tokens only;
    /// counted by [`Client::background_tasks`](crate::Client::background_tasks)); whatever
    /// is left expires with the TTL. With a custom token, obtain again with it to find out.
    #[error("obtain got no reply from Redis ({0}); the outcome is unknown")]
    UnknownOutcome(#[source] redis::RedisError),

    /// A key is held in a mode that cannot go with the one asked for, and never will: it is
    /// shared and a permit was asked for, or the other way round, or its holders hold
    /// permits under another limit. Nothing was changed. (A key held exclusively, or in the
    /// other of two compatible modes, is simply held: [`Error::NotObtained`].)
    #[error("key {key:?} is held as {held}, but was asked for as {requested}")]
    ModeMismatch {
        /// The key.
        key: String,
        /// The mode its holders hold it in.
        held: Mode,
        /// The mode asked for.
        requested: Mode,
    },

    /// Redis returned an error, or the connection failed. A server error that echoes a
    /// lock's value (an unknown command lists its arguments) shows `<redacted>` in its
    /// place: no token appears in an error text.
    #[error("redis error: {0}")]
    Redis(redis::RedisError),

    /// The server refuses to run the Lua scripts lockset needs (`EVAL` and `EVALSHA`): the
    /// ACL user may not run them, or they were renamed away. An obtain checks before it
    /// writes anything (once per connection), so nothing was locked; a later release,
    /// refresh or TTL query ends with this when scripts were taken away meanwhile (the keys
    /// then expire with their TTL). Not worth retrying: let the user run them
    /// (`ACL SETUSER <user> +eval +evalsha`, or `+@scripting`). See the guide's servers
    /// chapter.
    #[error(
        "the server refuses to run lockset's scripts (EVAL and EVALSHA): grant them to this user (+eval +evalsha), or do not rename them; nothing was locked by this request"
    )]
    ScriptsRefused,

    /// Fewer replicas than [`Replication`](crate::Replication) asks for acknowledged a
    /// write within its timeout (see [`Client::replicated`](crate::Client::replicated)).
    ///
    /// An obtain that ends with this did not get the lock: its keys were removed again
    /// (best effort; what is left expires with the TTL). A refresh that ends with this may
    /// have extended the keys on the primary, but the lock's validity stays where the last
    /// replicated write put it. [`Error::is_unavailable`] and [`Error::is_not_replicated`]
    /// are true: a replica is down, paused or lagging; alert, retry, or fail over.
    #[error(
        "only {acknowledged} of the {required} replicas a lock must reach acknowledged it in time (or are connected); the lock would not survive a failover"
    )]
    NotReplicated {
        /// How many replicas acknowledged.
        acknowledged: u32,
        /// How many were asked for.
        required: u32,
    },

    /// A Redlock operation did not reach a majority of the masters (see
    /// [`Client::quorum`](crate::Client::quorum)).
    ///
    /// When some master refused (the lock is another owner's there, or not ours),
    /// [`Error::is_not_obtained`] is true for an obtain or refresh and [`Error::is_not_held`]
    /// for a release or TTL query. When masters only failed or timed out,
    /// [`Error::is_unavailable`] is true instead: nothing is known about the lock.
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
        /// Also set, with `succeeded` 0 and no failures, when an obtain's TTL is within the
        /// drift allowance (no obtain could be valid): then nothing was sent.
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
    /// A TTL query.
    Ttl,
}

impl std::fmt::Display for QuorumOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Obtain => "obtain",
            Self::Refresh => "refresh",
            Self::Release => "release",
            Self::Ttl => "ttl",
        })
    }
}

/// Why one Redlock master did not agree.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum NodeFailure {
    /// The lock is held by another owner there (obtain), or another owner's value (or type)
    /// is in one of its keys there (refresh, release, TTL).
    Refused,
    /// The lock's keys are gone there (expired, or the master restarted empty), and no other
    /// owner has them.
    Missing,
    /// No answer within the per-node time limit.
    TimedOut(Duration),
    /// Nothing was sent: the master missed a deadline earlier and has not answered since
    /// (a probe asks it; see the guide: [Redlock](crate::guide::redlock)).
    Unresponsive,
    /// A key holds a non-string value there.
    WrongType(String),
    /// A Redis or connection error.
    Redis(redis::RedisError),
    /// Too few of the master's replicas acknowledged the write in time (see
    /// [`Error::NotReplicated`]).
    NotReplicated {
        /// How many replicas acknowledged.
        acknowledged: u32,
        /// How many were asked for.
        required: u32,
    },
    /// No tokio runtime to run the master's part on.
    NoRuntime,
    /// The master refuses to run lockset's scripts (see [`Error::ScriptsRefused`]).
    ScriptsRefused,
}

impl NodeFailure {
    pub(crate) fn wrong_type_key(&self) -> Option<&str> {
        match self {
            Self::WrongType(key) => Some(key),
            _ => None,
        }
    }

    /// The master answered that the lock is someone else's, or not ours.
    fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused)
    }
}

impl From<Error> for NodeFailure {
    fn from(err: Error) -> Self {
        match err {
            Error::Redis(err) | Error::UnknownOutcome(err) => Self::Redis(err),
            Error::WrongType { key } => Self::WrongType(key),
            Error::ScriptsRefused => Self::ScriptsRefused,
            Error::NotReplicated {
                acknowledged,
                required,
            } => Self::NotReplicated {
                acknowledged,
                required,
            },
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
            Self::Refused => f.write_str("held by another owner"),
            Self::Missing => f.write_str("the keys are gone"),
            Self::TimedOut(limit) => write!(f, "no answer within {limit:?}"),
            Self::Unresponsive => f.write_str("not answering since it missed a deadline"),
            Self::WrongType(key) => write!(f, "key {key:?} holds a non-string value"),
            Self::Redis(err) => write!(f, "{err}"),
            Self::NotReplicated {
                acknowledged,
                required,
            } => write!(f, "{acknowledged} of {required} replicas acknowledged"),
            Self::NoRuntime => f.write_str("no tokio runtime"),
            Self::ScriptsRefused => f.write_str("refuses to run lockset's scripts"),
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
    /// retry strategy or the deadline ended the wait; on a quorum, when some master refused
    /// an obtain or refresh, or a majority agreed too late (the validity ran out).
    pub fn is_not_obtained(&self) -> bool {
        match self {
            Self::NotObtained | Self::DeadlineExceeded => true,
            Self::Quorum {
                op,
                failures,
                expired,
                ..
            } => {
                matches!(op, QuorumOp::Obtain | QuorumOp::Refresh)
                    && (refused(failures) || *expired)
            }
            _ => false,
        }
    }

    /// True when obtain gave up because its deadline passed.
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self, Self::DeadlineExceeded)
    }

    /// True when the lock is no longer ours ([`Error::NotHeld`]); on a quorum, when some
    /// master refused a release or TTL query.
    pub fn is_not_held(&self) -> bool {
        match self {
            Self::NotHeld => true,
            Self::Quorum { op, failures, .. } => {
                matches!(op, QuorumOp::Release | QuorumOp::Ttl) && refused(failures)
            }
            _ => false,
        }
    }

    /// True when Redis could not be reached or did not answer in time: a connection error,
    /// a timeout, an unknown outcome, a server that is not the primary any more or not
    /// ready (`READONLY`, `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`: a failover or
    /// restart is under way), too few replicas that acknowledged a write, or a quorum that
    /// missed its majority only because masters failed or timed out (none refused, and not
    /// for lack of time). Nothing is known about the lock then.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::UnknownOutcome(_) | Self::NotReplicated { .. } => true,
            Self::Redis(err) => is_unreachable(err) || is_changing_over(err),
            Self::Quorum {
                failures, expired, ..
            } => !refused(failures) && !expired,
            _ => false,
        }
    }

    /// True when too few replicas acknowledged a write in time ([`Error::NotReplicated`]):
    /// the lock was not obtained (or the refresh does not count), since a failover could
    /// lose it. [`Error::is_unavailable`] is true as well.
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, Self::NotReplicated { .. })
    }

    /// True when the server refuses to run lockset's scripts ([`Error::ScriptsRefused`]):
    /// a setting of the server or its ACL to fix, not a state that passes.
    pub fn is_scripts_refused(&self) -> bool {
        matches!(self, Self::ScriptsRefused)
    }

    /// True when a call of the blocking API came from inside an async runtime
    /// ([`Error::InsideAsyncRuntime`]).
    pub fn is_inside_async_runtime(&self) -> bool {
        matches!(self, Self::InsideAsyncRuntime)
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        Self::Redis(redact(err))
    }
}

/// `err` without any lock value it echoes: a server error whose text quotes an argument that
/// is a lock's value (`'<token length>:<token>…'`, marked by a waiter or not) gets
/// `'<redacted>'` there, with its code and kind kept. Other errors are returned as they are.
pub(crate) fn redact(err: redis::RedisError) -> redis::RedisError {
    let (Some(code), Some(detail)) = (err.code(), err.detail()) else {
        return err;
    };
    let Some(redacted) = redact_values(detail) else {
        return err;
    };
    let line = format!("-{code} {redacted}\r\n");
    match redis::parse_redis_value(line.as_bytes()).map(redis::Value::extract_error) {
        Ok(Err(redacted)) => redacted,
        _ => err,
    }
}

/// `text` with every quoted lock value replaced by `<redacted>`; `None` when it quotes none.
/// Redis 7 quotes arguments with `'`, Redis 6.2 with a backtick.
fn redact_values(text: &str) -> Option<String> {
    let single = redact_quoted(text, '\'');
    let both = redact_quoted(single.as_deref().unwrap_or(text), '`');
    both.or(single)
}

/// `text` with every lock value quoted by `quote` replaced; `None` when it quotes none.
fn redact_quoted(text: &str, quote: char) -> Option<String> {
    let mut parts: Vec<&str> = text.split(quote).collect();
    let mut found = false;
    // Quoted parts are the odd ones.
    for part in parts.iter_mut().skip(1).step_by(2) {
        if is_lock_value(part) {
            *part = "<redacted>";
            found = true;
        }
    }
    found.then(|| parts.join(&quote.to_string()))
}

/// Whether `text` starts as a lock's value does: its owner tag's length, then a colon.
fn is_lock_value(text: &str) -> bool {
    let text = text.strip_prefix('!').unwrap_or(text);
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && text.as_bytes().get(digits) == Some(&b':')
}

/// Whether any master refused.
fn refused(failures: &[(usize, NodeFailure)]) -> bool {
    failures.iter().any(|(_, failure)| failure.is_refusal())
}

/// Errors of the connection, not of the command: nothing reached Redis, or no answer came.
/// A TLS handshake that failed over a certificate is an I/O error too, but not one of these:
/// a setting to fix (see `policy::is_refusal`).
pub(crate) fn is_unreachable(err: &redis::RedisError) -> bool {
    (err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_io_error())
        && !crate::waiting::policy::is_refusal(err)
}

/// An error for "no primary can be reached now" (sentinels that do not answer or agree, a
/// restarted primary that grants no lock yet), which callers treat as Redis being
/// unavailable: worth retrying, [`Error::is_unavailable`], and nothing was sent.
pub(crate) fn unavailable(why: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        why,
    ))
}

/// The server answered that it cannot serve the request now: it is no longer the primary,
/// still loading, or its cluster or primary is down. Nothing ran.
pub(crate) fn is_changing_over(err: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as Kind;
    matches!(
        err.kind(),
        redis::ErrorKind::Server(
            Kind::ReadOnly
                | Kind::BusyLoading
                | Kind::MasterDown
                | Kind::ClusterDown
                | Kind::TryAgain
        )
    )
}

/// No intact reply came (none, or a cut one): the request may or may not have run. A
/// refused connection is not one: nothing was sent.
pub(crate) fn is_outcome_unknown(err: &redis::RedisError) -> bool {
    (is_unreachable(err) && !err.is_connection_refusal()) || err.kind() == redis::ErrorKind::Parse
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
    /// No sentinel that answered monitors a master of this name.
    #[error("invalid input: no sentinel knows a master named {name:?}")]
    UnknownMaster {
        /// The master name asked for.
        name: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn quoted_lock_values_are_redacted_with_the_code_kept() {
        let line = b"-ERR unknown command 'EVALSHA', with args beginning with: 'f00' '1' \
            'k' '22:AAAAAAAAAAAAAAAAAAAAAA' '!5:minemeta' \r\n";
        let Ok(Err(err)) = redis::parse_redis_value(line).map(redis::Value::extract_error) else {
            panic!("not a server error");
        };
        let err = redact(err);
        let shown = format!("{err} {err:?}");
        assert!(
            !shown.contains("AAAA") && !shown.contains("mine"),
            "{shown}"
        );
        assert!(shown.contains("'k' '<redacted>' '<redacted>'"), "{shown}");
        assert_eq!(err.code(), Some("ERR"));
        // Redis 6.2 quotes with backticks.
        let line = b"-ERR unknown command `EVALSHA`, with args beginning with: `f00`, `1`, \
            `k`, `22:AAAAAAAAAAAAAAAAAAAAAAmeta`, `10000`, \r\n";
        let Ok(Err(err)) = redis::parse_redis_value(line).map(redis::Value::extract_error) else {
            panic!("not a server error");
        };
        let shown = format!("{}", redact(err));
        assert!(!shown.contains("AAAA"), "{shown}");
        assert!(shown.contains("`k`, `<redacted>`"), "{shown}");
    }
}
