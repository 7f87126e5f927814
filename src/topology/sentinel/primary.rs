//! What a primary says of itself when we connect to it: whether it is a primary, and
//! whether it may have come back without the locks it had.
//!
//! **A primary restarted empty.** A primary without safe persistence that is killed and
//! started again before the sentinels notice comes back empty; its replicas resynchronize
//! from it and drop their copies, so every lock it held is gone while its holders still
//! believe in them until their next refresh. No replica keeps them, so waiting for
//! replicas cannot help. What helps is Redlock's *delayed restart*: such a primary grants
//! no lock until the longest TTL in use has passed since it started. The client sees the
//! case from what it asks at connect (every client connects again after a restart):
//!
//! - it did not become the primary by a promotion since it started: it was never a
//!   replica (`second_repl_offset:-1`; a promoted replica has the data it replicated), or
//!   the sentinels knew its address as the primary from before it started (their
//!   `role-reported-time`, which a switch of primary starts again, is longer than its
//!   uptime). A primary that loads a snapshot at start (`save` persistence, or the file of
//!   a replica sync it once made) says it was a replica, and has a data set older than the
//!   locks it granted;
//! - the sentinels knew an earlier run of it: they last saw it under another run id (they
//!   ask every 10 s), or they have been up at least [`STARTED_AFTER`] longer than it (a
//!   deployment started together is new, not restarted), and
//! - it has no persistence that keeps every acknowledged write (`appendonly yes` with
//!   `appendfsync always`; a snapshot or a once-a-second fsync loses the last writes).
//!
//! What it cannot see: a whole deployment restarted at once (sentinels too). The guide's
//! failover page says which server settings close that.

use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::census::{Witness, info_field};

/// How much longer than the primary the sentinels must have been up for its start to
/// count as a restart. Uptimes are whole seconds, rounded down: sentinels started after the
/// primary never show more than it, so one second more means they were there before it.
/// (Sentinels started before the data nodes make a new deployment's first locks wait too:
/// safe, and only once.)
const STARTED_AFTER: u64 = 1;

/// What the primary said at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `ROLE` says it is a primary.
    pub(crate) is_primary: bool,
    /// When it started, if it restarted without the locks it had (see the module's docs).
    pub(crate) restarted_empty: Option<Instant>,
}

/// The commands whose replies [`Facts::parse`] reads, in one request.
pub(crate) fn ask() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("ROLE")
        .cmd("INFO")
        .arg("server")
        .cmd("INFO")
        .arg("persistence")
        .cmd("INFO")
        .arg("replication")
        .cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        // CONFIG may be refused to a lock user: then the fsync policy is not known to be
        // safe.
        .ignore_errors();
    pipe
}

impl Facts {
    /// Reads the replies to [`ask`], given what the sentinels know of the primary's past.
    pub(crate) fn parse(replies: &[Value], witness: &Witness) -> Self {
        let text = |i: usize| {
            replies
                .get(i)
                .and_then(|reply| redis::from_redis_value_ref::<String>(reply).ok())
                .unwrap_or_default()
        };
        let is_primary = replies.first().is_some_and(is_primary);
        let (server, persistence, replication) = (text(1), text(2), text(3));
        let uptime = info_field(&server, "uptime_in_seconds").and_then(|n| n.parse::<u64>().ok());
        let never_replica = info_field(&replication, "second_repl_offset") == Some("-1");
        // Known as the primary from before it started: not promoted since.
        let primary_before = match (uptime, witness.primary_for_ms) {
            (Some(uptime), Some(known)) => known / 1000 >= uptime + STARTED_AFTER,
            _ => false,
        };
        let keeps_every_write =
            info_field(&persistence, "aof_enabled") == Some("1") && fsync_always(replies.get(4));
        let run_id = info_field(&server, "run_id").unwrap_or("");
        let rerun = witness.run_ids.iter().any(|seen| seen != run_id);
        let started_after = match (uptime, witness.sentinels_up) {
            (Some(uptime), Some(sentinels)) => sentinels >= uptime + STARTED_AFTER,
            _ => false,
        };
        let not_promoted = never_replica || primary_before;
        let restarted =
            is_primary && not_promoted && !keeps_every_write && (rerun || started_after);
        Self {
            is_primary,
            restarted_empty: restarted.then(|| latest_start(uptime.unwrap_or(0))),
        }
    }
}

/// The latest moment a server that says it has been up `uptime` whole seconds can have
/// started. Redis counts them as the difference of two clock readings in whole seconds, so
/// the truth may be up to a second less: counting from the reading alone, the grace ended a
/// second early (a run overlapped a holder by 4 ms in the torture test).
fn latest_start(uptime: u64) -> Instant {
    let now = Instant::now() + Duration::from_secs(1);
    now.checked_sub(Duration::from_secs(uptime)).unwrap_or(now)
}

/// The server's refusal of who we are or of what we may run, when it answered `ROLE` (the
/// first of [`ask`]'s replies) with one: a login missing or wrong (`NOAUTH`, `WRONGPASS`),
/// or an ACL without `ROLE` (`NOPERM`). A setting to fix, not a primary that is not one
/// (which a failover under way would explain, and time would mend).
pub(crate) fn refusal(replies: &[Value]) -> Option<redis::RedisError> {
    let Some(Value::ServerError(err)) = replies.first() else {
        return None;
    };
    let err: redis::RedisError = err.clone().into();
    matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM")).then_some(err)
}

/// Whether a `CONFIG GET appendfsync` reply says `always`.
fn fsync_always(reply: Option<&Value>) -> bool {
    let Some(reply) = reply else {
        return false;
    };
    let said = match reply {
        Value::Array(items) => items
            .get(1)
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok()),
        Value::Map(pairs) => pairs
            .first()
            .and_then(|(_, v)| redis::from_redis_value_ref::<String>(v).ok()),
        _ => None,
    };
    said.is_some_and(|policy| policy.eq_ignore_ascii_case("always"))
}

/// Whether a `ROLE` reply is a primary's.
pub(crate) fn is_primary(role: &Value) -> bool {
    matches!(role, Value::Array(items) if matches!(items.first(), Some(Value::BulkString(role)) if role == b"master"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn replies(uptime: u64, second_offset: &str, aof: &str, fsync: &str) -> Vec<Value> {
        vec![
            Value::Array(vec![bulk("master"), Value::Int(0)]),
            bulk(&format!(
                "# Server\r\nrun_id:new1\r\nuptime_in_seconds:{uptime}\r\n"
            )),
            bulk(&format!("# Persistence\r\naof_enabled:{aof}\r\n")),
            bulk(&format!(
                "# Replication\r\nrole:master\r\nsecond_repl_offset:{second_offset}\r\n"
            )),
            Value::Array(vec![bulk("appendfsync"), bulk(fsync)]),
        ]
    }

    #[test]
    fn a_primary_that_started_after_its_sentinels_without_safe_persistence_restarted_empty() {
        let up = |sentinels_up| Witness {
            sentinels_up: Some(sentinels_up),
            run_ids: vec!["new1".into()],
            primary_for_ms: None,
        };
        let restarted = Facts::parse(&replies(0, "-1", "0", "everysec"), &up(30));
        assert!(restarted.is_primary);
        assert!(restarted.restarted_empty.is_some());
        // Started with its sentinels: a new deployment.
        assert!(
            Facts::parse(&replies(30, "-1", "0", "everysec"), &up(30))
                .restarted_empty
                .is_none()
        );
        // A replica promoted since it started has the data it replicated.
        assert!(
            Facts::parse(&replies(0, "1234", "0", "everysec"), &up(30))
                .restarted_empty
                .is_none()
        );
        // Every acknowledged write is on disk.
        assert!(
            Facts::parse(&replies(0, "-1", "1", "always"), &up(30))
                .restarted_empty
                .is_none()
        );
        assert!(
            Facts::parse(&replies(0, "-1", "1", "everysec"), &up(30))
                .restarted_empty
                .is_some()
        );
        // Nothing known of the sentinels: nothing to compare with.
        let unknown = Witness::default();
        let facts = Facts::parse(&replies(0, "-1", "0", "no"), &unknown);
        assert!(facts.restarted_empty.is_none());
        // Sentinels as young as it, that last saw it under another run id (they ask every
        // 10 s): it restarted.
        let rerun = Witness {
            sentinels_up: Some(1),
            run_ids: vec!["old1".into()],
            primary_for_ms: None,
        };
        let facts = Facts::parse(&replies(0, "-1", "0", "no"), &rerun);
        assert!(facts.restarted_empty.is_some());
    }

    /// A primary that loaded a snapshot at start says it was a replica; the sentinels
    /// knowing it as the primary from before it started tell it from a promoted replica.
    #[test]
    fn a_primary_restarted_from_a_snapshot_is_told_from_a_promoted_replica() {
        let known_for = |ms| Witness {
            sentinels_up: Some(60),
            run_ids: vec!["new1".into()],
            primary_for_ms: Some(ms),
        };
        // Known as the primary for 50 s, up for 2 s: restarted.
        let facts = Facts::parse(&replies(2, "1234", "0", "everysec"), &known_for(50_000));
        assert!(facts.restarted_empty.is_some());
        // Promoted 3 s ago, up for 40 s: it has what it replicated.
        let facts = Facts::parse(&replies(40, "1234", "0", "everysec"), &known_for(3_000));
        assert!(facts.restarted_empty.is_none());
        // Within a second of its uptime: whole seconds cannot tell, so not a restart.
        let facts = Facts::parse(&replies(2, "1234", "0", "everysec"), &known_for(2_900));
        assert!(facts.restarted_empty.is_none());
        // Every acknowledged write on disk: nothing forgotten.
        let facts = Facts::parse(&replies(2, "1234", "1", "always"), &known_for(50_000));
        assert!(facts.restarted_empty.is_none());
    }

    #[test]
    fn roles_are_recognised() {
        assert!(is_primary(&Value::Array(vec![
            bulk("master"),
            Value::Int(0)
        ])));
        assert!(!is_primary(&Value::Array(vec![bulk("slave")])));
    }
}
