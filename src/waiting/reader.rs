//! Who waits for a key: the waiter queue fair waiting keeps in Redis (`lua/queue.lua`),
//! read for tools such as `lockset status`.
//!
//! Reading only: nothing is written and nothing joins a queue. The queue's layout is known
//! on the Rust side here alone, in [`QUEUE_READER`] and [`parse_queue`]: a change of
//! `queue.lua`'s layout touches them and nothing else. What it reads describes; it never
//! decides who gets a lock (the scripts do).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, RedisResult, Value};

use crate::model::names::queue_key_for;
use crate::model::value::parse_value;

/// One waiter in a key's queue, as [`read_queue`] found it. Never its token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// The metadata it will store with the lock (see [`Options::metadata`](crate::Options::metadata)).
    pub metadata: String,
    /// How long it has waited: since it first queued, by the server's clock.
    pub waited: Duration,
    /// What is left of its lease (it renews it while it waits); `None` when its record is
    /// gone: it stopped waiting or died, and the next release drops it from the queue.
    pub lease: Option<Duration>,
    /// Every key it waits for, all at once (the queued key among them).
    pub keys: Vec<String>,
    /// The time to live it asks for.
    pub ttl: Duration,
}

/// Reads, in one script run (atomic, read-only): the server's time, the queue's members
/// with their arrival times (microseconds of the server's clock), and each member's record
/// with its remaining lease. `queue.lua`: a sorted set scored by arrival whose members name
/// hashes of `v` (the waiter's value), `t` (its TTL in ms), `n` (how many keys) and `1..n`
/// (its keys), expiring with the lease.
const QUEUE_READER: &str = include_str!("../../lua/read_queue.lua");

/// The waiters in `key`'s queue on the server behind `conn`, first come first: empty when
/// nobody waits, or the key has no queue (see [`queue_key_for`](crate::queue_key_for)).
///
/// See the guide: [observing](crate::guide::observing).
///
/// Only fair waiters queue (see [`Options::fair`](crate::Options::fair)): a client that
/// barges, or a Redlock quorum's, waits without a place in any queue. On a Redlock quorum,
/// ask each master.
///
/// ```no_run
/// # async fn demo(mut conn: lockset::redis::aio::MultiplexedConnection) -> lockset::redis::RedisResult<()> {
/// for (place, waiter) in lockset::read_queue(&mut conn, "orders").await?.iter().enumerate() {
///     println!("{}. {:?} waiting for {:?}", place + 1, waiter.metadata, waiter.waited);
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// The server's error, or one for a reply of an unexpected shape.
pub async fn read_queue<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
) -> RedisResult<Vec<QueuedWaiter>> {
    let Some(queue) = queue_key_for(key) else {
        return Ok(Vec::new());
    };
    let reply: Value = redis::cmd("EVAL")
        .arg(QUEUE_READER)
        .arg(1)
        .arg(queue)
        .query_async(conn)
        .await?;
    parse_queue(&reply).ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply while reading a waiter queue",
            format!("{reply:?}"),
        ))
    })
}

/// The waiters [`QUEUE_READER`]'s reply lists.
fn parse_queue(reply: &Value) -> Option<Vec<QueuedWaiter>> {
    let Value::Array(items) = reply else {
        return None;
    };
    let (now, entries) = items.split_at_checked(2)?;
    let seconds: u64 = redis::from_redis_value_ref(&now[0]).ok()?;
    let micros: u64 = redis::from_redis_value_ref(&now[1]).ok()?;
    let now = seconds.saturating_mul(1_000_000).saturating_add(micros);
    entries
        .chunks(3)
        .map(|entry| {
            let [arrival, pttl, record] = entry else {
                return None;
            };
            let arrival: f64 = redis::from_redis_value_ref(arrival).ok()?;
            let pttl: i64 = redis::from_redis_value_ref(pttl).ok()?;
            let fields: Vec<(String, String)> = redis::from_redis_value_ref(record).ok()?;
            Some(waiter(now, arrival, pttl, &fields))
        })
        .collect()
}

/// One waiter from its arrival (µs), its record's PTTL and its record's fields.
fn waiter(now: u64, arrival: f64, pttl: i64, fields: &[(String, String)]) -> QueuedWaiter {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let keys = (1..=number("n").unwrap_or(0))
        .filter_map(|i| field(&i.to_string()).map(str::to_owned))
        .collect();
    // Scores are whole microseconds, far below f64's exact range.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let arrival = arrival.max(0.0) as u64;
    QueuedWaiter {
        metadata: field("v")
            .and_then(parse_value)
            .map(|(_, metadata)| metadata.to_owned())
            .unwrap_or_default(),
        waited: Duration::from_micros(now.saturating_sub(arrival)),
        lease: u64::try_from(pttl).ok().map(Duration::from_millis),
        keys,
        ttl: Duration::from_millis(number("t").unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_reply_becomes_waiters_in_order_without_tokens() {
        let record = |value: &str, keys: &[&str]| {
            let mut fields = vec![bulk("v"), bulk(value), bulk("t"), bulk("5000")];
            fields.extend([bulk("n"), bulk(&keys.len().to_string())]);
            for (i, key) in keys.iter().enumerate() {
                fields.extend([bulk(&(i + 1).to_string()), bulk(key)]);
            }
            Value::Array(fields)
        };
        let reply = Value::Array(vec![
            bulk("100"),
            bulk("500000"),
            bulk("98500000"),
            Value::Int(4000),
            record("6:secretweb-2:17", &["{j}:a", "{j}:b"]),
            bulk("99900000"),
            Value::Int(-2),
            Value::Array(vec![]),
        ]);
        let waiters = parse_queue(&reply).unwrap();
        assert_eq!(waiters.len(), 2);
        assert_eq!(waiters[0].metadata, "web-2:17");
        assert_eq!(waiters[0].waited, Duration::from_millis(2_000));
        assert_eq!(waiters[0].lease, Some(Duration::from_secs(4)));
        assert_eq!(waiters[0].keys, ["{j}:a", "{j}:b"]);
        assert_eq!(waiters[0].ttl, Duration::from_secs(5));
        // A dead waiter whose record expired.
        assert_eq!(waiters[1].lease, None);
        assert_eq!(waiters[1].waited, Duration::from_millis(600));
        assert!(!format!("{waiters:?}").contains("secret"));
    }
}
