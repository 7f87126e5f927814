//! Watching locks: the retry callback's event, the names of what `tracing` records, and
//! where every operation's metrics are recorded (see `meter.rs` for their names).
//!
//! Every operation runs in a span at debug level: `lockset.obtain`, `lockset.refresh`,
//! `lockset.release` and `lockset.ttl`, with the fields `keys` (how many), `key` (the first),
//! `attempts`, `waited_ms` (from the call to its result) and `outcome`. Tokens are never
//! recorded. Each retry is a debug event (`lockset::retry`); a lock found lost and a failed
//! watchdog refresh are warnings.
//!
//! Every operation ends in [`finished`], which closes its span's fields and records its
//! metrics in one go; a lock found lost goes through [`lost`], and the end of a holding
//! through [`ended`]. Nothing else records a figure.
//!
//! May import `error`, `model` and `rt` (`tests/layers.rs` checks).

pub(crate) mod meter;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Span;

use self::meter::{End, HoldTimer, Meter, Waiting};
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
    /// Who holds the key of [`Blocked::Held`]: its metadata, when the server told it and
    /// there is any (see [`Error::NotObtained`]).
    pub holder: Option<&'a str>,
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
            holder = event.holder,
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

/// Awaits `$future` inside `$span`, or as it is when the span is disabled (no subscriber
/// wants it): wrapping costs moves of the whole future on every operation (about 0.1 µs of
/// an uncontended obtain and release). `$future` is written out in both branches, so that
/// each builds it in place: pass a call, not a closure, or its code is made twice.
/// (With `tracing`'s `log` feature and no subscriber, a disabled span still logs its enter
/// and exit at trace level; those two lines are what skipping it loses.)
macro_rules! in_span {
    ($span:expr, $future:expr) => {{
        let span: &tracing::Span = $span;
        if span.is_disabled() {
            $future.await
        } else {
            tracing::Instrument::instrument($future, span.clone()).await
        }
    }};
}
pub(crate) use in_span;

/// Which operation ended, with what its metrics need.
pub(crate) enum Op<'a> {
    /// An obtain, of the lock family `meter`, what its waiting saw, and when it ended (the
    /// clock read once for its wait and the lock's holding).
    Obtain(&'a Meter, &'a Progress<'a>, Instant),
    /// A refresh (by hand, or the watchdog's) of a lock of the family `meter`.
    Refresh(&'a Meter),
    /// A release of a lock of the family `meter`.
    Release(&'a Meter),
    /// A TTL query (no metrics).
    Ttl,
}

/// An operation ended: records its attempts, its time from the call and how it ended in its
/// span, and its metrics. The clock is read only when something records the time (an
/// obtain brings its own end).
pub(crate) fn finished<T>(
    span: &Span,
    op: Op<'_>,
    attempts: u32,
    started: Instant,
    result: &Result<T, Error>,
) {
    let mut waited = None;
    // One word for how it ended, in the metrics' `outcome` label and the span's alike.
    let word = match op {
        Op::Obtain(meter, progress, ended) => {
            let end = obtain_end(result);
            let took = ended.saturating_duration_since(started);
            waited = Some(took);
            meter.obtained(end, took, attempts);
            if let (Ok(_), Some(woken)) = (result, progress.woken_at) {
                meter.handed_over(ended.saturating_duration_since(woken));
            }
            end.word()
        }
        Op::Refresh(meter) => {
            let end = refresh_end(result);
            meter.refreshed(end);
            end.word()
        }
        Op::Release(meter) => {
            let end = release_end(result);
            meter.released(end);
            end.word()
        }
        Op::Ttl => ttl_word(result),
    };
    if span.is_disabled() {
        return;
    }
    let waited = waited.unwrap_or_else(|| started.elapsed());
    span.record("attempts", attempts);
    span.record("waited_ms", millis(waited));
    span.record("outcome", word);
}

/// How an obtain ended.
fn obtain_end<T>(result: &Result<T, Error>) -> meter::ObtainEnd {
    match result {
        Ok(_) => meter::ObtainEnd::Obtained,
        Err(Error::DeadlineExceeded) => meter::ObtainEnd::Deadline,
        Err(err) if err.is_not_obtained() => meter::ObtainEnd::NotObtained,
        Err(err) => match failure(err) {
            Failure::Unavailable => meter::ObtainEnd::Unavailable,
            Failure::InvalidInput => meter::ObtainEnd::InvalidInput,
            Failure::Other => meter::ObtainEnd::Error,
        },
    }
}

/// How a refresh ended.
fn refresh_end<T>(result: &Result<T, Error>) -> meter::RefreshEnd {
    match result {
        Ok(_) => meter::RefreshEnd::Refreshed,
        Err(err) if err.is_not_held() => meter::RefreshEnd::NotHeld,
        Err(err) => match failure(err) {
            Failure::Unavailable => meter::RefreshEnd::Unavailable,
            Failure::InvalidInput => meter::RefreshEnd::InvalidInput,
            Failure::Other => meter::RefreshEnd::Error,
        },
    }
}

/// How a release ended.
fn release_end<T>(result: &Result<T, Error>) -> meter::ReleaseEnd {
    match result {
        Ok(_) => meter::ReleaseEnd::Released,
        Err(err) if err.is_not_held() => meter::ReleaseEnd::NotHeld,
        Err(err) => match failure(err) {
            Failure::Unavailable => meter::ReleaseEnd::Unavailable,
            Failure::InvalidInput | Failure::Other => meter::ReleaseEnd::Error,
        },
    }
}

/// How a TTL query ended, in the words of the others (it has no metric).
fn ttl_word<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(err) if err.is_not_held() => "not_held",
        Err(err) => match failure(err) {
            Failure::Unavailable => "unavailable",
            Failure::InvalidInput => "invalid_input",
            Failure::Other => "error",
        },
    }
}

/// What an error that is neither "held" nor "not ours" means to whoever watches: the one
/// rule behind the `unavailable` and `invalid_input` outcomes of the metrics and the spans.
enum Failure {
    /// Redis could not be reached or did not answer ([`Error::is_unavailable`]).
    Unavailable,
    /// Rejected before anything was sent.
    InvalidInput,
    Other,
}

fn failure(err: &Error) -> Failure {
    match err {
        Error::InvalidInput(_) => Failure::InvalidInput,
        err if err.is_unavailable() => Failure::Unavailable,
        _ => Failure::Other,
    }
}

/// What an obtain's waiting saw, as it goes: whether it waits (the `lockset_waiters` gauge
/// counts it until this is dropped) and when a release event last woke it.
#[derive(Default)]
pub(crate) struct Progress<'a> {
    waiting: Waiting<'a>,
    /// When the last wait ended with a release event (or a hand-off notice); `None` when it
    /// ended otherwise, or none did.
    woken_at: Option<Instant>,
}

impl<'a> Progress<'a> {
    /// The progress of an obtain of the lock family `meter`.
    pub(crate) fn of(meter: &'a Meter) -> Self {
        Self {
            waiting: Waiting::of(meter),
            woken_at: None,
        }
    }

    /// The obtain is about to wait.
    pub(crate) fn waits(&mut self) {
        self.waiting.waits();
    }

    /// A wait ended: `by_release` when a release event (or hand-off notice) ended it.
    pub(crate) fn woke(&mut self, by_release: bool) {
        self.woken_at = by_release.then(Instant::now);
    }
}

/// A lock of `keys` was found lost (for the first time): a warning saying `why`, and its
/// metrics (the loss, and the holding's end).
pub(crate) fn lost(keys: &[String], holding: &HoldTimer, cause: meter::Lost) {
    let why = match cause {
        meter::Lost::Refresh => "a refresh found its keys gone or taken over",
        meter::Lost::Ttl => "a TTL query found its keys gone or taken over",
        meter::Lost::Expired => "its validity ran out before a refresh renewed it",
    };
    let key = keys.first().map_or("", String::as_str);
    tracing::warn!(keys = keys.len(), key = %key, "lock lost: {why}");
    holding.meter().lost(cause);
    holding.ended(End::Lost, Instant::now());
}

/// A holding ended by a release (called once, when the release starts, `at`).
pub(crate) fn ended(holding: &HoldTimer, at: Instant) {
    holding.ended(End::Released, at);
}

/// Whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
