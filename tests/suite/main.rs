//! The test suite: every integration test that may share a process, as one binary (one
//! build and link instead of one per file, and libtest runs them all in parallel). Each module
//! is one subject; `cargo test --all-features --test suite failover::` runs one of them.
//!
//! Binaries of their own: `history` and `soak` (long runs, `--ignored`), `metrics` (it
//! installs the process's one global recorder), `observe` (`tracing` caches process-wide
//! whether a call site has a listener) and `memory` (it reads the process's memory).

#[path = "../support/mod.rs"]
mod support;

mod announcements;
mod auth;
mod blocking;
mod cli;
mod cluster;
mod config;
mod connect;
mod contention;
mod edges;
mod error_context;
mod failover;
mod failover_torture;
mod fair;
mod fair_handoff;
mod fair_modes;
mod faults;
mod fencing;
mod gaps;
mod inspect;
mod invalid_input;
mod lifecycle;
mod long_work;
mod modes;
mod multi_key;
mod native;
mod one_client;
mod redlock;
mod reply_lost;
mod restricted;
mod retry_and_deadline;
mod scripts;
mod service;
mod status;
mod tls;
mod waiting;
mod waiting_faults;
mod wake;
