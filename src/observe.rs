//! Watching locks: the retry callback's event, and the names of what `tracing` records.
//!
//! Every operation runs in a span at debug level: `lockset.obtain`, `lockset.refresh`,
//! `lockset.release` and `lockset.ttl`, with the fields `keys` (how many), `key` (the first),
//! `attempts`, `waited_ms` (from the call to its result) and `outcome`. Tokens are never
//! recorded. Each retry is a debug event (`lockset::retry`); a lock found lost and a failed
//! watchdog refresh are warnings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tracing::Span;

use crate::error::Error;

/// What an obtain (or refresh) attempt ran into, before it is retried.
#[derive(Debug)]
#[non_exhaustive]
pub enum Blocked<'a> {
    /// Another owner holds `key`; `ttl` is its remaining time to live, when known.
    Held {
        /// The held key.
        key: &'a str,
        /// The holder's remaining TTL on that key, when the server told it.
        ttl: Option<Duration>,
    },
    /// The attempt failed with an error worth retrying (a connection error, a timeout, a
    /// quorum that missed its majority because of failing masters).
    Failed(&'a Error),
}

/// One failed attempt, after which the caller waits to try again, as given to
/// [`Options::on_retry`]. When the deadline ends that wait, no attempt follows.
///
/// [`Options::on_retry`]: crate::Options::on_retry
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryEvent<'a> {
    /// The attempt that just failed: 1 for the first.
    pub attempt: u32,
    /// Why it failed.
    pub blocked: Blocked<'a>,
    /// How long the caller waits at most before the next attempt: the retry strategy's
    /// delay, cut to the deadline (a release event or the holder's expiry may end the wait
    /// sooner).
    pub delay: Duration,
}

/// A callback for every retry, shared by the clones of one [`Options`](crate::Options).
#[derive(Clone)]
pub(crate) struct OnRetry(Arc<dyn Fn(&RetryEvent<'_>) + Send + Sync>);

impl OnRetry {
    pub(crate) fn new(callback: impl Fn(&RetryEvent<'_>) + Send + Sync + 'static) -> Self {
        Self(Arc::new(callback))
    }
}

impl fmt::Debug for OnRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRetry(..)")
    }
}

/// Reports a retry: a debug event, then the caller's callback, if any.
pub(crate) fn retrying(event: &RetryEvent<'_>, callback: Option<&OnRetry>) {
    let delay_ms = millis(event.delay);
    match &event.blocked {
        Blocked::Held { key, ttl } => tracing::debug!(
            target: "lockset::retry",
            attempt = event.attempt,
            held_key = %key,
            holder_ttl_ms = ttl.map(millis),
            delay_ms,
            "held by another owner; retrying"
        ),
        Blocked::Failed(err) => tracing::debug!(
            target: "lockset::retry",
            attempt = event.attempt,
            %err,
            delay_ms,
            "attempt failed; retrying"
        ),
    }
    if let Some(callback) = callback {
        (callback.0)(event);
    }
}

/// The span of one operation on `keys` (the fields filled in as it goes).
macro_rules! op_span {
    ($name:literal, $keys:expr) => {{
        let keys: &[String] = $keys;
        tracing::debug_span!(
            $name,
            keys = keys.len(),
            key = keys.first().map(String::as_str),
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        )
    }};
}
pub(crate) use op_span;

/// Records an operation's attempts, its time from the call, and how it ended.
pub(crate) fn finished<T>(
    span: &Span,
    attempts: u32,
    started: tokio::time::Instant,
    result: &Result<T, Error>,
) {
    if span.is_disabled() {
        return;
    }
    span.record("attempts", attempts);
    span.record("waited_ms", millis(started.elapsed()));
    span.record("outcome", outcome(result));
}

/// A short name for how an operation ended.
fn outcome<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(Error::DeadlineExceeded) => "deadline_exceeded",
        Err(err) if err.is_not_obtained() => "not_obtained",
        Err(Error::NotHeld) => "not_held",
        Err(Error::InvalidInput(_)) => "invalid_input",
        Err(Error::WrongType { .. }) => "wrong_type",
        Err(err) if err.is_unavailable() => "unavailable",
        Err(_) => "error",
    }
}

/// Whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
