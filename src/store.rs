//! One attempt against one Redis server: run a command or script and say what happened.
//!
//! This layer knows the scripts, the value encoding and the reply shapes; it knows nothing
//! about retries or deadlines (see `policy`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs, Value};

use crate::error::{Error, Result};
use crate::scripts;
use crate::value::Owner;

/// What one obtain attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Obtain {
    /// Every key is ours; with the fencing token minted, when one was asked for.
    Obtained { fence: Option<u64> },
    /// Another owner holds `keys[key]`; its remaining TTL when known (`None`: unknown or
    /// no expiry).
    Held { ttl: Option<Duration>, key: usize },
}

/// A connection to one Redis server, plus what we learned about that server.
pub(crate) struct Store<C> {
    conn: C,
    /// False once the server rejected `SET .. NX GET` (Redis before 7.0).
    set_nx_get: AtomicBool,
    /// The command `release.lua` announces releases with.
    announce: &'static str,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store<C> {
    /// A store on a Redis Cluster: releases are announced with sharded pub/sub (SPUBLISH),
    /// which stays within the key's shard instead of going to every node.
    #[cfg(feature = "cluster")]
    pub(crate) fn new_cluster(conn: C) -> Self {
        Self {
            announce: "SPUBLISH",
            ..Self::new(conn)
        }
    }

    pub(crate) fn new(conn: C) -> Self {
        Self {
            conn,
            set_nx_get: AtomicBool::new(true),
            // A standalone server: plain pub/sub. (redis-rs subscribes to sharded channels
            // only over cluster connections, and a single server gains nothing from them.)
            announce: "PUBLISH",
        }
    }

    /// Tries once to lock every key in `keys` for `ttl_ms` with `value`, incrementing the
    /// fencing `counter` on success when one is given.
    pub(crate) async fn obtain(
        &self,
        keys: &[String],
        owner: &Owner,
        value: &str,
        ttl_ms: u64,
        counter: Option<&str>,
    ) -> Result<Obtain> {
        if counter.is_none()
            && let [key] = keys
            && self.set_nx_get.load(Ordering::Relaxed)
            && let Some(outcome) = self.obtain_one(key, owner, value, ttl_ms).await?
        {
            return Ok(outcome);
        }
        self.obtain_by_script(keys, owner, value, ttl_ms, counter)
            .await
    }

    /// One key, no script: `SET key value NX PX ttl GET` either sets the key (reply nil) or
    /// returns the holder's value. Returns `None` when the script must decide: the key
    /// already holds our own token, or the server does not know this form of SET.
    async fn obtain_one(
        &self,
        key: &str,
        owner: &Owner,
        value: &str,
        ttl_ms: u64,
    ) -> Result<Option<Obtain>> {
        let reply: RedisResult<Option<Vec<u8>>> =
            Cmd::with_capacity(7, 32 + key.len() + value.len())
                .arg("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .arg("GET")
                .query_async(&mut self.conn.clone())
                .await;
        match reply {
            Ok(None) => Ok(Some(Obtain::Obtained { fence: None })),
            // Held by ourselves: re-obtain by script, which also resets the TTL and value.
            Ok(Some(holder)) if owner.owns(&holder) => Ok(None),
            Ok(Some(_)) => Ok(Some(Obtain::Held { ttl: None, key: 0 })),
            Err(err) if err.code() == Some("WRONGTYPE") => Err(Error::WrongType {
                key: key.to_owned(),
            }),
            Err(err) if is_syntax_error(&err) => {
                tracing::debug!("server rejects SET NX GET; obtaining single keys by script");
                self.set_nx_get.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(err) => Err(err.into()),
        }
    }

    async fn obtain_by_script(
        &self,
        keys: &[String],
        owner: &Owner,
        value: &str,
        ttl_ms: u64,
        counter: Option<&str>,
    ) -> Result<Obtain> {
        // The fencing counter, if any, goes last in KEYS, flagged by ARGV[4].
        let args = (owner.tag(), value, ttl_ms, counter.map(|_| 1));
        let reply = self.invoke(&scripts::OBTAIN, keys, counter, args).await?;
        parse_obtain_reply(reply)
    }

    /// The smallest remaining TTL across `keys`, or `None` when the lock is not held.
    /// A lock held without expiry reports `Duration::MAX`.
    pub(crate) async fn pttl(&self, keys: &[String], owner: &Owner) -> Result<Option<Duration>> {
        let left: i64 = self.invoke(&scripts::PTTL, keys, None, owner.tag()).await?;
        Ok(match left {
            scripts::PTTL_NOT_HELD => None,
            scripts::PTTL_PERSISTENT => Some(Duration::MAX),
            ms => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        })
    }

    /// Extends every key to `ttl_ms`; false when the lock is not held. With `restore`, keys
    /// that are missing are re-created with that value (Redlock, after a master restarted).
    pub(crate) async fn refresh(
        &self,
        keys: &[String],
        owner: &Owner,
        ttl_ms: u64,
        restore: Option<&str>,
    ) -> Result<bool> {
        let done: i64 = self
            .invoke(
                &scripts::REFRESH,
                keys,
                None,
                (owner.tag(), ttl_ms, restore),
            )
            .await?;
        Ok(done == 1)
    }

    /// Deletes every key; false when the lock is not held.
    pub(crate) async fn release(&self, keys: &[String], owner: &Owner) -> Result<bool> {
        let done: i64 = self
            .invoke(&scripts::RELEASE, keys, None, (owner.tag(), self.announce))
            .await?;
        Ok(done == 1)
    }

    /// Runs `script` by EVALSHA over `keys` (then `extra_key`, if any) with `args`, loading
    /// the script when the server answers NOSCRIPT.
    ///
    /// This is what `ScriptInvocation::invoke_async` does, minus its copies of every key
    /// and argument into a second command: this runs on every lock operation.
    async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        extra_key: Option<&str>,
        args: impl ToRedisArgs,
    ) -> Result<T> {
        let key_bytes: usize = keys.iter().map(String::len).sum();
        let mut cmd = Cmd::with_capacity(keys.len() + 8, key_bytes + 128);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len() + usize::from(extra_key.is_some()))
            .arg(keys)
            .arg(extra_key)
            .arg(args);
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                script.load_async(&mut conn).await?;
                Ok(cmd.query_async(&mut conn).await?)
            }
            reply => Ok(reply?),
        }
    }

    /// Like [`Store::release`], but sends the script's source with EVAL. For clean-up after
    /// a timed-out obtain: if the server is stalled, this queues behind the obtain and must
    /// not depend on a NOSCRIPT fallback that nobody will be waiting to run.
    pub(crate) async fn release_by_eval(&self, keys: &[String], owner: &Owner) -> Result<bool> {
        let done: i64 = redis::cmd("EVAL")
            .arg(scripts::RELEASE_SOURCE)
            .arg(keys.len())
            .arg(keys)
            .arg(owner.tag())
            .arg(self.announce)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(done == 1)
    }
}

fn is_syntax_error(err: &RedisError) -> bool {
    err.code() == Some("ERR") && err.detail().is_some_and(|d| d.contains("syntax error"))
}

fn parse_obtain_reply(reply: Value) -> Result<Obtain> {
    let unexpected = |reply: &Value| {
        Error::Redis(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply from obtain.lua",
            format!("{reply:?}"),
        )))
    };
    let Value::Array(items) = &reply else {
        return Err(unexpected(&reply));
    };
    match items.as_slice() {
        [Value::Int(scripts::OBTAINED)] => Ok(Obtain::Obtained { fence: None }),
        [Value::Int(scripts::OBTAINED), Value::Int(fence)] => Ok(Obtain::Obtained {
            fence: u64::try_from(*fence).ok(),
        }),
        [Value::Int(scripts::HELD), Value::Int(ms), Value::Int(index)] => Ok(Obtain::Held {
            ttl: u64::try_from(*ms).ok().map(Duration::from_millis),
            // Lua counts from 1.
            key: usize::try_from(*index - 1).unwrap_or(0),
        }),
        [Value::Int(scripts::WRONG_TYPE), key] => Err(Error::WrongType {
            key: redis::from_redis_value_ref(key).unwrap_or_default(),
        }),
        _ => Err(unexpected(&reply)),
    }
}
