//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! Every operation goes to all masters at once, each bounded by a per-node time limit, and is
//! decided as soon as the outcome is known (a majority for, or too many against): the slowest
//! master is never waited for. The decision does not abandon the others: each master's work
//! runs in a background task of its own that finishes it (within the per-node limit), so that
//! every master that is up ends up with the lock, or with the refresh.
//!
//! - **Obtain** counts only if a majority locked the whole key set **and** the validity
//!   `ttl − elapsed − drift` is still positive. Otherwise an attempt with a fresh random
//!   token is undone on every master once that master's attempt has finished, and the caller
//!   waits for the undoing: a late clean-up can then never delete a later attempt's lock. An
//!   attempt with the caller's own token is never undone: that token may hold the keys for
//!   an outer lock, or for a concurrent or retried obtain by the same token, and the value
//!   cannot tell them apart. Its keys on a minority of masters expire with the TTL.
//! - **Refresh** extends keys that every master still holds. A master that lost the keys
//!   (restarted empty) gets them back only after a majority confirmed that it still *holds*
//!   the lock: a lock that expired everywhere is never brought back.
//! - **TTL** reports the lock lost only when a majority says so; masters that do not answer
//!   are not evidence of anything, and make it an error.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionLike;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use crate::error::{Error, InvalidInput, NodeFailure, QuorumOp, Result};
use crate::mode::Mode;
use crate::request::{Claim, OwnedClaim, Try};
use crate::store::{Holding, Obtain, Store};
use crate::tasks::Tasks;

/// Settings of a Redlock quorum ([`Client::quorum`](crate::Client::quorum)).
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
}

/// The floor of the default per-node time limit.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(10);

/// The fixed part of the drift allowance.
const DRIFT_BASE: Duration = Duration::from_millis(2);

/// Background tasks that finish an operation's work on slow masters after its decision.
pub(crate) type Stragglers = Vec<JoinHandle<()>>;

/// N independent masters.
pub(crate) struct Quorum<C> {
    nodes: Vec<Arc<Store<C>>>,
    config: QuorumConfig,
    tasks: Tasks,
    /// Set once every master answered with a run id of its own.
    distinct: tokio::sync::OnceCell<()>,
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
        let factor = config.drift_factor;
        if !factor.is_finite() || !(0.0..1.0).contains(&factor) {
            return Err(InvalidInput::DriftFactor { factor }.into());
        }
        if config.node_timeout == Some(Duration::ZERO) {
            return Err(InvalidInput::ZeroNodeTimeout.into());
        }
        Ok(Self {
            nodes,
            config,
            tasks,
            distinct: tokio::sync::OnceCell::new(),
        })
    }

    /// Refuses masters that are one server under two names (the same run id), which a
    /// majority would count twice. Checked once, when every master first answers.
    async fn check_distinct(&self, limit: Duration) -> Result<()> {
        if self.distinct.initialized() {
            return Ok(());
        }
        let ids = self
            .nodes
            .iter()
            .map(|store| async move { timeout(limit, store.run_id()).await });
        let ids = futures_util::future::join_all(ids).await;
        // Every pair of masters that answered is compared, whoever did not. (A server
        // whose INFO has no run id, such as some proxies, tells nothing.)
        let ids: Vec<Option<&str>> = ids
            .iter()
            .map(|id| match id {
                Ok(Ok(id)) if !id.is_empty() => Some(id.as_str()),
                _ => None,
            })
            .collect();
        for (second, id) in ids.iter().enumerate() {
            if let Some(first) = id.and_then(|id| ids[..second].iter().position(|o| *o == Some(id)))
            {
                return Err(InvalidInput::DuplicateNode { first, second }.into());
            }
        }
        if ids.iter().all(Option::is_some) {
            let _ = self.distinct.set(());
        }
        // Else some master did not answer: check again next time.
        Ok(())
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
        self.nodes.len() / 2 + 1
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

    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.config
            .node_timeout
            .unwrap_or_else(|| ttl.mul_f64(0.05).max(MIN_NODE_TIMEOUT))
    }

    /// Tries once to lock the claim's keys on a majority within the validity budget. An
    /// attempt with a fresh random token (`random`) is undone everywhere on failure; one with
    /// the caller's token only where it created every key. With `mark_holder`, each master
    /// marks a held key for its holder's release to announce.
    pub(crate) async fn obtain(
        &self,
        claim: &Claim<'_>,
        random: bool,
        how: Try,
    ) -> (Result<Obtain>, Stragglers) {
        // Validity counts from before the check, as the caller's does.
        let start = Instant::now();
        let limit = self.node_timeout(claim.ttl.duration);
        if let Err(err) = self.check_distinct(limit).await {
            return (Err(err), Vec::new());
        }
        let ballot = self.ballot(claim, move |store, claim, votes, verdict| async move {
            let claim = claim.claim();
            // A quorum reports no holder's TTL: asking each master would be wasted.
            let how = Try {
                holder_ttl: false,
                ..how
            };
            let obtained = timeout(limit, store.obtain(&claim, how)).await;
            let vote = match obtained {
                Ok(Ok(Obtain::Obtained { .. })) => Vote::Yes(()),
                // Nothing was written there.
                Ok(Ok(Obtain::Held { .. })) => Vote::No(NodeFailure::Refused),
                Ok(Err(err)) => Vote::Failed(NodeFailure::from(err)),
                Err(_) => Vote::Failed(NodeFailure::TimedOut(limit)),
            };
            let written = !matches!(vote, Vote::No(_));
            let _ = votes.send(vote);
            // A caller that went away (cancelled) will not use the lock: undo it too.
            if random && written && verdict.wait().await != Verdict::Success {
                let _ = timeout(limit, store.release_by_eval(&claim)).await;
            }
        });
        let needed = self.needed(claim);
        let (votes, mut decide) = ballot.count(needed).await;
        let valid = self.still_valid(start, claim.ttl.duration);
        let verdict = self.verdict(QuorumOp::Obtain, votes, valid, needed);
        let success = matches!(verdict, Ok(true));
        let stragglers = decide(success);
        let outcome = verdict.map(|obtained| match obtained {
            true => Obtain::Obtained { fence: None },
            false => Obtain::Held {
                ttl: None,
                key: 0,
                queued: false,
            },
        });
        if success {
            (outcome, stragglers)
        } else {
            // Wait for the undoing, so that none of it lands after the next attempt.
            futures_util::future::join_all(stragglers).await;
            (outcome, Vec::new())
        }
    }

    /// Tries once to extend the lock on a majority (giving the keys the claim's value, with
    /// `rewrite`). `Ok(false)` when a majority says the lock is not held there. Masters that
    /// lost the keys get them back once a majority confirmed it still holds the lock.
    pub(crate) async fn refresh(
        &self,
        claim: &Claim<'_>,
        rewrite: bool,
    ) -> (Result<bool>, Stragglers) {
        let start = Instant::now();
        let limit = self.node_timeout(claim.ttl.duration);
        let ballot = self.ballot(claim, move |store, claim, votes, verdict| async move {
            let claim = claim.claim();
            let answer = timeout(limit, store.refresh(&claim, false, rewrite)).await;
            let missing = matches!(answer, Ok(Ok(Holding::Missing)));
            let vote = Vote::from_answer(answer, limit);
            let _ = votes.send(vote);
            if missing && verdict.wait().await == Verdict::Success {
                let _ = timeout(limit, store.refresh(&claim, true, rewrite)).await;
            }
        });
        let needed = self.needed(claim);
        let (votes, mut decide) = ballot.count(needed).await;
        let valid = self.still_valid(start, claim.ttl.duration);
        let verdict = self.verdict(QuorumOp::Refresh, votes, valid, needed);
        let stragglers = decide(matches!(verdict, Ok(true)));
        (verdict, stragglers)
    }

    /// The smallest remaining TTL among the masters that still hold the lock, once a
    /// majority does; `None` once a majority says it does not. Masters that do not answer
    /// decide nothing: without a majority either way, this is an error.
    pub(crate) async fn pttl(&self, claim: &Claim<'_>) -> Result<Option<Duration>> {
        let limit = self.node_timeout(claim.ttl.duration);
        let needed = self.needed(claim);
        let votes = self
            .vote_in_place(limit, needed, true, |store| store.pttl(claim))
            .await;
        let left = votes
            .iter()
            .filter_map(|(_, vote)| match vote {
                Vote::Yes(left) => Some(*left),
                _ => None,
            })
            .min();
        let yes = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::Yes(_)))
            .count();
        let votes = votes
            .into_iter()
            .map(|(i, vote)| (i, vote.map(|_| ())))
            .collect();
        match self.verdict(QuorumOp::Ttl, votes, true, needed)? {
            true if yes >= needed => Ok(left),
            _ => Ok(None),
        }
    }

    /// Deletes the lock on every master (waiting for all, within the per-node limit), with
    /// an announcement per master when `payload` is given; fine when a majority deleted it.
    pub(crate) async fn release(&self, claim: &Claim<'_>, payload: Option<&str>) -> Result<bool> {
        let limit = self.node_timeout(claim.ttl.duration);
        let needed = self.needed(claim);
        let votes = self
            .vote_in_place(limit, needed, false, |store| store.release(claim, payload))
            .await;
        self.verdict(QuorumOp::Release, votes, true, needed)
    }

    /// Releases on every master and waits for each (within the per-node limit): clean-up
    /// after an obtain whose caller went away.
    pub(crate) async fn release_everywhere(&self, claim: &Claim<'_>) {
        let limit = self.node_timeout(claim.ttl.duration);
        let releases = self
            .nodes
            .iter()
            .map(|store| timeout(limit, store.release_by_eval(claim)));
        futures_util::future::join_all(releases).await;
    }

    /// Starts `work` on every master in a counted background task of its own. Each task
    /// sends its vote, and may await the verdict to finish its part (undo, restore).
    fn ballot<F, Fut>(&self, claim: &Claim<'_>, work: F) -> Ballot
    where
        F: Fn(Arc<Store<C>>, Arc<OwnedClaim>, VoteSender, VerdictReceiver) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let claim = claim.to_shared();
        let (votes_tx, votes) = mpsc::unbounded_channel();
        let (verdict, _) = watch::channel(Verdict::Pending);
        let mut tasks = Vec::with_capacity(self.nodes.len());
        for (index, store) in self.nodes.iter().enumerate() {
            let sender = VoteSender {
                index,
                votes: votes_tx.clone(),
            };
            let receiver = VerdictReceiver(verdict.subscribe());
            let task = work(store.clone(), claim.clone(), sender, receiver);
            match self.tasks.spawn(task) {
                Some(handle) => tasks.push(handle),
                // Only outside a tokio runtime, where nothing async runs at all.
                None => {
                    let _ = votes_tx.send((index, Vote::Failed(NodeFailure::NoRuntime)));
                }
            }
        }
        Ballot {
            votes,
            verdict,
            tasks,
            nodes: self.nodes.len(),
        }
    }

    /// Runs `op` on every master within `limit`, in place (nothing outlives the call). With
    /// `early`, returns as soon as the outcome is decided.
    async fn vote_in_place<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        needed: usize,
        early: bool,
        op: F,
    ) -> Vec<(usize, Vote<T>)>
    where
        F: Fn(&'a Store<C>) -> Fut,
        Fut: Future<Output = Result<Holding<T>>>,
    {
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, store)| {
                let answer = timeout(limit, op(store));
                async move { (index, answer.await) }
            })
            .collect();
        let mut tally = Tally::new(self.nodes.len(), needed);
        let mut votes = Vec::with_capacity(self.nodes.len());
        while let Some((index, answer)) = pending.next().await {
            let vote = Vote::from_answer(answer, limit);
            tally.add(&vote);
            votes.push((index, vote));
            if early && tally.decided() {
                break;
            }
        }
        votes
    }

    /// `Ok(true)` when a majority said yes (and `valid`), `Ok(false)` when a majority
    /// refused, else an error naming every master that did not agree, and why.
    fn verdict(
        &self,
        op: QuorumOp,
        votes: Vec<(usize, Vote<()>)>,
        valid: bool,
        needed: usize,
    ) -> Result<bool> {
        let yes = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::Yes(())))
            .count();
        if yes >= needed && valid {
            return Ok(true);
        }
        let not_ours = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::No(_)))
            .count();
        // Refused by a majority, or by so many that `needed` cannot be reached.
        if not_ours >= self.majority().min(self.nodes.len() - needed + 1) {
            return Ok(false);
        }
        let mut failures: Vec<(usize, NodeFailure)> = votes
            .into_iter()
            .filter_map(|(index, vote)| match vote {
                Vote::Yes(()) => None,
                Vote::No(failure) | Vote::Failed(failure) => Some((index, failure)),
            })
            .collect();
        failures.sort_by_key(|(index, _)| *index);
        if let Some(key) = failures.iter().find_map(|(_, f)| f.wrong_type_key()) {
            return Err(Error::WrongType {
                key: key.to_owned(),
            });
        }
        Err(Error::Quorum {
            op,
            succeeded: yes,
            needed,
            nodes: self.nodes.len(),
            expired: yes >= needed,
            failures,
        })
    }
}

impl<T> Vote<T> {
    /// A master's answer within `limit` (`Err`: none came).
    fn from_answer<E>(answer: Result<Result<Holding<T>>, E>, limit: Duration) -> Self {
        match answer {
            Ok(Ok(Holding::Ours(value))) => Self::Yes(value),
            Ok(Ok(Holding::Missing)) => Self::No(NodeFailure::Missing),
            Ok(Ok(Holding::Foreign)) => Self::No(NodeFailure::Refused),
            Ok(Err(err)) => Self::Failed(NodeFailure::from(err)),
            Err(_) => Self::Failed(NodeFailure::TimedOut(limit)),
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Vote<U> {
        match self {
            Self::Yes(value) => Vote::Yes(f(value)),
            Self::No(failure) => Vote::No(failure),
            Self::Failed(failure) => Vote::Failed(failure),
        }
    }
}

/// Counts votes until the outcome is decided.
struct Tally {
    yes: usize,
    no: usize,
    nodes: usize,
    majority: usize,
}

impl Tally {
    fn new(nodes: usize, majority: usize) -> Self {
        Self {
            yes: 0,
            no: 0,
            nodes,
            majority,
        }
    }

    fn add<T>(&mut self, vote: &Vote<T>) {
        match vote {
            Vote::Yes(_) => self.yes += 1,
            Vote::No(_) | Vote::Failed(_) => self.no += 1,
        }
    }

    /// A majority said yes, or too many did not for a majority to be reached.
    fn decided(&self) -> bool {
        self.yes >= self.majority || self.no > self.nodes - self.majority
    }
}

/// A master's task's way to send its vote.
struct VoteSender {
    index: usize,
    votes: mpsc::UnboundedSender<(usize, Vote<()>)>,
}

impl VoteSender {
    fn send(self, vote: Vote<()>) -> bool {
        self.votes.send((self.index, vote)).is_ok()
    }
}

/// A master's task's way to learn the verdict.
struct VerdictReceiver(watch::Receiver<Verdict>);

impl VerdictReceiver {
    /// The verdict once it is known; `Failure` when the caller went away before deciding.
    async fn wait(mut self) -> Verdict {
        match self.0.wait_for(|v| *v != Verdict::Pending).await {
            Ok(verdict) => *verdict,
            Err(_) => Verdict::Failure,
        }
    }
}

/// The per-master tasks of one operation.
struct Ballot {
    votes: mpsc::UnboundedReceiver<(usize, Vote<()>)>,
    verdict: watch::Sender<Verdict>,
    tasks: Stragglers,
    nodes: usize,
}

impl Ballot {
    /// Collects votes until the outcome is decided (or every master answered). Returns them
    /// with the way to announce the verdict, which hands back the tasks still running.
    async fn count(
        mut self,
        majority: usize,
    ) -> (Vec<(usize, Vote<()>)>, impl FnMut(bool) -> Stragglers) {
        let mut tally = Tally::new(self.nodes, majority);
        let mut votes = Vec::with_capacity(self.nodes);
        while !tally.decided() {
            let Some((index, vote)) = self.votes.recv().await else {
                break;
            };
            tally.add(&vote);
            votes.push((index, vote));
        }
        let (verdict, mut tasks) = (self.verdict, self.tasks);
        let decide = move |success: bool| {
            verdict.send_replace(if success {
                Verdict::Success
            } else {
                Verdict::Failure
            });
            std::mem::take(&mut tasks)
        };
        (votes, decide)
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
    use super::permit_quorum;

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
            assert_eq!(permit_quorum(1, masters), masters / 2 + 1);
        }
        assert_eq!(permit_quorum(2, 5), 4);
        assert_eq!(permit_quorum(4, 5), 5);
    }
}
