//! The policy around attempts: retry iterator, deadline, and waiting between attempts for
//! whichever comes first: the backoff, a release event, or the holder's expiry. It knows
//! nothing about Lua or Redis replies; attempts tell it whether to stop or to try again.

use std::future::Future;
use std::time::Duration;

use redis::{RedisError, RetryMethod};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::events::{Events, Subscription};
use crate::retry::{Retry, RetryStrategy as _};
use crate::slots::release_channel;

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

/// What an attempt learned about the current holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// The holder's remaining TTL, when known.
    pub(crate) ttl: Option<Duration>,
    /// Which of the requested keys is held.
    pub(crate) key: usize,
}

impl<T> Step<T> {
    /// Classifies an attempt's error: transient Redis errors, and a Redlock majority missed
    /// because of failing masters, are worth another attempt.
    pub(crate) fn from_error(err: Error) -> Self {
        match &err {
            Error::Redis(redis) | Error::UnknownOutcome(redis) if is_transient(redis) => {
                Self::Again(err)
            }
            Error::Quorum { .. } => Self::Again(err),
            _ => Self::Stop(err),
        }
    }
}

/// Waits between attempts: sleeps, and when release events are on, listens to the release
/// channel of the key that was held.
pub(crate) struct Waiter<'a> {
    events: Option<&'a Events>,
    keys: &'a [String],
    subscription: Option<Subscription>,
}

impl<'a> Waiter<'a> {
    /// A waiter that only sleeps.
    pub(crate) fn sleeping() -> Self {
        Self {
            events: None,
            keys: &[],
            subscription: None,
        }
    }

    /// A waiter for an obtain of `keys`, woken by release events when `events` is given.
    pub(crate) fn for_keys(events: Option<&'a Events>, keys: &'a [String]) -> Self {
        Self {
            events,
            keys,
            subscription: None,
        }
    }

    /// Listens to the release channel of `keys[key]`; true when this is a new subscription,
    /// after which the caller must try again at once: the release may have happened between
    /// the failed attempt and the subscription.
    async fn listen_to(&mut self, key: usize) -> bool {
        let (Some(events), Some(key)) = (self.events, self.keys.get(key)) else {
            return false;
        };
        let channel = release_channel(key);
        if self
            .subscription
            .as_ref()
            .is_some_and(|s| s.channel() == channel)
        {
            return false;
        }
        // Replace any subscription to another key first, so it never lingers.
        self.subscription = None;
        self.subscription = Some(events.subscribe(channel).await);
        true
    }

    /// Waits until `until` (forever when `None`) or a release event; true when woken by
    /// the event.
    async fn wait(&self, until: Option<Instant>) -> bool {
        let sleep = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        match &self.subscription {
            Some(subscription) => tokio::select! {
                () = subscription.released() => true,
                () = sleep => false,
            },
            None => {
                sleep.await;
                false
            }
        }
    }
}

/// Runs `attempt` until it is done, fails for good, the strategy gives up, or the deadline
/// passes. Between attempts, waits for the strategy's next delay, cut short by a release
/// event or the holder's expiry; never waits past the deadline.
pub(crate) async fn run<T, F, Fut>(
    retry: &Retry,
    deadline: Option<Instant>,
    waiter: &mut Waiter<'_>,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Step<T>>,
{
    let mut backoff = retry.backoff();
    loop {
        let (failure, held) = match attempt().await {
            Step::Done(value) => return Ok(value),
            Step::Stop(err) => return Err(err),
            Step::Again(err) => (err, None),
            Step::Held(held) => (Error::NotObtained, Some(held)),
        };
        let Some(delay) = backoff.next() else {
            return Err(failure);
        };
        if let Some(held) = held
            && waiter.listen_to(held.key).await
        {
            continue;
        }
        let now = Instant::now();
        let mut wake = now.checked_add(delay);
        // Expiry publishes nothing: retry when the holder's lock runs out at the latest.
        if let Some(expiry) = held
            .and_then(|h| h.ttl)
            .and_then(|ttl| now.checked_add(ttl))
        {
            wake = Some(wake.map_or(expiry, |wake| wake.min(expiry)));
        }
        let listening = waiter.subscription.is_some();
        let until = match (wake, deadline) {
            // Nothing can wake us before the deadline but a release event.
            (Some(wake), Some(deadline)) if wake >= deadline && !listening => {
                return Err(at_deadline(failure));
            }
            (Some(wake), Some(deadline)) => Some(wake.min(deadline)),
            (wake, deadline) => wake.or(deadline),
        };
        let woken = waiter.wait(until).await;
        if !woken && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(at_deadline(failure));
        }
    }
}

/// The error to return when the deadline ends the retries: "held by another owner" becomes
/// "deadline passed"; any other failure is more telling as it is.
fn at_deadline(failure: Error) -> Error {
    match failure {
        Error::NotObtained => Error::DeadlineExceeded,
        other => other,
    }
}

/// Errors that say nothing about the lock itself: the connection, a timeout, a busy or
/// failing-over server.
pub(crate) fn is_transient(err: &RedisError) -> bool {
    err.is_timeout() || !matches!(err.retry_method(), RetryMethod::NoRetry)
}
