//! Who holds a key, on every server: read with [`lockset::inspect`], which understands
//! exclusive, shared and counted keys and their queues.
//!
//! Used for `status`, the conflict line, the waiting line, the reason a lock was lost, and
//! to check a token before `refresh` and `release`. Reading is not atomic with anything
//! else: it describes, it never decides who owns a lock (the library's scripts do).

use std::time::Duration;

use lockset::redis::RedisResult;
use lockset::redis::aio::ConnectionLike;
use lockset::{Holding, KeyState, Mode, QueuedWaiter, QuorumConfig};

use crate::duration;

/// One lock holding a key on one server. Never its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The holder's metadata.
    pub(crate) metadata: String,
    /// What is left of it; `None` without expiry.
    pub(crate) ttl: Option<Duration>,
    /// Whether it is the lock of the token the keys were read for.
    pub(crate) ours: bool,
}

/// What one server holds at a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    /// Nothing.
    Free,
    /// Locks written by lockset: one exclusive holder, or shared or counted holders.
    Held {
        /// How they hold it.
        mode: Mode,
        /// Who holds it, the first to expire first; never empty.
        holders: Vec<Holder>,
    },
    /// A string lockset did not write.
    Foreign {
        /// What is left of it; `None` without expiry.
        ttl: Option<Duration>,
    },
    /// A list, hash, set, ...: the Redis type's name.
    WrongType(String),
    /// The server did not answer.
    Unreachable(String),
}

/// A key as seen on every server (one, or each master of a Redlock quorum).
#[derive(Clone, Debug)]
pub(crate) struct Key {
    /// The key.
    pub(crate) name: String,
    /// What each server holds there.
    pub(crate) nodes: Vec<Node>,
    /// Per server, its queue for the key, first come first (empty where it did not answer).
    pub(crate) queues: Vec<Vec<QueuedWaiter>>,
    /// What is left of a writer's mark on any server, the longest: an exclusive obtain
    /// waits (or waited and gave up) for the key's shared or counted holders, and no new
    /// one gets in meanwhile. `None` without a mark.
    pub(crate) writer_waiting: Option<Duration>,
    /// Every server that answered let this user read the key's queue: false when the ACL
    /// covers the key and not the queue names that begin with it (its waiters unknown).
    pub(crate) queue_readable: bool,
}

/// How a key looks overall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Nobody holds it anywhere.
    Free,
    /// A lockset lock holds it (exclusive, shared or counted).
    Held,
    /// A string lockset did not write.
    Foreign,
    /// Not a lock.
    WrongType,
}

impl State {
    /// The name used in `status --json`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Held => "held",
            Self::Foreign => "foreign",
            Self::WrongType => "wrong_type",
        }
    }
}

/// The name of a mode in `status --json`.
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Shared => "shared",
        Mode::Permit { .. } => "permits",
        _ => "exclusive",
    }
}

impl Key {
    /// The node that best describes the key: locks (the most holders first) over a foreign
    /// value over a wrong type; `None` when the key is free on every server that answered.
    fn holder(&self) -> Option<&Node> {
        let rank = |node: &Node| match node {
            Node::Held { holders, .. } => (3, holders.len()),
            Node::Foreign { .. } => (2, 0),
            Node::WrongType(_) => (1, 0),
            Node::Free | Node::Unreachable(_) => (0, 0),
        };
        self.nodes
            .iter()
            .filter(|node| rank(node).0 > 0)
            .max_by_key(|node| rank(node))
    }

    /// The key's overall state.
    pub(crate) fn state(&self) -> State {
        match self.holder() {
            None | Some(Node::Free | Node::Unreachable(_)) => State::Free,
            Some(Node::Held { .. }) => State::Held,
            Some(Node::Foreign { .. }) => State::Foreign,
            Some(Node::WrongType(_)) => State::WrongType,
        }
    }

    /// The mode the key is held in, when lockset locks hold it.
    pub(crate) fn mode(&self) -> Option<Mode> {
        match self.holder()? {
            Node::Held { mode, .. } => Some(*mode),
            _ => None,
        }
    }

    /// Whether a new lock in mode `wanted` is kept out now: by the key's holders (see
    /// [`Key::holders_keep_out`]), or, for a shared or counted lock, by a writer's mark.
    pub(crate) fn keeps_out(&self, wanted: Mode) -> bool {
        (wanted != Mode::Exclusive && self.writer_waiting.is_some())
            || self.holders_keep_out(wanted)
    }

    /// Whether the key's holders, whatever any writer's mark says, keep out a lock in mode
    /// `wanted`: any holder keeps out an exclusive lock; shared holders let shared ones in,
    /// permit holders further permits under the same limit while some are left. (A mark
    /// takes nothing: a lost share was not taken by it.)
    pub(crate) fn holders_keep_out(&self, wanted: Mode) -> bool {
        let Some(node) = self.holder() else {
            return false;
        };
        let Node::Held { mode, holders } = node else {
            return true;
        };
        match (wanted, *mode) {
            (Mode::Shared, Mode::Shared) => false,
            (Mode::Permit { limit }, Mode::Permit { limit: held }) => {
                limit != held || holders.len() >= usize::try_from(limit).unwrap_or(usize::MAX)
            }
            _ => true,
        }
    }

    /// The exclusive holder's metadata, when one lock holds the key alone.
    pub(crate) fn metadata(&self) -> Option<&str> {
        match self.holder()? {
            Node::Held {
                mode: Mode::Exclusive,
                holders,
            } => holders.first().map(|holder| holder.metadata.as_str()),
            _ => None,
        }
    }

    /// Who holds the key, in a few words: `"web-1:42"`, `2 shared holders`, `3 of 3
    /// permits`; `None` when no lock holds it.
    pub(crate) fn holders_in_brief(&self) -> Option<String> {
        let Node::Held { mode, holders } = self.holder()? else {
            return None;
        };
        let n = holders.len();
        Some(match mode {
            Mode::Shared if n == 1 => "1 shared holder".to_owned(),
            Mode::Shared => format!("{n} shared holders"),
            Mode::Permit { limit } => format!("{n} of {limit} permits"),
            _ => format!("{:?}", holders.first()?.metadata),
        })
    }

    /// How the lock the keys were read for holds the key, and its hold, where it holds it.
    fn own(&self) -> Option<(Mode, &Holder)> {
        self.nodes.iter().find_map(|node| match node {
            Node::Held { mode, holders } => holders
                .iter()
                .find(|holder| holder.ours)
                .map(|holder| (*mode, holder)),
            _ => None,
        })
    }

    /// The metadata stored by the lock the keys were read for, when it holds the key
    /// anywhere.
    pub(crate) fn own_metadata(&self) -> Option<&str> {
        self.own().map(|(_, holder)| holder.metadata.as_str())
    }

    /// The mode the lock the keys were read for holds the key in (alone, shared, a permit),
    /// when it holds the key anywhere.
    pub(crate) fn own_mode(&self) -> Option<Mode> {
        self.own().map(|(mode, _)| mode)
    }

    /// The longest time left on any server holding the key, of any holder; `None` when
    /// free or persistent.
    pub(crate) fn ttl(&self) -> Option<Duration> {
        let mut longest: Option<Duration> = None;
        for node in &self.nodes {
            let ttls: Vec<Option<Duration>> = match node {
                Node::Held { holders, .. } => holders.iter().map(|holder| holder.ttl).collect(),
                Node::Foreign { ttl } => vec![*ttl],
                _ => Vec::new(),
            };
            for ttl in ttls {
                // A persistent copy anywhere means "no expiry".
                let ttl = ttl?;
                longest = Some(longest.map_or(ttl, |longest| longest.max(ttl)));
            }
        }
        longest
    }

    /// How many servers hold something at the key.
    pub(crate) fn held_on(&self) -> usize {
        self.nodes
            .iter()
            .filter(|node| !matches!(node, Node::Free | Node::Unreachable(_)))
            .count()
    }

    /// How many servers did not answer the read.
    pub(crate) fn unanswered(&self) -> usize {
        self.nodes
            .iter()
            .filter(|node| matches!(node, Node::Unreachable(_)))
            .count()
    }

    /// How many servers hold the key for the lock the keys were read for.
    pub(crate) fn ours_on(&self) -> usize {
        self.nodes
            .iter()
            .filter(|node| match node {
                Node::Held { holders, .. } => holders.iter().any(|holder| holder.ours),
                _ => false,
            })
            .count()
    }

    /// The key as others hold it: the holds of the lock the keys were read for are gone.
    pub(crate) fn others(&self) -> Self {
        let nodes = self
            .nodes
            .iter()
            .map(|node| match node {
                Node::Held { mode, holders } => {
                    let holders: Vec<Holder> = holders
                        .iter()
                        .filter(|holder| !holder.ours)
                        .cloned()
                        .collect();
                    match holders.is_empty() {
                        true => Node::Free,
                        false => Node::Held {
                            mode: *mode,
                            holders,
                        },
                    }
                }
                other => other.clone(),
            })
            .collect();
        Self {
            name: self.name.clone(),
            nodes,
            queues: self.queues.clone(),
            writer_waiting: self.writer_waiting,
            queue_readable: self.queue_readable,
        }
    }

    /// One phrase for people: `"orders" is held by "web-1:42" (12.3s left)`, `"doc" is held
    /// shared by 2 holders: "a" (4.1s left), "b" (9.0s left)`.
    pub(crate) fn describe(&self) -> String {
        let held = self.describe_holders();
        match self.writer_waiting {
            Some(mark) => format!(
                "{held}; a writer's mark keeps new shared and counted holders out ({} left)",
                duration::show(mark)
            ),
            None => held,
        }
    }

    /// Who holds the key, in one phrase (see [`Key::describe`]).
    fn describe_holders(&self) -> String {
        let name = &self.name;
        let left = left(self.ttl());
        match self.holder() {
            Some(Node::Held { mode, holders }) => {
                let n = holders.len();
                let list = holders.iter().map(who).collect::<Vec<_>>().join(", ");
                match mode {
                    Mode::Shared => {
                        let plural = if n == 1 { "" } else { "s" };
                        format!("{name:?} is held shared by {n} holder{plural}: {list}")
                    }
                    Mode::Permit { limit } => {
                        format!("{name:?} is held as {n} of {limit} permits: {list}")
                    }
                    _ => match holders.first().map(|holder| holder.metadata.as_str()) {
                        Some("") | None => {
                            format!("{name:?} is held by a lock without metadata ({left})")
                        }
                        // Quoted like the key: what anyone stored must not reach a terminal
                        // raw.
                        Some(metadata) => format!("{name:?} is held by {metadata:?} ({left})"),
                    },
                }
            }
            Some(Node::Foreign { .. }) => {
                format!("{name:?} holds a value lockset did not write ({left})")
            }
            Some(Node::WrongType(kind)) => format!("{name:?} holds a {kind}, not a lock"),
            _ => format!("{name:?} is free"),
        }
    }
}

/// `12.3s left`, or `no expiry`.
fn left(ttl: Option<Duration>) -> String {
    match ttl {
        Some(ttl) => format!("{} left", duration::show(ttl)),
        None => "no expiry".to_owned(),
    }
}

/// One holder among several: `"web-1:42" (4.1s left)`.
fn who(holder: &Holder) -> String {
    let left = left(holder.ttl);
    match holder.metadata.as_str() {
        "" => format!("a holder without metadata ({left})"),
        metadata => format!("{metadata:?} ({left})"),
    }
}

/// The first key the lock read for does not hold on a majority of the servers, as seen by
/// others.
#[derive(Clone, Debug)]
pub(crate) struct Loss {
    /// The key, where the lock's own holds count as gone: it never names the lock itself as
    /// the one who took it.
    pub(crate) others: Key,
    /// How many servers still hold the key for the lock.
    pub(crate) kept: usize,
}

impl Loss {
    /// The first of `keys` that the lock they were read for does not hold on a majority of
    /// the servers, as far as they answered: a server that did not answer (slow, paused,
    /// far) may still hold it, so only the answers that it does not can prove a loss. `None`
    /// when it holds them all, or may.
    pub(crate) fn find(keys: &[Key]) -> Option<Self> {
        let key = keys.iter().find(|key| {
            key.ours_on() + key.unanswered() < QuorumConfig::majority(key.nodes.len())
        })?;
        Some(Self {
            others: key.others(),
            kept: key.ours_on(),
        })
    }

    /// True when someone else holds the key somewhere (else it expired or was deleted).
    pub(crate) fn is_taken(&self) -> bool {
        self.others.state() != State::Free
    }

    /// One phrase for people: who holds the key instead, or on how few masters the lock
    /// still does.
    pub(crate) fn describe(&self) -> String {
        let nodes = self.others.nodes.len();
        if self.is_taken() || self.kept == 0 {
            return self.others.describe();
        }
        format!(
            "{:?} is held by this lock on only {} of {nodes} masters ({} needed)",
            self.others.name,
            self.kept,
            QuorumConfig::majority(nodes)
        )
    }
}

/// How long one master of several may take to answer a read, connecting included (the
/// read connections connect when first used): a paused or unreachable one is then described
/// as not answering, and the others still tell who holds the keys. A master that did not
/// answer proves no loss (see [`Loss::find`]). (One server has redis-rs's own timeouts: it
/// alone can describe them.)
const READ_LIMIT: Duration = Duration::from_secs(1);

/// Reads every key of `keys` on every connection of `nodes`, all of them at once; the holds
/// of `token`'s lock are marked as ours. Fails only when no server answered.
pub(crate) async fn inspect_all<C>(
    nodes: &[C],
    keys: &[String],
    token: Option<&str>,
) -> RedisResult<Vec<Key>>
where
    C: ConnectionLike + Clone,
{
    let limit = (nodes.len() > 1).then_some(READ_LIMIT);
    let reads = nodes
        .iter()
        .map(|conn| read_node(conn.clone(), keys, limit));
    let mut answers = futures_util::future::join_all(reads).await;
    if answers.iter().all(Result::is_err)
        && let Some(Err(err)) = answers.pop()
    {
        return Err(err);
    }
    let seen = keys.iter().enumerate().map(|(index, key)| {
        let mut seen = Key {
            name: key.clone(),
            nodes: Vec::with_capacity(answers.len()),
            queues: Vec::with_capacity(answers.len()),
            writer_waiting: None,
            queue_readable: true,
        };
        for answer in &answers {
            let (node, queue, mark) = match answer {
                Ok(states) => {
                    states
                        .get(index)
                        .cloned()
                        .map_or((Node::Free, Vec::new(), None), |state| {
                            seen.queue_readable &= state.queue_readable;
                            from_state(state, token)
                        })
                }
                Err(err) => (Node::Unreachable(err.to_string()), Vec::new(), None),
            };
            seen.nodes.push(node);
            seen.queues.push(queue);
            seen.writer_waiting = seen.writer_waiting.max(mark);
        }
        seen
    });
    Ok(seen.collect())
}

/// `keys` as one server holds them, within `limit` if any.
async fn read_node<C>(
    mut conn: C,
    keys: &[String],
    limit: Option<Duration>,
) -> RedisResult<Vec<KeyState>>
where
    C: ConnectionLike,
{
    let read = lockset::inspect(&mut conn, keys);
    let Some(limit) = limit else {
        return read.await;
    };
    tokio::time::timeout(limit, read).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {}", duration::show(limit)),
        )
        .into())
    })
}

/// The first key of `keys` whose holders keep out a lock in mode `wanted` (as far as a read
/// can tell), else the first key that is not free, described; `None` when all are free.
pub(crate) async fn first_held<C>(
    nodes: &[C],
    keys: &[String],
    wanted: Mode,
) -> RedisResult<Option<Key>>
where
    C: ConnectionLike + Clone,
{
    let mut held = None;
    for seen in inspect_all(nodes, keys, None).await? {
        if seen.keeps_out(wanted) {
            return Ok(Some(seen));
        }
        if held.is_none() && seen.state() != State::Free {
            held = Some(seen);
        }
    }
    Ok(held)
}

/// One server's view of a key, as the library read it, its queue, and what is left of a
/// writer's mark; the holds of `token`'s lock marked as ours.
fn from_state(state: KeyState, token: Option<&str>) -> (Node, Vec<QueuedWaiter>, Option<Duration>) {
    let holders = state
        .holders()
        .iter()
        .map(|holder| Holder {
            metadata: holder.metadata.clone(),
            ttl: holder.ttl,
            ours: token.is_some_and(|token| holder.is_owned_by(token)),
        })
        .collect();
    let node = match (state.mode(), &state.holding) {
        (Some(mode), _) => Node::Held { mode, holders },
        (None, Holding::Foreign { ttl }) => Node::Foreign { ttl: *ttl },
        (None, Holding::WrongType { kind }) => Node::WrongType(kind.clone()),
        _ => Node::Free,
    };
    (node, state.waiters, state.writer_waiting)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(nodes: Vec<Node>) -> Key {
        Key {
            name: "k".to_owned(),
            queues: vec![Vec::new(); nodes.len()],
            nodes,
            writer_waiting: None,
            queue_readable: true,
        }
    }

    fn holder(metadata: &str, secs: u64, ours: bool) -> Holder {
        Holder {
            metadata: metadata.to_owned(),
            ttl: Some(Duration::from_secs(secs)),
            ours,
        }
    }

    /// Held exclusively by "web-1:42"; by the lock read for when `ours`.
    fn held(ours: bool, secs: u64) -> Node {
        Node::Held {
            mode: Mode::Exclusive,
            holders: vec![holder("web-1:42", secs, ours)],
        }
    }

    /// A writer's mark keeps new readers out, but took no reader's share: a reader that
    /// lost its share beside fellow readers was not taken over (`run`'s loss message).
    #[test]
    fn a_writers_mark_keeps_readers_out_but_its_holders_do_not() {
        let mut readers = key(vec![Node::Held {
            mode: Mode::Shared,
            holders: vec![holder("a", 4, false)],
        }]);
        readers.writer_waiting = Some(Duration::from_secs(2));
        assert!(readers.keeps_out(Mode::Shared));
        assert!(!readers.holders_keep_out(Mode::Shared));
        assert!(readers.holders_keep_out(Mode::Exclusive));
    }

    #[test]
    fn descriptions_name_key_holders_and_time_left() {
        assert_eq!(
            key(vec![held(false, 12)]).describe(),
            r#""k" is held by "web-1:42" (12.0s left)"#
        );
        assert_eq!(key(vec![Node::Free]).describe(), r#""k" is free"#);
        assert_eq!(
            key(vec![Node::WrongType("list".to_owned())]).describe(),
            r#""k" holds a list, not a lock"#
        );
        let shared = key(vec![Node::Held {
            mode: Mode::Shared,
            holders: vec![holder("a", 4, false), holder("", 9, false)],
        }]);
        assert_eq!(
            shared.describe(),
            r#""k" is held shared by 2 holders: "a" (4.0s left), a holder without metadata (9.0s left)"#
        );
        assert_eq!(shared.ttl(), Some(Duration::from_secs(9)));
        assert_eq!(shared.metadata(), None);
        assert_eq!(
            shared.holders_in_brief().as_deref(),
            Some("2 shared holders")
        );
        let counted = key(vec![Node::Held {
            mode: Mode::Permit { limit: 3 },
            holders: vec![holder("a", 4, false)],
        }]);
        assert_eq!(
            counted.describe(),
            r#""k" is held as 1 of 3 permits: "a" (4.0s left)"#
        );
    }

    #[test]
    fn without_our_holds_a_key_shows_only_the_others() {
        let seen = key(vec![held(true, 3), Node::Free, held(false, 5)]);
        let others = seen.others();
        assert_eq!((seen.ours_on(), others.ours_on()), (1, 0));
        assert_eq!(others.held_on(), 1);
        assert_eq!(others.ttl(), Some(Duration::from_secs(5)));
        assert_eq!(
            key(vec![held(true, 3), Node::Free]).others().state(),
            State::Free
        );
        // A shared key we share with others stays held by them.
        let shared = key(vec![Node::Held {
            mode: Mode::Shared,
            holders: vec![holder("mine", 4, true), holder("theirs", 9, false)],
        }]);
        assert_eq!(shared.own_metadata(), Some("mine"));
        assert_eq!(
            shared.others().describe(),
            r#""k" is held shared by 1 holder: "theirs" (9.0s left)"#
        );
    }

    #[test]
    fn a_loss_never_names_its_own_lock() {
        let minority = key(vec![held(true, 3), Node::Free, Node::Free]);
        let loss = Loss::find(&[minority]).expect("lost");
        assert!(!loss.is_taken());
        assert_eq!(
            loss.describe(),
            r#""k" is held by this lock on only 1 of 3 masters (2 needed)"#
        );
        let taken = key(vec![held(true, 3), held(false, 5), held(false, 5)]);
        let loss = Loss::find(&[taken]).expect("lost");
        assert!(loss.is_taken());
        assert_eq!(loss.describe(), r#""k" is held by "web-1:42" (5.0s left)"#);
        let majority = key(vec![held(true, 3), held(true, 3), Node::Free]);
        assert!(Loss::find(&[majority]).is_none());
        // Masters that did not answer (slow, paused, far) may hold it: no proven loss.
        let unanswered = || Node::Unreachable("no answer within 1s".to_owned());
        let unknown = key(vec![held(true, 3), unanswered(), unanswered()]);
        assert!(Loss::find(&[unknown]).is_none());
        let lost = key(vec![Node::Free, Node::Free, unanswered()]);
        assert!(Loss::find(&[lost]).is_some());
    }

    #[test]
    fn a_quorum_key_counts_its_masters() {
        let seen = key(vec![
            held(true, 3),
            Node::Unreachable("down".to_owned()),
            held(true, 5),
        ]);
        assert_eq!(seen.state(), State::Held);
        assert_eq!((seen.held_on(), seen.ours_on()), (2, 2));
        assert_eq!(seen.ttl(), Some(Duration::from_secs(5)));
        let persistent = key(vec![held(false, 3), Node::Foreign { ttl: None }]);
        assert_eq!(persistent.ttl(), None);
        assert_eq!(key(vec![Node::Free]).state(), State::Free);
    }
}
