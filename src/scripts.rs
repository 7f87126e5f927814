//! The four bundled Lua scripts, each hashed once and run by EVALSHA (loaded and retried when
//! the server answers NOSCRIPT), and the codes they reply with.

use std::sync::LazyLock;

use redis::Script;

/// Locks every key or none; re-entrant by owner tag.
pub(crate) static OBTAIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/obtain.lua")));

/// The smallest remaining TTL of a held lock.
pub(crate) static PTTL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/pttl.lua")));

/// Extends every key of a held lock.
pub(crate) static REFRESH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/refresh.lua")));

/// Source of `release.lua`, also sent whole by EVAL where EVALSHA's fallback cannot run.
pub(crate) const RELEASE_SOURCE: &str = include_str!("../lua/release.lua");

/// Deletes every key of a held lock.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SOURCE));

/// Reply of `obtain.lua` for success: `{OBTAINED, fence}`.
pub(crate) const OBTAINED: i64 = 1;
/// Reply of `obtain.lua` when another owner holds a key: `{HELD, pttl, index}`.
pub(crate) const HELD: i64 = 0;
/// Reply of `obtain.lua` when a key holds a non-string value: `{WRONG_TYPE, key}`.
pub(crate) const WRONG_TYPE: i64 = 2;
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
