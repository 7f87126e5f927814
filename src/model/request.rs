//! What one lock operation sends, built once and passed down by reference: the keys, who
//! claims them and with what value, for how long, and the fencing counter.

use std::sync::Arc;
use std::time::Duration;

use crate::model::invalid::InvalidInput;
use crate::model::mode::Modes;
use crate::model::validate;
use crate::model::value::Owner;

/// A validated time to live: the duration asked for, and whole milliseconds (rounded up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ttl {
    pub(crate) duration: Duration,
    pub(crate) millis: u64,
}

impl Ttl {
    /// Checks and converts `duration` (see [`validate::ttl_millis`]).
    pub(crate) fn new(duration: Duration) -> Result<Self, InvalidInput> {
        let millis = validate::ttl_millis(duration)?;
        Ok(Self { duration, millis })
    }
}

/// One operation's claim on a set of keys: the keys, the owner, the value it stores, the TTL
/// and, for an obtain with fencing, the counter to increment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Claim<'a> {
    pub(crate) keys: &'a [String],
    pub(crate) owner: &'a Owner,
    /// The owner tag followed by the caller's metadata.
    pub(crate) value: &'a str,
    pub(crate) ttl: Ttl,
    pub(crate) counter: Option<&'a str>,
    /// Each key's mode, for a lock that holds some key shared or as a permit; `None` for a
    /// plain lock (every key exclusive).
    pub(crate) modes: Option<&'a Modes>,
    /// A fair waiter's place in the keys' queues.
    pub(crate) ticket: Option<&'a Ticket>,
}

/// A fair waiter's place in the queues of its keys (see `lua/queue.lua`): its id, unique to
/// one run of attempts with one token, the lease it renews while it waits, the turn of the
/// attempt that sends it (1, 2, ... under one id), and where it hears its hand-off.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    pub(crate) id: String,
    pub(crate) lease: Ttl,
    pub(crate) turn: u64,
    /// The index of the key whose release channel the waiter hears its hand-off on.
    pub(crate) listen: usize,
    /// Its client's hand-off tag, when it hears its hand-off on its client's own channel
    /// for that key instead (see `model/names.rs`, `handoff_channel`).
    pub(crate) tag: Option<std::sync::Arc<str>>,
}

/// A release handed a fair waiter its lock, and told it so: `g<id>:<turn>:<ms>` on its
/// channel. The keys hold the value of waiter `id` for `ms` from the hand-off, which came
/// after the waiter sent its attempt `turn` (see `lua/release.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handed {
    pub(crate) id: String,
    pub(crate) turn: u64,
    pub(crate) ttl: Duration,
}

impl Handed {
    /// The hand-off a notice's payload tells of; `None` when it is not one.
    pub(crate) fn parse(payload: &[u8]) -> Option<Self> {
        let payload = std::str::from_utf8(payload.strip_prefix(b"g")?).ok()?;
        let mut parts = payload.splitn(3, ':');
        let (id, turn, ms) = (parts.next()?, parts.next()?, parts.next()?);
        Some(Self {
            id: id.to_owned(),
            turn: turn.parse().ok()?,
            ttl: Duration::from_millis(ms.parse().ok()?),
        })
    }
}

impl Claim<'_> {
    /// An owned copy, for tasks that outlive the call (a quorum's per-master work).
    pub(crate) fn to_shared(self) -> Arc<OwnedClaim> {
        Arc::new(OwnedClaim {
            keys: self.keys.to_vec(),
            owner: self.owner.clone(),
            value: self.value.to_owned(),
            ttl: self.ttl,
            counter: self.counter.map(str::to_owned),
            modes: self.modes.cloned(),
            ticket: self.ticket.cloned(),
        })
    }
}

/// A [`Claim`] that owns its parts.
#[derive(Debug)]
pub(crate) struct OwnedClaim {
    keys: Vec<String>,
    owner: Owner,
    value: String,
    ttl: Ttl,
    counter: Option<String>,
    modes: Option<Modes>,
    ticket: Option<Ticket>,
}

impl OwnedClaim {
    /// What a release of this lock needs, for keeping until it can be sent (see
    /// `health.rs`): its keys, owner and modes. Without modes the value is cut to the owner
    /// tag, since the release script finds a key ours by its tag (see `lua/owner.lua`): the
    /// metadata need not be kept. (A shared member is found by its whole value.)
    pub(crate) fn to_release(&self) -> Self {
        let value = match self.modes {
            Some(_) => self.value.clone(),
            None => self.owner.value("").into_owned(),
        };
        Self {
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            value,
            ttl: self.ttl,
            counter: None,
            modes: self.modes.clone(),
            ticket: None,
        }
    }

    /// About how many bytes this claim takes: its keys and value, and a fixed allowance for
    /// the rest.
    pub(crate) fn size(&self) -> usize {
        const FIXED: usize = 256;
        const PER_KEY: usize = 32;
        let keys: usize = self.keys.iter().map(|key| key.len() + PER_KEY).sum();
        FIXED + keys + self.value.len() + self.owner.value("").len()
    }

    pub(crate) fn claim(&self) -> Claim<'_> {
        Claim {
            keys: &self.keys,
            owner: &self.owner,
            value: &self.value,
            ttl: self.ttl,
            counter: self.counter.as_deref(),
            modes: self.modes.as_ref(),
            ticket: self.ticket.as_ref(),
        }
    }
}

/// What an obtain attempt learned about the lock's current holder: the server's answer and
/// what the waiting policy acts on, one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The holder's remaining TTL, when known (`None`: unknown or no expiry).
    pub(crate) ttl: Option<Duration>,
    /// Which of the requested keys is held (the first, when unknown).
    pub(crate) key: usize,
    /// The attempt has a place in the keys' queues (fair waiting).
    pub(crate) queued: bool,
    /// The holder's metadata, when the server told it and there is any (never its token).
    pub(crate) holder: Option<String>,
}

impl Held {
    /// Held, with nothing more known than that: the first key, no TTL, not queued.
    pub(crate) const UNKNOWN: Self = Self {
        ttl: None,
        key: 0,
        queued: false,
        holder: None,
    };
}

/// How an obtain attempt should go about a held lock (the caller is about to wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IfHeld {
    /// Mark the holder, if the lock is held, so that its release announces itself.
    pub(crate) mark_holder: bool,
    /// Learn the holder's remaining TTL, if the lock is held, also where that costs a
    /// second round trip (the script-free single-key path).
    pub(crate) holder_ttl: bool,
    /// The caller tries again if the lock is held and does not queue: an exclusive obtain
    /// blocked by shared or permit holders then keeps new ones out until it tries again
    /// (writers first; a fair waiter's place in the queue does that).
    pub(crate) retries: bool,
    /// Queue for the lock (or renew the place in its queues) if it is held: a fair waiter
    /// that listens for its hand-off. Needs the claim's ticket.
    pub(crate) queue: bool,
    /// The index of the key on whose release channel a queued waiter hears its hand-off
    /// (its subscription was live when the attempt was sent; see `waiting/waiter.rs`).
    pub(crate) listen: usize,
    /// The waiter hears its hand-off on its client's own channel for that key instead (also
    /// live when the attempt was sent): only its client is told.
    pub(crate) own_channel: bool,
}
