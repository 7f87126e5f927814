//! Who holds a key: read straight from Redis, since the library has no call for it.
//!
//! Used for `status`, the conflict line, the waiting line, the reason a lock was lost, and
//! to check a token before `refresh` and `release`. Reading is not atomic with anything
//! else: it describes, it never decides who owns a lock (the library's scripts do).

use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::redis::{self, RedisResult};

use crate::duration;

/// What one server holds at a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    /// Nothing.
    Free,
    /// A lock written by lockset.
    Held {
        /// The holder's token: compared, never shown.
        token: String,
        /// The holder's metadata.
        metadata: String,
        /// What is left of it; `None` without expiry.
        ttl: Option<Duration>,
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
}

/// How a key looks overall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Nobody holds it anywhere.
    Free,
    /// A lockset lock holds it.
    Held,
    /// A string lockset did not write.
    Foreign,
    /// Not a string.
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

impl Key {
    /// The node that best describes the key: a lock over a foreign value over a wrong type;
    /// `None` when the key is free on every server that answered.
    fn holder(&self) -> Option<&Node> {
        let rank = |node: &Node| match node {
            Node::Held { .. } => 3,
            Node::Foreign { .. } => 2,
            Node::WrongType(_) => 1,
            Node::Free | Node::Unreachable(_) => 0,
        };
        self.nodes
            .iter()
            .filter(|node| rank(node) > 0)
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

    /// The holder's metadata, when a lockset lock holds the key.
    pub(crate) fn metadata(&self) -> Option<&str> {
        match self.holder()? {
            Node::Held { metadata, .. } => Some(metadata),
            _ => None,
        }
    }

    /// The metadata stored by the holder of `token`, when it holds the key anywhere.
    pub(crate) fn metadata_of(&self, token: &str) -> Option<&str> {
        self.nodes.iter().find_map(|node| match node {
            Node::Held {
                token: t, metadata, ..
            } if t == token => Some(metadata.as_str()),
            _ => None,
        })
    }

    /// The longest time left on any server holding the key; `None` when free or
    /// persistent.
    pub(crate) fn ttl(&self) -> Option<Duration> {
        let mut longest: Option<Duration> = None;
        for node in &self.nodes {
            match node {
                // A persistent copy anywhere means "no expiry".
                Node::Held { ttl: None, .. } | Node::Foreign { ttl: None } => return None,
                Node::Held { ttl: Some(ttl), .. } | Node::Foreign { ttl: Some(ttl) } => {
                    longest = Some(longest.map_or(*ttl, |longest| longest.max(*ttl)));
                }
                _ => {}
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

    /// How many servers hold the key with `token`.
    pub(crate) fn held_by(&self, token: &str) -> usize {
        self.nodes
            .iter()
            .filter(|node| matches!(node, Node::Held { token: t, .. } if t == token))
            .count()
    }

    /// The key as others hold it: every server where `token` holds it counts as free.
    pub(crate) fn without(&self, token: &str) -> Self {
        let nodes = self
            .nodes
            .iter()
            .map(|node| match node {
                Node::Held { token: t, .. } if t == token => Node::Free,
                other => other.clone(),
            })
            .collect();
        Self {
            name: self.name.clone(),
            nodes,
        }
    }

    /// One phrase for people: `"orders" is held by web-1:42 (12.3s left)`.
    pub(crate) fn describe(&self) -> String {
        let name = &self.name;
        let left = match self.ttl() {
            Some(ttl) => format!("{} left", duration::show(ttl)),
            None => "no expiry".to_owned(),
        };
        match self.holder() {
            Some(Node::Held { metadata, .. }) if metadata.is_empty() => {
                format!("{name:?} is held by a lock without metadata ({left})")
            }
            // Quoted like the key: what anyone stored must not reach a terminal raw.
            Some(Node::Held { metadata, .. }) => {
                format!("{name:?} is held by {metadata:?} ({left})")
            }
            Some(Node::Foreign { .. }) => {
                format!("{name:?} holds a value lockset did not write ({left})")
            }
            Some(Node::WrongType(kind)) => format!("{name:?} holds a {kind}, not a string"),
            _ => format!("{name:?} is free"),
        }
    }
}

/// The first key a token does not hold on a majority of the servers, as seen by others.
#[derive(Clone, Debug)]
pub(crate) struct Loss {
    /// The key, where the token's own copies count as free: it never names the token's
    /// holder as the one who took it.
    pub(crate) others: Key,
    /// How many servers still hold the key with the token.
    pub(crate) kept: usize,
}

impl Loss {
    /// The first of `keys` that `token` does not hold on a majority of the servers; `None`
    /// when it holds them all.
    pub(crate) fn find(keys: &[Key], token: &str) -> Option<Self> {
        let key = keys
            .iter()
            .find(|key| key.held_by(token) < key.nodes.len() / 2 + 1)?;
        Some(Self {
            others: key.without(token),
            kept: key.held_by(token),
        })
    }

    /// True when someone else holds the key somewhere (else it expired or was deleted).
    pub(crate) fn is_taken(&self) -> bool {
        self.others.state() != State::Free
    }

    /// One phrase for people: who holds the key instead, or on how few masters the token
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
            nodes / 2 + 1
        )
    }
}

/// Reads `key` on every connection of `nodes`. Fails only when no server answered.
pub(crate) async fn inspect<C>(nodes: &[C], key: &str) -> RedisResult<Key>
where
    C: ConnectionLike + Clone,
{
    let mut seen = Vec::with_capacity(nodes.len());
    let mut last_error = None;
    for conn in nodes {
        match inspect_node(&mut conn.clone(), key).await {
            Ok(node) => seen.push(node),
            Err(err) => {
                seen.push(Node::Unreachable(err.to_string()));
                last_error = Some(err);
            }
        }
    }
    let all_failed = seen.iter().all(|node| matches!(node, Node::Unreachable(_)));
    match last_error {
        Some(err) if all_failed => Err(err),
        _ => Ok(Key {
            name: key.to_owned(),
            nodes: seen,
        }),
    }
}

/// Reads every key of `keys`, in order.
pub(crate) async fn inspect_all<C>(nodes: &[C], keys: &[String]) -> RedisResult<Vec<Key>>
where
    C: ConnectionLike + Clone,
{
    let mut seen = Vec::with_capacity(keys.len());
    for key in keys {
        seen.push(inspect(nodes, key).await?);
    }
    Ok(seen)
}

/// The first key of `keys` that is not free, described; `None` when all are free.
pub(crate) async fn first_held<C>(nodes: &[C], keys: &[String]) -> RedisResult<Option<Key>>
where
    C: ConnectionLike + Clone,
{
    for key in keys {
        let seen = inspect(nodes, key).await?;
        if seen.state() != State::Free {
            return Ok(Some(seen));
        }
    }
    Ok(None)
}

/// What one server holds at `key`: its type and remaining TTL, then the value of a string.
async fn inspect_node<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<Node> {
    let (kind, pttl): (String, i64) = redis::pipe()
        .cmd("TYPE")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await?;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    match kind.as_str() {
        "none" => Ok(Node::Free),
        "string" => {
            let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(conn).await?;
            Ok(match value {
                // Gone between the two reads.
                None => Node::Free,
                Some(value) => from_value(&value, ttl),
            })
        }
        _ => Ok(Node::WrongType(kind)),
    }
}

/// A string value: a lockset lock, or something else.
fn from_value(value: &[u8], ttl: Option<Duration>) -> Node {
    let parsed = std::str::from_utf8(value)
        .ok()
        .and_then(lockset::parse_value);
    match parsed {
        Some((token, metadata)) => Node::Held {
            token: token.to_owned(),
            metadata: metadata.to_owned(),
            ttl,
        },
        None => Node::Foreign { ttl },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(nodes: Vec<Node>) -> Key {
        Key {
            name: "k".to_owned(),
            nodes,
        }
    }

    fn held(token: &str, secs: u64) -> Node {
        Node::Held {
            token: token.to_owned(),
            metadata: "web-1:42".to_owned(),
            ttl: Some(Duration::from_secs(secs)),
        }
    }

    #[test]
    fn values_parse_into_holders() {
        assert_eq!(
            from_value(b"3:abcweb-1:42", None),
            Node::Held {
                token: "abc".to_owned(),
                metadata: "web-1:42".to_owned(),
                ttl: None
            }
        );
        assert_eq!(from_value(b"hello", None), Node::Foreign { ttl: None });
        assert_eq!(from_value(&[0xff, 0xfe], None), Node::Foreign { ttl: None });
    }

    #[test]
    fn descriptions_name_key_holder_and_time_left_but_never_the_token() {
        let seen = key(vec![held("secret", 12)]);
        let text = seen.describe();
        assert_eq!(text, r#""k" is held by "web-1:42" (12.0s left)"#);
        assert!(!text.contains("secret"));
        assert_eq!(key(vec![Node::Free]).describe(), r#""k" is free"#);
        assert_eq!(
            key(vec![Node::WrongType("list".to_owned())]).describe(),
            r#""k" holds a list, not a string"#
        );
    }

    #[test]
    fn without_a_token_a_key_shows_only_the_others() {
        let seen = key(vec![held("t", 3), Node::Free, held("u", 5)]);
        let others = seen.without("t");
        assert_eq!((others.held_by("t"), others.held_by("u")), (0, 1));
        assert_eq!(others.ttl(), Some(Duration::from_secs(5)));
        assert_eq!(
            key(vec![held("t", 3), Node::Free]).without("t").state(),
            State::Free
        );
    }

    #[test]
    fn a_loss_never_names_its_own_token() {
        let minority = key(vec![held("t", 3), Node::Free, Node::Free]);
        let loss = Loss::find(&[minority], "t").expect("lost");
        assert!(!loss.is_taken());
        assert_eq!(
            loss.describe(),
            r#""k" is held by this lock on only 1 of 3 masters (2 needed)"#
        );
        let taken = key(vec![held("t", 3), held("u", 5), held("u", 5)]);
        let loss = Loss::find(&[taken], "t").expect("lost");
        assert!(loss.is_taken());
        assert_eq!(loss.describe(), r#""k" is held by "web-1:42" (5.0s left)"#);
        let majority = key(vec![held("t", 3), held("t", 3), Node::Free]);
        assert!(Loss::find(&[majority], "t").is_none());
    }

    #[test]
    fn a_quorum_key_counts_its_masters() {
        let seen = key(vec![
            held("t", 3),
            Node::Unreachable("down".to_owned()),
            held("t", 5),
        ]);
        assert_eq!(seen.state(), State::Held);
        assert_eq!(
            (seen.held_on(), seen.held_by("t"), seen.held_by("u")),
            (2, 2, 0)
        );
        assert_eq!(seen.ttl(), Some(Duration::from_secs(5)));
        let persistent = key(vec![held("t", 3), Node::Foreign { ttl: None }]);
        assert_eq!(persistent.ttl(), None);
        assert_eq!(key(vec![Node::Free]).state(), State::Free);
    }
}
