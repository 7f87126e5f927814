//! Obtaining: one key or several, adopting a lock by its token, and the scoped `with_lock`;
//! the call's checks and its loop of attempts (see `attempt.rs`).

use super::*;

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Locks one key for `ttl`.
    ///
    /// Tries once, then retries per `options`' [`Retry`](crate::Retry) strategy until the
    /// deadline: an explicit [`Options::timeout`] or [`Options::deadline`], or else **the
    /// TTL itself**. The TTL is rounded up to whole milliseconds and must be at least 1 ms.
    ///
    /// # Errors
    ///
    /// [`Error::NotObtained`] or [`Error::DeadlineExceeded`] when someone else holds the key
    /// ([`Error::is_not_obtained`] covers both); [`Error::InvalidInput`] for an empty key,
    /// a bad TTL or an empty token (nothing is sent); [`Error::WrongType`] when the key holds
    /// a non-string value; [`Error::UnknownOutcome`] when Redis did not answer in time;
    /// [`Error::Redis`] for other Redis failures.
    pub async fn obtain(
        &self,
        key: impl IntoKey,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        let (keys, modes) = mode::split(std::iter::once(key));
        self.obtain_keys(keys, modes, ttl, options).await
    }

    /// Locks every key of `keys` for `ttl`, all or nothing: either every key is locked or
    /// none is touched.
    ///
    /// `keys` may be any collection or iterator of string-like keys (see [`IntoKey`]):
    /// `["a", "b"]`, `&["a", "b"]`, `&vec_of_strings`, `vec_of_strings`, `&[String]`, an
    /// iterator of `&str` or `String`.
    ///
    /// Retries and errors as [`Client::obtain`]; additionally rejects an empty set,
    /// duplicate keys, more than [`MAX_KEYS`](crate::MAX_KEYS) keys, and a fencing counter
    /// that is one of the keys, before sending.
    pub async fn obtain_multi<I>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let (keys, modes) = mode::split(keys);
        self.obtain_keys(keys, modes, ttl, options).await
    }

    /// A handle on the lock that `options`' token holds on `keys` now, made elsewhere: by
    /// another process that passed the token on, or before a restart. One TTL query checks
    /// that every key is held by the token, and the handle's validity counts from when it
    /// was sent, for the smallest remaining TTL. Nothing is written, except on a client with
    /// [replicated writes](crate::Replication): there the primary's TTL may be ahead of
    /// what its replicas acknowledged (a refresh applied and not acknowledged), so the
    /// remaining TTL is set again and waited for, and the validity counts from that write,
    /// as a refresh's does (too few acknowledgements: [`Error::NotReplicated`]). `ttl` is what its
    /// refreshes (and a guard's watchdog) extend to; its metadata is `options`' metadata.
    /// The handle has no fencing token.
    ///
    /// See the guide: [the command line](crate::guide::command_line).
    ///
    /// Unlike a re-obtain by the same token, this never takes keys that are free: a lock
    /// that expired stays lost.
    ///
    /// ```no_run
    /// # async fn demo(client: lockset::Client, token: String) -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::Options;
    ///
    /// let options = Options::default().token(token);
    /// let lock = client.adopt(["db", "cache"], Duration::from_secs(30), &options).await?;
    /// lock.refresh(Duration::from_secs(30), &Options::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when some key is missing or held by someone else;
    /// [`InvalidInput::TokenRequired`] without a token in `options`; other invalid input as
    /// for [`Client::obtain_multi`]; [`Error::Redis`] or [`Error::Quorum`] when Redis could
    /// not answer.
    pub async fn adopt<I>(&self, keys: I, ttl: Duration, options: &Options) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let (keys, modes) = mode::split(keys);
        let modes = checked_modes(&keys, modes)?;
        let ttl = Ttl::new(ttl)?;
        options.check_metadata(keys.len())?;
        let token = options
            .token
            .as_deref()
            .ok_or(InvalidInput::TokenRequired)?;
        let owner = Owner::custom(token)?;
        #[cfg(feature = "cluster")]
        if self.inner.cluster {
            crate::model::names::check_one_slot(&keys, None)?;
        }
        let value = owner.value(options.metadata_to_store());
        let claim = Claim {
            keys: &keys,
            owner: &owner,
            value: &value,
            ttl,
            counter: None,
            modes: modes.as_ref(),
            ticket: None,
        };
        let sent = Instant::now();
        let Some(left) = self.backend().pttl(&claim, None).await? else {
            return Err(Error::NotHeld);
        };
        // Keys without expiry are held until released: count on the TTL to come.
        let left = if left == Duration::MAX {
            ttl.duration
        } else {
            left
        };
        let valid_for = left.saturating_sub(self.backend().drift(left));
        let obtained = Obtained {
            keys,
            modes,
            owner,
            metadata: options.metadata_to_store().to_owned(),
            ttl,
            fence: None,
            valid_until: sent.checked_add(valid_for).unwrap_or(sent),
            stragglers: None,
            meter: options
                .meter
                .clone()
                .unwrap_or_else(|| self.inner.meter.clone()),
            held_since: Instant::now(),
        };
        let lock = Lock::new(self.inner.clone(), obtained);
        if self.backend().is_replicated() {
            // The primary's TTL may be ahead of its replicas' (a refresh applied there and not
            // acknowledged), and the lock is nobody's belief yet: set the TTL again and wait
            // for the replicas, which then hold it at least as long as the validity the
            // refresh confirms. Not acknowledged: the handle is dropped with the error.
            let Ok(again) = Ttl::new(left) else {
                return Err(Error::NotHeld);
            };
            if !lock.refresh_once(again, None).await? {
                return Err(Error::NotHeld);
            }
        }
        Ok(lock)
    }

    /// Obtains `keys`, runs `work` while a watchdog keeps the lock alive, then releases the
    /// lock and returns `work`'s output.
    ///
    /// `keys` is a collection, as for [`Client::obtain_multi`]: one key is `["job"]`. (A
    /// bare `"job"` cannot be taken beside every iterator of keys: Rust's coherence rules
    /// forbid a second implementation for `&str`, which the standard library could one day
    /// make an iterator.)
    ///
    /// See the guide: [long work and validity](crate::guide::long_work).
    ///
    /// `work` receives the lock's [`LostSignal`]; select on it to stop when the lock is lost.
    /// The lock is released when `work` finishes, whatever it returns, and also when it
    /// panics or this future is dropped (then in the background, see
    /// [`Guard`](crate::Guard)). A failed release is logged, not returned: by then the work is
    /// done, and the signal told it if the lock was lost meanwhile. The watchdog refreshes
    /// every [`Options::watchdog_interval`] (default a third of the TTL).
    ///
    /// ```no_run
    /// # async fn demo(client: lockset::Client) -> Result<(), lockset::Error> {
    /// use std::time::Duration;
    /// use lockset::Options;
    ///
    /// let outcome = client
    ///     .with_lock(["invoice:42"], Duration::from_secs(5), &Options::default(), |lost| async move {
    ///         tokio::select! {
    ///             _ = lost.lost() => Err("lock lost; stopped early"),
    ///             _ = tokio::time::sleep(Duration::from_secs(30)) => Ok("done"),
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The errors of [`Client::obtain_multi`]; `work` does not run then.
    pub async fn with_lock<I, F, Fut, T>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
        work: F,
    ) -> Result<T>
    where
        I: IntoIterator,
        I::Item: IntoKey,
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self
            .obtain_multi(keys, ttl, options)
            .await?
            .watched(options);
        let output = work(guard.lost_signal()).await;
        crate::client::guard::released_after_work(guard.release().await);
        Ok(output)
    }

    pub(super) async fn obtain_keys(
        &self,
        keys: Vec<String>,
        modes: Vec<Mode>,
        ttl: Duration,
        options: &Options,
    ) -> Result<Lock<C>> {
        let start = Instant::now();
        let span = op_span!("lockset.obtain", &keys);
        let meter = options.meter.as_ref().unwrap_or(&self.inner.meter);
        let ((won, modes), held_since) = {
            // Counted among the waiters (when it waits) until it ends.
            let mut watch = Watch::new(&keys, options.on_retry.as_ref());
            watch.progress = Progress::of(meter);
            let obtained = in_span!(
                &span,
                self.try_obtain(&keys, modes, ttl, options, start, &mut watch)
            );
            let ended = Instant::now();
            let op = Op::Obtain(meter, &watch.progress, ended);
            finished(&span, op, watch.attempts, start, &obtained);
            (obtained?, ended)
        };
        let obtained = Obtained {
            keys,
            modes,
            owner: won.owner,
            metadata: options.metadata_to_store().to_owned(),
            ttl: won.ttl,
            fence: won.fence,
            valid_until: won.valid_until,
            stragglers: won.stragglers,
            meter: meter.clone(),
            held_since,
        };
        Ok(Lock::new(self.inner.clone(), obtained))
    }

    /// Validates the request, then attempts per `options` until the lock is won.
    pub(super) async fn try_obtain(
        &self,
        keys: &[String],
        modes: Vec<Mode>,
        ttl: Duration,
        options: &Options,
        start: Instant,
        watch: &mut Watch<'_>,
    ) -> Result<(Won, Option<Modes>)> {
        let modes = checked_modes(keys, modes)?;
        let ttl = Ttl::new(ttl)?;
        options.check_metadata(keys.len())?;
        let custom = options.token.as_deref().map(Owner::custom).transpose()?;
        let counter = self.fencing_counter(keys, options)?;
        #[cfg(feature = "cluster")]
        if self.inner.cluster {
            crate::model::names::check_one_slot(keys, counter.as_deref())?;
        }
        let fair = self.fair(keys, custom.as_ref(), ttl, options)?;
        let attempt = Attempt {
            client: self,
            keys,
            custom: custom.as_ref(),
            metadata: options.metadata_to_store(),
            ttl,
            counter: counter.as_deref(),
            modes: modes.as_ref(),
            fair: fair.as_ref(),
        };
        let deadline = options.deadline_from(start, ttl.duration);
        let mut waiter = Waiter::for_keys(self.events(), keys, modes.as_ref(), fair.as_ref());
        // Ending without the lock (an error, or cancelled) leaves the queues.
        let leave = LeaveOnDrop {
            client: self,
            fair: fair.as_ref(),
        };
        let limit = Limit {
            start,
            deadline,
            gap: self.inner.answer_gap(),
        };
        let won = policy::run(&options.retry, limit, &mut waiter, watch, |how, sent| {
            attempt.run(how, sent)
        })
        .await;
        if won.is_ok()
            && let Some(fair) = &fair
        {
            fair.won();
        }
        drop(leave);
        Ok((won?, modes))
    }

    /// The fair-waiting state of an obtain of `keys` (by the caller's token `custom`, if
    /// any), when it waits fairly (see [`Options::fair`]): a strategy that waits at all,
    /// release events to hear its hand-off, one server or a cluster, and a queue for every
    /// key.
    pub(super) fn fair(
        &self,
        keys: &[String],
        custom: Option<&Owner>,
        ttl: Ttl,
        options: &Options,
    ) -> Result<Option<Fair>> {
        // A lease given is checked also where it does not apply.
        let given = options.waiter_lease.map(Ttl::new).transpose()?;
        let fair = !options.barging
            && !matches!(options.retry, Retry::NoRetry)
            && !self.backend().is_quorum()
            && keys.iter().all(|key| crate::model::names::has_queue(key));
        if !fair {
            return Ok(None);
        }
        // A client without release events (none to hear a hand-off on) never queues.
        let Some(tag) = self.events().first().map(Events::handoff_tag) else {
            return Ok(None);
        };
        let lease = match given {
            Some(lease) => lease,
            None => Ttl::new(default_waiter_lease(ttl.duration))?,
        };
        Ok(Some(Fair::new(lease, custom.cloned(), tag)))
    }

    /// The fencing counter key, when `options` ask for fencing tokens.
    pub(super) fn fencing_counter(
        &self,
        keys: &[String],
        options: &Options,
    ) -> Result<Option<String>> {
        let Some(fencing) = &options.fencing else {
            return Ok(None);
        };
        if self.backend().is_quorum() {
            return Err(InvalidInput::FencingWithQuorum.into());
        }
        let first = &keys[0];
        let counter = fencing
            .counter_key(first)
            .ok_or_else(|| InvalidInput::NoFencingKey { key: first.clone() })?;
        if counter.is_empty() {
            return Err(InvalidInput::EmptyFencingKey.into());
        }
        // The lock would overwrite its own counter, and its release delete it.
        if keys.contains(&counter) {
            return Err(InvalidInput::FencingKeyIsLocked { key: counter }.into());
        }
        Ok(Some(counter))
    }
}

/// Checks a key set and its modes (see [`mode::split`]): a plain lock's modes are `None`.
pub(super) fn checked_modes(keys: &[String], modes: Vec<Mode>) -> Result<Option<Modes>> {
    if !modes.is_empty() {
        mode::check_repeats(keys, &modes)?;
    }
    validate::keys(keys)?;
    Ok(Modes::new(keys, modes)?)
}
