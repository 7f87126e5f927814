//! How a lock holds each of its keys: alone (exclusive), shared with other readers, or as
//! one of a limited number of permits. See [the guide](crate::guide::shared_and_counted).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::invalid::InvalidInput;
use crate::model::key::IntoKey;

/// How a lock holds one of its keys.
///
/// A key given without a mode is [`Mode::Exclusive`]. Pair a key with a mode to ask for
/// another, anywhere keys are taken ([`IntoKey`](crate::IntoKey) is implemented for
/// `(key, Mode)`); one obtain takes every key in its mode, or none:
///
/// ```no_run
/// # async fn demo(client: lockset::Client) -> Result<(), lockset::Error> {
/// use std::time::Duration;
/// use lockset::{Mode, Options};
///
/// // Write order 42 while reading the catalog and the prices: all or nothing.
/// let lock = client
///     .obtain_multi(
///         [
///             ("{shop}:order:42", Mode::Exclusive),
///             ("{shop}:catalog", Mode::Shared),
///             ("{shop}:prices", Mode::Shared),
///         ],
///         Duration::from_secs(10),
///         &Options::default(),
///     )
///     .await?;
/// lock.release().await?;
///
/// // At most 3 exports at once.
/// let permit = client
///     .obtain(("exports", Mode::Permit { limit: 3 }), Duration::from_secs(60), &Options::default())
///     .await?;
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// An exclusive holder of a key excludes every other holder; shared holders exclude only
/// exclusive ones; permit holders of a key number at most its limit, and exclude exclusive
/// ones. Shared and permit holders each expire with their own TTL. Once an exclusive obtain
/// waits for a key's shared or permit holders to leave, no new such holder is let in (see the
/// [the guide](crate::guide::shared_and_counted) for the bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Mode {
    /// The only holder of the key (a write lock). Stored as today's plain lock value.
    Exclusive,
    /// One of any number of holders that share the key (a read lock).
    Shared,
    /// One of at most `limit` holders of the key (a semaphore's permit). Every holder of
    /// one key must name the same limit.
    Permit {
        /// How many holders the key admits at once (at least 1).
        limit: u32,
    },
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exclusive => f.write_str("exclusive"),
            Self::Shared => f.write_str("shared"),
            Self::Permit { limit } => write!(f, "one of {limit} permits"),
        }
    }
}

impl Mode {
    /// The mode as `lua/modes_*.lua` names it.
    fn code(self) -> String {
        match self {
            Self::Exclusive => "x".to_owned(),
            Self::Shared => "s".to_owned(),
            Self::Permit { limit } => format!("p{limit}"),
        }
    }

    /// The mode `lua/modes_*.lua` names `code` (as it stores it), if any.
    pub(crate) fn from_code(code: &str) -> Option<Self> {
        match code {
            "x" => Some(Self::Exclusive),
            "s" => Some(Self::Shared),
            _ => code
                .strip_prefix('p')
                .and_then(|limit| limit.parse().ok())
                .map(|limit| Self::Permit { limit }),
        }
    }
}

/// The modes of a lock that holds some key in a mode other than exclusive, one per key,
/// and the form in which `lua/modes_*.lua` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Modes {
    modes: Vec<Mode>,
    encoded: String,
}

impl Modes {
    /// The modes of `keys` (`modes[i]` for `keys[i]`), checked: `None` when every key is
    /// exclusive (a plain lock).
    pub(crate) fn new(keys: &[String], modes: Vec<Mode>) -> Result<Option<Self>, InvalidInput> {
        if modes.iter().all(|mode| *mode == Mode::Exclusive) {
            return Ok(None);
        }
        for (key, mode) in keys.iter().zip(&modes) {
            if *mode == (Mode::Permit { limit: 0 }) {
                return Err(InvalidInput::ZeroLimit { key: key.clone() });
            }
        }
        Ok(Some(Self::encode(modes)))
    }

    /// Every one of `count` keys exclusive: for an obtain that found a shared or counted
    /// key, which only `lua/modes_*.lua` understands.
    pub(crate) fn exclusive(count: usize) -> Self {
        Self::encode(vec![Mode::Exclusive; count])
    }

    fn encode(modes: Vec<Mode>) -> Self {
        let codes: Vec<String> = modes.iter().map(|mode| mode.code()).collect();
        Self {
            encoded: codes.join(","),
            modes,
        }
    }

    /// The modes, one per key.
    pub(crate) fn list(&self) -> &[Mode] {
        &self.modes
    }

    /// The modes as `lua/modes_*.lua` takes them.
    pub(crate) fn encoded(&self) -> &str {
        &self.encoded
    }
}

/// Splits keys given with or without modes into the keys and, when some key is not
/// exclusive, every key's mode (empty otherwise: nothing is allocated for a plain lock).
pub(crate) fn split<I>(items: I) -> (Vec<String>, Vec<Mode>)
where
    I: IntoIterator,
    I::Item: IntoKey,
{
    let items = items.into_iter();
    let mut keys = Vec::with_capacity(items.size_hint().0);
    let mut modes = Vec::new();
    for item in items {
        let (key, mode) = item.into_key_and_mode();
        if mode != Mode::Exclusive && modes.len() < keys.len() + 1 {
            modes.resize(keys.len(), Mode::Exclusive);
            modes.push(mode);
        } else if !modes.is_empty() {
            modes.push(mode);
        }
        keys.push(key);
    }
    (keys, modes)
}

/// Checks that a key asked for twice is asked for in one mode (then it is a duplicate key,
/// found by the key check), before the modes are dropped for a plain lock.
pub(crate) fn check_repeats(keys: &[String], modes: &[Mode]) -> Result<(), InvalidInput> {
    let mut first = HashMap::with_capacity(keys.len());
    for (key, mode) in keys.iter().zip(modes) {
        match first.entry(key.as_str()) {
            Entry::Vacant(entry) => {
                entry.insert(*mode);
            }
            Entry::Occupied(entry) if entry.get() != mode => {
                return Err(InvalidInput::ConflictingModes {
                    key: key.clone(),
                    first: *entry.get(),
                    second: *mode,
                });
            }
            Entry::Occupied(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for mode in [Mode::Exclusive, Mode::Shared, Mode::Permit { limit: 17 }] {
            assert_eq!(Mode::from_code(&mode.code()), Some(mode));
        }
        assert_eq!(Mode::from_code("q"), None);
    }

    #[test]
    fn an_all_exclusive_lock_is_a_plain_lock() {
        let keys = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(Modes::new(&keys, vec![Mode::Exclusive; 2]), Ok(None));
        let modes = Modes::new(&keys, vec![Mode::Shared, Mode::Permit { limit: 3 }]);
        assert_eq!(modes.map(|m| m.map(|m| m.encoded)), Ok(Some("s,p3".into())));
    }

    #[test]
    fn split_keeps_every_mode_once_one_is_not_exclusive() {
        let (keys, modes) = split(["a", "b"]);
        assert_eq!((keys.len(), modes), (2, vec![]));
        let (_, modes) = split([("a", Mode::Shared)]);
        assert_eq!(modes, vec![Mode::Shared]);
        let (_, modes) = split([
            ("a", Mode::Exclusive),
            ("b", Mode::Shared),
            ("c", Mode::Exclusive),
        ]);
        assert_eq!(modes, vec![Mode::Exclusive, Mode::Shared, Mode::Exclusive]);
    }

    #[test]
    fn bad_modes_are_refused() {
        let keys = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(
            Modes::new(&keys, vec![Mode::Shared, Mode::Permit { limit: 0 }]),
            Err(InvalidInput::ZeroLimit { key: "b".into() })
        );
        let twice = vec!["a".to_owned(), "a".to_owned()];
        assert_eq!(
            check_repeats(&twice, &[Mode::Shared, Mode::Exclusive]),
            Err(InvalidInput::ConflictingModes {
                key: "a".into(),
                first: Mode::Shared,
                second: Mode::Exclusive
            })
        );
        assert_eq!(check_repeats(&twice, &[Mode::Shared, Mode::Shared]), Ok(()));
    }
}
