//! Fencing tokens: a counter per lock, incremented by every successful obtain.
//!
//! A lock's TTL cannot stop a holder that was paused (GC, swapping, a stalled VM) or whose
//! requests were delayed in the network: it may wake up after its lock expired and someone
//! else obtained it, and still act as the holder. A fencing token closes that gap *if the
//! protected resource checks it*: every obtain mints a number higher than all before it, the
//! holder sends it with every write, and the resource rejects a number lower than the highest
//! it has seen (Kleppmann, "How to do distributed locking").

use crate::model::names::fencing_key_for;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_counter_key_is_used_as_given() {
        let fencing = Fencing::Key("my:counter".into());
        assert_eq!(
            fencing.counter_key("odd}key").as_deref(),
            Some("my:counter")
        );
    }
}
