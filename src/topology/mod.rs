//! Where locks live: the closed [`Backend`](backend::Backend) enum over one server and a
//! Redlock quorum (its masters' health, telling them apart, writes still under way on slow
//! masters), the Sentinel connection that follows the primary, and TLS settings.
//!
//! May import `server`, `observe`, `error`, `model` and `rt` (`tests/layers.rs` checks).

pub(crate) mod backend;
pub(crate) mod distinct;
pub(crate) mod health;
pub(crate) mod quorum;
pub(crate) mod sentinel;
pub(crate) mod stragglers;
#[cfg(feature = "tls")]
pub(crate) mod tls;
