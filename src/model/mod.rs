//! What a lock is, as data, with no I/O: modes, keys, tokens and stored values, the names
//! derived from a key (queue, fencing counter, release channel, hash slot), the request
//! built once per operation, retry strategies, and the checks of input that run before
//! anything is sent.
//!
//! May import `rt` only (`tests/layers.rs` checks).

pub(crate) mod fencing;
pub(crate) mod invalid;
pub(crate) mod key;
pub(crate) mod mode;
pub(crate) mod names;
pub(crate) mod request;
pub(crate) mod retry;
pub(crate) mod retry_flat;
pub(crate) mod validate;
pub(crate) mod value;

/// How many of `members` make a majority: more than half. The one rule for Redlock masters,
/// sentinels and the command line's reports.
pub(crate) const fn majority(members: usize) -> usize {
    members / 2 + 1
}
