//! Fair waiting: one obtain's place in the waiter queues of its keys (`lua/queue.lua`).
//!
//! A fair obtain keeps one token for all its attempts, so that a release can hand the lock
//! to the value it queued with, and an id that names its queue entries and the hand-off
//! notice. Both change only after an attempt whose outcome is unknown (its clean-up, in the
//! background, releases and leaves by the old token and id, and must not touch the new).
//! An obtain that ends without the lock leaves its queues, also when it is cancelled.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{lock, release_payload};
use crate::request::{Claim, OwnedClaim, Ticket, Ttl};
use crate::value::Owner;

/// The token and queue entry of a run of attempts.
pub(crate) struct Stint {
    pub(crate) owner: Owner,
    pub(crate) ticket: Ticket,
}

impl Stint {
    fn new(lease: Ttl) -> Arc<Self> {
        Arc::new(Self {
            owner: Owner::random(),
            ticket: Ticket {
                id: release_payload(),
                lease,
            },
        })
    }
}

/// The fair-waiting state of one obtain call.
pub(crate) struct Fair {
    lease: Ttl,
    stint: Mutex<Arc<Stint>>,
    /// The claim of the last stint that queued, until the obtain wins: it leaves its queues
    /// (and releases what it was handed) when the obtain ends without the lock.
    queued: Mutex<Option<Arc<OwnedClaim>>>,
}

impl Fair {
    pub(crate) fn new(lease: Ttl) -> Self {
        Self {
            lease,
            stint: Mutex::new(Stint::new(lease)),
            queued: Mutex::new(None),
        }
    }

    /// The token and queue entry attempts use now.
    pub(crate) fn stint(&self) -> Arc<Stint> {
        lock(&self.stint).clone()
    }

    /// The id of the queue entry attempts use now: hand-off notices name it.
    pub(crate) fn id(&self) -> String {
        lock(&self.stint).ticket.id.clone()
    }

    /// How long the queue entry lasts without renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.lease.duration
    }

    /// An attempt by `stint` got no intact reply: the attempts after it take a new token and
    /// entry (the old one's clean-up is on its way).
    pub(crate) fn start_over(&self, stint: &Arc<Stint>) {
        let mut current = lock(&self.stint);
        if Arc::ptr_eq(&current, stint) {
            *current = Stint::new(self.lease);
        }
    }

    /// An attempt by `claim` queued: remember it for leaving (once per stint).
    pub(crate) fn queued(&self, claim: &Claim<'_>) {
        let mut queued = lock(&self.queued);
        let same = queued
            .as_ref()
            .is_some_and(|q| q.claim().ticket.map(|t| &t.id) == claim.ticket.map(|t| &t.id));
        if !same {
            *queued = Some(claim.to_shared());
        }
    }

    /// The obtain won: nothing to leave.
    pub(crate) fn won(&self) {
        lock(&self.queued).take();
    }

    /// What the obtain must leave, if it ends now without the lock.
    pub(crate) fn to_leave(&self) -> Option<Arc<OwnedClaim>> {
        lock(&self.queued).take()
    }
}
