//! The policy around attempts: retry iterator, deadline and sleeping. It knows nothing about
//! Lua or Redis replies; attempts tell it whether to stop or to try again.

use std::future::Future;

use redis::{RedisError, RetryMethod};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::retry::{Retry, RetryStrategy as _};

/// What one attempt concluded.
pub(crate) enum Step<T> {
    /// Success: stop and return this.
    Done(T),
    /// Failed in a way another attempt may fix (held by another owner, a transient Redis
    /// error): retry if the strategy and the deadline allow, else return this error.
    Again(Error),
    /// Failed for good: return this error at once.
    Stop(Error),
}

impl<T> Step<T> {
    /// Classifies an attempt's error: transient Redis errors are worth another attempt.
    pub(crate) fn from_error(err: Error) -> Self {
        match &err {
            Error::Redis(redis) | Error::UnknownOutcome(redis) if is_transient(redis) => {
                Self::Again(err)
            }
            _ => Self::Stop(err),
        }
    }
}

/// Runs `attempt` until it is done, fails for good, the strategy gives up, or the next
/// retry would start after `deadline`. Never sleeps past the deadline.
pub(crate) async fn run<T, F, Fut>(
    retry: &Retry,
    deadline: Option<Instant>,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Step<T>>,
{
    let mut backoff = retry.backoff();
    loop {
        let failure = match attempt().await {
            Step::Done(value) => return Ok(value),
            Step::Stop(err) => return Err(err),
            Step::Again(err) => err,
        };
        let Some(delay) = backoff.next() else {
            return Err(failure);
        };
        let wake = Instant::now().checked_add(delay);
        if let (Some(deadline), Some(wake)) = (deadline, wake)
            && wake >= deadline
        {
            return Err(at_deadline(failure));
        }
        match wake {
            Some(wake) => tokio::time::sleep_until(wake).await,
            // A delay beyond what Instant can represent: wait for the deadline, or forever.
            None => return Err(wait_out(deadline, failure).await),
        }
    }
}

async fn wait_out(deadline: Option<Instant>, failure: Error) -> Error {
    match deadline {
        Some(deadline) => {
            tokio::time::sleep_until(deadline).await;
            at_deadline(failure)
        }
        None => std::future::pending().await,
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
