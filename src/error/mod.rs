//! The one error type of this crate, and (in `classify`) what each Redis error means.
//!
//! May import `model` and `rt` (`tests/layers.rs` checks).

pub(crate) mod classify;

use std::time::Duration;

use crate::error::classify::{is_changing_over, is_unreachable};
use crate::model::invalid::InvalidInput;
use crate::model::mode::Mode;

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
    /// The lock is held by someone else, and the retry strategy gave up. Says which key
    /// was held, by whom and for how long, as far as the server told:
    /// `lock not obtained: "job2" is held by "vm:17548" (4.5s left)`.
    ///
    /// (A refresh of a lock that was lost is [`Error::NotHeld`].)
    #[error("lock not obtained: {key:?} is held by {}{}", holder_text(holder), left_text(*ttl_left))]
    #[non_exhaustive]
    NotObtained {
        /// The key found held (of several, the first the server found held).
        key: String,
        /// The holder's metadata ([`Options::metadata`](crate::Options::metadata)), when
        /// it has any and the server told it: it does unless the key is held in shares
        /// ([`Mode::Shared`], permits), which have no single holder. Its first 256 bytes,
        /// never its token.
        holder: Option<String>,
        /// What was left of the holder's TTL on the key (for shares: until the key frees),
        /// when the server told it: every scripted refusal does; a single key refused by
        /// `SET … NX GET` on a client with release events does not ask (see the guide's
        /// [errors](crate::guide::errors)).
        ttl_left: Option<Duration>,
    },

    /// The lock is held by someone else, and obtain gave up because its deadline passed
    /// (an explicit timeout or deadline, or by default the lock's TTL).
    ///
    /// [`Error::is_not_obtained`] is true for this variant as well.
    #[error("lock not obtained: deadline passed while it was held by another owner")]
    DeadlineExceeded,

    /// The lock is not held by us any more: it expired, or another owner replaced it.
    /// A release or a refresh of a lock that was lost ends with this: stop the work it
    /// protects.
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
    /// permits under another limit; or the token asking ([`Options::token`](crate::Options::token))
    /// holds it itself in another mode (a read lock is not upgraded to a write lock, nor the
    /// other way: release it first; waiting would wait for itself). That includes a hold
    /// left by a process that crashed with the same token: it is reported at once, not
    /// waited out; it expires with its TTL. Nothing was changed. (A key held exclusively, or in the
    /// other of two compatible modes, is simply held: [`Error::NotObtained`].) A Redlock
    /// obtain ends with this when the masters that hold a key in another mode are too many
    /// for its quorum to be reached; on fewer masters, a mismatch counts as that master
    /// refusing ([`NodeFailure::ModeMismatch`]) and the obtain retries as for any holder
    /// (`tests/suite/redlock.rs`, `a_mode_mismatch_on_a_majority_ends_the_obtain_at_once`,
    /// `a_mode_mismatch_on_a_minority_is_waited_out_like_a_holder`).
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
        "the server refuses to run lockset's scripts (EVAL and EVALSHA): grant them to this user (+eval +evalsha), or do not rename them (an obtain writes nothing then; a lock already held stays until its TTL)"
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
    /// [`Error::is_not_obtained`] is true for an obtain and [`Error::is_not_held`] for a
    /// release or TTL query. When masters only failed or timed out, or a refresh was refused
    /// by too few to decide, [`Error::is_unavailable`] is true instead: nothing is known
    /// about the lock. A majority that agreed too late (`expired`) is not obtained for an
    /// obtain and not held for a refresh.
    #[error("{op}: {succeeded} of {nodes} masters agreed, {needed} needed{}{}",
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
    /// A key is held there in a mode that cannot go with the one asked for: a refusal, and
    /// [`Error::ModeMismatch`] when such masters alone leave too few for the quorum.
    ModeMismatch {
        /// The key.
        key: String,
        /// The mode its holders hold it in there.
        held: Mode,
        /// The mode asked for.
        requested: Mode,
    },
}

impl NodeFailure {
    pub(crate) fn wrong_type_key(&self) -> Option<&str> {
        match self {
            Self::WrongType(key) => Some(key),
            _ => None,
        }
    }

    /// The error a mode mismatch on this master ends the operation with: as on one server,
    /// it is not worth retrying (see [`Error::ModeMismatch`]).
    pub(crate) fn mode_mismatch(&self) -> Option<Error> {
        match self {
            Self::ModeMismatch {
                key,
                held,
                requested,
            } => Some(Error::ModeMismatch {
                key: key.clone(),
                held: *held,
                requested: *requested,
            }),
            _ => None,
        }
    }

    /// The master answered that the lock is someone else's, or not ours (its key held there
    /// in another mode included).
    fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused | Self::ModeMismatch { .. })
    }
}

impl From<Error> for NodeFailure {
    fn from(err: Error) -> Self {
        match err {
            Error::Redis(err) | Error::UnknownOutcome(err) => Self::Redis(err),
            Error::WrongType { key } => Self::WrongType(key),
            Error::ScriptsRefused => Self::ScriptsRefused,
            Error::ModeMismatch {
                key,
                held,
                requested,
            } => Self::ModeMismatch {
                key,
                held,
                requested,
            },
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
            Self::ModeMismatch {
                key,
                held,
                requested,
            } => write!(
                f,
                "key {key:?} is held as {held}, but was asked for as {requested}"
            ),
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

/// Who holds a refused key, for [`Error::NotObtained`]'s message.
fn holder_text(holder: &Option<String>) -> String {
    match holder {
        Some(metadata) => format!("{metadata:?}"),
        None => "another owner".to_owned(),
    }
}

/// For how long a refused key is held, for [`Error::NotObtained`]'s message.
fn left_text(left: Option<Duration>) -> String {
    match left {
        Some(left) if left < Duration::from_secs(1) => format!(" ({}ms left)", left.as_millis()),
        Some(left) => format!(" ({:.1}s left)", left.as_secs_f64()),
        None => String::new(),
    }
}

fn describe(failures: &[(usize, NodeFailure)]) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = failures
        .iter()
        .map(|(node, failure)| format!("master {node}: {failure}"))
        .collect();
    format!(": {}", parts.join("; "))
}

impl Error {
    /// True when the lock was not obtained because somebody else holds it, whether the
    /// retry strategy or the deadline ended the wait; on a quorum, when some master refused
    /// an obtain, or its majority agreed too late (the validity ran out).
    pub fn is_not_obtained(&self) -> bool {
        match self {
            Self::NotObtained { .. } | Self::DeadlineExceeded => true,
            Self::Quorum {
                op: QuorumOp::Obtain,
                failures,
                expired,
                ..
            } => refused(failures) || *expired,
            _ => false,
        }
    }

    /// True when obtain gave up because its deadline passed.
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(self, Self::DeadlineExceeded)
    }

    /// True when the lock is no longer ours ([`Error::NotHeld`]); on a quorum, when some
    /// master refused a release or TTL query, or a refresh's majority agreed too late (the
    /// validity ran out). (A refresh that enough masters refuse is [`Error::NotHeld`]; one
    /// that a few refuse while others fail decides nothing: [`Error::is_unavailable`].)
    pub fn is_not_held(&self) -> bool {
        match self {
            Self::NotHeld => true,
            Self::Quorum {
                op: QuorumOp::Refresh,
                expired,
                ..
            } => *expired,
            Self::Quorum { op, failures, .. } => {
                matches!(op, QuorumOp::Release | QuorumOp::Ttl) && refused(failures)
            }
            _ => false,
        }
    }

    /// True when Redis could not be reached or did not answer in time: a connection error,
    /// a timeout, an unknown outcome, a server that is not the primary any more or not
    /// ready (`READONLY`, `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`: a failover or
    /// restart is under way; `NOREPLICAS`: a primary short of the replicas its
    /// `min-replicas-to-write` asks for), too few replicas that acknowledged a write, or a quorum that
    /// missed its majority because masters failed or timed out (for a refresh, also when a
    /// few refused: too few to decide), not for lack of time. Nothing is known about the
    /// lock then.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::UnknownOutcome(_) | Self::NotReplicated { .. } => true,
            Self::Redis(err) => is_unreachable(err) || is_changing_over(err),
            Self::Quorum {
                op,
                failures,
                expired,
                ..
            } => {
                (*op == QuorumOp::Refresh || !refused(failures))
                    && !expired
                    && !self.is_scripts_refused()
            }
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
    /// On a Redlock quorum, true when the masters that refuse the scripts leave no majority
    /// ([`NodeFailure::ScriptsRefused`]).
    pub fn is_scripts_refused(&self) -> bool {
        match self {
            Self::ScriptsRefused => true,
            Self::Quorum {
                failures,
                nodes,
                needed,
                ..
            } => {
                let refusing = failures
                    .iter()
                    .filter(|(_, failure)| matches!(failure, NodeFailure::ScriptsRefused))
                    .count();
                refusing > 0 && nodes.saturating_sub(refusing) < *needed
            }
            _ => false,
        }
    }

    /// True when the server's ACL refuses this user a key, channel or command the lock
    /// needs: `NOPERM`, or a command one of lockset's scripts runs (which the server reports
    /// with `ERR` and its own words). A setting to fix, not a state that passes (see the
    /// guide's servers chapter for what a lock user needs). On a Redlock quorum, true when
    /// some master refused so.
    pub fn is_refused_by_acl(&self) -> bool {
        match self {
            Self::Redis(err) => classify::is_acl_refusal(err),
            Self::Quorum { failures, .. } => failures.iter().any(
                |(_, failure)| matches!(failure, NodeFailure::Redis(err) if classify::is_acl_refusal(err)),
            ),
            _ => false,
        }
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

/// An error for "no primary can be reached now" (sentinels that do not answer or agree, a
/// restarted primary that grants no lock yet), which callers treat as Redis being
/// unavailable: worth retrying, [`Error::is_unavailable`], and nothing was sent.
pub(crate) fn unavailable(why: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        why,
    ))
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Error, redact};

    #[test]
    fn a_refusal_says_which_key_whose_and_how_long() {
        let refusal = |holder: Option<&str>, ms: Option<u64>| Error::NotObtained {
            key: "job2".into(),
            holder: holder.map(str::to_owned),
            ttl_left: ms.map(Duration::from_millis),
        };
        let cases = [
            (
                refusal(Some("vm:17548"), Some(4_500)),
                r#"lock not obtained: "job2" is held by "vm:17548" (4.5s left)"#,
            ),
            (
                refusal(None, Some(40)),
                r#"lock not obtained: "job2" is held by another owner (40ms left)"#,
            ),
            (
                refusal(None, None),
                r#"lock not obtained: "job2" is held by another owner"#,
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }

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
