//! Following the primary: looking it up by a majority of the sentinels, checking it every few
//! seconds and on each `+switch-master`, and what a lookup learns (the replicas a promotion
//! could choose, a primary restarted empty) for the writes that count on it.

use super::*;

use std::sync::MutexGuard;

impl Follower {
    /// The current primary, looked up when none is known.
    pub(super) async fn primary(self: &Arc<Self>) -> RedisResult<Primary> {
        if let Some(primary) = lock(&self.current).clone() {
            return Ok(primary);
        }
        let _one = self.lookup.lock().await;
        if let Some(primary) = lock(&self.current).clone() {
            return Ok(primary);
        }
        if let Some((at, err)) = lock(&self.failed).clone()
            && at.elapsed() < LOOKUP_PAUSE
        {
            return Err(err);
        }
        match self.look_up().await {
            Ok(primary) => {
                *lock(&self.failed) = None;
                *lock(&self.current) = Some(primary.clone());
                let address = Some((primary.host.clone(), primary.port));
                let moved = std::mem::replace(&mut *lock(&self.last), address.clone()) != address;
                if moved {
                    tracing::info!(host = %primary.host, port = primary.port, epoch = primary.epoch, replicas = primary.replicas.len(), "following the primary");
                    self.changes.send_modify(|n| *n += 1);
                }
                if primary.restarted_empty.is_some() {
                    tracing::warn!(host = %primary.host, port = primary.port, "the primary restarted without its data: it grants no lock until the longest TTL in use has passed since its start");
                }
                self.watch_switches();
                Ok(primary)
            }
            Err(err) => {
                *lock(&self.failed) = Some((Instant::now(), err.clone()));
                Err(err)
            }
        }
    }

    /// Asks the sentinels for the primary and connects to it (see the module's docs).
    pub(super) async fn look_up(&self) -> RedisResult<Primary> {
        let census = self.ask_sentinels(false).await;
        let Some(elected) = census.elected() else {
            return Err(census.failure(&self.config.master));
        };
        let dissent = census.dissent(&elected);
        if !dissent.is_empty() {
            tracing::warn!(master = %self.config.master, host = %elected.host, port = elected.port, dissent = %dissent.join("; "), "sentinels disagree on the primary; following the majority");
        }
        if elected.failing_over {
            return Err(unavailable(format!(
                "a failover of {:?} is under way: {}",
                self.config.master,
                census.describe().join("; ")
            )));
        }
        let (conn, facts) = self
            .connect_primary(&elected.host, elected.port, &elected.witness)
            .await?;
        if !facts.is_primary {
            return Err(unavailable(format!(
                "{}:{}, which the sentinels name, is not a primary (a failover under way)",
                elected.host, elected.port
            )));
        }
        Ok(Primary {
            conn,
            host: elected.host,
            port: elected.port,
            epoch: elected.epoch,
            generation: self.lookups.fetch_add(1, Ordering::Relaxed) + 1,
            replicas: elected.replicas.into(),
            restarted_empty: facts.restarted_empty,
        })
    }

    /// What the sentinels say of the master: every answer until a majority of the
    /// configured sentinels agrees (see `census.rs`), or every answer within its time limit
    /// with `everyone`.
    pub(super) async fn ask_sentinels(&self, everyone: bool) -> Census {
        let config = &self.config;
        let mut census = Census::new(config.sentinels.len());
        let mut answers: futures_util::stream::FuturesUnordered<_> = config
            .sentinels
            .iter()
            .map(|sentinel| async move {
                (
                    sentinel.addr().to_string(),
                    self.ask_sentinel(sentinel).await,
                )
            })
            .collect();
        while let Some((sentinel, answer)) = answers.next().await {
            census.add(sentinel, answer);
            if !everyone && census.decided() {
                break;
            }
        }
        census
    }

    /// What one sentinel says of the master (see [`census::parse_answer`]).
    pub(super) async fn ask_sentinel(&self, sentinel: &ConnectionInfo) -> Answer {
        let config = &self.config;
        let asked = async {
            let mut conn = config
                .client(sentinel.clone())?
                .get_multiplexed_async_connection_with_config(&config.connection_config())
                .await?;
            // The address a client should use (during a failover, the replica being
            // promoted), the master's epoch and state, its replicas, and how long this
            // sentinel has been up.
            let mut ask = redis::pipe();
            ask.cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&config.master)
                .cmd("SENTINEL")
                .arg("MASTER")
                .arg(&config.master)
                .cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(&config.master)
                .cmd("INFO")
                .arg("server")
                .ignore_errors();
            ask.query_async::<Vec<Value>>(&mut conn).await
        };
        let limit = config.connection_timeout + config.response_timeout;
        match tokio::time::timeout(limit, asked).await {
            Err(_) => Answer::Failed(unavailable(format!(
                "sentinel {} did not answer in {limit:?}",
                sentinel.addr()
            ))),
            Ok(Err(err)) => Answer::Failed(err),
            Ok(Ok(replies)) => census::parse_answer(&replies),
        }
    }

    /// A connection to the server at `host:port`, and what it says of itself (see
    /// `primary.rs`), given what the sentinels know of its past.
    pub(super) async fn connect_primary(
        &self,
        host: &str,
        port: u16,
        witness: &Witness,
    ) -> RedisResult<(MultiplexedConnection, Facts)> {
        let config = &self.config;
        let client = config.node_client(host, port)?;
        let connected = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config.connection_config())
                .await?;
            let replies: Vec<Value> = primary::ask().query_async(&mut conn).await?;
            if let Some(err) = primary::refusal(&replies) {
                return Err(err);
            }
            RedisResult::Ok((conn, Facts::parse(&replies, witness)))
        };
        let limit = config.connection_timeout + config.response_timeout;
        tokio::time::timeout(limit, connected)
            .await
            .unwrap_or_else(|_| {
                Err(unavailable(format!(
                    "{host}:{port} did not answer in {limit:?}"
                )))
            })
    }

    /// Whether the server at `host:port` answers that it is a primary (one that cannot be
    /// reached in time is not).
    pub(super) async fn is_primary_at(&self, host: &str, port: u16) -> bool {
        matches!(
            self.connect_primary(host, port, &Witness::default()).await,
            Ok((_, facts)) if facts.is_primary
        )
    }

    /// Forgets the primary: the next request looks it up again.
    pub(super) fn forget(&self, host: &str, port: u16) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_some_and(|primary| primary.port == port && primary.host == host)
        {
            tracing::info!(%host, port, "the primary failed or was demoted; asking the sentinels again");
            *current = None;
        }
    }

    /// The sentinels announced a new primary: forget the old one, and tell release events.
    pub(super) fn switched(&self) {
        self.let_go(lock(&self.current));
    }

    /// Forgets the primary `current` guards (the next request looks it up again) and tells
    /// release events, which listen on the primary, that it changed. Takes the guard that
    /// the caller decided under, so that a lookup in between is not the one forgotten.
    fn let_go(&self, mut current: MutexGuard<'_, Option<Primary>>) {
        current.take();
        drop(current);
        self.changes.send_modify(|n| *n += 1);
    }

    /// After a request to `primary` failed with `err`, or answered `reply`: forgets the
    /// primary when it is gone or demoted, and checks with the sentinels in the background
    /// when it only timed out (a paused primary may have been replaced meanwhile).
    pub(super) fn after(
        self: &Arc<Self>,
        primary: &Primary,
        failure: Option<&RedisError>,
        replies: &[Value],
    ) {
        let demoted = replies.iter().any(is_read_only);
        match failure {
            Some(err) if err.is_timeout() => self.check_soon(),
            Some(err)
                if err.is_connection_dropped()
                    || err.is_connection_refusal()
                    || err.is_io_error() =>
            {
                self.forget(&primary.host, primary.port);
            }
            Some(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                self.forget(&primary.host, primary.port);
            }
            _ if demoted => self.forget(&primary.host, primary.port),
            _ => {}
        }
    }

    /// Asks the sentinels, in the background, whether the primary is still the one they
    /// name; forgets it when not.
    pub(super) fn check_soon(self: &Arc<Self>) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = tokio::runtime::Handle::try_current().map(|runtime| {
            runtime.spawn(async move {
                if let Some(follower) = me.upgrade() {
                    follower.check().await;
                    follower.checking.store(false, Ordering::Release);
                }
            })
        });
        if spawned.is_err() {
            self.checking.store(false, Ordering::Release);
        }
    }

    /// Whether a majority of the sentinels still names the current primary: forgets it when
    /// they name another; else takes their count of replicas.
    pub(super) async fn check(&self) {
        let census = self.ask_sentinels(false).await;
        if let Some(elected) = census.elected() {
            self.compare(&elected);
        }
    }

    /// Compares what a majority of the sentinels said with the current primary: forgets it
    /// (announcing the change) when they name another address or a newer epoch, else
    /// takes their count of replicas. Whether it is still the deployment's primary.
    pub(super) fn compare(&self, elected: &Elected) -> bool {
        let mut current = lock(&self.current);
        let Some(primary) = current.as_mut() else {
            return false;
        };
        if names_another(elected, &primary.host, primary.port, primary.epoch) {
            tracing::info!(host = %primary.host, port = primary.port, new_host = %elected.host, new_port = elected.port, epoch = elected.epoch, "the sentinels name a new primary, or a newer epoch");
            self.let_go(current);
            return false;
        }
        primary.replicas = elected.replicas.clone().into();
        true
    }

    /// Whether a majority of the sentinels names the current primary, up, at its epoch,
    /// with no failover under way anywhere (every sentinel is asked): then the primary is
    /// still the deployment's. When they name another primary or a higher epoch, a
    /// promotion is under way: the primary is forgotten (and the change announced), and
    /// the answer is no, as it is when no majority answers.
    pub(super) async fn confirm(&self) -> bool {
        let census = self.ask_sentinels(true).await;
        let Some(elected) = census.elected() else {
            return false;
        };
        // A failover under way names the old primary until the promotion is seen.
        self.compare(&elected) && !elected.down && !elected.failing_over
    }

    /// Heard `+switch-master` (its `payload`): forgets the primary (announcing the change),
    /// unless the address announced is the one followed already. The sentinel that leads a
    /// failover announces it only once it has reconfigured the replicas, seconds after the
    /// others named the new primary; a client that looked it up meanwhile follows it
    /// already, and forgetting it would undo the obtains on their way there (see
    /// `Store::obtain`). The sentinels are asked again right after (`watch_switches`): a
    /// majority naming a newer epoch (a failover back to it that this client missed) still
    /// has it forgotten; while no majority answers, the next check (every few seconds) or a
    /// failed request does, as after an announcement this client did not hear.
    pub(super) fn announced(&self, payload: &[u8]) {
        let announced = announced_address(payload);
        // Compared and forgotten under one lock: a lookup in between is not forgotten.
        let current = lock(&self.current);
        let followed = current
            .as_ref()
            .zip(announced.as_ref())
            .is_some_and(|(primary, (host, port))| primary.host == *host && primary.port == *port);
        if followed {
            tracing::debug!(master = %self.config.master, "a sentinel announced the switch to the primary followed already");
            return;
        }
        self.let_go(current);
        // Logged after the lock is let go: every request takes it.
        tracing::info!(master = %self.config.master, "the sentinels switched the primary");
    }

    /// Starts listening for `+switch-master` (once).
    pub(super) fn watch_switches(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        if tokio::runtime::Handle::try_current()
            .map(|runtime| runtime.spawn(watch_switches(me)))
            .is_err()
        {
            self.watching.store(false, Ordering::Release);
        }
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next one when it fails), and
/// asks all sentinels every [`CHECK_EVERY`] and after each reconnect; ends with the last
/// clone of the connection.
pub(super) async fn watch_switches(follower: Weak<Follower>) {
    let mut next = 0;
    loop {
        let Some((sentinel, config)) = follower.upgrade().map(|f| {
            let sentinels = &f.config.sentinels;
            (sentinels[next % sentinels.len()].clone(), f.config.clone())
        }) else {
            return;
        };
        next += 1;
        let limit = config.connection_timeout + config.response_timeout;
        let subscribed = tokio::time::timeout(limit, async {
            let mut pubsub = config.client(sentinel.clone())?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        })
        .await;
        let Ok(Ok(pubsub)) = subscribed else {
            tokio::time::sleep(LOOKUP_PAUSE * 5).await;
            continue;
        };
        let (mut sink, mut messages) = pubsub.split();
        let mut prefix = config.master.clone().into_bytes();
        prefix.push(b' ');
        loop {
            // An announcement may have been missed while not subscribed, or this sentinel
            // may be cut off: ask every sentinel now and then.
            match follower.upgrade() {
                Some(f) => f.check().await,
                None => return,
            }
            let until = Instant::now() + CHECK_EVERY;
            let heard = loop {
                tokio::select! {
                    message = messages.next() => match message {
                        Some(message) if message.get_payload_bytes().starts_with(&prefix) => {
                            break Heard::Switch(message.get_payload_bytes().to_vec());
                        }
                        Some(_) => {}
                        None => break Heard::Gone,
                    },
                    () = tokio::time::sleep_until(until) => break Heard::Nothing,
                }
            };
            match heard {
                Heard::Switch(announced) => match follower.upgrade() {
                    Some(f) => f.announced(&announced),
                    None => return,
                },
                // A sentinel that stopped answering is left for the next.
                Heard::Nothing => {
                    let pinged = tokio::time::timeout(limit, sink.ping::<Value>()).await;
                    if !matches!(pinged, Ok(Ok(_))) {
                        break;
                    }
                }
                Heard::Gone => break,
            }
        }
    }
}

/// What the sentinel a follower listens to said within a check's period.
enum Heard {
    /// A `+switch-master` of the followed master (its payload).
    Switch(Vec<u8>),
    /// Nothing of the master.
    Nothing,
    /// The subscription ended.
    Gone,
}

/// Whether what a majority of the sentinels said, `elected`, names another primary than the
/// one followed at `host`:`port` with `epoch`: another address, or the same one at a newer
/// epoch (a failover away and back that this client missed: it may have restarted empty, or
/// been a replica meanwhile).
fn names_another(elected: &Elected, host: &str, port: u16, epoch: u64) -> bool {
    elected.host != host || elected.port != port || elected.epoch > epoch
}

/// The new address a `+switch-master` payload announces (`<master> <old ip> <old port>
/// <new ip> <new port>`).
fn announced_address(payload: &[u8]) -> Option<(String, u16)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.rsplit(' ');
    let port = words.next()?.parse().ok()?;
    let host = words.next()?;
    Some((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::{announced_address, names_another};
    use crate::topology::sentinel::census::Elected;

    fn elected(host: &str, port: u16, epoch: u64) -> Elected {
        Elected {
            host: host.to_owned(),
            port,
            epoch,
            down: false,
            failing_over: false,
            replicas: Vec::new(),
            witness: Default::default(),
        }
    }

    #[test]
    fn another_address_or_a_newer_epoch_names_another_primary() {
        let (host, port, epoch) = ("127.0.0.1", 6380, 3);
        let names_another = |elected| names_another(&elected, host, port, epoch);
        assert!(!names_another(elected(host, port, epoch)));
        // An older epoch is a sentinel that has not heard of the last failover yet.
        assert!(!names_another(elected(host, port, 2)));
        assert!(names_another(elected(host, port, 4)));
        assert!(names_another(elected(host, 6381, epoch)));
        assert!(names_another(elected("127.0.0.2", port, epoch)));
    }

    #[test]
    fn an_announcement_names_the_new_address_last() {
        let said = b"locks 127.0.0.1 6379 127.0.0.1 6380";
        assert_eq!(
            announced_address(said),
            Some(("127.0.0.1".to_owned(), 6380))
        );
        assert_eq!(announced_address(b"locks 127.0.0.1 6379 ::1 x"), None);
        assert_eq!(announced_address(b"6380"), None);
    }
}
