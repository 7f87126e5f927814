//! Names derived from a lock key that stay in the key's Redis Cluster hash slot: the fencing
//! counter, the waiter queue and the release channel. Redis hashes only a key's hash tag when it has one (the
//! text between the first `{` and the next `}`, when not empty), so a derived name either
//! keeps the key's tag or makes the whole key its tag.

/// Redis Cluster's hash tag of `key`, when it has one.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
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
    derived(key, ":fence")
}

/// Whether `key` has a waiter queue (fair waiting): see [`queue_key_for`].
pub(crate) fn has_queue(key: &str) -> bool {
    queue_key_for(key).is_some()
}

/// What every name of a waiter queue or waiter record contains (after the lock key).
pub(crate) const QUEUE_SUFFIX: &str = ":lockset:queue";

/// The name of `key`'s waiter queue (fair waiting), as `lua/queue.lua` derives it for the
/// keys of the waiters a release hands on to. It begins with `key`, so that one ACL key
/// pattern per key prefix (`~pre:*`) covers the queue and the waiter records named after
/// it (`<queue>:<waiter id>`), and it hashes to `key`'s Redis Cluster slot:
///
/// - A key with a hash tag keeps it: `{user42}:cart` → `{user42}:cart:lockset:queue`.
/// - A key without one becomes the tag, after itself: `orders` →
///   `orders{orders}:lockset:queue`.
/// - A key without a hash tag that contains `{` or `}` can do neither (a brace of its own
///   would end or open the tag): `None`, and its waiters wait without a queue, as with
///   [`Options::fair(false)`](crate::Options::fair).
///
/// ```
/// use lockset::queue_key_for;
/// assert_eq!(queue_key_for("{u42}:cart").as_deref(), Some("{u42}:cart:lockset:queue"));
/// assert_eq!(queue_key_for("orders").as_deref(), Some("orders{orders}:lockset:queue"));
/// assert_eq!(queue_key_for("odd{key"), None);
/// ```
pub fn queue_key_for(key: &str) -> Option<String> {
    if hash_tag(key).is_some() {
        Some(format!("{key}{QUEUE_SUFFIX}"))
    } else if key.contains(['{', '}']) {
        None
    } else {
        Some(format!("{key}{{{key}}}{QUEUE_SUFFIX}"))
    }
}

/// The channel on which the client with hand-off tag `tag` hears the hand-offs of `key` to
/// its fair waiters (`lua/queue.lua`'s `handoff_channel`): named after the key's queue, so
/// that it begins with `key` (an ACL channel pattern per key prefix, `&pre:*`, covers it)
/// and hashes to `key`'s slot (sharded pub/sub). `None` for a key without a queue.
pub(crate) fn handoff_channel(key: &str, tag: &str) -> Option<String> {
    queue_key_for(key).map(|queue| format!("{queue}:to:{tag}"))
}

/// How a name derived from `key` stays in `key`'s slot: `Some(true)` by keeping `key`'s own
/// hash tag, `Some(false)` by making `key` the tag; `None` when neither can (no tag, and a
/// `}` that would end one).
fn keeps_tag(key: &str) -> Option<bool> {
    if hash_tag(key).is_some() {
        Some(true)
    } else {
        (!key.contains('}')).then_some(false)
    }
}

/// `key` followed by `suffix`, in `key`'s slot: see [`fencing_key_for`].
fn derived(key: &str, suffix: &str) -> Option<String> {
    Some(match keeps_tag(key)? {
        true => format!("{key}{suffix}"),
        false => format!("{{{key}}}{suffix}"),
    })
}

/// The pub/sub channel on which releases of `key` are announced: the key's own name (pub/sub
/// channels live in a namespace of their own). A channel hashes like a key, so it stays in
/// the key's cluster slot for sharded pub/sub; `release.lua` announces on the same names.
///
/// ```
/// assert_eq!(lockset::release_channel("{u1}:cart"), "{u1}:cart");
/// ```
pub fn release_channel(key: &str) -> &str {
    key
}

/// Checks that `keys` and the fencing `counter` all hash to one Redis Cluster slot, with
/// redis-rs's implementation of Redis's CRC16 and hash-tag rule.
#[cfg(feature = "cluster")]
pub(crate) fn check_one_slot(
    keys: &[String],
    counter: Option<&str>,
) -> Result<(), crate::model::invalid::InvalidInput> {
    use redis::cluster_routing::Slot;

    let mut names = keys.iter().map(String::as_str).chain(counter);
    let Some(first) = names.next() else {
        return Ok(());
    };
    let slot = Slot::for_key(first);
    if names.all(|name| Slot::for_key(name) == slot) {
        return Ok(());
    }
    let keys = keys.iter().map(String::as_str).chain(counter);
    Err(crate::model::invalid::InvalidInput::CrossSlot {
        keys: keys.map(|key| (key.to_owned(), slot_number(key))).collect(),
    })
}

/// The number of `key`'s slot. redis-rs keeps it private inside `Slot`, so this error-path
/// helper finds it by comparison rather than re-implementing CRC16.
#[cfg(feature = "cluster")]
pub fn slot_number(key: &str) -> u16 {
    use redis::cluster_routing::Slot;

    let slot = Slot::for_key(key);
    (0..16_384)
        .find(|n| Slot::new(*n) == Some(slot))
        .unwrap_or(0)
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
    fn derived_names_keep_the_slot() {
        assert_eq!(fencing_key_for("a{b}c").as_deref(), Some("a{b}c:fence"));
        assert_eq!(fencing_key_for("x{open").as_deref(), Some("{x{open}:fence"));
        assert_eq!(hash_tag("{x{open}:fence"), Some("x{open"));
        assert_eq!(fencing_key_for("{}x"), None);
    }

    #[test]
    fn queue_names_begin_with_the_key_and_keep_its_slot() {
        assert_eq!(
            queue_key_for("a{b}c").as_deref(),
            Some("a{b}c:lockset:queue")
        );
        assert_eq!(
            queue_key_for("pre:held").as_deref(),
            Some("pre:held{pre:held}:lockset:queue")
        );
        assert_eq!(
            hash_tag("pre:held{pre:held}:lockset:queue"),
            Some("pre:held")
        );
        // A brace without a tag would open or end the one the name needs.
        for key in ["x{open", "odd}key", "{}x", "a}{b"] {
            assert_eq!(queue_key_for(key), None, "{key}");
        }
        assert!(has_queue("job") && has_queue("{job}") && !has_queue("x{open"));
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn keys_with_a_common_tag_share_a_slot() {
        let keys = vec!["{user42}:cart".to_owned(), "{user42}:wallet".to_owned()];
        assert_eq!(check_one_slot(&keys, Some("{user42}:cart:fence")), Ok(()));
        let keys = vec!["cart".to_owned(), "wallet".to_owned()];
        let Err(crate::model::invalid::InvalidInput::CrossSlot { keys }) =
            check_one_slot(&keys, None)
        else {
            panic!("cart and wallet hash to different slots");
        };
        // Known values (CLUSTER KEYSLOT): the tests against a real cluster check more.
        assert_eq!(
            keys,
            vec![
                ("cart".to_owned(), slot_number("cart")),
                ("wallet".to_owned(), slot_number("wallet"))
            ]
        );
        assert_eq!(slot_number("foo"), 12_182);
        for key in ["pre:held", "{user42}:cart", "a{b}c"] {
            let queue = queue_key_for(key).unwrap();
            assert_eq!(slot_number(&queue), slot_number(key), "{queue}");
        }
        assert_eq!(
            slot_number("{user1000}.following"),
            slot_number("{user1000}.followers")
        );
    }
}
