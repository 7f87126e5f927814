//! What a primary says of its replicas (`INFO replication`) and what a write's `WAIT`
//! acknowledged: the counts a replicated write is judged by.

use super::*;

/// The replicas a primary has, from `INFO replication`
/// (`slaveN:ip=…,port=…,state=online,offset=…,lag=0`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Replicas {
    /// How many are online and acknowledged within the last 2 s.
    pub(crate) in_sync: u32,
    /// Their addresses (none known on a cluster, where only the count is).
    pub(crate) synced: Vec<Address>,
    /// Every replica listed, in sync or not.
    pub(crate) listed: Vec<Address>,
}

impl Replicas {
    /// How many replicas the primary has connected, in sync or behind for now: what a fixed
    /// count is checked against. (A replica behind is a passing state that each write's
    /// `WAIT` judges, not a setting to refuse.)
    pub(crate) fn connected(&self) -> u32 {
        let listed = u32::try_from(self.listed.len()).unwrap_or(u32::MAX);
        listed.max(self.in_sync)
    }

    /// `in_sync` replicas whose addresses are not known (a cluster's fewest per shard).
    pub(crate) fn counted(in_sync: u32) -> Self {
        Self {
            in_sync,
            ..Self::default()
        }
    }

    /// Reads an `INFO replication` reply.
    pub(crate) fn parse(info: &str) -> Self {
        let mut replicas = Self::default();
        for line in info.lines() {
            let Some((name, fields)) = line.split_once(':') else {
                continue;
            };
            if !name.starts_with("slave") {
                continue;
            }
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
            };
            let Some(address) = field("ip").zip(field("port").and_then(|p| p.trim().parse().ok()))
            else {
                continue;
            };
            let address = (address.0.to_owned(), address.1);
            let synced = field("state") == Some("online")
                && field("lag")
                    .and_then(|lag| lag.trim().parse::<u64>().ok())
                    .is_some_and(|lag| lag <= 2);
            if synced {
                replicas.synced.push(address.clone());
            }
            replicas.listed.push(address);
        }
        replicas.in_sync = u32::try_from(replicas.synced.len()).unwrap_or(u32::MAX);
        replicas
    }
}

/// What the waiting command answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acks {
    /// How many replicas acknowledged.
    pub(crate) replicas: u32,
    /// `WAITAOF` only: the primary's own append-only file has the writes.
    pub(crate) local: bool,
    /// How many the write waited for: what it is judged by. (With [`Replication::all`]
    /// the count may grow while it waits, from another write's look at the replicas: a
    /// replica that caught up counts from the next write on.)
    pub(crate) required: u32,
}

impl Acks {
    /// Reads the reply of `WAIT` (a number) or `WAITAOF` (`[local, replicas]`) to a write
    /// that waited for `required` replicas.
    pub(crate) fn parse(reply: &redis::Value, required: u32) -> Option<Self> {
        let count = |value: &redis::Value| match value {
            redis::Value::Int(n) => u32::try_from(*n).ok(),
            _ => None,
        };
        match reply {
            redis::Value::Array(items) => match items.as_slice() {
                [local, replicas] => Some(Self {
                    replicas: count(replicas)?,
                    local: count(local)? > 0,
                    required,
                }),
                _ => None,
            },
            other => Some(Self {
                replicas: count(other)?,
                local: false,
                required,
            }),
        }
    }
}
