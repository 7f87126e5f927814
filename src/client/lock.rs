//! A held lock: its keys and token, and the operations only its owner may perform.

use std::borrow::Cow;
use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::options::Options;
use crate::client::state::ClientState;
use crate::error::{Error, Result};
use crate::model::mode::{Mode, Modes};
use crate::model::names::release_channel;
use crate::model::request::{Claim, Ttl};
use crate::model::value::Owner;
use crate::observe::meter::{self, HoldTimer, Meter};
use crate::observe::{self, Op, finished, in_span, op_span};
use crate::rt::signal::LostSignal;
use crate::topology::stragglers::Stragglers;
use crate::waiting::events::{after_queueing, release_payload};
use crate::waiting::policy::{self, Step, Waiter, Watch};

/// A lock on one or more keys, returned by [`Client::obtain`](crate::Client::obtain) and
/// [`Client::obtain_multi`](crate::Client::obtain_multi).
///
/// See the guide: [long work and validity](crate::guide::long_work).
///
/// Dropping a `Lock` does not release it: the keys expire with their TTL. Call
/// [`Lock::release`] to free them early and to learn whether they were still ours, or turn
/// it into a [`Guard`](crate::Guard) that releases on drop and can keep the lock alive.
/// `Debug` output never shows the token.
pub struct Lock<C = ConnectionManager> {
    shared: Arc<ClientState<C>>,
    keys: Vec<String>,
    /// Each key's mode, unless every key is exclusive.
    modes: Option<Modes>,
    owner: Owner,
    /// Replaced by a refresh that changes it.
    metadata: Mutex<String>,
    ttl: Ttl,
    fence: Option<u64>,
    validity: Mutex<Validity>,
    /// Redlock: the lock's writes still under way on slow masters after an obtain or
    /// refresh was decided, kept clear of its release and TTL queries.
    stragglers: Option<Arc<Stragglers>>,
    /// The lock family its metrics go to, and since when it is held.
    holding: HoldTimer,
}

/// Until when the lock is known to be valid.
///
/// It follows the last successful obtain or refresh, ordered by when each was *sent* (its TTL
/// counts from then; the keys expire no earlier on the server), also when that makes it
/// shorter. Every refresh caps it before it is sent: until a reply confirms it, the refresh
/// may have run (or may still run, if its caller went away), and a shorter TTL would then
/// end the keys sooner. A confirmation lifts the caps of refreshes sent before it (they ran
/// before it, on each server's connection), never of those sent after. A TTL query that
/// learns that the keys live shorter caps it too. Once the lock is known lost or released,
/// it is over for good: nothing moves it forward again.
///
/// The channel behind [`LostSignal`]s is only made when the first signal is asked for: most
/// locks never need one, and it costs an allocation and wake-ups on every release.
struct Validity {
    until: Instant,
    /// The sequence number of the operation that set `until` (the obtain is 0).
    basis: u64,
    /// The last sequence number given to a refresh.
    sent: u64,
    /// Refreshes sent after `basis` that no reply confirmed: their number and cap.
    unconfirmed: Vec<(u64, Instant)>,
    lost: bool,
    signal: Option<watch::Sender<Instant>>,
}

impl Validity {
    fn set(&mut self, until: Instant) {
        self.until = until;
        if let Some(signal) = &self.signal {
            signal.send_replace(until);
        }
    }

    /// A refresh is about to be sent, which may make the keys live only until `cap`: caps
    /// the validity and returns the refresh's sequence number.
    fn sending(&mut self, cap: Instant) -> u64 {
        self.sent += 1;
        self.unconfirmed.push((self.sent, cap));
        self.at_most(cap);
        self.sent
    }

    /// Refresh number `seq` succeeded: valid until `until`, unless a refresh sent after it
    /// (unconfirmed) caps it sooner.
    fn confirmed(&mut self, seq: u64, until: Instant) {
        if self.lost || seq <= self.basis {
            return;
        }
        self.basis = seq;
        self.unconfirmed.retain(|(sent, _)| *sent > seq);
        let cap = self.unconfirmed.iter().map(|(_, cap)| *cap).min();
        self.set(cap.map_or(until, |cap| cap.min(until)));
    }

    /// The lock may not be valid beyond `until`.
    fn at_most(&mut self, until: Instant) {
        if until < self.until {
            self.set(until);
        }
    }

    fn lost(&mut self) {
        self.lost_at(Instant::now());
    }

    /// Lost (or released) since `at`, a moment already passed.
    fn lost_at(&mut self, at: Instant) {
        self.lost = true;
        self.unconfirmed.clear();
        self.at_most(at);
    }
}

/// What a successful obtain hands to [`Lock::new`].
pub(crate) struct Obtained {
    pub(crate) keys: Vec<String>,
    pub(crate) modes: Option<Modes>,
    pub(crate) owner: Owner,
    pub(crate) metadata: String,
    pub(crate) ttl: Ttl,
    pub(crate) fence: Option<u64>,
    /// When the successful attempt was sent, plus the TTL, less any drift allowance.
    pub(crate) valid_until: Instant,
    /// A quorum's writes of the lock still under way (`None`: none, or one server).
    pub(crate) stragglers: Option<Arc<Stragglers>>,
    /// The lock family its metrics go to.
    pub(crate) meter: Meter,
    /// When the obtain ended: the holding counts from then (`lockset_hold_seconds`).
    pub(crate) held_since: Instant,
}

impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(shared: Arc<ClientState<C>>, obtained: Obtained) -> Self {
        let stragglers = obtained
            .stragglers
            .or_else(|| shared.backend().stragglers());
        Self {
            shared,
            keys: obtained.keys,
            modes: obtained.modes,
            owner: obtained.owner,
            metadata: Mutex::new(obtained.metadata),
            ttl: obtained.ttl,
            fence: obtained.fence,
            validity: Mutex::new(Validity {
                until: obtained.valid_until,
                basis: 0,
                sent: 0,
                unconfirmed: Vec::new(),
                lost: false,
                signal: None,
            }),
            stragglers,
            holding: HoldTimer::new(obtained.meter, obtained.held_since),
        }
    }

    /// The first key of the lock.
    pub fn key(&self) -> &str {
        // A lock is only built from a validated, non-empty key set.
        self.keys.first().map_or("", String::as_str)
    }

    /// Every key of the lock, in the order given to obtain.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The mode each key is held in, in the order of [`Lock::keys`].
    pub fn modes(&self) -> Vec<Mode> {
        match &self.modes {
            Some(modes) => modes.list().to_vec(),
            None => vec![Mode::Exclusive; self.keys.len()],
        }
    }

    /// The lock's token: whoever knows it owns the lock. Keep it secret.
    pub fn token(&self) -> &str {
        self.owner.token()
    }

    /// The metadata stored with the lock: as obtained, or as the last successful refresh
    /// that changed it ([`Options::metadata`]) left it.
    ///
    /// A copy, unlike [`Lock::key`]'s `&str`: a refresh through another reference to this
    /// lock (a guard's watchdog, a task sharing it) may replace the metadata meanwhile, so
    /// no borrow of it could be handed out.
    pub fn metadata(&self) -> String {
        self.stored_metadata().clone()
    }

    fn stored_metadata(&self) -> MutexGuard<'_, String> {
        // A plain value: a panic while holding the lock cannot corrupt it.
        crate::rt::lock(&self.metadata)
    }

    /// The lock's value: its owner tag followed by its metadata.
    fn value(&self) -> Cow<'_, str> {
        self.owner.value(&self.stored_metadata())
    }

    /// The fencing token minted when this lock was obtained, if
    /// [`Options::fencing`](crate::Options::fencing) asked for one.
    ///
    /// Tokens from one counter strictly increase with every successful obtain, including a
    /// re-obtain by the same token (which therefore supersedes the earlier one: use the
    /// highest you hold). Send it with every write to the protected resource, and have the
    /// resource reject a token lower than the highest it has seen. The counter is never
    /// reset by release or expiry. A token is the counter plus one or the server's clock in
    /// microseconds, whichever is higher, so tokens keep increasing also when a server
    /// restarted without persistence forgot the counter, or it came back older (unless the
    /// server's clock went back).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// Until when the lock is known to be valid, by the local monotonic clock.
    ///
    /// See the guide: [validity](crate::guide::long_work#validity-what-the-holder-may-believe).
    ///
    /// It is the moment the last successful obtain or refresh was *sent*, plus its TTL (less
    /// Redlock's drift allowance): the keys expire no earlier on the server. A lock handed
    /// to a fair waiter counts from the send of the waiter's attempt that ran before the
    /// hand-off, for what the hand-off gave. A refresh to a
    /// shorter TTL makes it shorter. It never claims more than is known: a refresh counts as
    /// if it ran from the moment it is sent, when that would end the lock sooner (its outcome
    /// is unknown until it is confirmed, and a refresh whose caller went away may still run),
    /// and a [`Lock::ttl`] query that finds the keys expiring sooner shortens it. Once the
    /// lock is known lost, or released, this is in the past for good.
    ///
    /// Handles that share a token (a re-obtain by [`Options::token`](crate::Options::token))
    /// are one owner: a refresh or release through one of them changes the keys of all, but
    /// each handle's validity reflects only its own operations. Let the outermost handle
    /// refresh and release, and let no inner handle outlive it.
    pub fn valid_until(&self) -> Instant {
        self.validity().until
    }

    /// A cheap, cloneable signal that fires when the lock is known lost: its validity ran
    /// out without a successful refresh, a refresh or TTL query found it gone, or it was
    /// released. See [`LostSignal`].
    pub fn lost_signal(&self) -> LostSignal {
        let mut validity = self.validity();
        let until = validity.until;
        let signal = validity
            .signal
            .get_or_insert_with(|| watch::Sender::new(until));
        LostSignal::new(signal.subscribe())
    }

    fn validity(&self) -> MutexGuard<'_, Validity> {
        // Validity is a plain value: a panic while holding the lock cannot corrupt it.
        crate::rt::lock(&self.validity)
    }

    /// What this lock claims, with its TTL (or a new one, for a refresh).
    fn claim<'a>(&'a self, value: &'a str, ttl: Ttl) -> Claim<'a> {
        Claim {
            keys: &self.keys,
            owner: &self.owner,
            value,
            ttl,
            counter: None,
            modes: self.modes.as_ref(),
            ticket: None,
        }
    }

    /// The moment `sent` plus `ttl`, less the backend's drift allowance.
    fn valid_for(&self, sent: Instant, ttl: Duration) -> Instant {
        let valid_for = ttl.saturating_sub(self.shared.backend().drift(ttl));
        sent.checked_add(valid_for).unwrap_or(sent)
    }

    /// The remaining time of the lock: the smallest remaining TTL across its keys, capped
    /// by what is left of its validity ([`Lock::valid_until`]).
    ///
    /// `Ok(None)` means the lock is not held any more: a key expired or now belongs to
    /// someone else, or its validity ran out. A Redlock lock is held while a majority of
    /// masters hold it, and this reports what a majority still holds (the longest remaining
    /// TTL that enough masters share), never more; masters that do not answer say nothing,
    /// and without a majority either way make this an error ([`Error::Quorum`]) that leaves
    /// the validity alone.
    pub async fn ttl(&self) -> Result<Option<Duration>> {
        let sent = Instant::now();
        let span = op_span!("lockset.ttl", &self.keys);
        let left = in_span!(&span, self.ttl_once(sent));
        finished(&span, Op::Ttl, 1, sent, &left);
        left
    }

    async fn ttl_once(&self, sent: Instant) -> Result<Option<Duration>> {
        let value = self.value();
        let claim = self.claim(&value, self.ttl);
        let stragglers = self.stragglers.as_ref();
        let Some(left) = self.shared.backend().pttl(&claim, stragglers).await? else {
            self.found_lost(meter::Lost::Ttl);
            return Ok(None);
        };
        if left != Duration::MAX {
            // The keys live at least `left` from when the query was sent.
            let until = self.valid_for(sent, left);
            self.validity().at_most(until);
        }
        let remaining = self.valid_until().saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            self.found_lost(meter::Lost::Expired);
            return Ok(None);
        }
        Ok(Some(left.min(remaining)))
    }

    /// Extends every key of the lock to `ttl`, only if every key is still ours. The
    /// validity then counts from when this refresh was sent: a shorter TTL shortens it.
    /// With [`Options::metadata`], the keys' metadata is replaced in the same step.
    ///
    /// A lock whose validity has run out is not refreshed (nothing is sent): it may have
    /// been someone else's in between.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] at once when the lock was lost (expired, deleted or taken over:
    /// stop the work it protects);
    /// transient Redis errors are retried per `options`' retry strategy and deadline
    /// (by default the new TTL); [`Error::InvalidInput`] for a bad TTL.
    pub async fn refresh(&self, ttl: Duration, options: &Options) -> Result<()> {
        let start = Instant::now();
        let ttl = Ttl::new(ttl)?;
        options.check_metadata(self.keys.len())?;
        let deadline = options.deadline_from(start, ttl.duration);
        let span = op_span!("lockset.refresh", &self.keys);
        let mut watch = Watch::new(&self.keys, options.on_retry.as_ref());
        let limit = policy::Limit {
            start,
            deadline,
            gap: self.shared.answer_gap(),
        };
        let refreshed = in_span!(
            &span,
            self.refresh_retrying(ttl, options, limit, &mut watch)
        );
        let op = Op::Refresh(self.holding.meter());
        finished(&span, op, watch.attempts, start, &refreshed);
        refreshed
    }

    /// One refresh attempt, storing `metadata` when given and different; keeps the validity
    /// (and the metadata) up to date.
    pub(crate) async fn refresh_once(&self, ttl: Ttl, metadata: Option<&str>) -> Result<bool> {
        let sent = Instant::now();
        let until = self.valid_for(sent, ttl.duration);
        let seq = {
            let mut validity = self.validity();
            if validity.until > sent {
                Some(validity.sending(until))
            } else {
                None
            }
        };
        let Some(seq) = seq else {
            self.found_lost(meter::Lost::Expired);
            return Ok(false);
        };
        let new = metadata.filter(|new| *new != *self.stored_metadata());
        let value = match new {
            Some(new) => self.owner.value(new),
            None => self.value(),
        };
        let claim = self.claim(&value, ttl);
        let refreshed = self
            .shared
            .backend()
            .refresh(&claim, new.is_some(), self.stragglers.as_ref())
            .await;
        match &refreshed {
            Ok(true) => {
                self.validity().confirmed(seq, until);
                if let Some(new) = new {
                    *self.stored_metadata() = new.to_owned();
                }
            }
            Ok(false) => self.found_lost(meter::Lost::Refresh),
            // It may have run (on some masters): the cap taken when sending stays.
            Err(_) => {}
        }
        refreshed
    }

    /// Releases the lock: deletes every key, only if every key is still ours.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock expired or was taken over (nothing is deleted then);
    /// [`Error::Redis`] when Redis could not be reached (the keys expire with their TTL).
    pub async fn release(self) -> Result<()> {
        self.release_keys().await
    }

    pub(crate) async fn release_keys(&self) -> Result<()> {
        let start = Instant::now();
        let span = op_span!("lockset.release", &self.keys);
        let released = in_span!(&span, self.release_once(start));
        finished(
            &span,
            Op::Release(self.holding.meter()),
            1,
            start,
            &released,
        );
        released
    }

    /// Releases once; `start`: when the release was called (it is over from then on).
    async fn release_once(&self, start: Instant) -> Result<()> {
        let held = {
            let mut validity = self.validity();
            let held = !validity.lost;
            validity.lost_at(start);
            held
        };
        if held {
            observe::ended(&self.holding, start);
        }
        let value = self.value();
        let claim = self.claim(&value, self.ttl);
        let events = self.shared.events();
        // A payload names the release when a local waiter is handed the lock (its
        // announcement is then skipped), and on a quorum (whose masters each announce it).
        let named = self.shared.backend().is_quorum() || events.iter().any(|e| e.channels() > 0);
        let payload = match () {
            () if !self.shared.announces() => None,
            () if named => Some(release_payload()),
            () => Some(String::new()),
        };
        let stragglers = self.stragglers.as_ref();
        let release = self
            .shared
            .backend()
            .release(&claim, payload.as_deref(), stragglers);
        let mut release = pin!(release);
        let released = match (events, &payload) {
            // A waiter of this very client: hand over as soon as the release is on its way.
            ([events], Some(payload)) if events.channels() > 0 => {
                let channels = || self.keys.iter().map(|key| release_channel(key));
                let hand_over = || {
                    for channel in channels() {
                        events.hand_over(channel, payload);
                    }
                };
                let reloads = self.shared.backend().script_reloads();
                let released = after_queueing(release.as_mut(), hand_over).await;
                if !matches!(released, Ok(true)) {
                    // Nothing was announced: no announcement is to be skipped.
                    for channel in channels() {
                        events.withdraw(channel, payload);
                    }
                } else if self.shared.backend().script_reloads() != reloads {
                    // The release may have met NOSCRIPT and run behind the woken waiter's
                    // attempt, which then found the lock still held: wake it again. (A
                    // reload by another call costs at most one needless attempt.)
                    for channel in channels() {
                        events.wake_again(channel);
                    }
                }
                released?
            }
            _ => release.await?,
        };
        match released {
            true => Ok(()),
            false => Err(Error::NotHeld),
        }
    }

    /// Refreshes to `ttl`, retrying per `options` within `limit`.
    async fn refresh_retrying(
        &self,
        ttl: Ttl,
        options: &Options,
        limit: policy::Limit,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        let metadata = options.metadata.as_deref();
        policy::run(
            &options.retry,
            limit,
            &mut Waiter::sleeping(),
            watch,
            |_, _| async move {
                match self.refresh_once(ttl, metadata).await {
                    Ok(true) => Step::Done(()),
                    Ok(false) => Step::Stop(Error::NotHeld),
                    Err(err) => Step::from_error(err),
                }
            },
        )
        .await
        // An attempt cut at the deadline: a reply that did not come in time, as a refresh
        // reports it (an obtain's unknown outcome means keys to clean up; a refresh has none).
        .map_err(|err| match err {
            Error::UnknownOutcome(err) => Error::Redis(err),
            err => err,
        })
    }

    /// Refreshes once with the TTL the lock was obtained with (for the watchdog), in a
    /// `lockset.refresh` span of its own, recorded as a refresh by hand would be.
    pub(crate) async fn refresh_with_own_ttl(&self) -> Result<bool> {
        let start = Instant::now();
        let span = op_span!("lockset.refresh", &self.keys);
        let refreshed = in_span!(&span, self.refresh_once(self.ttl, None));
        let op = || Op::Refresh(self.holding.meter());
        match &refreshed {
            Ok(false) => finished(&span, op(), 1, start, &Err::<(), _>(Error::NotHeld)),
            done => finished(&span, op(), 1, start, done),
        }
        refreshed
    }

    /// The TTL the lock was obtained with.
    pub(crate) fn obtained_ttl(&self) -> Duration {
        self.ttl.duration
    }

    pub(crate) fn shared(&self) -> &ClientState<C> {
        &self.shared
    }

    /// Marks the lock lost, with a warning (and its metrics) the first time it is found
    /// lost.
    pub(crate) fn found_lost(&self, cause: meter::Lost) {
        let first = {
            let mut validity = self.validity();
            let first = !validity.lost;
            validity.lost();
            first
        };
        if first {
            observe::lost(&self.keys, &self.holding, cause);
        }
    }
}

impl<C> fmt::Debug for Lock<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("keys", &self.keys)
            .field("token", &"<redacted>")
            .field("metadata", &*crate::rt::lock(&self.metadata))
            .field("ttl", &self.ttl.duration)
            .field("fencing_token", &self.fence)
            .finish_non_exhaustive()
    }
}
