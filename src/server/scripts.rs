//! The bundled Lua scripts, each hashed once and run by EVALSHA (sent whole by EVAL
//! when the server answers NOSCRIPT), and the codes they reply with.

use std::sync::LazyLock;

/// A bundled script: its source, and the SHA1 hash EVALSHA names it by.
pub(crate) struct Lua {
    /// The script itself, for EVAL.
    pub(crate) source: String,
    /// Its hash, for EVALSHA.
    pub(crate) hash: String,
}

impl Lua {
    fn new(source: String) -> Self {
        let hash = redis::Script::new(&source).get_hash().to_owned();
        Self { source, hash }
    }
}

/// The line in `obtain.lua`, `release.lua` and `modes.lua` where `queue.lua` goes: after
/// their fast paths, so that an uncontended obtain or release defines none of its functions.
const QUEUE_GOES_HERE: &str = "-- (queue.lua goes here)\n";

/// The line in every script where `owner.lua` goes: where the lock's value is known, and
/// after the fast paths of `obtain.lua` and `release.lua`.
const OWNER_GOES_HERE: &str = "-- (owner.lua goes here)\n";

/// The line in `obtain.lua` and `modes.lua` where `fence.lua` goes.
const FENCE_GOES_HERE: &str = "-- (fence.lua goes here)\n";

/// `script` with `owner.lua`, `queue.lua` and `fence.lua` in place of their marker lines.
fn bundle(script: &str) -> Lua {
    let script = script
        .replacen(OWNER_GOES_HERE, include_str!("../../lua/owner.lua"), 1)
        .replacen(QUEUE_GOES_HERE, include_str!("../../lua/queue.lua"), 1)
        .replacen(FENCE_GOES_HERE, include_str!("../../lua/fence.lua"), 1);
    Lua::new(script)
}

/// Locks every key or none; re-entrant by owner tag; queues a fair waiter.
pub(crate) static OBTAIN: LazyLock<Lua> =
    LazyLock::new(|| bundle(include_str!("../../lua/obtain.lua")));

/// The smallest remaining TTL of a held lock.
pub(crate) static PTTL: LazyLock<Lua> =
    LazyLock::new(|| bundle(include_str!("../../lua/pttl.lua")));

/// Extends every key of a held lock.
pub(crate) static REFRESH: LazyLock<Lua> =
    LazyLock::new(|| bundle(include_str!("../../lua/refresh.lua")));

/// Deletes every key of a held lock, handing each to its queue's first waiter; a fair
/// waiter that gives up leaves its queues through it too.
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| bundle(include_str!("../../lua/release.lua")));

/// Every operation on a lock that holds some key shared or as a permit.
pub(crate) static MODES: LazyLock<Lua> =
    LazyLock::new(|| bundle(include_str!("../../lua/modes.lua")));

/// How releases are announced on a single server, and what `release.lua` assumes when not
/// told otherwise.
pub(crate) const PUBLISH: &str = "PUBLISH";

/// Reply of `obtain.lua` for success: `{OBTAINED, fence}`.
pub(crate) const OBTAINED: i64 = 1;
/// Reply of `obtain.lua` when another owner holds a key: `{HELD, pttl, index}`.
pub(crate) const HELD: i64 = 0;
/// Reply of `obtain.lua` when a key holds a non-string value: `{WRONG_TYPE, key}`.
pub(crate) const WRONG_TYPE: i64 = 2;
/// Reply of `modes.lua`'s obtain when a key is held in a mode that cannot go with the one
/// asked for: `{MODE_MISMATCH, index, stored mode}`.
pub(crate) const MODE_MISMATCH: i64 = 3;
/// Reply of `pttl.lua` when some key is another owner's.
pub(crate) const PTTL_NOT_HELD: i64 = -2;
/// Reply of `pttl.lua` when some keys are missing and none is another owner's.
pub(crate) const PTTL_MISSING: i64 = -3;
/// Reply of `pttl.lua` when every key is held without expiry.
pub(crate) const PTTL_PERSISTENT: i64 = -1;
/// Reply of `refresh.lua` and `release.lua` when every key was ours (and was extended, or
/// deleted).
pub(crate) const DONE: i64 = 1;
/// Reply of `refresh.lua` and `release.lua` when some keys are missing and none is another
/// owner's (nothing changed).
pub(crate) const MISSING: i64 = 2;
