//! The pub/sub connection behind release events: subscribing and unsubscribing channels,
//! dispatching pushes to waiters, following a Sentinel primary, and sweeping idle channels.

use super::*;

impl Inner {
    /// Whether `channel` still has waiters and this subscription `state` (the sweeper did
    /// not forget it).
    pub(super) fn is_wanted(&self, channel: &str, state: &ChannelState) -> bool {
        lock(&self.channels).get(channel).is_some_and(|entry| {
            entry.waiters > 0 && std::ptr::eq(Arc::as_ptr(&entry.state), state)
        })
    }

    /// The generation of the listener now.
    pub(super) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Completes once the listener of `generation` has been replaced.
    pub(super) async fn replaced(&self, generation: u64) {
        let mut generations = self.generation.subscribe();
        // The sender lives as long as `self`: the wait ends only by a replacement.
        let _ = generations.wait_for(|now| *now != generation).await;
    }

    /// Whether subscribing is paused after the server refused it: any channel, or (`own`)
    /// the client's own hand-off channels.
    pub(super) fn refused(&self, own: bool) -> bool {
        let paused = |until: &Mutex<Option<Instant>>| {
            lock(until).is_some_and(|until| Instant::now() < until)
        };
        paused(&self.refused_until) || (own && paused(&self.own_refused_until))
    }

    /// A request on the pub/sub connection failed (for one of the client's own hand-off
    /// channels when `own`). A refusal by the server pauses subscribing: every channel, or
    /// only hand-off channels when one of those was refused (their waiters hear their
    /// hand-offs on the keys' channels meanwhile). Connection failures, a few in a row,
    /// replace the connection.
    pub(super) fn failed(&self, err: &RedisError, own: bool) {
        if matches!(err.kind(), redis::ErrorKind::Server(_)) {
            let mut until = lock(match own {
                true => &self.own_refused_until,
                false => &self.refused_until,
            });
            if until.is_none() {
                match own {
                    true => {
                        tracing::info!(%err, "the server refuses hand-off channels; fair waiters hear their hand-offs on the keys' channels")
                    }
                    false => {
                        tracing::warn!(%err, "the server refuses release-event subscriptions; waiters poll")
                    }
                }
            }
            *until = Some(Instant::now() + REFUSED_PAUSE);
            return;
        }
        tracing::debug!(%err, "release-event connection failed; waiters poll meanwhile");
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_BEFORE_RECONNECT {
            tracing::warn!("release-event connection keeps failing; opening a new one");
            self.replace_listener();
        }
    }

    /// Drops the connection (it may be half-open): every subscription is gone, and one
    /// waiter per channel is woken to subscribe again.
    pub(super) fn replace_listener(&self) {
        self.failures.store(0, Ordering::Relaxed);
        // The generation moves before the slot is emptied: a connection opened meanwhile
        // sees the new generation when it is about to be stored, and is not (`listener`).
        self.generation.send_modify(|generation| *generation += 1);
        lock(&self.listener).take();
        self.lapse_all();
    }

    /// The server lost every subscription: mark them gone, wake one waiter per channel now,
    /// and another once its subscription is back.
    pub(super) fn lapse_all(&self) {
        for entry in lock(&self.channels).values_mut() {
            entry.state.unsubscribed();
            entry.lapsed = true;
            if entry.waiters > 0 {
                entry.missed();
            }
        }
    }

    /// Opens the pub/sub connection of `generation`, with pushes handled by
    /// [`Inner::on_push`].
    pub(super) async fn connect(&self, me: Weak<Self>, generation: u64) -> RedisResult<Conn> {
        let on_push = move |push: PushInfo| match me.upgrade() {
            Some(inner) => {
                inner.on_push(push, generation);
                Ok(())
            }
            None => Err(()),
        };
        match &self.source {
            Source::Server(client) => Self::connect_server(client, on_push),
            Source::Sentinel(sentinel) => {
                let client = sentinel.primary_client().await?;
                Self::connect_server(&client, on_push)
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(nodes) => {
                let conn = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(on_push)
                    .connection_timeout(REQUEST_TIMEOUT)
                    .response_timeout(REQUEST_TIMEOUT)
                    .build()?
                    .get_async_connection()
                    .await?;
                Ok(Conn::Cluster {
                    conn,
                    sharded: Arc::new(AtomicBool::new(true)),
                })
            }
        }
    }

    /// A connection to the server behind `client` that hands its pushes to `on_push`.
    pub(super) fn connect_server(
        client: &redis::Client,
        on_push: impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static,
    ) -> RedisResult<Conn> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let config = ConnectionManagerConfig::new()
            .set_push_sender(on_push)
            .set_automatic_resubscription()
            .set_connection_timeout(Some(REQUEST_TIMEOUT))
            .set_response_timeout(Some(REQUEST_TIMEOUT))
            .set_max_delay(REQUEST_TIMEOUT);
        // Connects on the first request, within its caller's time limit.
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Conn::Server(conn))
    }

    /// Handles one push from the pub/sub connection of `generation`, without waiting for
    /// anything.
    pub(super) fn on_push(&self, push: PushInfo, generation: u64) {
        let channel = push.data.first().and_then(bytes);
        // A replaced connection (it may linger a while) says nothing about today's
        // subscriptions; its messages are still releases.
        let current = generation == self.generation();
        match (push.kind, channel) {
            (PushKind::Message | PushKind::SMessage, Some(channel)) => {
                let payload = push.data.get(1).and_then(bytes).unwrap_or_default();
                self.announced(channel, payload);
            }
            _ if !current => {}
            (PushKind::Subscribe | PushKind::SSubscribe, Some(channel)) => {
                self.with_channel(channel, |_, entry| {
                    entry.state.subscribed.send_replace(Some(generation));
                    if std::mem::take(&mut entry.lapsed) && entry.waiters > 0 {
                        entry.missed();
                    }
                });
            }
            // Our own unsubscribes forget the subscription before they are sent; any other
            // comes from the server (a cluster slot moved away).
            (PushKind::Unsubscribe | PushKind::SUnsubscribe, Some(channel)) => {
                self.with_channel(channel, |_, entry| {
                    if entry.state.unsubscribed() && entry.waiters > 0 {
                        entry.lapsed = true;
                        entry.missed();
                    }
                });
            }
            (PushKind::Disconnection, _) => self.lapse_all(),
            _ => {}
        }
    }

    /// A release was announced on `channel`: wake one waiter, unless the release was handed
    /// over here already, or heard from another master of the quorum.
    pub(super) fn announced(&self, channel: &[u8], payload: &[u8]) {
        self.with_channel(channel, |name, entry| {
            if entry.waiters == 0 {
                return;
            }
            // A hand-off: it wakes the waiter it names, if it is one of ours.
            if payload.starts_with(b"g") {
                if let Some(handed) = Handed::parse(payload)
                    && let Some(grant) = entry.grants.get(handed.id.as_bytes())
                {
                    *lock(&grant.handed) = Some(handed);
                    grant.notify.notify_one();
                }
                return;
            }
            entry
                .expected
                .retain(|(_, since)| since.elapsed() < REMEMBER_FOR);
            if let Some(handed_over) = entry.expected.iter().position(|(p, _)| &**p == payload) {
                entry.expected.swap_remove(handed_over);
                return;
            }
            let first = payload.is_empty()
                || self
                    .heard
                    .as_ref()
                    .is_none_or(|heard| heard.wakes(name, payload));
            if first {
                entry.wake();
            }
        });
    }

    pub(super) fn with_channel(&self, channel: &[u8], f: impl FnOnce(&str, &mut Channel)) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(entry) = lock(&self.channels).get_mut(channel) {
            f(channel, entry);
        }
    }
}

impl Conn {
    pub(super) async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Self::Server(conn) => conn.clone().subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, sharded } => {
                let mut conn = conn.clone();
                if sharded.load(Ordering::Relaxed) {
                    match conn.ssubscribe(channel).await {
                        Err(err) if is_unknown_command(&err) => {
                            // Redis before 7.0: releases are announced with PUBLISH there.
                            sharded.store(false, Ordering::Relaxed);
                        }
                        other => return other,
                    }
                }
                conn.subscribe(channel).await
            }
        }
    }

    /// Unsubscribes `channels`, each attempted even when another fails.
    pub(super) async fn unsubscribe(&self, channels: &[String]) -> RedisResult<()> {
        match self {
            Self::Server(conn) => conn.clone().unsubscribe(channels).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, sharded } => {
                let mut conn = conn.clone();
                if !sharded.load(Ordering::Relaxed) {
                    return conn.unsubscribe(channels).await;
                }
                // Sharded channels live on their slots' shards: one command each.
                let mut outcome = Ok(());
                for channel in channels {
                    if let Err(err) = conn.sunsubscribe(channel).await {
                        outcome = Err(err);
                    }
                }
                outcome
            }
        }
    }

    pub(super) async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        match self {
            Self::Server(conn) => ping.exec_async(&mut conn.clone()).await,
            #[cfg(feature = "cluster")]
            Self::Cluster { conn, .. } => ping.exec_async(&mut conn.clone()).await,
        }
    }
}

/// Replaces the pub/sub connection whenever the primary of a Sentinel deployment changes:
/// every subscription is made again on the new primary, and every waiter is woken (a release
/// may have gone unheard).
pub(super) async fn follow_primary(inner: Weak<Inner>, mut changes: watch::Receiver<u64>) {
    while changes.changed().await.is_ok() {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        tracing::debug!("the primary changed; release events subscribe again there");
        inner.replace_listener();
    }
}

/// Unsubscribes channels that nobody waited for during [`IDLE`], in batches, and pings the
/// connection while somebody waits, until the client is gone.
pub(super) async fn sweeper(inner: Weak<Inner>) {
    let mut last_ping = Instant::now();
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        sweep(&inner).await;
        if last_ping.elapsed() >= PING_EVERY && inner.watched.load(Ordering::Relaxed) > 0 {
            last_ping = Instant::now();
            let listener = lock(&inner.listener).clone();
            if let Some(listener) = listener
                && let Err(err) = listener.conn.ping().await
            {
                inner.failed(&err, false);
            }
        }
    }
}

pub(super) async fn sweep(inner: &Inner) {
    // Take each idle channel's operation lock (skipping busy ones), so that no SUBSCRIBE of
    // the same channel can overtake the UNSUBSCRIBE, and forget the subscription under the
    // channels' lock, so that no new waiter takes it for live in between.
    let idle: Vec<(String, tokio::sync::OwnedMutexGuard<()>)> = {
        let channels = lock(&inner.channels);
        channels
            .iter()
            .filter(|(_, c)| c.waiters == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= IDLE))
            .filter_map(|(name, c)| {
                let guard = c.state.op.clone().try_lock_owned().ok()?;
                // Also channels not known to be subscribed: a SUBSCRIBE whose confirmation
                // came too late for its waiter may still have reached the server.
                c.state.unsubscribed();
                Some((name.clone(), guard))
            })
            .collect()
    };
    if idle.is_empty() {
        return;
    }
    let listener = lock(&inner.listener).clone();
    if let Some(listener) = listener {
        let names: Vec<String> = idle.iter().map(|(name, _)| name.clone()).collect();
        // Bounded batches: one command and its confirmations never hold the server long.
        for batch in names.chunks(UNSUBSCRIBE_BATCH) {
            if let Err(err) = listener.conn.unsubscribe(batch).await {
                tracing::debug!(%err, "unsubscribing idle release channels failed");
            }
        }
    }
    let mut channels = lock(&inner.channels);
    for (name, _guard) in &idle {
        if channels.get(name).is_some_and(|c| c.waiters == 0) {
            channels.remove(name);
            inner.known.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A push's bulk string.
pub(super) fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        _ => None,
    }
}
