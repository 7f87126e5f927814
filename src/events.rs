//! Release events: one shared pub/sub connection per client wakes its waiting obtains the
//! moment a lock is released, instead of leaving them to poll.
//!
//! A background task owns the connection. Waiters register interest in a key's release
//! channel; the first waiter of a channel subscribes, the last one to leave unsubscribes,
//! and every command to the server goes through the task in order, so subscribing and
//! unsubscribing never race. When the connection drops, the task reconnects and subscribes
//! again; meanwhile waiters keep their retry strategy's polling, so nobody hangs.
//!
//! Each release wakes **one** waiter of this client per channel (`Notify::notify_one`): the
//! lock can only go to one of them, so waking all would send N scripts for one winner. The
//! woken waiter either obtains the lock, and its own release later wakes the next one, or
//! finds it taken by another client and waits again; the others keep their polling fallback.
//!
//! A release by this very client hands over without the pub/sub round trip: as soon as the
//! release script is queued on the connection, one local waiter is woken, and its obtain is
//! queued behind the release on the same connection, so Redis runs it right after the keys
//! are deleted. The announcement that then arrives for that release is not passed on, so
//! the hand-over wakes one waiter, not two.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::{Notify, mpsc, oneshot};

/// How long the task waits before reconnecting after the connection failed.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// The release events of one client (shared by its clones).
#[derive(Clone)]
pub(crate) struct Events {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    channels: Arc<Mutex<Channels>>,
    /// `channels.len()`, readable without the lock on every release.
    watched: Arc<AtomicUsize>,
    commands: mpsc::UnboundedSender<Command>,
    /// The task's end of `commands`, until the task is started by the first waiter.
    pending: Mutex<Option<mpsc::UnboundedReceiver<Command>>>,
}

/// Channels somebody waits on: how many waiters, and how to wake one.
type Channels = HashMap<String, Channel>;

struct Channel {
    waiters: usize,
    notify: Arc<Notify>,
    /// Announcements still to come for releases already handed over locally.
    handed_over: usize,
}

enum Command {
    /// Subscribe, and say whether the server confirmed.
    Subscribe(String, oneshot::Sender<bool>),
    /// Unsubscribe, unless a waiter came back meanwhile.
    Unsubscribe(String),
}

impl Events {
    /// Release events over pub/sub connections opened from `client`. Nothing is sent until
    /// the first waiter subscribes.
    pub(crate) fn new(client: redis::Client) -> Self {
        let (commands, pending) = mpsc::unbounded_channel();
        Self {
            inner: Arc::new(Inner {
                client,
                channels: Arc::default(),
                watched: Arc::default(),
                commands,
                pending: Mutex::new(Some(pending)),
            }),
        }
    }

    /// Registers interest in `channel` and, for its first waiter, subscribes to it. Returns
    /// once the server confirmed the subscription, or failed to (then the waiter only polls
    /// until the subscriber reconnects).
    pub(crate) async fn subscribe(&self, channel: &str) -> Subscription {
        self.start();
        let (notify, first) = {
            let mut channels = lock(&self.inner.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    waiters: 0,
                    notify: Arc::new(Notify::new()),
                    handed_over: 0,
                });
            entry.waiters += 1;
            let joined = (entry.notify.clone(), entry.waiters == 1);
            self.inner.watched.store(channels.len(), Ordering::Relaxed);
            joined
        };
        let subscription = Subscription {
            events: self.clone(),
            channel: channel.to_owned(),
            notify,
        };
        if first {
            let (confirmed, confirmation) = oneshot::channel();
            let command = Command::Subscribe(channel.to_owned(), confirmed);
            if self.inner.commands.send(command).is_ok() {
                let _ = confirmation.await;
            }
        }
        subscription
    }

    /// Wakes one local waiter of `channel` for a release this client is sending; true when
    /// somebody was waiting.
    pub(crate) fn hand_over(&self, channel: &str) -> bool {
        let mut channels = lock(&self.inner.channels);
        let Some(entry) = channels.get_mut(channel) else {
            return false;
        };
        entry.handed_over += 1;
        entry.notify.notify_one();
        true
    }

    /// How many channels have waiters now.
    pub(crate) fn channels(&self) -> usize {
        self.inner.watched.load(Ordering::Relaxed)
    }

    /// Starts the subscriber task on first use.
    fn start(&self) {
        let Some(commands) = lock(&self.inner.pending).take() else {
            return;
        };
        let (client, channels) = (self.inner.client.clone(), self.inner.channels.clone());
        tokio::spawn(subscriber(client, channels, commands));
    }
}

/// A waiter's interest in one release channel; unsubscribes when the last one is dropped.
pub(crate) struct Subscription {
    events: Events,
    channel: String,
    notify: Arc<Notify>,
}

impl Subscription {
    /// Completes when a release was announced on this channel (one waiter per announcement).
    pub(crate) async fn released(&self) {
        self.notify.notified().await;
    }

    /// The channel this subscription listens on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.events.inner.channels);
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            channels.remove(&self.channel);
            self.events
                .inner
                .watched
                .store(channels.len(), Ordering::Relaxed);
            let command = Command::Unsubscribe(self.channel.clone());
            let _ = self.events.inner.commands.send(command);
        }
    }
}

/// The subscriber task: owns the pub/sub connection, runs commands in order, dispatches
/// messages, and reconnects. Ends when the client and all its clones are gone.
async fn subscriber(
    client: redis::Client,
    channels: Arc<Mutex<Channels>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    loop {
        match client.get_async_pubsub().await {
            Ok(connection) => {
                if serve(connection, &channels, &mut commands).await.is_break() {
                    return;
                }
                tracing::warn!("release-event connection lost; waiters poll until it is back");
            }
            Err(err) => tracing::warn!(%err, "release-event connection failed; retrying"),
        }
        if refuse_until(RECONNECT_PAUSE, &mut commands)
            .await
            .is_break()
        {
            return;
        }
    }
}

/// Serves one connection until it fails (`Continue`) or the client is gone (`Break`).
///
/// Commands are taken in batches and reconciled against what the server has: for every
/// channel a batch touches, subscribe when waiters want it and the server does not have it,
/// unsubscribe in the opposite case. One SUBSCRIBE and one UNSUBSCRIBE per batch, however
/// fast waiters come and go, so the queue cannot grow faster than it drains.
async fn serve(
    connection: redis::aio::PubSub,
    channels: &Mutex<Channels>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> std::ops::ControlFlow<()> {
    use std::ops::ControlFlow::{Break, Continue};

    let (mut sink, mut stream) = connection.split();
    // Subscriptions from before a reconnect.
    let mut subscribed: HashSet<String> = lock(channels).keys().cloned().collect();
    if !subscribed.is_empty()
        && sink
            .subscribe(subscribed.iter().collect::<Vec<_>>())
            .await
            .is_err()
    {
        return Continue(());
    }
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            received = commands.recv_many(&mut batch, BATCH) => {
                if received == 0 {
                    return Break(());
                }
                if !reconcile(&mut batch, channels, &mut subscribed, &mut sink).await {
                    return Continue(());
                }
            }
            message = stream.next() => match message {
                None => return Continue(()),
                Some(message) => {
                    if let Some(entry) = lock(channels).get_mut(message.get_channel_name()) {
                        if entry.handed_over > 0 {
                            entry.handed_over -= 1;
                        } else {
                            entry.notify.notify_one();
                        }
                    }
                }
            },
        }
    }
}

/// Most commands taken at once.
const BATCH: usize = 1024;

/// Brings the server's subscriptions in line with the waiters for every channel in
/// `batch`, then confirms the batch's subscriptions. False when the connection failed.
async fn reconcile(
    batch: &mut Vec<Command>,
    channels: &Mutex<Channels>,
    subscribed: &mut HashSet<String>,
    sink: &mut redis::aio::PubSubSink,
) -> bool {
    let mut touched = HashSet::new();
    let mut confirmations = Vec::new();
    for command in batch.drain(..) {
        match command {
            Command::Subscribe(channel, confirmed) => {
                touched.insert(channel);
                confirmations.push(confirmed);
            }
            Command::Unsubscribe(channel) => {
                touched.insert(channel);
            }
        }
    }
    let (mut add, mut remove) = (Vec::new(), Vec::new());
    {
        let wanted = lock(channels);
        for channel in touched {
            match (wanted.contains_key(&channel), subscribed.contains(&channel)) {
                (true, false) => add.push(channel),
                (false, true) => remove.push(channel),
                _ => {}
            }
        }
    }
    let mut ok = true;
    if !remove.is_empty() {
        ok = sink.unsubscribe(&remove).await.is_ok();
        for channel in &remove {
            subscribed.remove(channel);
        }
    }
    if ok && !add.is_empty() {
        ok = sink.subscribe(&add).await.is_ok();
        if ok {
            subscribed.extend(add);
        }
    }
    for confirmed in confirmations {
        let _ = confirmed.send(ok);
    }
    ok
}

/// While disconnected: answer subscriptions with "not confirmed" for `pause`.
async fn refuse_until(
    pause: Duration,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> std::ops::ControlFlow<()> {
    let until = tokio::time::Instant::now() + pause;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => return std::ops::ControlFlow::Continue(()),
            command = commands.recv() => match command {
                None => return std::ops::ControlFlow::Break(()),
                Some(Command::Subscribe(_, confirmed)) => {
                    let _ = confirmed.send(false);
                }
                Some(Command::Unsubscribe(_)) => {}
            },
        }
    }
}

/// Locks a mutex; a panic elsewhere while holding it leaves the map consistent enough.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `future` up to its first pending point (for a Redis command: queued on the
/// connection), then `then`, then the rest of `future`.
pub(crate) async fn after_queueing<F: std::future::Future>(
    future: F,
    then: impl FnOnce(),
) -> F::Output {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
    then();
    match first {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => future.await,
    }
}
