//! What a server lets this client do, found out per connection: run the Lua scripts at all,
//! and the lock primitives that newer servers have as commands.
//!
//! - Scripts: `EVAL` and `EVALSHA`, which every multi-key, shared or queued operation and
//!   every release, refresh and TTL query of a contended key needs. An ACL user without
//!   them, or a server that renamed them away, could otherwise take a single key by plain
//!   `SET NX` and then never release it: an obtain checks first, before anything is written.
//!
//! - Compare-and-delete: `DELIFEQ key value` (Valkey 9.0+), `DELEX key IFEQ value` (Redis
//!   8.4+, Valkey 9.2+): deletes the key only if it holds exactly `value`.
//! - Compare-and-set: `SET key value IFEQ old PX ttl` (Valkey 8.1+, Redis 8.4+): sets the
//!   key (and its TTL) only if it holds exactly `old`.
//!
//! A server is asked what it has, once per connection (and again after a Sentinel failover
//! to another primary, which may run another version), by `COMMAND INFO` and `COMMAND
//! DOCS SET`: never by its version string, since Valkey reports `redis_version:7.2.4`
//! whatever its own version. A server that then refuses the command anyway (a restart into
//! an older version behind the same address, an ACL user without it) gets scripts from then
//! on; the operation at hand goes by script.
//!
//! **Invariant.** A native command only ever stands in for a script's first step when that
//! step would do exactly the same: a key that holds exactly the lock's value (no waiter's
//! mark, the same metadata) is deleted, or extended with its value unchanged. Whenever the
//! command changes nothing (the key is marked by a waiter, its metadata was rewritten by
//! another handle of the same token, it is missing, someone else's, of another type), the
//! script runs and decides, as it always did: hand-offs to fair waiters, announcements,
//! `Missing` versus `Foreign`.
//!
//! Where: one server, a cluster (each command goes to the key's node, as the scripts do),
//! and a Redlock quorum's refreshes. A quorum's releases keep their script: one command per
//! master, so that a waiter of the same client, woken by one master's announcement, reaches
//! every other master behind the delete there (a native delete that finds a waiter's mark,
//! then the script, would leave a gap; measured: the waiter then found the lock held and
//! slept 7.5 s for want of another announcement).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::error::classify::refuses_command;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisResult, Value};

/// What was found: [`KNOWN`] once the commands were asked for, and those the server has;
/// [`SCRIPTS_KNOWN`] once scripts were tried, and [`SCRIPTS`] when they run.
const KNOWN: u8 = 1;
const DELIFEQ: u8 = 2;
const DELEX: u8 = 4;
const SET_IFEQ: u8 = 8;
const SCRIPTS_KNOWN: u8 = 16;
const SCRIPTS: u8 = 32;

/// What a server behind one connection lets this client do, once found out.
pub(crate) struct Natives {
    /// The bits above; 0 while nobody asked.
    found: AtomicU8,
    /// The Sentinel epoch of the primary that was asked, plus one (0: not under Sentinel).
    epoch: AtomicU64,
    /// Held by the task whose question's answer is kept as it is; others that come meanwhile
    /// ask too and merge their answers (see [`Natives::learn`]).
    asking: tokio::sync::Mutex<()>,
}

/// What one server has, as found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found(u8);

impl Natives {
    pub(crate) fn new() -> Self {
        Self {
            found: AtomicU8::new(0),
            epoch: AtomicU64::new(0),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// What the server behind `conn` has, asking it first when nobody has yet (or the
    /// primary changed since: `epoch`, the current primary's Sentinel epoch). A server that
    /// refuses to say (an ACL without `COMMAND`) has nothing native; a connection that fails
    /// returns its error, and the next use asks again.
    pub(crate) async fn found<C: ConnectionLike + Clone>(
        &self,
        conn: &C,
        epoch: Option<u64>,
    ) -> RedisResult<Found> {
        let found = self
            .learn(epoch, KNOWN, async || ask(&mut conn.clone()).await)
            .await?;
        Ok(found)
    }

    /// Whether the server behind `conn` runs this client's scripts, trying them first when
    /// nobody has yet (or the primary changed since, or they were refused since). One round
    /// trip: an obtain asks before it writes anything, and a client that connects asks
    /// beforehand. Only a yes is kept: a refused client asks again at its next obtain (which
    /// fails anyway), so that an operator's fix counts at once. `key`: the tries name it, so
    /// that a cluster routes them to the node that serves it (key-less commands go to any
    /// node; one with its own ACL or renamed commands would answer for all).
    pub(crate) async fn scripts<C: ConnectionLike + Clone>(
        &self,
        conn: &C,
        epoch: Option<u64>,
        key: Option<&str>,
    ) -> RedisResult<bool> {
        let found = self
            .learn(epoch, SCRIPTS_KNOWN, async || {
                let run = scripts_run(&mut conn.clone(), key).await?;
                Ok(if run { SCRIPTS_KNOWN | SCRIPTS } else { 0 })
            })
            .await?;
        Ok(found.0 & SCRIPTS != 0)
    }

    /// The server refused a script as such after it was found to run them (an ACL changed,
    /// a server replaced behind the same address): the next obtain asks again.
    pub(crate) fn forget_scripts(&self) {
        self.found
            .fetch_and(!(SCRIPTS_KNOWN | SCRIPTS), Ordering::AcqRel);
    }

    /// The bits known of the current primary, after asking by `ask` (which returns `part`
    /// and what it found) when `part` is not known yet. One question at a time, but nobody
    /// waits for another task's: a task that finds a question under way asks too, and
    /// merges its answer. Every wait of an attempt is then one of its own requests, which its
    /// connection's response timeout bounds: what lets an attempt far from its deadline go
    /// without a timer (see `rt/deadline.rs`). Queued behind other tasks' questions, each up
    /// to a response timeout, it waited past its deadline.
    async fn learn(
        &self,
        epoch: Option<u64>,
        part: u8,
        ask: impl AsyncFnOnce() -> RedisResult<u8>,
    ) -> RedisResult<Found> {
        let known = self.known(epoch);
        if known & part != 0 {
            return Ok(Found(known));
        }
        let asking = self.asking.try_lock().ok();
        let known = self.known(epoch);
        if known & part != 0 {
            return Ok(Found(known));
        }
        let found = Found(known | ask().await?);
        tracing::debug!(?found, "what the server lets this client do");
        let mark = epoch.map_or(0, |epoch| epoch + 1);
        match asking {
            Some(_asking) => {
                self.epoch.store(mark, Ordering::Relaxed);
                self.found.store(found.0, Ordering::Release);
            }
            // Beside the task that holds the question: its answer counts too, for the same
            // primary only (the other may have moved on to a new one meanwhile).
            None if self.epoch.load(Ordering::Relaxed) == mark => {
                self.found.fetch_or(found.0, Ordering::AcqRel);
            }
            None => {}
        }
        Ok(found)
    }

    /// The bits known of the primary of `epoch` (none when they are of another one).
    fn known(&self, epoch: Option<u64>) -> u8 {
        let found = self.found.load(Ordering::Acquire);
        let same_primary = self.epoch.load(Ordering::Relaxed) == epoch.map_or(0, |epoch| epoch + 1);
        if same_primary { found } else { 0 }
    }

    /// The server refused a native command it was found to have (`err`: it does not know it
    /// after all, as after a restart into an older version behind the same address, or the
    /// ACL user may not run it): scripts from now on, until another primary is found.
    pub(crate) fn give_up(&self, err: &RedisError) {
        // An unknown command's text echoes its arguments: the lock's value.
        let err = crate::error::redact(err.clone());
        tracing::debug!(%err, "server refuses a native command; scripts from now on");
        self.found
            .fetch_and(KNOWN | SCRIPTS_KNOWN | SCRIPTS, Ordering::AcqRel);
    }
}

impl Found {
    /// `key` deleted only if it holds exactly `value`, when the server can: replies 1 when
    /// deleted, else 0.
    pub(crate) fn delete_if_equal(self, key: &str, value: &str) -> Option<Cmd> {
        let mut cmd = Cmd::with_capacity(4, 16 + key.len() + value.len());
        if self.0 & DELIFEQ != 0 {
            cmd.arg("DELIFEQ").arg(key).arg(value);
        } else if self.0 & DELEX != 0 {
            cmd.arg("DELEX").arg(key).arg("IFEQ").arg(value);
        } else {
            return None;
        }
        Some(cmd)
    }

    /// `key` given `ttl_ms` only if it holds exactly `value` (which stays), when the server
    /// can: replies OK when done, else nil.
    pub(crate) fn extend_if_equal(self, key: &str, value: &str, ttl_ms: u64) -> Option<Cmd> {
        if self.0 & SET_IFEQ == 0 {
            return None;
        }
        let mut cmd = Cmd::with_capacity(7, 32 + key.len() + 2 * value.len());
        cmd.arg("SET")
            .arg(key)
            .arg(value)
            .arg("IFEQ")
            .arg(value)
            .arg("PX")
            .arg(ttl_ms);
        Some(cmd)
    }
}

/// Asks the server which primitives it has: `COMMAND INFO` names a command it knows (nil for
/// one it does not), and `COMMAND DOCS SET` lists SET's options (an error before Redis 7).
/// One question after the other, not pipelined: on a cluster they may go to different nodes.
/// An error reply (an ACL without `COMMAND`) counts as "none". Returns the bits found.
async fn ask<C: ConnectionLike>(conn: &mut C) -> RedisResult<u8> {
    let info = answer(
        redis::cmd("COMMAND")
            .arg("INFO")
            .arg("DELIFEQ")
            .arg("DELEX")
            .query_async(conn)
            .await,
    )?;
    let docs = answer(
        redis::cmd("COMMAND")
            .arg("DOCS")
            .arg("SET")
            .query_async(conn)
            .await,
    )?;
    let known = |index: usize| match &info {
        Value::Array(commands) => commands
            .get(index)
            .is_some_and(|command| !matches!(command, Value::Nil)),
        _ => false,
    };
    let mut found = KNOWN;
    if known(0) {
        found |= DELIFEQ;
    }
    if known(1) {
        found |= DELEX;
    }
    if mentions_token(&docs, "IFEQ") {
        found |= SET_IFEQ;
    }
    Ok(found)
}

/// Whether the server runs scripts for this client: a trivial `EVAL`, and `EVALSHA` of its
/// hash (NOSCRIPT still means it may run it), in one request; over `key`, when given (a
/// cluster routes them by it). A refusal as such (`NOPERM`, an unknown command) is a no; any
/// other error (`LOADING`, a failed connection) is returned, so that nothing is concluded
/// from a server that cannot answer now.
async fn scripts_run<C: ConnectionLike>(conn: &mut C, key: Option<&str>) -> RedisResult<bool> {
    const PROBE: &str = "return 1";
    let mut eval = redis::cmd("EVAL");
    eval.arg(PROBE).arg(usize::from(key.is_some())).arg(key);
    let mut by_hash = redis::cmd("EVALSHA");
    by_hash
        .arg(redis::Script::new(PROBE).get_hash())
        .arg(usize::from(key.is_some()))
        .arg(key);
    // Each reply as it came, errors included (else the first error stands for both).
    let mut both = redis::pipe();
    both.add_command(eval).add_command(by_hash).ignore_errors();
    let values: Vec<Value> = both.query_async(conn).await?;
    let replies: Vec<RedisResult<Value>> = values.into_iter().map(Value::extract_error).collect();
    for reply in replies {
        match reply {
            Ok(_) => {}
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
            Err(err) if refuses_command(&err) => {
                tracing::warn!(%err, "the server refuses this client's scripts: no lock can be obtained");
                return Ok(false);
            }
            Err(err) => return Err(err),
        }
    }
    Ok(true)
}

/// A reply, with the server's refusal as a reply like any other (nil): only a failed
/// connection is an error.
fn answer(reply: RedisResult<Value>) -> RedisResult<Value> {
    match reply {
        Err(err) if err.code().is_some() => Ok(Value::Nil),
        reply => reply,
    }
}

/// Whether a `COMMAND DOCS` reply has an argument with the token `token` (its text exactly,
/// not a history line that mentions it), in RESP2's nested lists or RESP3's maps.
fn mentions_token(value: &Value, token: &str) -> bool {
    match value {
        Value::BulkString(text) => text.eq_ignore_ascii_case(token.as_bytes()),
        Value::SimpleString(text) => text.eq_ignore_ascii_case(token),
        Value::Array(items) | Value::Set(items) => {
            items.iter().any(|item| mentions_token(item, token))
        }
        Value::Map(pairs) => pairs
            .iter()
            .any(|(key, value)| mentions_token(key, token) || mentions_token(value, token)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<other>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn delifeq_is_preferred_to_delex() {
        let both = Found(KNOWN | DELIFEQ | DELEX);
        let cmd = both.delete_if_equal("k", "22:v").expect("a command");
        assert_eq!(args(&cmd), ["DELIFEQ", "k", "22:v"]);
        let delex = Found(KNOWN | DELEX);
        let cmd = delex.delete_if_equal("k", "22:v").expect("a command");
        assert_eq!(args(&cmd), ["DELEX", "k", "IFEQ", "22:v"]);
        assert!(Found(KNOWN | SET_IFEQ).delete_if_equal("k", "v").is_none());
    }

    #[test]
    fn extend_keeps_the_value_it_compares() {
        let cmd = Found(KNOWN | SET_IFEQ)
            .extend_if_equal("k", "2:ab{}", 1500)
            .expect("a command");
        assert_eq!(
            args(&cmd),
            ["SET", "k", "2:ab{}", "IFEQ", "2:ab{}", "PX", "1500"]
        );
        assert!(
            Found(KNOWN | DELIFEQ)
                .extend_if_equal("k", "v", 1)
                .is_none()
        );
    }

    #[test]
    fn a_token_counts_only_as_a_whole_text() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let docs = Value::Array(vec![
            bulk("set"),
            Value::Map(vec![(
                bulk("history"),
                Value::Array(vec![bulk("Added the `IFEQ` option.")]),
            )]),
        ]);
        assert!(!mentions_token(&docs, "IFEQ"));
        let with_argument =
            Value::Array(vec![docs, Value::Array(vec![bulk("token"), bulk("IFEQ")])]);
        assert!(mentions_token(&with_argument, "IFEQ"));
    }
}
