//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! Every operation goes to all masters at once, each bounded by a per-node time limit, and is
//! decided as soon as the outcome is known (a majority for, or too many against): no
//! operation waits for a master its decision does not need, be it slow, paused or down. The
//! decision does not abandon the others: each master's work runs in a background task of its
//! own that finishes it (within the per-node limit), so that every master that is up ends up
//! with the lock, the refresh, or the release. Who each master is (its run id) is learned
//! beside its first operation (see `distinct.rs`), and a lock's writes still under way on
//! slow masters are kept clear of its release and TTL queries (see `stragglers.rs`).
//!
//! - **Obtain** counts only if a majority locked the whole key set **and** the validity
//!   `ttl − elapsed − drift` is still positive. Otherwise an attempt with a fresh random
//!   token is undone on every master by that master's task, once its attempt there has
//!   finished. The next attempt has a token of its own, so a late clean-up can never delete
//!   its lock; still, the caller waits for the undoing where the attempt answered, and
//!   elsewhere no longer than the decision took (masters that are up are done by then):
//!   contenders that split a vote otherwise retry into each other's leftovers. A master that
//!   is down is not waited for. An attempt with the caller's
//!   own token is never undone: that token may hold the keys for an outer lock, or for a
//!   concurrent or retried obtain by the same token, and the value cannot tell them apart.
//!   Its keys on a minority of masters expire with the TTL.
//! - **Refresh** extends keys that every master still holds. A master that lost the keys
//!   (restarted empty) gets them back only after a majority confirmed that it still *holds*
//!   the lock: a lock that expired everywhere is never brought back.
//! - **TTL** reports what a majority holds (the `needed`-th longest remaining TTL among the
//!   answers), and the lock lost only when a majority says so; masters that do not answer
//!   are not evidence of anything, and make it an error.
//! - **Release** deletes on every master, and returns once a majority is decided; a lock
//!   with the caller's own token waits for every master (see `stragglers.rs`).

mod ballot;

use ballot::*;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionLike;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, timeout};

use crate::error::{Error, NodeFailure, QuorumOp, Result};
use crate::model::invalid::InvalidInput;
use crate::model::mode::Mode;
use crate::model::request::{Claim, Held, IfHeld, OwnedClaim};
use crate::rt::lock;
use crate::rt::tasks::Tasks;
use crate::server::store::{Obtain, Ownership, Store};
use crate::topology::distinct::Identities;
use crate::topology::health::Health;
use crate::topology::stragglers::{Stragglers, Writing};

/// Settings of a Redlock quorum ([`Client::quorum`](crate::Client::quorum)).
///
/// See the guide: [Redlock](crate::guide::redlock).
///
/// ```
/// use std::time::Duration;
/// use lockset::QuorumConfig;
///
/// let config = QuorumConfig::default()
///     .node_timeout(Duration::from_millis(50))
///     .drift_factor(0.01);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuorumConfig {
    node_timeout: Option<Duration>,
    drift_factor: f64,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self {
            node_timeout: None,
            drift_factor: 0.01,
        }
    }
}

impl QuorumConfig {
    /// The settings' own rule, checked before anything is sent: a drift factor in [0, 1),
    /// a per-node limit that is not zero.
    pub(crate) fn check(&self) -> Result<(), InvalidInput> {
        let factor = self.drift_factor;
        if !factor.is_finite() || !(0.0..1.0).contains(&factor) {
            return Err(InvalidInput::DriftFactor { factor });
        }
        if self.node_timeout == Some(Duration::ZERO) {
            return Err(InvalidInput::ZeroNodeTimeout);
        }
        Ok(())
    }

    /// How long one master may take to answer one operation. Must not be zero. Defaults to
    /// 5% of the lock's TTL (as redsync), at least [`MIN_NODE_TIMEOUT`].
    #[must_use]
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The clock drift allowed for, as a fraction of the TTL: drift = ttl × factor + 2 ms.
    /// Defaults to 0.01.
    #[must_use]
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// How many of `masters` must agree for a lock to be held: more than half.
    ///
    /// ```
    /// assert_eq!(lockset::QuorumConfig::majority(5), 3);
    /// assert_eq!(lockset::QuorumConfig::majority(4), 3);
    /// ```
    #[must_use]
    pub const fn majority(masters: usize) -> usize {
        crate::model::majority(masters)
    }
}

/// The floor of the default per-node time limit.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(10);

/// The fixed part of the drift allowance.
const DRIFT_BASE: Duration = Duration::from_millis(2);

/// N independent masters.
pub(crate) struct Quorum<C> {
    nodes: Vec<Arc<Store<C>>>,
    config: QuorumConfig,
    tasks: Tasks,
    /// Who each master is, learned beside its first operation.
    identities: Arc<Identities>,
    /// Whether each master answers, and the releases owed to it (see `health.rs`).
    health: Vec<Arc<Health>>,
}

/// How one master answered.
enum Vote<T> {
    Yes(T),
    /// The lock is not ours there: [`NodeFailure::Refused`] (another owner's) or
    /// [`NodeFailure::Missing`].
    No(NodeFailure),
    Failed(NodeFailure),
}

/// An operation's outcome, as its per-master tasks learn it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pending,
    Success,
    Failure,
}

impl<C> Quorum<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(
        nodes: Vec<Arc<Store<C>>>,
        config: QuorumConfig,
        tasks: Tasks,
    ) -> Result<Self> {
        if nodes.is_empty() {
            return Err(InvalidInput::NoNodes.into());
        }
        config.check()?;
        let identities = Arc::new(Identities::new(nodes.len()));
        let health = nodes.iter().map(|_| Health::new(tasks.clone())).collect();
        Ok(Self {
            nodes,
            config,
            tasks,
            identities,
            health,
        })
    }

    /// Refuses an operation on masters known to be one server under two names (see
    /// `distinct.rs`), before anything is sent.
    fn check_distinct(&self) -> Result<()> {
        match self.identities.duplicate() {
            Some(duplicate) => Err(duplicate.into()),
            None => Ok(()),
        }
    }

    /// A lock's writes under way, for a lock made without an obtain (adopted).
    pub(crate) fn stragglers(&self) -> Arc<Stragglers> {
        Stragglers::new(self.nodes.len())
    }

    /// `stragglers`, or none under way (a lock that never had any).
    pub(crate) fn or_fresh(&self, stragglers: Option<&Arc<Stragglers>>) -> Arc<Stragglers> {
        stragglers.cloned().unwrap_or_else(|| self.stragglers())
    }

    /// How many commands ran only after loading their script (NOSCRIPT), on all masters.
    /// The masters.
    pub(crate) fn nodes(&self) -> &[Arc<Store<C>>] {
        &self.nodes
    }

    pub(crate) fn script_reloads(&self) -> u64 {
        self.nodes.iter().map(|store| store.script_reloads()).sum()
    }

    /// How many masters make a majority.
    fn majority(&self) -> usize {
        QuorumConfig::majority(self.nodes.len())
    }

    /// How many masters must agree for `claim`: a majority, or more for a counted key. Each
    /// master admits at most `limit` holders of such a key, so `limit + 1` holders can only
    /// each be on `q` masters if `(limit + 1) × q ≤ limit × masters`: with
    /// `q = limit × masters / (limit + 1) + 1` they cannot, and the limit holds across the
    /// quorum as it does on each master. (A majority suffices for one permit, and for
    /// shared keys, which admit any number of readers: a writer's majority meets every
    /// reader's on some master.)
    fn needed(&self, claim: &Claim<'_>) -> usize {
        let masters = self.nodes.len();
        let limits = claim.modes.into_iter().flat_map(|modes| modes.list());
        limits
            .filter_map(|mode| match mode {
                Mode::Permit { limit } => usize::try_from(*limit).ok(),
                _ => None,
            })
            .map(|limit| permit_quorum(limit, masters))
            .fold(self.majority(), usize::max)
    }

    /// The drift allowance for `ttl`: `ttl × factor + 2 ms`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.config.drift_factor)
            .saturating_add(DRIFT_BASE)
    }

    /// Whether a lock obtained or refreshed at `start` is still valid for `ttl`.
    fn still_valid(&self, start: Instant, ttl: Duration) -> bool {
        ttl.checked_sub(start.elapsed())
            .and_then(|left| left.checked_sub(self.drift(ttl)))
            .is_some_and(|left| !left.is_zero())
    }

    /// The error for an obtain whose TTL is within the drift allowance: no lock it makes
    /// could be valid, so nothing is sent.
    fn never_valid(&self, claim: &Claim<'_>) -> Error {
        Error::Quorum {
            op: QuorumOp::Obtain,
            succeeded: 0,
            needed: self.needed(claim),
            nodes: self.nodes.len(),
            expired: true,
            failures: Vec::new(),
        }
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.config
            .node_timeout
            .unwrap_or_else(|| ttl.mul_f64(0.05).max(MIN_NODE_TIMEOUT))
    }

    /// Tries once to lock the claim's keys on a majority within the validity budget. An
    /// attempt with a fresh random token (`random`) is undone everywhere on failure, by each
    /// master's task once that master's attempt finished; one with the caller's token is not
    /// undone. Returns the lock's writes still under way on success.
    pub(crate) async fn obtain(
        &self,
        claim: &Claim<'_>,
        random: bool,
        how: IfHeld,
    ) -> (Result<Obtain>, Option<Arc<Stragglers>>) {
        let start = Instant::now();
        if let Err(err) = self.check_distinct() {
            return (Err(err), None);
        }
        if !self.still_valid(start, claim.ttl.duration) {
            return (Err(self.never_valid(claim)), None);
        }
        let limit = self.node_timeout(claim.ttl.duration);
        // A quorum reports no holder's TTL: asking each master would be wasted.
        let how = IfHeld {
            holder_ttl: false,
            ..how
        };
        let stragglers = Stragglers::unsent(self.nodes.len());
        // What the first refusing master found held (any one: each is another owner's), so
        // that a waiter listens for that key's release, not its first key's, and the refusal
        // names the key and its holder as that master told them.
        let blocking: Arc<Mutex<Option<Held>>> = Arc::default();
        let ballot = self.ballot(claim, Some(&stragglers), limit, |mut share| {
            let blocking = blocking.clone();
            async move {
                let writing = share.writing.take();
                let claim = share.claim.claim();
                // Whether the master runs the scripts is asked (once per connection) within
                // a time limit of its own, so that the write keeps its whole limit. The
                // validity still counts from the start: only the limit is not shared.
                let first = claim.keys.first().map(String::as_str);
                let obtained = match share.answer(share.store.check_scripts(first)).await {
                    Ok(()) => share.answer(share.store.obtain(&claim, how)).await,
                    Err(failure) => Err(failure),
                };
                share.note_sent(writing.as_ref(), &obtained);
                let vote = match obtained {
                    Ok(Obtain::Obtained { .. }) => Vote::Yes(()),
                    // Nothing was written there.
                    Ok(Obtain::Held(held)) => {
                        lock(&blocking).get_or_insert(held);
                        Vote::No(NodeFailure::Refused)
                    }
                    Err(failure) => Vote::failed(failure),
                };
                // Nothing was written where the lock was refused, or nothing was sent.
                let written =
                    !matches!(vote, Vote::No(_) | Vote::Failed(NodeFailure::Unresponsive));
                let _ = share.votes.send(vote);
                // A caller that went away (cancelled) will not use the lock: undo it too.
                // Owed to a master that does not answer (see `health.rs`).
                if random && written && share.verdict.wait().await != Verdict::Success {
                    let _ = share
                        .release(share.store.release_by_eval(&claim), true)
                        .await;
                }
            }
        });
        let needed = self.needed(claim);
        let (counted, mut decide) = ballot.count(needed, Some(&self.identities)).await;
        let answered: Vec<usize> = counted.votes.iter().map(|(master, _)| *master).collect();
        let valid = self.still_valid(start, claim.ttl.duration);
        let verdict = counted.verdict(self, QuorumOp::Obtain, valid, needed);
        let success = matches!(verdict, Ok(true));
        decide(success);
        if !success {
            // The undoing where the attempt answered takes a round trip: wait for it, so
            // that the next attempt (this caller's, or a rival's woken by it) does not find
            // this one's leftovers. Masters still busy with the attempt undo it later.
            let decided_in = start.elapsed();
            let (answered, others): (Vec<usize>, Vec<usize>) =
                (0..self.nodes.len()).partition(|master| answered.contains(master));
            let undone = answered
                .into_iter()
                .map(|master| stragglers.written(master));
            let later = others.into_iter().map(|master| stragglers.written(master));
            let later = timeout(decided_in, futures_util::future::join_all(later));
            let _ = futures_util::future::join(futures_util::future::join_all(undone), later).await;
        }
        let outcome = verdict.map(|obtained| match obtained {
            true => Obtain::Obtained { fence: None },
            false => Obtain::Held(Held {
                // Queued on one master means nothing to a quorum.
                queued: false,
                ..lock(&blocking).take().unwrap_or(Held::UNKNOWN)
            }),
        });
        (outcome, success.then_some(stragglers))
    }

    /// Tries once to extend the lock on a majority (giving the keys the claim's value, with
    /// `rewrite`). `Ok(false)` when a majority says the lock is not held there. Masters that
    /// lost the keys get them back once a majority confirmed it still holds the lock. Each
    /// master's refresh is one of the lock's `stragglers` until it is done.
    pub(crate) async fn refresh(
        &self,
        claim: &Claim<'_>,
        rewrite: bool,
        stragglers: &Arc<Stragglers>,
    ) -> Result<bool> {
        let start = Instant::now();
        self.check_distinct()?;
        let limit = self.node_timeout(claim.ttl.duration);
        let ballot = self.ballot(
            claim,
            Some(stragglers),
            limit,
            move |mut share| async move {
                // Released meanwhile: nothing more is sent.
                let Some(writing) = share.writing.take() else {
                    let _ = share.votes.send(Vote::No(NodeFailure::Missing));
                    return;
                };
                let claim = share.claim.claim();
                let answer = share
                    .answer(share.store.refresh(&claim, false, rewrite))
                    .await;
                share.note_sent(Some(&writing), &answer);
                let missing = matches!(answer, Ok(Ownership::Missing));
                let _ = share.votes.send(Vote::from_answer(answer));
                if missing && share.verdict.wait().await == Verdict::Success {
                    let _ = share
                        .answer(share.store.refresh(&claim, true, rewrite))
                        .await;
                }
            },
        );
        let needed = self.needed(claim);
        let (counted, mut decide) = ballot.count(needed, Some(&self.identities)).await;
        let valid = self.still_valid(start, claim.ttl.duration);
        let verdict = counted.verdict(self, QuorumOp::Refresh, valid, needed);
        decide(matches!(verdict, Ok(true)));
        verdict
    }

    /// What a majority of masters still holds: the `needed`-th longest remaining TTL among
    /// the masters that answered, once enough hold the lock; `None` once a majority says it
    /// does not. Each master is asked once the lock's writes there are done (a refresh on
    /// its way would be answered with the old TTL). Masters that do not answer decide
    /// nothing: without a majority either way, this is an error.
    pub(crate) async fn pttl(
        &self,
        claim: &Claim<'_>,
        stragglers: &Stragglers,
    ) -> Result<Option<Duration>> {
        self.check_distinct()?;
        let limit = self.node_timeout(claim.ttl.duration);
        let needed = self.needed(claim);
        let counted = self
            .vote_in_place(
                None,
                limit,
                needed,
                InPlace::Decide,
                |master, store| async move {
                    stragglers.written(master).await;
                    store.pttl(claim).await
                },
            )
            .await;
        if let Some(duplicate) = counted.duplicate {
            return Err(duplicate.into());
        }
        let held: Vec<Duration> = counted
            .votes
            .iter()
            .filter_map(|(_, vote)| match vote {
                Vote::Yes(left) => Some(*left),
                _ => None,
            })
            .collect();
        let votes = Counted {
            votes: counted
                .votes
                .into_iter()
                .map(|(i, vote)| (i, vote.map(|_| ())))
                .collect(),
            duplicate: None,
        };
        match votes.verdict(self, QuorumOp::Ttl, true, needed)? {
            true => Ok(held_by(held, needed)),
            false => Ok(None),
        }
    }

    /// Deletes the lock on every master, with an announcement per master when `payload` is
    /// given; fine when a majority deleted it. Returns as soon as that is decided.
    ///
    /// With a random token, each master's delete is sent once the lock's writes there are
    /// done, in a task of its own (see `stragglers.rs`). With the caller's token, this first
    /// waits for those writes everywhere, then for every master's delete (each within the
    /// per-node limit): a delete still on its way when this returns could take a later lock
    /// of the same token, and one given up on (a second round trip after NOSCRIPT) would
    /// leave the keys behind.
    pub(crate) async fn release(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
        stragglers: &Arc<Stragglers>,
    ) -> Result<bool> {
        let limit = self.node_timeout(claim.ttl.duration);
        let needed = self.needed(claim);
        stragglers.release();
        if claim.owner.is_custom() {
            stragglers.settled().await;
            let owed = claim.to_shared();
            let counted = self
                .vote_in_place(Some(&owed), limit, needed, InPlace::Finish, |_, store| {
                    store.release_by_script(claim, payload)
                })
                .await;
            return counted.verdict(self, QuorumOp::Release, true, needed);
        }
        let payload: Option<Arc<str>> = payload.map(Arc::from);
        let ballot = self.ballot(claim, None, limit, |share| {
            let (payload, stragglers) = (payload.clone(), stragglers.clone());
            async move {
                stragglers.written(share.master).await;
                let claim = share.claim.claim();
                // Owed to a master that does not answer, where the lock may be.
                let owed = stragglers.ever_sent(share.master);
                let release = share.store.release_by_script(&claim, payload.as_deref());
                let answer = share.release(release, owed).await;
                let _ = share.votes.send(Vote::from_answer(answer));
            }
        });
        // The deletes go on whatever this finds: they only ever take this lock's keys.
        let (counted, mut decide) = ballot.count(needed, None).await;
        decide(true);
        counted.verdict(self, QuorumOp::Release, true, needed)
    }

    /// Releases on every master and waits for each (within the per-node limit): clean-up
    /// after an obtain whose caller went away. Owed to a master that does not answer.
    pub(crate) async fn release_everywhere(&self, claim: &Claim<'_>) {
        let limit = self.node_timeout(claim.ttl.duration);
        let owed = &claim.to_shared();
        let releases = self.nodes.iter().zip(&self.health).map(|(store, health)| {
            let bounded = timeout(limit, store.release_by_eval(claim));
            health.release(store, owed, limit, bounded)
        });
        futures_util::future::join_all(releases).await;
    }

    /// Starts `work` on every master in a counted background task of its own. Each task
    /// sends its vote, and may await the verdict to finish its part (undo, restore). With
    /// `stragglers`, each task's write is registered there before this returns.
    fn ballot<F, Fut>(
        &self,
        claim: &Claim<'_>,
        stragglers: Option<&Arc<Stragglers>>,
        limit: Duration,
        work: F,
    ) -> Ballot
    where
        F: Fn(Share<C>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let claim = claim.to_shared();
        let (votes_tx, votes) = mpsc::unbounded_channel();
        let (verdict, _) = watch::channel(Verdict::Pending);
        for (master, store) in self.nodes.iter().enumerate() {
            let share = Share {
                master,
                store: store.clone(),
                claim: claim.clone(),
                votes: VoteSender {
                    index: master,
                    votes: votes_tx.clone(),
                },
                verdict: VerdictReceiver(verdict.subscribe()),
                identities: self.identities.clone(),
                health: self.health[master].clone(),
                limit,
                writing: stragglers.and_then(|stragglers| stragglers.writing(master)),
            };
            if self.tasks.spawn(work(share)).is_none() {
                // Only outside a tokio runtime, where nothing async runs at all.
                let _ = votes_tx.send((master, Vote::Failed(NodeFailure::NoRuntime)));
            }
        }
        Ballot {
            votes,
            verdict,
            nodes: self.nodes.len(),
        }
    }

    /// Runs `op` on every master within `limit`, in place (nothing outlives the call), until
    /// `until` says; nothing is sent to a master that does not answer (see `health.rs`).
    /// With `owed`, `op` is its release, owed to a master that does not answer.
    async fn vote_in_place<'a, T, F, Fut>(
        &'a self,
        owed: Option<&Arc<OwnedClaim>>,
        limit: Duration,
        needed: usize,
        until: InPlace,
        op: F,
    ) -> Counted<T>
    where
        F: Fn(usize, &'a Store<C>) -> Fut,
        Fut: Future<Output = Result<Ownership<T>>>,
    {
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(master, store)| {
                let health = &self.health[master];
                let bounded = self
                    .identities
                    .beside(master, store, limit, op(master, store));
                async move {
                    let answer = match owed {
                        Some(owed) => health.release(store, owed, limit, bounded).await,
                        None => health.ask(store, limit, bounded).await,
                    };
                    (master, answer)
                }
            })
            .collect();
        let mut tally = Tally::new(self.nodes.len(), needed);
        let mut counted = Counted {
            votes: Vec::with_capacity(self.nodes.len()),
            duplicate: None,
        };
        while let Some((master, answer)) = pending.next().await {
            let vote = Vote::from_answer(answer);
            tally.add(&vote);
            counted.votes.push((master, vote));
            if until == InPlace::Decide {
                counted.duplicate = self.identities.duplicate();
                if tally.decided() || counted.duplicate.is_some() {
                    break;
                }
            }
        }
        counted
    }
}

impl<C> fmt::Debug for Quorum<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quorum")
            .field("nodes", &self.nodes.len())
            .field("config", &self.config)
            .finish()
    }
}

/// How many of `masters` must hold a permit of a key with `limit` permits, so that no
/// more than `limit` holders can each hold it on that many (see [`Quorum::needed`]).
fn permit_quorum(limit: usize, masters: usize) -> usize {
    (limit.saturating_mul(masters) / limit.saturating_add(1))
        .saturating_add(1)
        .min(masters)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{held_by, permit_quorum};

    #[test]
    fn ttl_is_what_the_needed_th_longest_holder_has() {
        let ms = Duration::from_millis;
        let held = vec![ms(9_900), ms(20_000), ms(19_990), ms(5), ms(19_995)];
        assert_eq!(held_by(held.clone(), 3), Some(ms(19_990)));
        assert_eq!(held_by(held.clone(), 1), Some(ms(20_000)));
        assert_eq!(held_by(held.clone(), 5), Some(ms(5)));
        assert_eq!(held_by(held, 6), None);
        assert_eq!(held_by(Vec::new(), 0), None);
    }

    /// `limit + 1` holders on `q` masters each would need more room than the masters have
    /// (each admits `limit`), and `q - 1` would not be enough for that.
    #[test]
    fn permit_quorums_keep_the_limit_and_ask_no_more_than_needed() {
        for masters in 1..=9 {
            for limit in 1..=12 {
                let q = permit_quorum(limit, masters);
                assert!(
                    (limit + 1) * q > limit * masters,
                    "{limit} of {masters}: {q}"
                );
                assert!(
                    (limit + 1) * (q - 1) <= limit * masters,
                    "{limit} of {masters}: {q}"
                );
            }
            assert_eq!(
                permit_quorum(1, masters),
                super::QuorumConfig::majority(masters)
            );
        }
        assert_eq!(permit_quorum(2, 5), 4);
        assert_eq!(permit_quorum(4, 5), 5);
    }
}
