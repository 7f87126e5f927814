//! The public handles, the top layer: [`Client`](handle::Client) obtains locks,
//! [`Lock`](lock::Lock) is one held lock, [`Guard`](guard::Guard) releases on drop, and
//! [`Options`](options::Options) are the per-call settings; `state` is what a client, its
//! clones and its locks share, and `link` the connection under it, one type for every
//! topology.
//!
//! May import every layer below: `waiting`, `topology`, `server`, `observe`, `error`,
//! `model`, `rt`. Nothing below imports from here (`tests/layers.rs` checks).

pub(crate) mod config;
pub(crate) mod guard;
pub(crate) mod handle;
pub(crate) mod link;
pub(crate) mod lock;
pub(crate) mod options;
pub(crate) mod state;
