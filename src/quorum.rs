//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! Every operation goes to all masters at once, each bounded by a per-node time limit, and
//! returns as soon as the outcome is decided (a majority for, or a majority against): the
//! slowest node is never waited for. An obtain counts only if a majority locked the whole
//! key set **and** the validity `ttl − elapsed − drift` is still positive; otherwise it
//! releases on every master, including those that failed or timed out.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionLike;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, InvalidInput, NodeFailure, QuorumOp, Result};
use crate::store::{Obtain, Store};
use crate::value::Owner;

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
    /// How long one master may take to answer one operation. Defaults to 5% of the lock's
    /// TTL (as redsync), at least [`MIN_NODE_TIMEOUT`].
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

/// N independent masters, each reached through its own [`Client`].
pub(crate) struct Quorum<C> {
    nodes: Vec<Client<C>>,
    config: QuorumConfig,
}

/// How one master answered.
enum Vote<T> {
    Yes(T),
    /// The lock is someone else's (obtain), or not ours (refresh, release, TTL).
    Refused,
    Failed(NodeFailure),
}

impl<C> Quorum<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(nodes: Vec<Client<C>>, config: QuorumConfig) -> Result<Self> {
        if nodes.is_empty() {
            return Err(InvalidInput::NoNodes.into());
        }
        let factor = config.drift_factor;
        if !factor.is_finite() || !(0.0..1.0).contains(&factor) {
            return Err(InvalidInput::DriftFactor { factor }.into());
        }
        Ok(Self { nodes, config })
    }

    /// How many masters make a majority.
    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
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

    /// Runs `op` on every master at once, each within the per-node limit. With `early`,
    /// returns as soon as a majority said yes or too many said no to reach one; masters still
    /// working then are abandoned (their requests stay queued in order on their connection).
    async fn vote<'a, T, F, Fut>(
        &'a self,
        ttl: Duration,
        early: bool,
        op: F,
    ) -> Vec<(usize, Vote<T>)>
    where
        F: Fn(&'a Client<C>) -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let limit = self.node_timeout(ttl);
        let majority = self.majority();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let answer = tokio::time::timeout(limit, op(node));
                async move { (index, answer.await) }
            })
            .collect();
        let mut votes = Vec::with_capacity(self.nodes.len());
        let (mut yes, mut no) = (0, 0);
        while let Some((index, answer)) = pending.next().await {
            let vote = match answer {
                Ok(Ok(Some(value))) => Vote::Yes(value),
                Ok(Ok(None)) => Vote::Refused,
                Ok(Err(err)) => Vote::Failed(NodeFailure::from(err)),
                Err(_) => Vote::Failed(NodeFailure::TimedOut(limit)),
            };
            if matches!(vote, Vote::Yes(_)) {
                yes += 1;
            } else {
                no += 1;
            }
            votes.push((index, vote));
            if early && (yes >= majority || no > self.nodes.len() - majority) {
                break;
            }
        }
        votes
    }

    /// Tries once to lock `keys` on a majority within the validity budget.
    pub(crate) async fn obtain(
        &self,
        keys: &[String],
        owner: &Owner,
        value: &str,
        ttl: Duration,
        ttl_ms: u64,
    ) -> Result<Obtain> {
        let start = Instant::now();
        let votes = self
            .vote(ttl, true, |node| async move {
                let outcome = store(node)?
                    .obtain(keys, owner, value, ttl_ms, None)
                    .await?;
                Ok(matches!(outcome, Obtain::Obtained { .. }).then_some(()))
            })
            .await;
        let valid = self.still_valid(start, ttl);
        let verdict = self.verdict(QuorumOp::Obtain, votes, valid);
        if !matches!(verdict, Ok(true)) {
            // Not ours: undo everywhere, also where the attempt failed or is still in flight.
            self.release_everywhere(keys, owner, ttl).await;
        }
        match verdict? {
            true => Ok(Obtain::Obtained { fence: None }),
            false => Ok(Obtain::Held { ttl: None, key: 0 }),
        }
    }

    /// Tries once to extend the lock on a majority; missing keys are re-created with the
    /// lock's value (a master that restarted empty). `Ok(false)` when a majority says the
    /// lock is not held.
    pub(crate) async fn refresh(
        &self,
        keys: &[String],
        owner: &Owner,
        metadata: &str,
        ttl: Duration,
        ttl_ms: u64,
    ) -> Result<bool> {
        let start = Instant::now();
        let value = &*owner.value(metadata);
        let votes = self
            .vote(ttl, true, |node| async move {
                let refreshed = store(node)?
                    .refresh(keys, owner, ttl_ms, Some(value))
                    .await?;
                Ok(refreshed.then_some(()))
            })
            .await;
        let valid = self.still_valid(start, ttl);
        self.verdict(QuorumOp::Refresh, votes, valid)
    }

    /// The smallest remaining TTL among the masters that still hold the lock, if a majority
    /// does (decided as soon as a majority answered either way).
    pub(crate) async fn pttl(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl: Duration,
    ) -> Result<Option<Duration>> {
        let votes = self
            .vote(ttl, true, |node| async move {
                store(node)?.pttl(keys, owner).await
            })
            .await;
        let left: Vec<Duration> = votes
            .into_iter()
            .filter_map(|(_, vote)| match vote {
                Vote::Yes(left) => Some(left),
                _ => None,
            })
            .collect();
        Ok((left.len() >= self.majority()).then(|| left.into_iter().min().unwrap_or_default()))
    }

    /// Deletes the lock on every master (waiting for all, within the per-node limit); fine
    /// when a majority deleted it.
    pub(crate) async fn release(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool> {
        let votes = self
            .vote(ttl, false, |node| async move {
                Ok(store(node)?.release(keys, owner).await?.then_some(()))
            })
            .await;
        self.verdict(QuorumOp::Release, votes, true)
    }

    /// Releases on every master and waits for each (within the per-node limit), so that no
    /// clean-up of this attempt is still on its way when the next attempt starts.
    pub(crate) async fn release_everywhere(&self, keys: &[String], owner: &Owner, ttl: Duration) {
        let limit = self.node_timeout(ttl);
        let releases = self.nodes.iter().map(|node| {
            tokio::time::timeout(limit, async move {
                store(node)?.release_by_eval(keys, owner).await
            })
        });
        futures_util::future::join_all(releases).await;
    }

    /// `Ok(true)` when a majority said yes (and `valid`), `Ok(false)` when a majority
    /// refused, else an error naming every node that failed and why.
    fn verdict(&self, op: QuorumOp, votes: Vec<(usize, Vote<()>)>, valid: bool) -> Result<bool> {
        let yes = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::Yes(())))
            .count();
        if yes >= self.majority() && valid {
            return Ok(true);
        }
        let refused = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::Refused))
            .count();
        if refused >= self.majority() {
            return Ok(false);
        }
        let mut failures: Vec<(usize, NodeFailure)> = votes
            .into_iter()
            .filter_map(|(index, vote)| match vote {
                Vote::Yes(()) => None,
                Vote::Refused => Some((index, NodeFailure::Refused)),
                Vote::Failed(failure) => Some((index, failure)),
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
            needed: self.majority(),
            nodes: self.nodes.len(),
            expired: yes >= self.majority(),
            failures,
        })
    }
}

/// The store behind a master (checked when the quorum was built).
fn store<C>(node: &Client<C>) -> Result<&Store<C>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    node.store()
        .ok_or_else(|| InvalidInput::NestedQuorum.into())
}

impl<C> fmt::Debug for Quorum<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quorum")
            .field("nodes", &self.nodes.len())
            .field("config", &self.config)
            .finish()
    }
}
