//! Running a future until a deadline, with a timer armed only when it can matter.
//!
//! A timer costs every attempt a registration in the runtime's timer wheel and its removal
//! (about 0.3 µs an uncontended obtain, under 64 tasks: a third of lockset's own work per
//! cycle, see `examples/client_work.rs`). Most attempts are answered long before their
//! deadline. When the connection is known to wake its caller at least every `gap` (each
//! request ends, answered or failed, within its response timeout), an attempt whose
//! deadline is further away than that needs no timer: every wake-up checks the clock, and a
//! timer is armed once the deadline is within `gap`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Runs `future`, made at `made`, until `limit`: its output, or `None` when `limit` came
/// first.
///
/// With `gap` (the longest `future` goes without waking its task: its connection's bound
/// on one request), the timer is armed only once `limit` is within `gap`; without it, at
/// the first poll that leaves `future` pending, as `tokio::time::timeout_at` does. The
/// first poll counts from `made` (taken just before: the clock is read once less per
/// attempt, most of which need one poll before their answer).
pub(crate) async fn until<F: Future>(
    future: Pin<&mut F>,
    made: Instant,
    limit: Instant,
    gap: Option<Duration>,
) -> Option<F::Output> {
    let Some(gap) = gap else {
        return tokio::time::timeout_at(limit, future).await.ok();
    };
    let mut future = future;
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    let mut first = Some(made);
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if timer.is_none() {
            let now = first.take().unwrap_or_else(Instant::now);
            if now >= limit {
                return Poll::Ready(None);
            }
            if limit.saturating_duration_since(now) > gap {
                // The future wakes this task again before `limit - gap` has passed.
                return Poll::Pending;
            }
            timer = Some(Box::pin(tokio::time::sleep_until(limit)));
        }
        match timer.as_mut().map(|timer| timer.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_far_deadline_arms_the_timer_once_within_the_gap() {
        // A future that wakes its task every 100 ms and never finishes: the deadline 1 s
        // away ends it, with a gap of 200 ms as with none.
        for gap in [Some(Duration::from_millis(200)), None] {
            let start = Instant::now();
            let ticking = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            let ticking = std::pin::pin!(ticking);
            let limit = start + Duration::from_secs(1);
            let ended: Option<()> = until(ticking, start, limit, gap).await;
            assert!(ended.is_none());
            assert_eq!(start.elapsed(), Duration::from_secs(1), "gap {gap:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_before_the_deadline_is_returned() {
        let answer = std::pin::pin!(async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            7
        });
        let now = Instant::now();
        let limit = now + Duration::from_secs(5);
        let gap = Some(Duration::from_millis(500));
        assert_eq!(until(answer, now, limit, gap).await, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_passed_ends_a_pending_future_at_once() {
        let never = std::pin::pin!(std::future::pending::<()>());
        let limit = Instant::now();
        let gap = Some(Duration::from_secs(1));
        assert!(until(never, limit, limit, gap).await.is_none());
    }
}
