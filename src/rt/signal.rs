//! The lost-lock signal.

use tokio::sync::watch;
use tokio::time::Instant;

/// Fires when a lock is known lost, so work that depends on it can stop.
///
/// It fires once the lock's validity (see [`Lock::valid_until`](crate::Lock::valid_until))
/// runs out without a successful refresh, as soon as a refresh or TTL query finds the lock
/// gone, and when the lock is released. Cheap to clone; every clone fires.
///
/// ```no_run
/// # async fn demo(guard: lockset::Guard<lockset::redis::aio::ConnectionManager>) {
/// let lost = guard.lost_signal();
/// tokio::select! {
///     _ = lost.lost() => eprintln!("lock lost: stop before someone else's work is overwritten"),
///     _ = do_the_work() => {}
/// }
/// # }
/// # async fn do_the_work() {}
/// ```
#[derive(Clone, Debug)]
pub struct LostSignal {
    validity: watch::Receiver<Instant>,
}

impl LostSignal {
    pub(crate) fn new(validity: watch::Receiver<Instant>) -> Self {
        Self { validity }
    }

    /// True once the lock is known lost (or released).
    pub fn is_lost(&self) -> bool {
        Instant::now() >= *self.validity.borrow()
    }

    /// Completes when the lock is known lost (or released). Cancel-safe.
    pub async fn lost(&self) {
        let mut validity = self.validity.clone();
        loop {
            let until = *validity.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                changed = validity.changed() => {
                    if changed.is_err() {
                        // The lock is gone without a last word: its validity still stands.
                        let until = *validity.borrow();
                        tokio::time::sleep_until(until).await;
                        return;
                    }
                }
            }
        }
    }
}
