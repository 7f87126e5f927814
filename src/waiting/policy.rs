//! The policy around attempts: retry iterator, deadline, and waiting between attempts for
//! whichever comes first: the backoff, a release event, or the holder's expiry. It knows
//! nothing about Lua or Redis replies; attempts tell it whether to stop or to try again.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use redis::RedisError;
use tokio::time::Instant;

use crate::error::classify::{is_access_refusal, is_transient};
use crate::error::{Error, NodeFailure, QuorumOp, Result};
use crate::model::request::{Held, IfHeld};
use crate::model::retry::{Retry, RetryStrategy as _};
use crate::observe::{Blocked, OnRetry, Progress, RetryEvent, retrying};
use crate::rt::deadline;
pub(crate) use crate::waiting::waiter::Waiter;

/// What one attempt concluded.
pub(crate) enum Step<T> {
    /// Success: stop and return this.
    Done(T),
    /// Another owner holds the lock: wait and retry, or give up with "not obtained".
    Held(Held),
    /// Failed in a way another attempt may fix (a transient Redis error): retry if the
    /// strategy and the deadline allow, else return this error.
    Again(Error),
    /// Failed for good: return this error at once.
    Stop(Error),
}

impl<T> Step<T> {
    /// Classifies an attempt's error: transient Redis errors, a Redlock majority missed
    /// because of failing masters, and a write too few replicas acknowledged are worth
    /// another attempt. A quorum whose majority is out of reach because masters refuse the
    /// login (or the certificate) or the scripts is not: no retry changes a setting.
    pub(crate) fn from_error(err: Error) -> Self {
        match &err {
            Error::Redis(redis) | Error::UnknownOutcome(redis) if is_transient(redis) => {
                Self::Again(err)
            }
            Error::Quorum {
                nodes,
                needed,
                failures,
                ..
            } => {
                let refusing = failures
                    .iter()
                    .filter(|(_, failure)| match failure {
                        NodeFailure::Redis(redis) => is_access_refusal(redis),
                        NodeFailure::ScriptsRefused => true,
                        _ => false,
                    })
                    .count();
                if nodes.saturating_sub(refusing) < *needed {
                    Self::Stop(err)
                } else {
                    Self::Again(err)
                }
            }
            Error::NotReplicated { .. } => Self::Again(err),
            _ => Self::Stop(err),
        }
    }
}

/// A Redlock obtain whose majority is out of reach partly because masters hold the lock for
/// another owner (the others failed or did not answer: a master down) waits as for a held
/// lock: it listens for the release, and is woken again when a release reached it too early.
/// The error stays what the caller gets when the strategy gives up. It names no blocking key:
/// the waiter listens on its first key's channel (a lock of one key, most often).
fn held_on_a_quorum(err: &Error) -> Option<Held> {
    let Error::Quorum {
        op: QuorumOp::Obtain,
        failures,
        ..
    } = err
    else {
        return None;
    };
    failures
        .iter()
        .any(|(_, failure)| matches!(failure, NodeFailure::Refused))
        .then_some(Held::UNKNOWN)
}

/// Runs `attempt` until it is done, fails for good, the strategy gives up, or the deadline
/// passes. Between attempts, waits for the strategy's next delay, cut short by a release
/// event or the holder's expiry; never waits past the deadline.
///
/// Every attempt after the first takes one delay from the strategy and happens before the
/// deadline, also the one made at once after starting to listen for release events (see
/// `waiter.rs`: at most one per key, and one per lapse of a subscription, so that a waiter
/// whose blocking key keeps changing cannot spin).
pub(crate) async fn run<T, F, Fut>(
    retry: &Retry,
    limit: Limit,
    waiter: &mut Waiter<'_>,
    watch: &mut Watch<'_>,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut(IfHeld, Instant) -> Fut,
    Fut: Future<Output = Step<T>>,
{
    let Limit {
        start,
        deadline,
        gap,
    } = limit;
    // The first attempt goes out right after the start, which serves as its send time
    // (earlier than the send: its validity counts short, never long).
    let mut first = Some(start);
    let mut backoff = retry.backoff().peekable();
    waiter.join_live();
    // The last wait ended with a release event.
    let mut woken = false;
    // Time a queued waiter drew from the strategy and has not slept yet.
    let mut banked = Duration::ZERO;
    // The delay the last attempt, a recheck sent at once, took from the strategy. A waiter
    // that queued in it and finds the strategy used up still waits that long (its delays
    // count time waited); one with delays left sleeps those, so that a recheck still
    // counts as one retry.
    let mut rechecked = Duration::ZERO;
    // The last attempt fell short of its replicas: what the caller is told when the
    // deadline cuts the next one (most likely waiting for the same replicas).
    let mut short: Option<Error> = None;
    // A queued waiter that gives up looks once more (see below): what it gives up with
    // unless that look finds the lock its own.
    let mut last_look: Option<Error> = None;
    loop {
        // When this attempt is sent, at the earliest.
        let sending = first.take().unwrap_or_else(Instant::now);
        waiter.attempting();
        let how = IfHeld {
            mark_holder: waiter.marking(),
            // Nothing but the holder's expiry can wake a waiter that cannot listen.
            holder_ttl: waiter.events.is_empty(),
            // A fair waiter's place in the queues keeps readers out instead of a mark.
            retries: backoff.peek().is_some() && !waiter.is_fair(),
            queue: waiter.queueing(),
            listen: waiter.listen_key(),
            own_channel: waiter.names_own_channel(),
        };
        watch.attempts += 1;
        // Pinned here, where it is made, and only while it runs.
        let step = {
            let attempt = pin!(attempt(how, sending));
            match attempt_limit(deadline, sending) {
                Some(limit) => deadline::until(attempt, sending, limit, gap).await,
                None => Some(attempt.await),
            }
        };
        // The last look can only turn giving up into success: cut, held or failing, it
        // gives up with what it would have without it.
        if let Some(giving_up) = last_look.take() {
            return match step {
                Some(Step::Done(value)) => {
                    waiter.used();
                    Ok(value)
                }
                _ => Err(giving_up),
            };
        }
        let Some(step) = step else {
            // The attempt, dropped, cleans up after itself in the background. Attempts that
            // kept falling short of their replicas are reported as that, not as a reply
            // that never came.
            return Err(short.unwrap_or_else(|| Error::UnknownOutcome(cut_at_deadline())));
        };
        let (failure, held) = match step {
            Step::Done(value) => {
                waiter.used();
                return Ok(value);
            }
            Step::Stop(err) => return Err(err),
            Step::Again(err) => {
                let held = held_on_a_quorum(&err);
                short = match &err {
                    Error::NotReplicated {
                        acknowledged,
                        required,
                    } => Some(Error::NotReplicated {
                        acknowledged: *acknowledged,
                        required: *required,
                    }),
                    _ => None,
                };
                (err, held)
            }
            Step::Held(held) => {
                waiter.held(&held);
                (watch.not_obtained(&held), Some(held))
            }
        };
        let now = Instant::now();
        let queued_until = queued_until(waiter.queued_lease(), now, held.as_ref());
        // A queued waiter may still have time it drew and did not sleep: banked, or the
        // delay a recheck took when that was the strategy's last.
        let unslept = std::mem::take(&mut rechecked);
        let next = backoff.next();
        let after_last_recheck = next.is_none() && !unslept.is_zero();
        let Some(mut delay) = next.or_else(|| {
            let left = !banked.is_zero() || !unslept.is_zero();
            (queued_until.is_some() && left).then_some(unslept)
        }) else {
            return Err(failure);
        };
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Err(at_deadline(failure));
        }
        // A queued waiter is handed the lock and told so: it does not poll, but sleeps
        // until its lease needs renewing or the holder's lock runs out, as long as its
        // strategy's delays last (they measure time waited, not attempts: what it does not
        // sleep now is kept for later).
        if let Some(until) = queued_until {
            let want = until.saturating_duration_since(now);
            let drawn = draw(&mut backoff, banked.saturating_add(delay), want);
            delay = drawn.min(want);
            banked = drawn - delay;
        }
        // The wait a recheck owed from the strategy's last delay, and nothing after it: the
        // waiter gives up at its end unless something woke it (a hand-off, a release, the
        // holder's expiry), without one more attempt (the recheck was the last retry).
        let give_up_at = (after_last_recheck && banked.is_zero())
            .then(|| now.checked_add(delay))
            .flatten();
        let mut wake = now.checked_add(delay);
        // Expiry publishes nothing: retry when the holder's lock runs out at the latest.
        if let Some(expiry) = held
            .as_ref()
            .and_then(|h| h.ttl)
            .and_then(|ttl| now.checked_add(ttl))
        {
            wake = Some(wake.map_or(expiry, |wake| wake.min(expiry)));
        }
        let until = earliest(wake, deadline);
        // Woken by a release that had not reached a majority of a quorum yet: its later
        // announcements (or those already heard) are for this waiter. Tried again at most
        // once per master that announced it since the last try.
        if let Some(held) = &held
            && woken
            && waiter.too_early()
        {
            watch.retrying(&failure, Some(held), Duration::ZERO);
            rechecked = delay;
            continue;
        }
        // Confirming a subscription takes no longer than this waiter would sleep anyway.
        // The waits' futures are boxed (as below): every obtain's future would otherwise
        // carry room for them, and copy it each time it moves, also when it never waits.
        if let Some(held) = &held
            && Box::pin(waiter.listen_to(held.key, until)).await
        {
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(at_deadline(failure));
            }
            watch.retrying(&failure, Some(held), Duration::ZERO);
            // The recheck took this delay from the strategy without sleeping it (see
            // `rechecked`).
            rechecked = delay;
            continue;
        }
        // Waiting on, still for this key (or another, whose subscription took over): any
        // wake-up so far was used by the attempt that just failed.
        waiter.used();
        if !waiter.hears()
            && wake
                .zip(deadline)
                .is_some_and(|(wake, deadline)| wake >= deadline)
        {
            // Nothing can wake us before the deadline.
            return Err(at_deadline(failure));
        }
        let delay = until.map_or(delay, |until| {
            until.saturating_duration_since(Instant::now())
        });
        watch.retrying(&failure, held.as_ref(), delay);
        woken = Box::pin(waiter.wait(until)).await;
        watch.progress.woke(woken);
        if !woken && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            // A queued waiter may have been handed the lock with a notice that never came
            // (its holder's user may not publish, a pub/sub connection dropped): one last
            // attempt takes it, within the grace an attempt has past the deadline. (A
            // strategy used up before the deadline gives up without one: its last delay was
            // its last retry.)
            if queued_until.is_none() {
                return Err(at_deadline(failure));
            }
            last_look = Some(at_deadline(failure));
            continue;
        }
        if !woken && give_up_at.is_some_and(|at| Instant::now() >= at) {
            return Err(failure);
        }
    }
}

/// What the policy reports as it goes: how many attempts it made, and each retry (as a
/// debug event and to the caller's callback).
pub(crate) struct Watch<'a> {
    keys: &'a [String],
    on_retry: Option<&'a OnRetry>,
    /// The attempts made so far.
    pub(crate) attempts: u32,
    /// What the waiting saw, for the operation's metrics.
    pub(crate) progress: Progress<'a>,
}

impl<'a> Watch<'a> {
    /// Watches an operation on `keys`, calling `on_retry` before each retry.
    pub(crate) fn new(keys: &'a [String], on_retry: Option<&'a OnRetry>) -> Self {
        Self {
            keys,
            on_retry,
            attempts: 0,
            progress: Progress::default(),
        }
    }

    /// The error for an attempt that found the lock held as `held` says: which key, whose.
    fn not_obtained(&self, held: &Held) -> Error {
        Error::NotObtained {
            key: self.keys.get(held.key).cloned().unwrap_or_default(),
            holder: held.holder.clone(),
            ttl_left: held.ttl,
        }
    }

    fn retrying(&mut self, failure: &Error, held: Option<&Held>, delay: Duration) {
        self.progress.waits();
        let blocked = match held {
            // A quorum error waits as for a held lock (see `held_on_a_quorum`), but is
            // reported as the failure it is: a master failing is what an operator must see.
            Some(held) if matches!(failure, Error::NotObtained { .. }) => Blocked::Held {
                key: self.keys.get(held.key).map_or("", String::as_str),
                ttl: held.ttl,
            },
            _ => Blocked::Failed(failure),
        };
        let event = RetryEvent {
            attempt: self.attempts,
            blocked,
            holder: held.and_then(|held| held.holder.as_deref()),
            delay,
        };
        retrying(&event, self.on_retry);
    }
}

/// How long past the deadline an attempt already on its way may take to get its answer: a
/// zero timeout still tries once, and an attempt started just before the deadline is not
/// wasted; a server that does not answer delays the caller by no more than this.
const ATTEMPT_GRACE: Duration = Duration::from_millis(100);

/// Until when an attempt sent at `sending` may run: the deadline, or [`ATTEMPT_GRACE`]
/// after `sending` if that is later; unbounded without a deadline.
fn attempt_limit(deadline: Option<Instant>, sending: Instant) -> Option<Instant> {
    deadline.map(|deadline| deadline.max(sending + ATTEMPT_GRACE))
}

/// When an operation started, until when its attempts may run, and the longest its
/// connection leaves an attempt without waking it (its bound on one request, when known: see
/// [`deadline::until`]).
pub(crate) struct Limit {
    pub(crate) start: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) gap: Option<Duration>,
}

/// The error of an attempt still waiting for Redis when the deadline passed: its outcome is
/// unknown, as with any reply that did not come in time.
fn cut_at_deadline() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the deadline passed before Redis answered",
    ))
}

/// At most this many delays are drawn for one sleep of a queued waiter: a strategy of short
/// delays (1 ms) would otherwise cost thousands of steps per wait, on the way to a hand-off
/// that usually comes within a few of them. Such a waiter then renews its place more often
/// than its lease needs.
const DRAWN_AT_MOST: usize = 64;

/// Draws delays from `backoff` after `first` until they add up to `want`, it runs out, or
/// [`DRAWN_AT_MOST`] were drawn: how long a queued waiter may sleep. A zero delay (a
/// strategy that never waits) covers any time.
fn draw(backoff: &mut impl Iterator<Item = Duration>, first: Duration, want: Duration) -> Duration {
    let mut total = first;
    for _ in 0..DRAWN_AT_MOST {
        if total >= want {
            break;
        }
        match backoff.next() {
            Some(delay) if !delay.is_zero() => total = total.saturating_add(delay),
            Some(_) => return want,
            None => break,
        }
    }
    total
}

/// When a queued waiter that hears its hand-off (its lease `lease`) wakes at the latest,
/// from `now`: to renew its lease, or when the holder's lock runs out (expiry hands
/// nothing on).
fn queued_until(lease: Option<Duration>, now: Instant, held: Option<&Held>) -> Option<Instant> {
    let renew = now.checked_add(lease? / 3);
    let expiry = held
        .and_then(|h| h.ttl)
        .and_then(|ttl| now.checked_add(ttl));
    earliest(renew, expiry)
}

/// The earlier of two optional instants (`None`: never).
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The error to return when the deadline ends the retries: "held by another owner" becomes
/// "deadline passed"; any other failure is more telling as it is.
fn at_deadline(failure: Error) -> Error {
    match failure {
        Error::NotObtained { .. } => Error::DeadlineExceeded,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn draw_adds_delays_up_to_what_is_wanted() {
        let mut delays = std::iter::repeat_n(MS * 10, 5);
        assert_eq!(draw(&mut delays, MS * 10, MS * 25), MS * 30);
        // Two of five were drawn, three are left for later.
        assert_eq!(delays.count(), 3);
    }

    #[test]
    fn draw_stops_when_the_strategy_runs_out() {
        let mut delays = std::iter::repeat_n(MS * 10, 2);
        assert_eq!(draw(&mut delays, MS * 10, Duration::from_secs(1)), MS * 30);
    }

    #[test]
    fn a_zero_delay_covers_any_time() {
        let mut delays = std::iter::repeat(Duration::ZERO);
        assert_eq!(
            draw(&mut delays, MS, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn draw_takes_a_bounded_number_of_short_delays() {
        // A 1 ms strategy and a 5 s lease renewal: not 5,000 steps, but at most 64.
        let mut delays = std::iter::repeat(MS);
        let drawn = draw(&mut delays, MS, Duration::from_secs(5));
        assert_eq!(drawn, MS * (DRAWN_AT_MOST as u32 + 1));
    }

    #[test]
    fn endless_delays_never_overflow() {
        let mut delays = std::iter::repeat(Duration::MAX);
        assert_eq!(draw(&mut delays, MS, Duration::from_secs(5)), Duration::MAX);
    }
}
