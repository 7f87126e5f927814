//! Deadlines for attempts: one timer per client instead of one per attempt.
//!
//! Every obtain or refresh attempt is bounded by its call's deadline, and nearly every
//! attempt ends long before it. A tokio timer per attempt registers in the runtime's timer
//! wheel and leaves it again, which on a multi-threaded runtime costs as much as a fifth of
//! an uncontended lock's time on the client. Instead, an attempt that has to wait writes its
//! deadline and waker into one of a few shards (picked by thread, so that the workers seldom
//! meet on a mutex), and one task per client sleeps until the earliest deadline it knows of,
//! then wakes the attempts whose deadline passed. That task runs only while attempts wait,
//! on the runtime of the attempt that started it, and an attempt is told only about a
//! deadline earlier than the one the task sleeps until.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::events::lock;

/// How many shards deadlines are spread over.
const SHARDS: usize = 8;

/// `wake_at` when the timer task must be told of every deadline: none runs, or it is
/// looking at the deadlines now.
const TELL: u64 = u64::MAX;

/// The deadlines of one client's waiting attempts, and the task that keeps them.
#[derive(Clone)]
pub(crate) struct Deadlines(Arc<Timer>);

struct Timer {
    shards: [Mutex<Shard>; SHARDS],
    /// When the timer task wakes next, in nanoseconds from `base` ([`TELL`]: tell it).
    wake_at: AtomicU64,
    base: Instant,
    /// Whether a timer task runs (changed only under this lock).
    running: Mutex<bool>,
    /// Tells the running task of an earlier deadline.
    earlier: Notify,
}

/// The waiting attempts of one shard: a slab of entries and its free slots.
#[derive(Default)]
struct Shard {
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
}

struct Entry {
    deadline: Instant,
    /// Taken when the deadline passed and the attempt was woken.
    waker: Option<Waker>,
}

impl Deadlines {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Timer {
            shards: Default::default(),
            wake_at: AtomicU64::new(TELL),
            base: Instant::now(),
            running: Mutex::new(false),
            earlier: Notify::new(),
        }))
    }

    /// Runs `future` to its end, or gives it up (then `None`) once `deadline` passed (if
    /// any), as `tokio::time::timeout_at` does. The future is pinned by the caller, where it
    /// is made: moved around, a future costs a copy of its whole size each time.
    pub(crate) fn bound<'a, F: Future>(
        &'a self,
        deadline: Option<Instant>,
        future: Pin<&'a mut F>,
    ) -> Bounded<'a, F> {
        Bounded {
            future,
            deadline,
            waiting: Waiting {
                timer: &self.0,
                slot: None,
            },
        }
    }
}

/// A future bounded by a deadline: see [`Deadlines::bound`].
pub(crate) struct Bounded<'a, F> {
    future: Pin<&'a mut F>,
    deadline: Option<Instant>,
    waiting: Waiting<'a>,
}

impl<F: Future> Future for Bounded<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(output) = this.future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        let Some(deadline) = this.deadline else {
            return Poll::Pending;
        };
        if this.waiting.arm(deadline, cx.waker()) {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// One attempt's place among the deadlines, given up when it is dropped.
struct Waiting<'a> {
    timer: &'a Arc<Timer>,
    /// Shard and index of its entry.
    slot: Option<(usize, usize)>,
}

impl Waiting<'_> {
    /// Makes sure the timer wakes `waker` at `deadline`; true instead when the deadline
    /// passed. Only a wake-up by the timer can mean that it did: the clock is read only
    /// then.
    fn arm(&mut self, deadline: Instant, waker: &Waker) -> bool {
        match self.slot {
            Some((shard, index)) => {
                let mut shard = lock(&self.timer.shards[shard]);
                let Some(Some(entry)) = shard.entries.get_mut(index) else {
                    return false;
                };
                match &mut entry.waker {
                    Some(current) => {
                        current.clone_from(waker);
                        return false;
                    }
                    // Woken by the timer: the deadline passed, or the task that woke it
                    // stopped (its runtime shut down); then it waits on, armed again.
                    empty => {
                        if Instant::now() >= deadline {
                            return true;
                        }
                        *empty = Some(waker.clone());
                    }
                }
            }
            None => {
                self.slot = Some(self.insert(Entry {
                    deadline,
                    waker: Some(waker.clone()),
                }));
            }
        }
        // After the entry is in place: a timer task that looks from now on sees it.
        if self.timer.nanos(deadline) < self.timer.wake_at.load(Ordering::SeqCst) {
            Timer::earlier(self.timer);
        }
        false
    }

    /// Puts `entry` in the calling thread's shard; returns where.
    fn insert(&self, entry: Entry) -> (usize, usize) {
        let shard = this_threads_shard();
        let mut entries = lock(&self.timer.shards[shard]);
        let index = match entries.free.pop() {
            Some(index) => {
                entries.entries[index] = Some(entry);
                index
            }
            None => {
                entries.entries.push(Some(entry));
                entries.entries.len() - 1
            }
        };
        (shard, index)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some((shard, index)) = self.slot {
            let mut shard = lock(&self.timer.shards[shard]);
            shard.entries[index] = None;
            shard.free.push(index);
        }
    }
}

impl Timer {
    fn nanos(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        u64::try_from(nanos).unwrap_or(TELL - 1).min(TELL - 1)
    }

    /// A deadline earlier than the timer task's next wake-up was armed: tells the task, or
    /// starts one.
    fn earlier(this: &Arc<Self>) {
        let mut running = lock(&this.running);
        if *running {
            // Kept as a permit if the task is not waiting yet: it then looks once more.
            this.earlier.notify_one();
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("an attempt waits outside a tokio runtime: nothing bounds it");
            return;
        };
        *running = true;
        drop(running);
        // The guard goes in with the task: dropped also if the task never ran.
        runtime.spawn(Self::run(Stopped {
            timer: this.clone(),
            done: false,
        }));
    }

    /// The timer task: wakes the attempts whose deadline passed, then sleeps until the
    /// earliest deadline left, or until told of an earlier one; ends when no attempt waits.
    async fn run(mut stopped: Stopped) {
        let this = stopped.timer.clone();
        loop {
            // Every deadline armed from now on is told, until the next wake-up is known.
            this.wake_at.store(TELL, Ordering::SeqCst);
            let Some(next) = this.wake_passed(Instant::now()) else {
                let mut running = lock(&this.running);
                // An attempt that armed while this looked waits for the lock, then starts a
                // task of its own.
                if this.wake_passed(Instant::now()).is_none() {
                    *running = false;
                    stopped.done = true;
                    return;
                }
                continue;
            };
            this.wake_at.store(this.nanos(next), Ordering::SeqCst);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = this.earlier.notified() => {}
            }
        }
    }

    /// Wakes every armed attempt whose deadline is at or before `now`; returns the earliest
    /// deadline of those left armed.
    fn wake_passed(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for shard in &self.shards {
            let mut shard = lock(shard);
            for entry in shard.entries.iter_mut().flatten() {
                if entry.waker.is_none() {
                    continue;
                }
                if entry.deadline <= now {
                    if let Some(waker) = entry.waker.take() {
                        waker.wake();
                    }
                } else {
                    next = Some(next.map_or(entry.deadline, |next| next.min(entry.deadline)));
                }
            }
        }
        next
    }

    /// Wakes every armed attempt, whatever its deadline: the timer task stops, and they arm
    /// again (starting another).
    fn wake_all(&self) {
        for shard in &self.shards {
            let mut shard = lock(shard);
            for entry in shard.entries.iter_mut().flatten() {
                if let Some(waker) = entry.waker.take() {
                    waker.wake();
                }
            }
        }
    }
}

/// Dropped with the timer task. When it did not end by itself (its runtime shut down), the
/// next deadline armed starts another task, and those armed now arm again.
struct Stopped {
    timer: Arc<Timer>,
    done: bool,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.done {
            *lock(&self.timer.running) = false;
            self.timer.wake_at.store(TELL, Ordering::SeqCst);
            self.timer.wake_all();
        }
    }
}

/// The shard of the calling thread: threads take turns.
fn this_threads_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|shard| *shard)
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::pin::pin;
    use std::time::Duration;

    use tokio::time::{Instant, timeout};

    use super::Deadlines;

    /// Far beyond any deadline these tests set: they pass on a loaded machine.
    const GENEROUS: Duration = Duration::from_secs(10);

    async fn bounded_pending(timer: &Deadlines, after: Duration) -> (Option<()>, Duration) {
        let start = Instant::now();
        let never = pin!(pending::<()>());
        let outcome = timer.bound(Some(start + after), never).await;
        (outcome, start.elapsed())
    }

    #[tokio::test]
    async fn a_future_that_ends_in_time_gives_its_output() {
        let timer = Deadlines::new();
        let ready = pin!(async { 7 });
        let deadline = Instant::now() + GENEROUS;
        assert_eq!(timer.bound(Some(deadline), ready).await, Some(7));
    }

    #[tokio::test]
    async fn a_future_still_pending_at_its_deadline_is_given_up() {
        let timer = Deadlines::new();
        let (outcome, took) = timeout(GENEROUS, bounded_pending(&timer, Duration::from_millis(50)))
            .await
            .expect("bounded");
        assert_eq!(outcome, None);
        assert!(took >= Duration::from_millis(50), "{took:?}");
        // The timer task ended with the last attempt; the next one starts another.
        let (outcome, _) = timeout(GENEROUS, bounded_pending(&timer, Duration::from_millis(20)))
            .await
            .expect("bounded again");
        assert_eq!(outcome, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_earlier_deadline_armed_later_is_kept() {
        let timer = Deadlines::new();
        let late = tokio::spawn({
            let timer = timer.clone();
            async move { bounded_pending(&timer, GENEROUS * 6).await }
        });
        tokio::task::yield_now().await;
        for _ in 0..20 {
            let (outcome, took) =
                timeout(GENEROUS, bounded_pending(&timer, Duration::from_millis(5)))
                    .await
                    .expect("the earlier deadline was kept");
            assert_eq!(outcome, None);
            assert!(took >= Duration::from_millis(5));
        }
        late.abort();
    }

    #[tokio::test]
    async fn without_a_deadline_nothing_gives_up() {
        let timer = Deadlines::new();
        let never = pin!(pending::<()>());
        let unbounded = timer.bound(None, never);
        assert!(timeout(Duration::from_millis(50), unbounded).await.is_err());
    }

    /// The timer task runs on the runtime of the attempt that started it. When that runtime
    /// shuts down, attempts waiting on another runtime arm again there.
    #[test]
    fn a_timer_whose_runtime_shut_down_is_replaced() {
        let timer = Deadlines::new();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        first.spawn({
            let timer = timer.clone();
            async move { bounded_pending(&timer, GENEROUS * 6).await }
        });
        // The far deadline starts the timer task on the first runtime.
        first.block_on(tokio::task::yield_now());
        let (started, waited) = std::sync::mpsc::channel();
        let second = std::thread::spawn({
            let timer = timer.clone();
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async {
                    let waiting = bounded_pending(&timer, Duration::from_millis(300));
                    let waiting = pin!(waiting);
                    let mut waiting = waiting;
                    // Armed (on the first runtime's timer) before that runtime goes.
                    assert!(
                        timeout(Duration::from_millis(10), waiting.as_mut())
                            .await
                            .is_err()
                    );
                    started.send(()).expect("told");
                    timeout(GENEROUS, waiting).await
                })
            }
        });
        waited.recv().expect("the second runtime's attempt armed");
        drop(first);
        let (outcome, took) = second.join().expect("no panic").expect("given up in time");
        assert_eq!(outcome, None);
        assert!(took >= Duration::from_millis(300));
    }
}
