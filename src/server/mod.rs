//! One Redis server, one attempt: the store decides how to run an operation there (the
//! script-free fast path, a native command, a script by `EVALSHA` then `EVAL`), sends it
//! (with `WAIT` when writes are replicated), and reads the reply; what the server lets this
//! client do is found out once per connection; replicas are counted for replicated writes.
//! Nothing here retries, waits or knows about other servers.
//!
//! May import `observe`, `error`, `model` and `rt` (`tests/layers.rs` checks).

pub(crate) mod native;
pub(crate) mod replication;
pub(crate) mod scripts;
pub(crate) mod store;
