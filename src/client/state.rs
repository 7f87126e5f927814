//! What a client, its clones and every lock it made share: the backend, the background
//! tasks, and the release events.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::client::link::Link;
use crate::observe::meter::Meter;
use crate::rt::tasks::Tasks;
use crate::topology::backend::Backend;
use crate::waiting::events::Events;

/// The state behind a [`Client`](crate::Client), shared by its clones and its locks.
pub(crate) struct ClientState<C> {
    pub(crate) backend: Backend<Link<C>>,
    /// A Redis Cluster: all keys of a lock must share a slot.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) cluster: bool,
    pub(crate) tasks: Tasks,
    /// Release events this client's waiters listen to: one server's, or each master's.
    pub(crate) events: OnceLock<Box<[Events]>>,
    /// Whether waiters listen to `events` (`Client::without_release_events` turns it off).
    pub(crate) listen: AtomicBool,
    /// Whether releases are announced.
    pub(crate) announce: AtomicBool,
    /// The server's address, when known (to refuse one server twice in a quorum).
    pub(crate) address: OnceLock<String>,
    /// Where the metrics of locks without a family of their own go.
    pub(crate) meter: Meter,
    /// The longest one request on the connection takes, answered or failed, in
    /// nanoseconds; 0 when unknown (see `Client::connection_answers_within`).
    pub(crate) answer_bound: AtomicU64,
}

impl<C> ClientState<C> {
    pub(crate) fn new(backend: Backend<Link<C>>, cluster: bool, tasks: Tasks) -> Self {
        Self {
            backend,
            cluster,
            tasks,
            events: OnceLock::new(),
            listen: AtomicBool::new(true),
            announce: AtomicBool::new(true),
            address: OnceLock::new(),
            meter: Meter::default(),
            answer_bound: AtomicU64::new(0),
        }
    }

    /// The longest an attempt goes without being woken by its connection, when known (see
    /// `rt/deadline.rs`).
    pub(crate) fn answer_gap(&self) -> Option<Duration> {
        match self.answer_bound.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    pub(crate) fn backend(&self) -> &Backend<Link<C>> {
        &self.backend
    }

    pub(crate) fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// The release events this client's waiters listen to (none when turned off): one
    /// server's, or each master's of a quorum.
    pub(crate) fn events(&self) -> &[Events] {
        match self.events.get() {
            Some(events) if self.listen.load(Ordering::Relaxed) => events,
            _ => &[],
        }
    }

    /// Whether this client's releases announce themselves.
    pub(crate) fn announces(&self) -> bool {
        self.announce.load(Ordering::Relaxed)
    }
}
