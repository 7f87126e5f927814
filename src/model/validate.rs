//! Input checks that run before anything is sent to Redis.

use std::collections::HashSet;
use std::time::Duration;

use crate::model::invalid::InvalidInput;

/// The most keys one lock may hold: 2,500. Checked before anything is sent.
///
/// The scripts walk the keys one by one (no `unpack()`), so the limit is there to bound
/// the time one script blocks the server, not because of Lua's stack. The costliest case is
/// an obtain refused by its last key (the keys before it are set, then undone, then looked
/// at one by one): it costs the server about 11 µs a key on an idle 2-core machine, and up to
/// 61 µs a key when that machine is loaded nine times over (5,000 keys: 56 ms, then 305 ms of
/// the server's own time). At this size it stays within half of redis-rs's default 500 ms
/// response timeout even then; 10,000 keys took 563–631 ms and came back as an unknown
/// outcome (100,000 blocked the server ~884 ms alone).
pub const MAX_KEYS: usize = 2_500;

/// The most bytes of metadata one lock may store ([`Options::metadata`](crate::Options::metadata)):
/// 64 KiB. Checked before anything is sent. Every key of the lock stores it, so a lock takes
/// about keys × (metadata + 32) bytes of server memory; a large value also costs every
/// operation of the lock its transfer (a release compares it).
pub const MAX_METADATA: usize = 64 * 1024;

/// The most bytes of metadata one lock may store over all its keys (keys × metadata): 4 MiB.
/// Checked before anything is sent. A release reads every key's value to compare it, which
/// costs the server about 5 ms a MiB on an idle 2-core machine (2,500 keys of 64 KiB, 160 MiB:
/// ~1 s, and the release timed out): at this size it stays within half of redis-rs's default
/// 500 ms response timeout on that machine loaded nine times over, as [`MAX_KEYS`] does.
pub const MAX_LOCK_METADATA: usize = 4 * 1024 * 1024;

/// The longest TTL: 2^52 ms, about 142,000 years, far inside what Redis accepts.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 52);

/// Key sets up to this size are checked for duplicates pairwise.
const SMALL_SET: usize = 16;

/// Checks a key set: not empty, no empty key, no duplicate, at most [`MAX_KEYS`].
// What names lockset's waiter queues and records (see `lua/queue.lua`).
use crate::model::names::QUEUE_SUFFIX as QUEUE_MARK;

pub(crate) fn keys(keys: &[String]) -> Result<(), InvalidInput> {
    if keys.is_empty() {
        return Err(InvalidInput::NoKeys);
    }
    if keys.len() > MAX_KEYS {
        return Err(InvalidInput::TooManyKeys {
            count: keys.len(),
            max: MAX_KEYS,
        });
    }
    if let Some(index) = keys.iter().position(String::is_empty) {
        return Err(InvalidInput::EmptyKey { index });
    }
    if let Some(key) = keys.iter().find(|key| key.contains(QUEUE_MARK)) {
        return Err(InvalidInput::ReservedKey { key: key.clone() });
    }
    // Small sets are compared pairwise, without allocating a set on the hot path.
    let duplicate = if keys.len() <= SMALL_SET {
        keys.iter()
            .enumerate()
            .find(|(i, key)| keys[..*i].contains(key))
            .map(|(_, key)| key)
    } else {
        let mut seen = HashSet::with_capacity(keys.len());
        keys.iter().find(|key| !seen.insert(key.as_str()))
    };
    match duplicate {
        Some(key) => Err(InvalidInput::DuplicateKey { key: key.clone() }),
        None => Ok(()),
    }
}

/// Checks metadata to store in each of `keys` keys: at most [`MAX_METADATA`] bytes, and at
/// most [`MAX_LOCK_METADATA`] over all keys.
pub(crate) fn metadata(metadata: &str, keys: usize) -> Result<(), InvalidInput> {
    let len = metadata.len();
    if len > MAX_METADATA {
        return Err(InvalidInput::MetadataTooLong {
            len,
            max: MAX_METADATA,
        });
    }
    if len.saturating_mul(keys) > MAX_LOCK_METADATA {
        return Err(InvalidInput::LockMetadataTooLarge {
            keys,
            len,
            max: MAX_LOCK_METADATA,
        });
    }
    Ok(())
}

/// Converts a TTL to whole milliseconds, rounding up: a lock never lives shorter than
/// asked. Rejects TTLs under 1 ms (Redis would delete the keys at once) and over
/// [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, InvalidInput> {
    if ttl < Duration::from_millis(1) {
        return Err(InvalidInput::TtlTooShort { ttl });
    }
    if ttl > MAX_TTL {
        return Err(InvalidInput::TtlTooLong { ttl, max: MAX_TTL });
    }
    let millis = ttl.as_millis();
    let round_up = u128::from(!ttl.as_nanos().is_multiple_of(1_000_000));
    // MAX_TTL keeps this far below u64::MAX.
    Ok(u64::try_from(millis + round_up).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn accepts_distinct_non_empty_keys() {
        assert_eq!(keys(&owned(&["a"])), Ok(()));
        assert_eq!(keys(&owned(&["a", "b", "c"])), Ok(()));
    }

    #[test]
    fn rejects_bad_key_sets() {
        assert_eq!(keys(&[]), Err(InvalidInput::NoKeys));
        assert_eq!(
            keys(&owned(&["a", ""])),
            Err(InvalidInput::EmptyKey { index: 1 })
        );
        assert_eq!(
            keys(&owned(&["a", "b", "a"])),
            Err(InvalidInput::DuplicateKey { key: "a".into() })
        );
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| i.to_string()).collect();
        assert_eq!(
            keys(&many),
            Err(InvalidInput::TooManyKeys {
                count: MAX_KEYS + 1,
                max: MAX_KEYS
            })
        );
    }

    #[test]
    fn ttl_rounds_fractional_milliseconds_up() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), Ok(1));
        assert_eq!(ttl_millis(Duration::from_micros(1001)), Ok(2));
        assert_eq!(ttl_millis(Duration::from_micros(2500)), Ok(3));
        assert_eq!(ttl_millis(Duration::from_secs(10)), Ok(10_000));
    }

    #[test]
    fn ttl_under_a_millisecond_is_rejected() {
        for ttl in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
        ] {
            assert_eq!(ttl_millis(ttl), Err(InvalidInput::TtlTooShort { ttl }));
        }
    }

    #[test]
    fn ttl_beyond_the_maximum_is_rejected() {
        assert_eq!(ttl_millis(MAX_TTL), Ok(1 << 52));
        let ttl = MAX_TTL + Duration::from_nanos(1);
        assert_eq!(
            ttl_millis(ttl),
            Err(InvalidInput::TtlTooLong { ttl, max: MAX_TTL })
        );
        assert!(ttl_millis(Duration::MAX).is_err());
    }
}
