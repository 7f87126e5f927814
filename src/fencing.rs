//! Fencing tokens: a counter per lock, incremented by every successful obtain.
//!
//! A lock's TTL cannot stop a holder that was paused (GC, swapping, a stalled VM) or whose
//! requests were delayed in the network: it may wake up after its lock expired and someone
//! else obtained it, and still act as the holder. A fencing token closes that gap *if the
//! protected resource checks it*: every obtain mints a number higher than all before it, the
//! holder sends it with every write, and the resource rejects a number lower than the highest
//! it has seen (Kleppmann, "How to do distributed locking").

/// Which counter mints a lock's fencing tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// Derived from the lock's first key by [`fencing_key_for`].
    Derived,
    /// A counter key the caller chose.
    Key(String),
}

impl Fencing {
    /// The counter key for a lock whose first key is `first_key`, or `None` when it cannot
    /// be derived (see [`fencing_key_for`]).
    pub(crate) fn counter_key(&self, first_key: &str) -> Option<String> {
        match self {
            Self::Derived => fencing_key_for(first_key),
            Self::Key(key) => Some(key.clone()),
        }
    }
}

/// The fencing counter key derived from a lock's first key: it hashes to the same Redis
/// Cluster slot as `key`.
///
/// - A key with a hash tag keeps it: `{user42}:cart` → `{user42}:cart:fence`.
/// - A key without one becomes the tag: `orders` → `{orders}:fence`.
/// - A key without a hash tag that contains `}` cannot be wrapped that way: `None`; pass a
///   counter key with [`Options::fencing_key`](crate::Options::fencing_key) instead.
///
/// ```
/// use lockset::fencing_key_for;
/// assert_eq!(fencing_key_for("{user42}:cart").as_deref(), Some("{user42}:cart:fence"));
/// assert_eq!(fencing_key_for("orders").as_deref(), Some("{orders}:fence"));
/// assert_eq!(fencing_key_for("odd}key"), None);
/// ```
pub fn fencing_key_for(key: &str) -> Option<String> {
    if hash_tag(key).is_some() {
        Some(format!("{key}:fence"))
    } else if key.contains('}') {
        None
    } else {
        Some(format!("{{{key}}}:fence"))
    }
}

/// Redis Cluster's hash tag of `key`: the text between the first `{` and the first `}`
/// after it, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        assert_eq!(hash_tag("{user42}:cart"), Some("user42"));
        assert_eq!(hash_tag("a{b}c{d}"), Some("b"));
        assert_eq!(hash_tag("{}x"), None);
        assert_eq!(hash_tag("{{a}}"), Some("{a"));
        assert_eq!(hash_tag("plain"), None);
        assert_eq!(hash_tag("x{open"), None);
    }

    #[test]
    fn derived_keys_keep_the_slot() {
        assert_eq!(fencing_key_for("a{b}c").as_deref(), Some("a{b}c:fence"));
        assert_eq!(fencing_key_for("x{open").as_deref(), Some("{x{open}:fence"));
        assert_eq!(hash_tag("{x{open}:fence"), Some("x{open"));
        assert_eq!(fencing_key_for("{}x"), None);
    }

    #[test]
    fn an_explicit_counter_key_is_used_as_given() {
        let fencing = Fencing::Key("my:counter".into());
        assert_eq!(
            fencing.counter_key("odd}key").as_deref(),
            Some("my:counter")
        );
    }
}
