//! How a quorum operation counts: each master's vote, the tally that decides as soon as a
//! majority agreed (or can no longer agree), and the state one operation shares with its
//! masters' tasks.

use super::*;

/// How long an operation run in place goes on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum InPlace {
    /// Until its outcome is decided, or two masters turn out to be one server.
    Decide,
    /// Until every master answered or ran out of time: every command it sends is sent, and
    /// answered, before it returns.
    Finish,
}

/// The `needed`-th longest of the remaining TTLs `held` (`None` with fewer): at least
/// `needed` masters hold the lock that long, and no more than that can be said of `needed`.
pub(super) fn held_by(mut held: Vec<Duration>, needed: usize) -> Option<Duration> {
    let nth = needed.checked_sub(1)?;
    if nth >= held.len() {
        return None;
    }
    let (_, nth, _) = held.select_nth_unstable_by(nth, |a, b| b.cmp(a));
    Some(*nth)
}

/// The votes an operation counted until its outcome was decided, and two masters found to
/// be one server meanwhile (which decides it too).
pub(super) struct Counted<T> {
    pub(super) votes: Vec<(usize, Vote<T>)>,
    pub(super) duplicate: Option<InvalidInput>,
}

impl Counted<()> {
    /// `Ok(true)` when a majority said yes (and `valid`), `Ok(false)` when a majority
    /// refused, else an error naming every master that did not agree, and why.
    pub(super) fn verdict<C>(
        self,
        quorum: &Quorum<C>,
        op: QuorumOp,
        valid: bool,
        needed: usize,
    ) -> Result<bool> {
        if let Some(duplicate) = self.duplicate {
            return Err(duplicate.into());
        }
        let votes = self.votes;
        let nodes = quorum.nodes.len();
        let yes = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::Yes(())))
            .count();
        if yes >= needed && valid {
            return Ok(true);
        }
        // A key held there in a mode that never goes with ours ends the obtain, as on one
        // server, only when those masters alone leave too few for the quorum; on fewer it is
        // a refusal like any holder's (a leftover, a rival racing), and worth waiting out.
        let mismatched = || {
            votes
                .iter()
                .filter_map(|(_, v)| v.failure()?.mode_mismatch())
        };
        if mismatched().count() > nodes.saturating_sub(needed)
            && let Some(mismatch) = mismatched().next()
        {
            return Err(mismatch);
        }
        let not_ours = votes
            .iter()
            .filter(|(_, v)| matches!(v, Vote::No(_)))
            .count();
        // Refused by a majority, or by so many that `needed` cannot be reached.
        if not_ours >= QuorumConfig::majority(nodes).min(nodes - needed + 1) {
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
            nodes,
            expired: yes >= needed,
            failures,
        })
    }
}

/// What one master's task of an operation gets.
pub(super) struct Share<C> {
    pub(super) master: usize,
    pub(super) store: Arc<Store<C>>,
    pub(super) claim: Arc<OwnedClaim>,
    pub(super) votes: VoteSender,
    pub(super) verdict: VerdictReceiver,
    pub(super) identities: Arc<Identities>,
    pub(super) health: Arc<Health>,
    /// The per-node time limit.
    pub(super) limit: Duration,
    /// The write this task is about to send, registered with the lock's stragglers; `None`
    /// when the operation registers none, or the lock's release started.
    pub(super) writing: Option<Writing>,
}

impl<C> Share<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// This master's answer to `op` within the limit, its run id asked for beside it if
    /// it never answered (see `distinct.rs`); nothing is sent while it does not answer (see
    /// `health.rs`).
    pub(super) async fn answer<T>(
        &self,
        op: impl Future<Output = Result<T>>,
    ) -> Result<T, NodeFailure> {
        let bounded = self
            .identities
            .beside(self.master, &self.store, self.limit, op);
        self.health.ask(&self.store, self.limit, bounded).await
    }

    /// As [`Share::answer`], for this master's part of a release or clean-up; with `owed`,
    /// owed to it when it could not be sent or got no answer in time.
    pub(super) async fn release<T>(
        &self,
        op: impl Future<Output = Result<T>>,
        owed: bool,
    ) -> Result<T, NodeFailure> {
        if !owed {
            return self.answer(op).await;
        }
        let bounded = self
            .identities
            .beside(self.master, &self.store, self.limit, op);
        self.health
            .release(&self.store, &self.claim, self.limit, bounded)
            .await
    }

    /// Records that this master may hold the lock, unless nothing was sent to it.
    pub(super) fn note_sent<T>(&self, writing: Option<&Writing>, answer: &Result<T, NodeFailure>) {
        let unsent = matches!(answer, Err(NodeFailure::Unresponsive));
        if let Some(writing) = writing.filter(|_| !unsent) {
            writing.sent();
        }
    }
}

impl<T> Vote<T> {
    /// A master's answer (`Err`: none came in time, or nothing was sent).
    pub(super) fn from_answer(answer: Result<Ownership<T>, NodeFailure>) -> Self {
        match answer {
            Ok(Ownership::Ours(value)) => Self::Yes(value),
            Ok(Ownership::Missing) => Self::No(NodeFailure::Missing),
            Ok(Ownership::Foreign) => Self::No(NodeFailure::Refused),
            Err(failure) => Self::failed(failure),
        }
    }

    /// A master's failure to answer as asked: a refusal (`No`) when the key is held there in
    /// another mode, as nothing was written there either; else `Failed`.
    pub(super) fn failed(failure: NodeFailure) -> Self {
        match failure {
            NodeFailure::ModeMismatch { .. } => Self::No(failure),
            failure => Self::Failed(failure),
        }
    }

    /// Why the master did not agree, if it did not.
    fn failure(&self) -> Option<&NodeFailure> {
        match self {
            Self::Yes(_) => None,
            Self::No(failure) | Self::Failed(failure) => Some(failure),
        }
    }

    pub(super) fn map<U>(self, f: impl FnOnce(T) -> U) -> Vote<U> {
        match self {
            Self::Yes(value) => Vote::Yes(f(value)),
            Self::No(failure) => Vote::No(failure),
            Self::Failed(failure) => Vote::Failed(failure),
        }
    }
}

/// Counts votes until the outcome is decided.
pub(super) struct Tally {
    pub(super) yes: usize,
    pub(super) no: usize,
    pub(super) nodes: usize,
    pub(super) majority: usize,
}

impl Tally {
    pub(super) fn new(nodes: usize, majority: usize) -> Self {
        Self {
            yes: 0,
            no: 0,
            nodes,
            majority,
        }
    }

    pub(super) fn add<T>(&mut self, vote: &Vote<T>) {
        match vote {
            Vote::Yes(_) => self.yes += 1,
            Vote::No(_) | Vote::Failed(_) => self.no += 1,
        }
    }

    /// A majority said yes, or too many did not for a majority to be reached.
    pub(super) fn decided(&self) -> bool {
        self.yes >= self.majority || self.no > self.nodes - self.majority
    }
}

/// A master's task's way to send its vote.
pub(super) struct VoteSender {
    pub(super) index: usize,
    pub(super) votes: mpsc::UnboundedSender<(usize, Vote<()>)>,
}

impl VoteSender {
    pub(super) fn send(&self, vote: Vote<()>) -> bool {
        self.votes.send((self.index, vote)).is_ok()
    }
}

/// A master's task's way to learn the verdict.
pub(super) struct VerdictReceiver(pub(super) watch::Receiver<Verdict>);

impl VerdictReceiver {
    /// The verdict once it is known; `Failure` when the caller went away before deciding.
    pub(super) async fn wait(&mut self) -> Verdict {
        match self.0.wait_for(|v| *v != Verdict::Pending).await {
            Ok(verdict) => *verdict,
            Err(_) => Verdict::Failure,
        }
    }
}

/// The per-master tasks of one operation: their votes, and the way to tell them the verdict.
pub(super) struct Ballot {
    pub(super) votes: mpsc::UnboundedReceiver<(usize, Vote<()>)>,
    pub(super) verdict: watch::Sender<Verdict>,
    pub(super) nodes: usize,
}

impl Ballot {
    /// Collects votes until the outcome is decided (or every master answered), or, with
    /// `identities`, until two masters turn out to be one server. Returns them with the way
    /// to announce the verdict to the tasks.
    pub(super) async fn count(
        mut self,
        majority: usize,
        identities: Option<&Identities>,
    ) -> (Counted<()>, impl FnMut(bool)) {
        let mut tally = Tally::new(self.nodes, majority);
        let mut counted = Counted {
            votes: Vec::with_capacity(self.nodes),
            duplicate: None,
        };
        while !tally.decided() && counted.duplicate.is_none() {
            let Some((index, vote)) = self.votes.recv().await else {
                break;
            };
            tally.add(&vote);
            counted.votes.push((index, vote));
            counted.duplicate = identities.and_then(Identities::duplicate);
        }
        let verdict = self.verdict;
        let decide = move |success: bool| {
            verdict.send_replace(if success {
                Verdict::Success
            } else {
                Verdict::Failure
            });
        };
        (counted, decide)
    }
}
