//! One obtain attempt of a call: its inputs computed once, what it won, and taking what a
//! release handed to a fair waiter.

use super::*;
use crate::client::handle::cleanup::CleanupOnDrop;

/// One obtain call's inputs, computed once.
pub(super) struct Attempt<'a, C> {
    pub(super) client: &'a Client<C>,
    pub(super) keys: &'a [String],
    /// The caller's token; `None` for a fresh random token per attempt.
    pub(super) custom: Option<&'a Owner>,
    pub(super) metadata: &'a str,
    pub(super) ttl: Ttl,
    pub(super) counter: Option<&'a str>,
    pub(super) modes: Option<&'a Modes>,
    /// The obtain's place in the queues, when it waits fairly.
    pub(super) fair: Option<&'a Fair>,
}

/// A successful attempt.
pub(super) struct Won {
    pub(super) owner: Owner,
    pub(super) ttl: Ttl,
    pub(super) fence: Option<u64>,
    pub(super) valid_until: Instant,
    /// A quorum's writes of the lock still under way.
    pub(super) stragglers: Option<Arc<Stragglers>>,
}

impl<C> Attempt<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One attempt.
    ///
    /// Without a custom token every attempt gets a fresh random one, so a late clean-up of
    /// a failed attempt can never delete a later attempt's lock (on a slow Redlock master,
    /// say). A reply that never came (client-side timeout) leaves the outcome unknown: the
    /// script may have locked the keys. So does dropping this future mid-flight (at the
    /// deadline, or cancelled). For a random token, release by token then, in the
    /// background: on the same connection, after the obtain. A custom token may already
    /// have held these keys before this call, so they are left to expire with the TTL (a
    /// fair waiter's queue entry is left, by the same clean-up).
    ///
    /// `sent`: a moment before the attempt is sent, where its validity counts from.
    pub(super) async fn run(&self, how: IfHeld, sent: Instant) -> Step<Won> {
        // A fair obtain keeps its token while it queues (see `waiting/fair.rs`).
        let stint = self.fair.map(Fair::stint);
        if let Some(won) = self.take_handed(stint.as_ref()) {
            return Step::Done(won);
        }
        let ticket = stint
            .as_ref()
            .map(|stint| stint.sending(how.listen, how.own_channel));
        let owner = match (self.custom, &stint) {
            (Some(owner), _) => Cow::Borrowed(owner),
            (None, Some(stint)) => Cow::Borrowed(&stint.owner),
            (None, None) => Cow::Owned(Owner::random()),
        };
        let value = owner.value(self.metadata);
        let claim = Claim {
            keys: self.keys,
            owner: &owner,
            value: &value,
            ttl: self.ttl,
            counter: self.counter,
            modes: self.modes,
            ticket: ticket.as_ref(),
        };
        let random = self.custom.is_none();
        // A custom token's keys may be an outer lock's: only its queue entry is left.
        let mut cleanup = CleanupOnDrop {
            attempt: (random || claim.ticket.is_some()).then_some((self.client, &claim)),
        };
        let (outcome, stragglers) = self.client.backend().obtain(&claim, random, how).await;
        // No intact reply: the script may or may not have run. The clean-up goes on in the
        // background, so that a server that does not answer delays nobody's deadline.
        if !matches!(&outcome, Err(Error::Redis(err)) if is_outcome_unknown(err)) {
            cleanup.attempt = None;
        } else if let (Some(fair), Some(stint)) = (self.fair, &stint) {
            fair.start_over(stint);
        }
        drop(cleanup);
        if let (Some(fair), Ok(Obtain::Held(Held { queued: true, .. }))) = (self.fair, &outcome) {
            fair.queued(&claim);
        }
        match outcome {
            Ok(Obtain::Obtained { fence, .. }) => {
                let ttl = self.ttl.duration;
                let valid_for = ttl.saturating_sub(self.client.backend().drift(ttl));
                let valid_until = sent.checked_add(valid_for).unwrap_or(sent);
                Step::Done(Won {
                    owner: owner.into_owned(),
                    ttl: self.ttl,
                    fence,
                    valid_until,
                    stragglers,
                })
            }
            Ok(Obtain::Held(held)) => Step::Held(held),
            Err(Error::Redis(err)) if is_outcome_unknown(&err) => {
                Step::from_error(Error::UnknownOutcome(err))
            }
            // A quorum's TTL within its drift allowance: no attempt could ever be valid
            // (nothing was sent), so none is retried.
            Err(err) if is_never_valid(&err) => Step::Stop(err),
            Err(err) => Step::from_error(err),
        }
    }
}

impl<C> Attempt<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The lock a release handed to `stint` and told it of, taken as it is, with nothing
    /// sent: its keys hold the stint's value for the time the hand-off gave, counted from
    /// when the attempt it names was sent (see [`Stint::handed_until`]).
    ///
    /// Only when that leaves nearly the full TTL (7/8 of it: the waiter was handed the
    /// lock soon after it last renewed, and its lease covered the TTL); otherwise, for
    /// an obtain that mints a fencing token, and when writes wait for replicas, `None`: an attempt then makes the keys its own
    /// for the full TTL, if they still are (one more round trip, where a hand-off came long
    /// after the last renewal, or a short lease cut it).
    pub(super) fn take_handed(&self, stint: Option<&Arc<Stint>>) -> Option<Won> {
        let (fair, stint) = (self.fair?, stint?);
        let handed = fair.take_handed()?;
        let drift = self.client.backend().drift(handed.ttl);
        let until = stint.handed_until(&handed)?.checked_sub(drift)?;
        let ttl = self.ttl.duration;
        let left = until.saturating_duration_since(Instant::now());
        // A hand-off the replicas may not have yet is confirmed by an attempt that waits
        // for them: they apply the release's hand-off before that attempt's write.
        if self.counter.is_some() || left < ttl - ttl / 8 || self.client.backend().is_replicated() {
            return None;
        }
        Some(Won {
            owner: stint.owner.clone(),
            ttl: self.ttl,
            fence: None,
            valid_until: until,
            stragglers: None,
        })
    }
}

/// Whether `err` is a quorum's refusal of a TTL within its drift allowance: nothing sent,
/// no master asked (see `Quorum::obtain`).
fn is_never_valid(err: &Error) -> bool {
    matches!(
        err,
        Error::Quorum { expired: true, succeeded: 0, failures, .. } if failures.is_empty()
    )
}
