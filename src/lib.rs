//! Multi-key atomic distributed locks on Redis.
//!
//! `lockset` locks one Redis key, or a whole set of keys all-or-nothing, for a time to live
//! (TTL). It follows Go's [bsm/redislock](https://github.com/bsm/redislock) and fixes its
//! known flaws: exact token ownership, re-obtain of a superset, no Lua stack limit on the
//! number of keys, typed errors for bad input before anything is sent, and retry
//! strategies whose state is fresh for every call.
//!
//! ```no_run
//! use std::time::Duration;
//! use lockset::{Client, Options, Retry};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), lockset::Error> {
//! let client = Client::connect("redis://127.0.0.1/").await?;
//!
//! // Lock two keys at once, retrying every 50 ms for at most 2 s.
//! let options = Options::default()
//!     .retry(Retry::linear(Duration::from_millis(50)))
//!     .metadata("worker-7")
//!     .timeout(Duration::from_secs(2));
//! let lock = client
//!     .obtain_multi(["{user42}:cart", "{user42}:wallet"], Duration::from_secs(10), &options)
//!     .await?;
//!
//! // How long is left? `None` means the lock was lost.
//! if let Some(left) = lock.ttl().await? {
//!     println!("held for another {left:?}");
//! }
//! lock.refresh(Duration::from_secs(10), &Options::default()).await?;
//! lock.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! New here? The [`guide`] explains every topic on a page of its own, starting
//! with [getting started](crate::guide::getting_started).
//!
//! # Concepts
//!
//! - **Keys and value.** Every key of a lock stores the same value,
//!   `"<token length>:<token><metadata>"` (see [`parse_value`]). Ownership is decided by the
//!   exact token; the metadata is for humans and tools. See the
//!   [wire format](crate::guide::wire_format).
//! - **Token.** 16 random bytes from a cryptographically secure RNG, base64 URL-safe
//!   without padding, unless you pass your own with [`Options::token`]. Obtaining again
//!   with the token of a lock you hold re-obtains it (re-entrancy).
//! - **Deadline.** Obtain retries per its [`Retry`] strategy until a deadline; without
//!   [`Options::timeout`] or [`Options::deadline`], **the deadline is the lock's TTL**. See
//!   [retries and deadlines](crate::guide::retries).
//! - **Errors.** One [`Error`] enum; [`Error::is_not_obtained`] tells "somebody else holds
//!   it" whatever ended the wait. See [errors](crate::guide::errors).
//! - **Long work.** [`Client::with_lock`] and [`Lock::keep_alive`] keep a lock alive with a
//!   watchdog; [`Lock::lost_signal`] tells the work when the lock is lost; a [`Guard`]
//!   releases on drop; a cancelled obtain cleans up after itself; [`Options::fencing`] mints
//!   fencing tokens. See [long work and validity](crate::guide::long_work).
//! - **Waiting.** A client from [`Client::connect`] wakes its waiting obtains when a lock is
//!   released, over one shared pub/sub connection ([`Client::with_release_events`]). Waiters
//!   queue in Redis, first come first served across processes, and a release hands the lock
//!   straight to the first of them ([`Options::fair`]). See
//!   [waiting](crate::guide::waiting).
//! - **Modes.** Pair a key with a [`Mode`] to hold it shared (a read lock) or as one of N
//!   permits (a semaphore), mixed with exclusive keys in one atomic obtain:
//!   `client.obtain_multi([("order", Mode::Exclusive), ("catalog", Mode::Shared)], ttl, &options)`.
//!   See [shared and counted locks](crate::guide::shared_and_counted).
//! - **Failover.** [`Client::connect_sentinel`] follows the primary of a Sentinel
//!   deployment across failovers ([`SentinelConnection`]), and [`Client::replicated`] makes a
//!   lock count only once N replicas acknowledged it (`WAIT`), so that a failover to one of
//!   them keeps it; a Sentinel client waits for every replica in sync by default
//!   ([`Replication`]). See [failover](crate::guide::failover).
//! - **Redlock.** [`Client::quorum`] makes one lock over N independent masters, with the same
//!   API. See [Redlock](crate::guide::redlock).
//! - **Cluster.** All keys of one lock must live in one hash slot: give them a common hash
//!   tag, like `{user42}:cart` and `{user42}:wallet`. With the `cluster` feature,
//!   `Client::cluster` checks this before sending. See [Redis Cluster](crate::guide::cluster).
//! - **Observing.** Every operation runs in a `tracing` span; with the `metrics` feature,
//!   figures go through the `metrics` facade. See [observing](crate::guide::observing).
//! - **Faults.** What the library promises under each fault, and how it is tested:
//!   [faults](crate::guide::faults), [the history checker](crate::guide::history).
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `cluster` | `Client::cluster` over redis-rs's `cluster_async::ClusterConnection` (enables `redis/cluster-async`), the cross-slot check, `slot_number` |
//! | `metrics` | counters, histograms and a gauge through the [`metrics`](https://docs.rs/metrics) facade, and `Options::metrics_label` (see [observing](crate::guide::observing#metrics)) |
//! | `blocking` | `lockset::blocking`: the same operations for synchronous code, on a runtime of their own (see [the blocking API](crate::guide::blocking)) |
//! | `tls` | `rediss://` URLs over rustls (enables `redis/tokio-rustls-comp`): the system's roots by default; `Tls` for a private CA and client certificates, `Client::connect_with_tls`, `SentinelConfig::tls` (see [TLS and logins](crate::guide::servers#tls-and-logins)) |
//! | `cli` | the `lockset` command line (`cargo install --path . --features cli`; implies `cluster` and `tls`; see [the command line](crate::guide::command_line)) |

// No panics and no printing in the library itself; tests, examples and test support may.
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

// The layers, bottom to top: rt, model, error, observe, server, topology, waiting, client,
// blocking. Each folder's `mod.rs` says its job and what it may import, and
// `tests/layers.rs` fails on an import that points up.
#[cfg(feature = "blocking")]
pub mod blocking;
mod client;
mod error;
pub mod guide;
mod model;
mod observe;
mod rt;
mod server;
mod topology;
mod waiting;

pub use client::config::{Config, LockSettings, SentinelSettings, TlsFiles};
pub use client::guard::Guard;
pub use client::handle::Client;
pub use client::lock::Lock;
pub use client::options::Options;
pub use error::{Error, NodeFailure, QuorumOp, Result};
pub use model::invalid::InvalidInput;
pub use model::key::IntoKey;
pub use model::mode::Mode;
#[cfg(feature = "cluster")]
pub use model::names::slot_number;
pub use model::names::{fencing_key_for, queue_key_for, release_channel};
pub use model::retry::{Backoff, Jitter, Retry, RetryStrategy};
pub use model::validate::{MAX_KEYS, MAX_LOCK_METADATA, MAX_METADATA, MAX_TTL};
pub use model::value::parse_value;
pub use observe::{Blocked, RetryEvent};
pub use rt::signal::LostSignal;
pub use server::replication::Replication;
pub use topology::health::MAX_OWED_BYTES;
pub use topology::quorum::{MIN_NODE_TIMEOUT, QuorumConfig};
pub use topology::sentinel::{SentinelConfig, SentinelConnection};
#[cfg(feature = "tls")]
pub use topology::tls::Tls;
pub use waiting::inspect::{Holder, Holding, KeyState, inspect};
pub use waiting::reader::{QueuedWaiter, read_queue};

/// The redis-rs version this crate is built with, so your connections match.
pub use redis;

// Compile the README's example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
struct ReadmeDoctests;
