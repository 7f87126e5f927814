//! The waiting subsystem: what an obtain does between attempts.
//!
//! - `policy`: the retry loop around attempts (strategy, deadline, waiting for whichever
//!   comes first: the backoff, a release event, the holder's expiry).
//! - `waiter`: the channels a waiter listens on between attempts, and when an attempt must
//!   be followed at once by another (no notice where nobody listens).
//! - `events`: release events (one pub/sub connection per client) that wake waiters, and
//!   the hand-off notices that tell a fair waiter it was handed the lock.
//! - `fair`: a fair obtain's place in the waiter queues in Redis (`lua/queue.lua`, `lua/handoff.lua`).
//! - `reader`: who waits for a key, read from its queue (public: `read_queue`).
//! - `inspect`: who holds a key and how, and who waits for it (public: `inspect`).
//!
//! May import `topology`, `server`, `observe`, `error`, `model` and `rt` (`tests/layers.rs`
//! checks).

pub(crate) mod events;
pub(crate) mod fair;
pub(crate) mod inspect;
pub(crate) mod policy;
pub(crate) mod reader;
pub(crate) mod waiter;
