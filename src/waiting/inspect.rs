//! Who holds a key, in which mode, for how long, and who waits for it: read for tools such
//! as `lockset status`, without a token in sight.
//!
//! Reading only: nothing is written and nothing joins a queue. The storage of shared and
//! counted keys (`lua/modes_args.lua`, `lua/sets.lua`) is known on the Rust side here alone, in [`KEY_READER`]
//! and [`parse_reply`]; the queue's in [`read_queue`]. What it reads describes; it never
//! decides who gets a lock (the scripts do).

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, RedisResult, Value};

use crate::error::classify;
use crate::model::mode::Mode;
use crate::model::value::{WAITER_MARK, parse_value};
use crate::waiting::reader::{QueuedWaiter, read_queue};

/// What one key holds on one server, as [`inspect`] found it. Never a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The key.
    pub key: String,
    /// Who holds it, and how.
    pub holding: Holding,
    /// Somebody that waits for release events marked the key (the `!` in front of an
    /// exclusive holder's value, `=w` in a shared or counted key): the release that makes
    /// room announces it.
    pub waited_for: bool,
    /// An exclusive obtain waits for the shared or counted holders to leave, and lets no new
    /// one in meanwhile ("writers first"): what is left of its mark. `None` for none.
    pub writer_waiting: Option<Duration>,
    /// The waiters queued for the key (fair waiting), first come first, as [`read_queue`]
    /// lists them.
    pub waiters: Vec<QueuedWaiter>,
    /// Whether the queue could be read: false when the server's ACL lets this user read the
    /// key but not its queue's names (a key pattern that names the key exactly, see the
    /// servers guide), and `waiters` is empty for want of reading it.
    pub queue_readable: bool,
}

impl KeyState {
    /// The mode the key is held in; `None` when nobody holds it as a lock (free, foreign or
    /// of another type).
    #[must_use]
    pub fn mode(&self) -> Option<Mode> {
        match &self.holding {
            Holding::Exclusive(_) => Some(Mode::Exclusive),
            Holding::Shared(_) => Some(Mode::Shared),
            Holding::Permits { limit, .. } => Some(Mode::Permit { limit: *limit }),
            Holding::Free | Holding::Foreign { .. } | Holding::WrongType { .. } => None,
        }
    }

    /// Every holder of the key: one for an exclusive key, none for a free one.
    #[must_use]
    pub fn holders(&self) -> &[Holder] {
        match &self.holding {
            Holding::Exclusive(holder) => std::slice::from_ref(holder),
            Holding::Shared(holders) | Holding::Permits { holders, .. } => holders,
            Holding::Free | Holding::Foreign { .. } | Holding::WrongType { .. } => &[],
        }
    }

    /// True when nobody holds the key (it may still be marked, see
    /// [`writer_waiting`](Self::writer_waiting)).
    #[must_use]
    pub fn is_free(&self) -> bool {
        self.holding == Holding::Free
    }
}

/// How a key is held.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holding {
    /// Nobody holds it: missing, or a shared or counted key whose holders all expired.
    Free,
    /// One lock holds it alone ([`Mode::Exclusive`]).
    Exclusive(Holder),
    /// Locks that share it ([`Mode::Shared`]), the first to expire first; never empty.
    Shared(Vec<Holder>),
    /// Locks that each hold one of its permits ([`Mode::Permit`]), the first to expire
    /// first; never empty.
    Permits {
        /// How many holders the key admits at once.
        limit: u32,
        /// The holders, at most `limit` of them.
        holders: Vec<Holder>,
    },
    /// A string this crate did not write.
    Foreign {
        /// What is left of it; `None` without expiry.
        ttl: Option<Duration>,
    },
    /// Not a lock: a list, hash, set, ..., or a sorted set this crate did not write.
    WrongType {
        /// The Redis type's name (`TYPE`): `"list"`, `"zset"`, ...
        kind: String,
    },
}

/// One lock that holds a key: what it stored, and what is left of it. Its token is kept
/// to be compared ([`is_owned_by`](Self::is_owned_by)), never shown, not even by `Debug`.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The metadata it stored (see [`Options::metadata`](crate::Options::metadata)).
    pub metadata: String,
    /// What is left of its hold on the key; `None` without expiry.
    pub ttl: Option<Duration>,
    /// Its token: compared, never shown.
    token: String,
}

impl Holder {
    /// True when the lock with `token` (see [`Lock::token`](crate::Lock::token)) is this
    /// holder.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     mut conn: lockset::redis::aio::MultiplexedConnection,
    /// #     lock: lockset::Lock<lockset::redis::aio::ConnectionManager>,
    /// # ) -> lockset::redis::RedisResult<()> {
    /// let states = lockset::inspect(&mut conn, ["job"]).await?;
    /// let mine = states
    ///     .iter()
    ///     .flat_map(|state| state.holders())
    ///     .any(|holder| holder.is_owned_by(lock.token()));
    /// assert!(mine, "the lock lost \"job\"");
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn is_owned_by(&self, token: &str) -> bool {
        self.token == token
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder")
            .field("metadata", &self.metadata)
            .field("ttl", &self.ttl)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Reads, in one script run (atomic, read-only): the key's type and PTTL; then a string's
/// value, or a sorted set's marks (the members scored `-inf`: its mode `=s` or `=p<N>`, and
/// `=w` when somebody waits) and its members that have not expired, each with the
/// milliseconds left of it by the server's clock (a holder's value, or `=x`: a waiting
/// writer). The layout is `lua/modes_args.lua`'s.
const KEY_READER: &str = include_str!("../../lua/read_key.lua");

/// Who holds each of `keys` on the server behind `conn`, in which mode and for how long,
/// and who waits for it; in the order of `keys`.
///
/// Exclusive keys, shared and counted keys ([`Mode`]) and their waiters are all understood;
/// a key that holds something else is [`Holding::Foreign`] or [`Holding::WrongType`]. Each
/// key is read with one read-only script, its queue with another ([`read_queue`]): a
/// snapshot of each, not of all keys at once. On a Redlock quorum, ask each master.
///
/// See the guide: [observing](crate::guide::observing).
///
/// ```no_run
/// use lockset::Holding;
///
/// # async fn demo(mut conn: lockset::redis::aio::MultiplexedConnection) -> lockset::redis::RedisResult<()> {
/// for state in lockset::inspect(&mut conn, ["orders", "catalog"]).await? {
///     match &state.holding {
///         Holding::Free => println!("{:?} is free", state.key),
///         Holding::Exclusive(holder) => {
///             println!("{:?} is held by {:?} ({:?} left)", state.key, holder.metadata, holder.ttl)
///         }
///         Holding::Shared(holders) => println!("{:?} is shared by {}", state.key, holders.len()),
///         Holding::Permits { limit, holders } => {
///             println!("{:?}: {} of {limit} permits taken", state.key, holders.len())
///         }
///         _ => println!("{:?} is not a lock", state.key),
///     }
///     println!("{} waiting", state.waiters.len());
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// The server's error (scripts refused, a connection lost, ...), or one for a reply of an
/// unexpected shape.
pub async fn inspect<C, I>(conn: &mut C, keys: I) -> RedisResult<Vec<KeyState>>
where
    C: ConnectionLike,
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let keys = keys.into_iter();
    let mut states = Vec::with_capacity(keys.size_hint().0);
    for key in keys {
        let key = key.as_ref();
        let reply: Value = redis::cmd("EVAL")
            .arg(KEY_READER)
            .arg(1)
            .arg(key)
            .query_async(conn)
            .await?;
        let Some((holding, waited_for, writer_waiting)) = parse_reply(&reply) else {
            tracing::debug!(key, ?reply, "unexpected reply while reading a lock key");
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply while reading a lock key",
                format!("{reply:?}"),
            )));
        };
        let (waiters, queue_readable) = match read_queue(conn, key).await {
            Ok(waiters) => (waiters, true),
            // The key's pattern does not cover its queue's names: who holds it is known.
            Err(err) if classify::is_acl_refusal(&err) => (Vec::new(), false),
            Err(err) => return Err(err),
        };
        states.push(KeyState {
            key: key.to_owned(),
            holding,
            waited_for,
            writer_waiting,
            waiters,
            queue_readable,
        });
    }
    Ok(states)
}

/// [`KEY_READER`]'s reply: the holding, whether somebody marked the key, and what is left
/// of a waiting writer's mark.
fn parse_reply(reply: &Value) -> Option<(Holding, bool, Option<Duration>)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let kind: String = redis::from_redis_value_ref(items.first()?).ok()?;
    let pttl: i64 = redis::from_redis_value_ref(items.get(1)?).ok()?;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    match kind.as_str() {
        "none" => Some((Holding::Free, false, None)),
        "string" => {
            let value: Option<Vec<u8>> = redis::from_redis_value_ref(items.get(2)?).ok()?;
            Some(match value {
                None => (Holding::Free, false, None),
                Some(value) => from_string(&value, ttl),
            })
        }
        "zset" => {
            let marks: Vec<String> = redis::from_redis_value_ref(items.get(2)?).ok()?;
            let live: Vec<(Vec<u8>, i64)> = redis::from_redis_value_ref(items.get(3)?).ok()?;
            Some(from_set(&marks, &live))
        }
        _ => Some((Holding::WrongType { kind }, false, None)),
    }
}

/// A string: an exclusive holder (marked by a waiter or not), or a value written by others.
fn from_string(value: &[u8], ttl: Option<Duration>) -> (Holding, bool, Option<Duration>) {
    let parsed = std::str::from_utf8(value).ok().and_then(parse_value);
    match parsed {
        Some((token, metadata)) => (
            Holding::Exclusive(Holder {
                metadata: metadata.to_owned(),
                ttl,
                token: token.to_owned(),
            }),
            value.first() == Some(&WAITER_MARK),
            None,
        ),
        None => (Holding::Foreign { ttl }, false, None),
    }
}

/// A sorted set: shared or counted holders, given its marks and its live members with the
/// milliseconds left of each; a set without a mode mark is not a lock.
fn from_set(marks: &[String], live: &[(Vec<u8>, i64)]) -> (Holding, bool, Option<Duration>) {
    let left = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let mode = marks
        .iter()
        .find_map(|mark| mark.strip_prefix('=').and_then(Mode::from_code));
    let waited_for = marks.iter().any(|mark| mark == "=w");
    let writer_waiting = live
        .iter()
        .find(|(member, _)| member == b"=x")
        .map(|(_, ms)| left(*ms));
    let holders: Vec<Holder> = live
        .iter()
        .filter_map(|(member, ms)| {
            let (token, metadata) = std::str::from_utf8(member).ok().and_then(parse_value)?;
            Some(Holder {
                metadata: metadata.to_owned(),
                ttl: Some(left(*ms)),
                token: token.to_owned(),
            })
        })
        .collect();
    let holding = match mode {
        Some(_) if holders.is_empty() => Holding::Free,
        Some(Mode::Shared) => Holding::Shared(holders),
        Some(Mode::Permit { limit }) => Holding::Permits { limit, holders },
        // The modes scripts never store "=x" among the marks: not a set it wrote.
        Some(Mode::Exclusive) | None => Holding::WrongType {
            kind: "zset".to_owned(),
        },
    };
    (holding, waited_for, writer_waiting)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn array(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|item| bulk(item)).collect())
    }

    fn set_reply(marks: &[&str], live: &[(&str, i64)]) -> Value {
        let mut left = Vec::new();
        for (member, ms) in live {
            left.extend([bulk(member), Value::Int(*ms)]);
        }
        Value::Array(vec![
            bulk("zset"),
            Value::Int(9000),
            array(marks),
            Value::Array(left),
        ])
    }

    #[test]
    fn a_string_is_an_exclusive_holder_or_foreign() {
        let reply = Value::Array(vec![bulk("string"), Value::Int(1500), bulk("!3:abcweb-1")]);
        let (holding, waited_for, writer) = parse_reply(&reply).unwrap();
        let Holding::Exclusive(holder) = holding else {
            panic!("{holding:?}")
        };
        assert_eq!(holder.metadata, "web-1");
        assert_eq!(holder.ttl, Some(Duration::from_millis(1500)));
        assert!(holder.is_owned_by("abc") && !holder.is_owned_by("ab"));
        assert!(waited_for);
        assert_eq!(writer, None);
        assert!(!format!("{holder:?}").contains("abc"));

        let reply = Value::Array(vec![bulk("string"), Value::Int(-1), bulk("hello")]);
        assert_eq!(
            parse_reply(&reply).unwrap().0,
            Holding::Foreign { ttl: None }
        );
        let reply = Value::Array(vec![bulk("none"), Value::Int(-2)]);
        assert_eq!(parse_reply(&reply).unwrap().0, Holding::Free);
        let reply = Value::Array(vec![bulk("list"), Value::Int(-1)]);
        assert_eq!(
            parse_reply(&reply).unwrap().0,
            Holding::WrongType {
                kind: "list".to_owned()
            }
        );
        assert_eq!(parse_reply(&bulk("nonsense")), None);
    }

    #[test]
    fn a_set_lists_its_holders_and_marks() {
        let reply = set_reply(
            &["=p3", "=w"],
            &[("1:aone", 1200), ("=x", 4000), ("1:b", 8000)],
        );
        let (holding, waited_for, writer) = parse_reply(&reply).unwrap();
        let Holding::Permits { limit, holders } = holding else {
            panic!("{holding:?}")
        };
        assert_eq!(limit, 3);
        let seen: Vec<_> = holders
            .iter()
            .map(|h| (h.metadata.as_str(), h.ttl))
            .collect();
        assert_eq!(
            seen,
            [
                ("one", Some(Duration::from_millis(1200))),
                ("", Some(Duration::from_millis(8000)))
            ]
        );
        assert!(holders[1].is_owned_by("b"));
        assert!(waited_for);
        assert_eq!(writer, Some(Duration::from_secs(4)));

        let reply = set_reply(&["=s"], &[("1:a", 10)]);
        assert!(matches!(parse_reply(&reply).unwrap().0, Holding::Shared(h) if h.len() == 1));
        // Every holder expired: free, whatever marks are left.
        let reply = set_reply(&["=s", "=w"], &[("=x", 10)]);
        assert_eq!(parse_reply(&reply).unwrap().0, Holding::Free);
        // Not written by this crate.
        let reply = set_reply(&[], &[("alice", 10)]);
        assert_eq!(
            parse_reply(&reply).unwrap().0,
            Holding::WrongType {
                kind: "zset".to_owned()
            }
        );
    }
}
