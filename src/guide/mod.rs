//! The guide: how lockset works and how to use it, one page per topic.
//!
//! These modules hold documentation only: no items, nothing to import. Every Rust example in
//! them compiles as a doctest (`no_run` where it needs a Redis server).
//!
//! | page | what it covers |
//! |---|---|
//! | [`getting_started`] | a first lock, and the API at a glance |
//! | [`errors`] | the error helpers and what to do; bad input; unknown outcomes |
//! | [`retries`] | the default deadline and the retry strategies |
//! | [`long_work`] | watchdog, lost signal, release on drop, cancellation, fencing, validity |
//! | [`waiting`] | waking on release, the fair queue and the direct hand-off |
//! | [`shared_and_counted`] | read locks and semaphores mixed with exclusive keys |
//! | [`failover`] | Sentinel, replicated writes (`WAIT`), what a failover can lose |
//! | [`redlock`] | one lock over N masters, and a master that is down |
//! | [`cluster`] | Redis Cluster: hash tags, slots, migrations |
//! | [`servers`] | supported servers, native commands, TLS and logins |
//! | [`observing`] | tracing spans and events, metrics, `lockset status` |
//! | [`blocking`] | the blocking API for synchronous code |
//! | [`command_line`] | the `lockset` command: `run`, `acquire`, `refresh`, `release`, `status` |
//! | [`faults`] | what the library promises under each fault, and the tests that check it |
//! | [`history`] | the history checker: random operations, random faults, a proof over the history |
//! | [`wire_format`] | keys, values, queues and scripts, for programs in other languages |
//! | [`performance`] | the benchmark harness, its figures, and how to reproduce them |
//! | [`peers`] | what lockset does differently from bsm/redislock, Redisson, redsync and rslock |
//! | [`contributing`] | the layout of the crate, and how CI runs the tests |

#[doc = include_str!("getting_started.md")]
pub mod getting_started {}

#[doc = include_str!("errors.md")]
pub mod errors {}

#[doc = include_str!("retries.md")]
pub mod retries {}

#[doc = include_str!("long_work.md")]
pub mod long_work {}

#[doc = include_str!("waiting.md")]
pub mod waiting {}

#[doc = include_str!("shared_and_counted.md")]
pub mod shared_and_counted {}

#[doc = include_str!("failover.md")]
pub mod failover {}

#[doc = include_str!("redlock.md")]
pub mod redlock {}

#[doc = include_str!("cluster.md")]
pub mod cluster {}

#[doc = include_str!("servers.md")]
pub mod servers {}

#[doc = include_str!("observing.md")]
pub mod observing {}

#[doc = include_str!("blocking.md")]
pub mod blocking {}

#[doc = include_str!("command_line.md")]
pub mod command_line {}

#[doc = include_str!("faults.md")]
pub mod faults {}

#[doc = include_str!("history.md")]
pub mod history {}

#[doc = include_str!("wire_format.md")]
pub mod wire_format {}

#[doc = include_str!("performance.md")]
pub mod performance {}

#[doc = include_str!("peers.md")]
pub mod peers {}

#[doc = include_str!("contributing.md")]
pub mod contributing {}
