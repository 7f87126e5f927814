//! How a row of the spec table (`tests/suite/scripts.rs`) is run and checked.

use crate::support::{Env, ms};
use Given::{Hold, Raw};

use lockset::redis::aio::ConnectionManager;
use lockset::{Error, Lock, Mode, Options};
use std::collections::HashMap;

/// Something done before the call.
pub(super) enum Given {
    /// A raw command.
    Raw(&'static [&'static str]),
    /// An obtain by token `.0` of keys `.1` for 60 s, that must succeed (kept for a later
    /// release by that token).
    Hold(&'static str, &'static [(&'static str, Mode)]),
    /// The release of what token `.0` holds.
    Release(&'static str),
    /// A fair waiter "w" (value "1:w", for 30 s) queued on keys `.1` in modes `.0`, as a
    /// blocked obtain queues it (see `lua/queue.lua`).
    Waiter(&'static str, &'static [&'static str]),
}

/// The call a row is about.
pub(super) enum Call {
    /// An obtain, once: token, keys in their modes, TTL in ms, metadata.
    Obtain(
        &'static str,
        &'static [(&'static str, Mode)],
        u64,
        &'static str,
    ),
    /// The same, with fencing tokens from the counter "{d}fence".
    Fenced(&'static str, &'static [(&'static str, Mode)]),
    /// An obtain that retries (for 150 ms) rather than trying once.
    Retried(&'static str, &'static [(&'static str, Mode)]),
    /// The release of what a token holds.
    Release(&'static str),
    /// The refresh of what a token holds, to a TTL in ms.
    Refresh(&'static str, u64),
    /// The remaining TTL of what a token holds.
    Ttl(&'static str),
}

/// What the call returns.
#[derive(Debug, PartialEq)]
pub(super) enum Reply {
    /// Obtained, released, refreshed; for a ttl, some time left.
    Done,
    /// Obtained, with a fencing token that the counter now holds.
    Fence,
    /// Not obtained: held by another owner.
    Held,
    /// Held in a mode that cannot go with the one asked for.
    Mismatch,
    /// A key of another type.
    WrongType,
    /// Not held (release, refresh), or nothing left (ttl).
    NotHeld,
    /// Any other error.
    Failed(String),
}

/// A check of the raw state after the call.
pub(super) enum Then {
    /// The string value of a key (None: no string there).
    Get(&'static str, Option<&'static str>),
    /// A sorted set's members, in order.
    Members(&'static str, &'static [&'static str]),
    /// A key's PTTL is above this many ms.
    LivesOver(&'static str, i64),
    /// A key's PTTL is at most this many ms (and it expires).
    LivesAtMost(&'static str, i64),
    /// A set member's expiry is more than this many ms away.
    ScoreOver(&'static str, &'static str, f64),
    /// Whether a key exists.
    Exists(&'static str, bool),
}

/// A row of the table: "It should `it`": given that, when this is called, it replies so,
/// and then the keys are so.
pub(super) struct Row {
    pub(super) it: &'static str,
    pub(super) given: &'static [Given],
    pub(super) when: Call,
    pub(super) reply: Reply,
    pub(super) then: &'static [Then],
}

/// The locks the row's obtains got, by token.
type Locks = HashMap<&'static str, Lock<ConnectionManager>>;

/// The server's clock in ms.
async fn server_ms(env: &Env) -> f64 {
    let time: Vec<String> = env.cmd(&["TIME"]).await;
    let secs: f64 = time[0].parse().unwrap();
    let micros: f64 = time[1].parse().unwrap();
    secs * 1000.0 + micros / 1000.0
}

/// Runs a raw command, with `{now+N}` replaced by the server's clock plus N ms.
async fn raw(env: &Env, args: &[&str]) -> Result<(), String> {
    let now = server_ms(env).await;
    let args: Vec<String> = args
        .iter()
        .map(
            |arg| match arg.strip_prefix("{now+").and_then(|a| a.strip_suffix('}')) {
                Some(plus) => format!("{:.3}", now + plus.parse::<f64>().unwrap()),
                None => (*arg).to_owned(),
            },
        )
        .collect();
    let mut cmd = lockset::redis::cmd(&args[0]);
    cmd.arg(&args[1..]);
    cmd.query_async::<lockset::redis::Value>(&mut env.raw.clone())
        .await
        .map(drop)
        .map_err(|err| format!("{args:?}: {err}"))
}

/// Queues waiter "w" as `Given::Waiter` says.
async fn queue_waiter(env: &Env, modes: &str, keys: &[&str]) -> Result<(), String> {
    let record = format!("{}:lockset:queue:w", keys[0]);
    let n = keys.len().to_string();
    let mut hset = vec!["HSET", &record, "v", "1:w", "t", "30000", "i", "w", "n", &n];
    hset.extend(["l", "1", "s", "1", "m", modes]);
    let fields: Vec<String> = (1..=keys.len()).map(|j| j.to_string()).collect();
    for (field, key) in fields.iter().zip(keys) {
        hset.extend([field.as_str(), key]);
    }
    raw(env, &hset).await?;
    raw(env, &["PEXPIRE", &record, "30000"]).await?;
    for key in keys {
        raw(
            env,
            &["ZADD", &format!("{key}:lockset:queue"), "1", &record],
        )
        .await?;
    }
    Ok(())
}

fn by(token: &str) -> Options {
    Options::default().token(token)
}

/// What an obtain's outcome says, as a row's reply.
fn obtained(
    outcome: lockset::Result<Lock<ConnectionManager>>,
    locks: &mut Locks,
    token: &'static str,
) -> Reply {
    match outcome {
        Ok(lock) => {
            let fenced = lock.fencing_token().is_some();
            locks.insert(token, lock);
            if fenced { Reply::Fence } else { Reply::Done }
        }
        Err(Error::NotObtained { .. } | Error::DeadlineExceeded) => Reply::Held,
        Err(Error::ModeMismatch { .. }) => Reply::Mismatch,
        Err(Error::WrongType { .. }) => Reply::WrongType,
        Err(err) => Reply::Failed(err.to_string()),
    }
}

fn done(outcome: lockset::Result<()>) -> Reply {
    match outcome {
        Ok(()) => Reply::Done,
        Err(Error::NotHeld) => Reply::NotHeld,
        Err(err) => Reply::Failed(err.to_string()),
    }
}

/// Runs one row on a flushed server; what went otherwise than it says.
pub(super) async fn run(env: &Env, row: &Row) -> Result<(), String> {
    let _: () = env.cmd(&["FLUSHALL"]).await;
    let mut locks = Locks::new();
    for given in row.given {
        match given {
            Raw(args) => raw(env, args).await?,
            Hold(token, keys) => {
                let lock = env
                    .client
                    .obtain_multi(keys.iter().copied(), ms(60_000), &by(token))
                    .await;
                locks.insert(token, lock.map_err(|err| format!("hold {token}: {err}"))?);
            }
            Given::Release(token) => {
                let lock = locks.remove(token).ok_or("no lock")?;
                lock.release()
                    .await
                    .map_err(|err| format!("release {token}: {err}"))?;
            }
            Given::Waiter(modes, keys) => queue_waiter(env, modes, keys).await?,
        }
    }
    let reply = match &row.when {
        Call::Obtain(token, keys, ttl, metadata) => {
            let options = by(token).metadata(*metadata);
            let outcome = env
                .client
                .obtain_multi(keys.iter().copied(), ms(*ttl), &options)
                .await;
            obtained(outcome, &mut locks, token)
        }
        Call::Fenced(token, keys) => {
            // The token is the counter plus one, or the server's clock in µs when higher.
            let clock = server_ms(env).await.floor() * 1000.0;
            let options = by(token).fencing_key("{d}fence");
            let outcome = env
                .client
                .obtain_multi(keys.iter().copied(), ms(10_000), &options)
                .await;
            let reply = obtained(outcome, &mut locks, token);
            if reply == Reply::Fence {
                let minted = locks[token].fencing_token().unwrap_or(0);
                let counter: Option<String> = env.get("{d}fence").await;
                #[allow(clippy::cast_precision_loss)] // A clock in µs: 2^53 is far off.
                let behind = (minted as f64) < clock;
                if minted <= 5 || behind || counter != Some(minted.to_string()) {
                    return Err(format!(
                        "token {minted}, counter {counter:?}, clock {clock}"
                    ));
                }
            }
            reply
        }
        Call::Retried(token, keys) => {
            let options = by(token)
                .fair(false)
                .retry(lockset::Retry::linear(ms(20)))
                .timeout(ms(150));
            let outcome = env
                .client
                .obtain_multi(keys.iter().copied(), ms(10_000), &options)
                .await;
            obtained(outcome, &mut locks, token)
        }
        Call::Release(token) => done(locks.remove(token).ok_or("no lock")?.release().await),
        Call::Refresh(token, ttl) => {
            done(locks[token].refresh(ms(*ttl), &Options::default()).await)
        }
        Call::Ttl(token) => match locks[token].ttl().await {
            Ok(Some(_)) => Reply::Done,
            Ok(None) => Reply::NotHeld,
            Err(err) => Reply::Failed(err.to_string()),
        },
    };
    let expected_failure =
        matches!(row.reply, Reply::Failed(_)) && matches!(reply, Reply::Failed(_));
    if reply != row.reply && !expected_failure {
        return Err(format!("replied {reply:?}, not {:?}", row.reply));
    }
    for then in row.then {
        check(env, then).await?;
    }
    Ok(())
}

/// Checks one thing of the state after.
async fn check(env: &Env, then: &Then) -> Result<(), String> {
    match *then {
        Then::Get(key, want) => {
            let kind: String = env.cmd(&["TYPE", key]).await;
            let got = if kind == "string" {
                env.get(key).await
            } else {
                None
            };
            if got.as_deref() != want {
                return Err(format!("{key} holds {got:?} ({kind}), not {want:?}"));
            }
        }
        Then::Members(key, want) => {
            let got: Vec<String> = env.cmd(&["ZRANGE", key, "0", "-1"]).await;
            if got != want {
                return Err(format!("{key} has {got:?}, not {want:?}"));
            }
        }
        Then::LivesOver(key, least) => {
            let left: i64 = env.cmd(&["PTTL", key]).await;
            if left <= least {
                return Err(format!("{key} lives {left} ms, not over {least}"));
            }
        }
        Then::LivesAtMost(key, most) => {
            let left: i64 = env.cmd(&["PTTL", key]).await;
            if left < 0 || left > most {
                return Err(format!("{key} lives {left} ms, not at most {most}"));
            }
        }
        Then::ScoreOver(key, member, least) => {
            let score: Option<f64> = env.cmd(&["ZSCORE", key, member]).await;
            let now = server_ms(env).await;
            if score.is_none_or(|at| at - now <= least) {
                return Err(format!(
                    "{key}'s {member} expires at {score:?}, not {least} ms after {now}"
                ));
            }
        }
        Then::Exists(key, want) => {
            if env.exists(key).await != want {
                return Err(format!("{key} exists: not {want}"));
            }
        }
    }
    Ok(())
}
