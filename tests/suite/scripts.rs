//! The scripts' spec table: each row a state before, a call, the reply and the state after,
//! read as "It should ...". Rows drive the public API (an obtain in some modes, a release, a
//! refresh, a ttl) against a real server and check the raw keys, so that they outlive any
//! refactor of the Lua; what only a script reaches (another client's holder, a queued
//! waiter's record, a writer's mark) is written by hand in the state before.
//!
//! `{now+N}` in a raw command is the server's clock in ms plus N (a set member's expiry).
//! One server for the whole table, flushed before each row; every failing row is reported.

use crate::support::{Env, ms};

use lockset::redis::aio::ConnectionManager;
use lockset::{Error, Lock, Mode, Options};
use std::collections::HashMap;

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared;
const P1: Mode = Mode::Permit { limit: 1 };
const P2: Mode = Mode::Permit { limit: 2 };
const P3: Mode = Mode::Permit { limit: 3 };

/// Something done before the call.
enum Given {
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
enum Call {
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
enum Reply {
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
enum Then {
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

struct Row {
    it: &'static str,
    given: &'static [Given],
    when: Call,
    reply: Reply,
    then: &'static [Then],
}

use Given::{Hold, Raw};

/// Someone else ("5:other") shares "{d}doc" for 60 s.
const READER: Given = Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "5:other"]);
/// A writer waits for "{d}doc"'s holders to leave, for 60 s more.
const WRITER_WAITS: Given = Raw(&["ZADD", "{d}doc", "{now+60000}", "=x"]);
/// "{d}doc" lives for 60 s.
const DOC_LIVES: Given = Raw(&["PEXPIRE", "{d}doc", "60000"]);

const ROWS: &[Row] = &[
    // The admission rule: exclusive, shared, counted.
    Row {
        it: "let a reader share a key with live readers",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me", "5:other"])],
    },
    Row {
        it: "keep a writer out while a reader holds the key",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", X)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=s", "5:other"])],
    },
    Row {
        it: "keep a reader out of an exclusively held key",
        given: &[Raw(&["SET", "{d}doc", "5:other", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Get("{d}doc", Some("5:other"))],
    },
    Row {
        it: "let a writer replace a set whose holders all expired",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "1", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", X)], 10_000, ""),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}doc", Some("2:me")),
            Then::LivesAtMost("{d}doc", 10_000),
        ],
    },
    Row {
        it: "let a reader replace a permit set whose holders all expired",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "1", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me"])],
    },
    Row {
        it: "refuse a reader on a key held as permits (another mode)",
        given: &[Raw(&[
            "ZADD",
            "{d}doc",
            "-inf",
            "=p2",
            "{now+60000}",
            "5:other",
        ])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Mismatch,
        then: &[Then::Members("{d}doc", &["=p2", "5:other"])],
    },
    Row {
        it: "refuse a permit of another limit",
        given: &[Raw(&[
            "ZADD",
            "{d}doc",
            "-inf",
            "=p2",
            "{now+60000}",
            "5:other",
        ])],
        when: Call::Obtain("me", &[("{d}doc", P3)], 10_000, ""),
        reply: Reply::Mismatch,
        then: &[],
    },
    Row {
        it: "admit permit holders up to the limit",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=p2", "2:me", "5:other"])],
    },
    Row {
        it: "refuse a permit beyond the limit",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            Raw(&["ZADD", "{d}doc", "{now+60000}", "6:other2"]),
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=p2", "5:other", "6:other2"])],
    },
    Row {
        it: "prune expired permit holders and not count them",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            Raw(&["ZADD", "{d}doc", "1", "6:other2"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=p2", "2:me", "5:other"])],
    },
    Row {
        it: "keep readers out while a writer waits (writers first)",
        given: &[READER, WRITER_WAITS, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=s", "5:other", "=x"])],
    },
    Row {
        it: "keep permit holders out while a writer waits, with permits left",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p3", "{now+60000}", "5:other"]),
            WRITER_WAITS,
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P3)], 10_000, ""),
        reply: Reply::Held,
        then: &[],
    },
    Row {
        it: "keep readers out of a set nobody holds while a writer waits",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "=x"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[],
    },
    Row {
        it: "let a lock that writes some key read past a waiting writer",
        given: &[READER, WRITER_WAITS, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S), ("{d}out", X)], 10_000, ""),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "2:me", "5:other", "=x"]),
            Then::Get("{d}out", Some("2:me")),
        ],
    },
    Row {
        it: "ignore a writer's mark that has expired",
        given: &[READER, Raw(&["ZADD", "{d}doc", "1", "=x"]), DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me", "5:other"])],
    },
    Row {
        it: "mark a writer's wait, so that new readers stay out, when the writer retries",
        given: &[READER, DOC_LIVES],
        when: Call::Retried("me", &[("{d}doc", X)]),
        reply: Reply::Held,
        then: &[Then::ScoreOver("{d}doc", "=x", 1_000.0)],
    },
    Row {
        it: "take no key when one of them is held (all or nothing)",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}free", P2), ("{d}doc", X)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Exists("{d}free", false)],
    },
    Row {
        it: "report a key of another type",
        given: &[Raw(&["HSET", "{d}doc", "f", "v"])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::WrongType,
        then: &[],
    },
    // Re-obtain by the owner's own token.
    Row {
        it: "re-obtain an exclusive key by token, keeping the longer TTL",
        given: &[Raw(&["SET", "{d}a", "2:me", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}a", X), ("{d}b", X)], 1_000, ""),
        reply: Reply::Done,
        then: &[
            Then::LivesOver("{d}a", 30_000),
            Then::LivesAtMost("{d}b", 1_000),
        ],
    },
    Row {
        it: "re-obtain an exclusive key by token, keeping a waiter's mark",
        given: &[Raw(&["SET", "{d}a", "!2:me", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}a", X), ("{d}doc", S)], 1_000, "m"),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}a", Some("!2:mem")),
            Then::LivesOver("{d}a", 30_000),
        ],
    },
    Row {
        it: "re-obtain a shared key by token under new metadata, never for less",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "2:me"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 1_000, "m"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "2:mem"]),
            Then::ScoreOver("{d}doc", "2:mem", 30_000.0),
        ],
    },
    Row {
        it: "re-obtain a shared key by token for longer when asked for longer",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+1000}", "2:me"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 60_000, ""),
        reply: Reply::Done,
        then: &[Then::ScoreOver("{d}doc", "2:me", 30_000.0)],
    },
    // Fencing.
    Row {
        it: "mint a fencing token above the counter and the clock, and leave it in the counter",
        given: &[Raw(&["SET", "{d}fence", "5"])],
        when: Call::Fenced("me", &[("{d}a", X)]),
        reply: Reply::Fence,
        then: &[],
    },
    Row {
        it: "mint a fencing token for a lock with modes",
        given: &[Raw(&["SET", "{d}fence", "5"])],
        when: Call::Fenced("me", &[("{d}doc", S), ("{d}a", X)]),
        reply: Reply::Fence,
        then: &[Then::Members("{d}doc", &["=s", "2:me"])],
    },
    Row {
        it: "refuse a fencing counter that is not a number, and take no key",
        given: &[Raw(&["SET", "{d}fence", "abc"])],
        when: Call::Fenced("me", &[("{d}doc", S)]),
        reply: Reply::Failed(String::new()),
        then: &[Then::Exists("{d}doc", false)],
    },
    // Expiry.
    Row {
        it: "report a lock whose shared member expired as held no more",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "XX", "1", "2:me"]),
        ],
        when: Call::Ttl("me"),
        reply: Reply::NotHeld,
        then: &[],
    },
    Row {
        it: "refresh a shared key, the set living as long as its latest holder",
        given: &[Hold("me", &[("{d}doc", S)]), READER],
        when: Call::Refresh("me", 120_000),
        reply: Reply::Done,
        then: &[
            Then::ScoreOver("{d}doc", "2:me", 90_000.0),
            Then::LivesOver("{d}doc", 90_000),
        ],
    },
    Row {
        it: "release a shared key, leaving the other readers",
        given: &[Hold("me", &[("{d}doc", S)]), READER],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "5:other"])],
    },
    // The hand-off: a release gives a freed key to the queue's first waiter.
    Row {
        it: "hand a freed exclusive key to the queued waiter, marked",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Given::Waiter("x", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}doc", Some("!1:w")),
            Then::Exists("{d}doc:lockset:queue:w", false),
        ],
    },
    Row {
        it: "keep a queued writer waiting while a reader is left",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Hold("you", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("x", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "=w", "3:you"]),
            Then::Exists("{d}doc:lockset:queue:w", true),
        ],
    },
    Row {
        it: "hand a key to a queued writer when the last reader leaves",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Hold("you", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("x", &["{d}doc"]),
            Given::Release("you"),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Get("{d}doc", Some("!1:w"))],
    },
    Row {
        it: "hand a freed permit to a queued permit waiter",
        given: &[
            Hold("me", &[("{d}doc", P1)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("p1", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=p1", "=w", "1:w"]),
            Then::Exists("{d}doc:lockset:queue:w", false),
        ],
    },
    Row {
        it: "hand a reader nothing while a writer waits on its other key (writers first)",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&[
                "ZADD",
                "{d}lib",
                "-inf",
                "=s",
                "{now+60000}",
                "5:other",
                "{now+60000}",
                "=x",
            ]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Exists("{d}doc", false),
            Then::Exists("{d}doc:lockset:queue:w", true),
        ],
    },
    Row {
        it: "hand a reader both keys when the writer's mark on its other key has expired",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&[
                "ZADD",
                "{d}lib",
                "-inf",
                "=s",
                "{now+60000}",
                "5:other",
                "1",
                "=x",
            ]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "=w", "1:w"])],
    },
    Row {
        it: "hand a reader both keys when its other key has room",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&["ZADD", "{d}lib", "-inf", "=s", "{now+60000}", "5:other"]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "=w", "1:w"]),
            Then::Members("{d}lib", &["=s", "1:w", "5:other"]),
        ],
    },
];

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
        Err(Error::NotObtained | Error::DeadlineExceeded) => Reply::Held,
        Err(Error::ModeMismatch { .. }) => Reply::Mismatch,
        Err(Error::WrongType { .. }) => Reply::WrongType,
        Err(err) => Reply::Failed(err.to_string()),
    }
}

fn done(outcome: lockset::Result<()>) -> Reply {
    match outcome {
        Ok(()) => Reply::Done,
        Err(Error::NotHeld | Error::NotObtained) => Reply::NotHeld,
        Err(err) => Reply::Failed(err.to_string()),
    }
}

/// Runs one row on a flushed server; what went otherwise than it says.
async fn run(env: &Env, row: &Row) -> Result<(), String> {
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

/// It should ... every row of the table.
#[tokio::test]
async fn the_scripts_do_what_each_row_says() {
    let env = Env::start().await;
    let mut failed = Vec::new();
    for row in ROWS {
        if let Err(why) = run(&env, row).await {
            failed.push(format!("It should {}: {why}", row.it));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} rows failed:\n{}",
        failed.len(),
        ROWS.len(),
        failed.join("\n")
    );
}
