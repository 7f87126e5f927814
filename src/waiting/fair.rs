//! Fair waiting: one obtain's place in the waiter queues of its keys (`lua/queue.lua`).
//!
//! A fair obtain keeps one token for all its attempts, so that a release can hand the lock
//! to the value it queued with, and an id that names its queue entries and the hand-off
//! notice. Both change only after an attempt whose outcome is unknown (its clean-up, in the
//! background, releases and leaves by the old token and id, and must not touch the new);
//! a caller's own token never changes (only the id does, and the clean-up only leaves the
//! queues: the keys the token holds may be an outer lock's, see `client/handle/obtain.rs`). An obtain
//! that ends without the lock leaves its queues, also when it is cancelled.
//!
//! A hand-off notice is the lock: the obtain takes it without sending anything. Its validity
//! counts from the send of the attempt the notice names (the last to queue or renew the
//! waiter, so it ran before the hand-off): each attempt gets the next turn, and the send
//! times of the latest turns are remembered.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::request::{Claim, Handed, OwnedClaim, Ticket, Ttl};
use crate::model::value::Owner;
use crate::rt::lock;
use crate::waiting::events::release_payload;

/// How many of a stint's latest attempts it remembers the send time of: a hand-off names
/// the last one that queued or renewed it, which is one of the latest (attempts are made
/// one after another).
const REMEMBERED_TURNS: usize = 8;

/// The token and queue entry of a run of attempts.
pub(crate) struct Stint {
    pub(crate) owner: Owner,
    id: String,
    lease: Ttl,
    /// Its client's hand-off tag (see [`Fair::tag`]).
    tag: Arc<str>,
    /// The latest attempts' turns and when each was sent, the newest last.
    sent: Mutex<VecDeque<(u64, Instant)>>,
}

impl Stint {
    /// A stint by the caller's token `custom`, else by a fresh random one.
    fn new(lease: Ttl, custom: Option<&Owner>, tag: &Arc<str>) -> Arc<Self> {
        Arc::new(Self {
            owner: custom.cloned().unwrap_or_else(Owner::random),
            id: release_payload(),
            lease,
            tag: tag.clone(),
            sent: Mutex::new(VecDeque::with_capacity(REMEMBERED_TURNS)),
        })
    }

    /// The ticket of an attempt sent now, which names `listen`'s channel for the hand-off
    /// (its client's own channel for that key when `own_channel`): the next turn, whose send
    /// time is remembered.
    pub(crate) fn sending(&self, listen: usize, own_channel: bool) -> Ticket {
        let mut sent = lock(&self.sent);
        let turn = sent.back().map_or(1, |(turn, _)| turn + 1);
        if sent.len() == REMEMBERED_TURNS {
            sent.pop_front();
        }
        sent.push_back((turn, Instant::now()));
        Ticket {
            id: self.id.clone(),
            lease: self.lease,
            turn,
            listen,
            tag: own_channel.then(|| self.tag.clone()),
        }
    }

    /// Until when the lock `handed` to this stint is its own: from when the attempt it names
    /// was sent (the hand-off came later), for the time the hand-off gave. `None` when it
    /// was handed to another stint's id, or that attempt is not remembered.
    pub(crate) fn handed_until(&self, handed: &Handed) -> Option<Instant> {
        if handed.id != self.id {
            return None;
        }
        let sent = lock(&self.sent);
        let (_, at) = sent.iter().find(|(turn, _)| *turn == handed.turn)?;
        at.checked_add(handed.ttl)
    }
}

/// The fair-waiting state of one obtain call.
pub(crate) struct Fair {
    lease: Ttl,
    /// The caller's own token, which every stint keeps.
    custom: Option<Owner>,
    /// The client's hand-off tag: the name of the channel on which its fair waiters hear
    /// their hand-offs (see `model/names.rs`, `handoff_channel`).
    tag: Arc<str>,
    stint: Mutex<Arc<Stint>>,
    /// The claim of the last stint that queued, until the obtain wins: it leaves its queues
    /// (and releases what it was handed) when the obtain ends without the lock.
    queued: Mutex<Option<Arc<OwnedClaim>>>,
    /// A hand-off this obtain was told of and has not taken yet.
    handed: Mutex<Option<Handed>>,
}

impl Fair {
    /// The state of an obtain whose queue entries last `lease` without renewal, by the
    /// caller's token `custom` (else a random one per stint), for a client with hand-off tag
    /// `tag`.
    pub(crate) fn new(lease: Ttl, custom: Option<Owner>, tag: Arc<str>) -> Self {
        Self {
            lease,
            stint: Mutex::new(Stint::new(lease, custom.as_ref(), &tag)),
            custom,
            tag,
            queued: Mutex::new(None),
            handed: Mutex::new(None),
        }
    }

    /// A release handed the lock to this obtain (to one of its stints) and told it so.
    pub(crate) fn handed(&self, handed: Handed) {
        *lock(&self.handed) = Some(handed);
    }

    /// The hand-off told of and not taken yet, if any.
    pub(crate) fn take_handed(&self) -> Option<Handed> {
        lock(&self.handed).take()
    }

    /// The token and queue entry attempts use now.
    pub(crate) fn stint(&self) -> Arc<Stint> {
        lock(&self.stint).clone()
    }

    /// The id of the queue entry attempts use now: hand-off notices name it.
    pub(crate) fn id(&self) -> String {
        lock(&self.stint).id.clone()
    }

    /// The client's hand-off tag.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
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
            *current = Stint::new(self.lease, self.custom.as_ref(), &self.tag);
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
