//! Checks of the command line's input that the library would make only after connecting:
//! bad input must exit 64 with nothing sent to Redis.

use std::collections::HashSet;

use lockset::redis::cluster_routing::Slot;

/// What the keys are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// One lock: on a cluster, every key must hash to one slot.
    Lock,
    /// Looking at keys, each on its own.
    Look,
}

/// Where the keys go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    /// How many Redis URLs were given.
    pub(crate) urls: usize,
    /// Whether they are cluster seeds.
    pub(crate) cluster: bool,
}

/// Checks a key set: no empty or repeated key, not too many, one slot on a cluster for a
/// lock.
pub(crate) fn keys(keys: &[String], target: Target, used: Use) -> Result<(), String> {
    if keys.len() > lockset::MAX_KEYS {
        return Err(format!(
            "{} keys given, at most {} are allowed",
            keys.len(),
            lockset::MAX_KEYS
        ));
    }
    if let Some(index) = keys.iter().position(String::is_empty) {
        return Err(format!("key #{} is empty", index + 1));
    }
    let mut seen = HashSet::with_capacity(keys.len());
    if let Some(key) = keys.iter().find(|key| !seen.insert(key.as_str())) {
        return Err(format!("key {key:?} is given more than once"));
    }
    if target.cluster && used == Use::Lock {
        one_slot(keys)?;
    }
    Ok(())
}

/// Checks that fencing tokens can be minted for a lock on `keys`.
pub(crate) fn fencing(keys: &[String], target: Target) -> Result<(), String> {
    if target.urls > 1 && !target.cluster {
        return Err(
            "--fencing is not available with a Redlock quorum (several --redis without \
             --cluster): its masters have no common counter"
                .to_owned(),
        );
    }
    let first = keys.first().map_or("", String::as_str);
    if lockset::fencing_key_for(first).is_none() {
        return Err(format!(
            "no fencing counter key can be derived from {first:?}: put the first key's \
             hash tag in braces, like {{name}}:rest"
        ));
    }
    Ok(())
}

/// Checks that the command to run has a program name.
pub(crate) fn command(argv: &[String]) -> Result<(), String> {
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(()),
        _ => Err("the command after -- is empty".to_owned()),
    }
}

/// On a cluster, all keys of one lock must live in one hash slot.
fn one_slot(keys: &[String]) -> Result<(), String> {
    let Some(first) = keys.first() else {
        return Ok(());
    };
    let slot = Slot::for_key(first);
    if keys.iter().all(|key| Slot::for_key(key) == slot) {
        return Ok(());
    }
    let slots: Vec<String> = keys
        .iter()
        .map(|key| format!("{key:?} is in slot {}", lockset::slot_number(key)))
        .collect();
    Err(format!(
        "on a cluster all keys of a lock must hash to one slot, but {}; give them a common \
         hash tag, like {{deploy}}:db and {{deploy}}:cache",
        slots.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SINGLE: Target = Target {
        urls: 1,
        cluster: false,
    };
    const CLUSTER: Target = Target {
        urls: 3,
        cluster: true,
    };

    fn owned(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|&key| key.to_owned()).collect()
    }

    #[test]
    fn bad_key_sets_are_refused() {
        assert!(
            keys(&owned(&["a", ""]), SINGLE, Use::Lock)
                .unwrap_err()
                .contains("#2")
        );
        assert!(
            keys(&owned(&["a", "a"]), SINGLE, Use::Lock)
                .unwrap_err()
                .contains("\"a\"")
        );
        assert!(keys(&owned(&["a", "b"]), SINGLE, Use::Lock).is_ok());
    }

    #[test]
    fn a_cluster_lock_needs_one_slot_but_a_look_does_not() {
        let apart = owned(&["cart", "wallet"]);
        assert!(
            keys(&apart, CLUSTER, Use::Lock)
                .unwrap_err()
                .contains("slot")
        );
        assert!(keys(&apart, CLUSTER, Use::Look).is_ok());
        assert!(keys(&owned(&["{u}:cart", "{u}:wallet"]), CLUSTER, Use::Lock).is_ok());
    }

    #[test]
    fn fencing_needs_one_counter() {
        let quorum = Target {
            urls: 3,
            cluster: false,
        };
        assert!(
            fencing(&owned(&["a"]), quorum)
                .unwrap_err()
                .contains("quorum")
        );
        assert!(fencing(&owned(&["odd}key"]), SINGLE).is_err());
        assert!(fencing(&owned(&["a"]), CLUSTER).is_ok());
    }
}
