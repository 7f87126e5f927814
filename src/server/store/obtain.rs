//! Obtaining on one server: one key without a script (`SET NX GET`), a plain lock by
//! `obtain.lua`, a lock with shared or counted keys by `modes_obtain.lua`, and their replies.

use super::*;

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store<C> {
    pub(super) async fn obtain_plain(
        &self,
        claim: &Claim<'_>,
        how: IfHeld,
    ) -> Result<Written<Obtain>> {
        // A fair waiter goes by script: it queues, or takes what was handed or reserved to it.
        let queue = claim.ticket.filter(|_| how.queue);
        if queue.is_none()
            && claim.counter.is_none()
            && let [key] = claim.keys
            && self.set_nx_get.load(Ordering::Relaxed)
            && let Some((outcome, acks)) = self.obtain_one(key, claim).await?
        {
            match outcome {
                Obtain::Held(_) if how.mark_holder => {}
                Obtain::Held(held) if how.holder_ttl => {
                    let held = Obtain::Held(Held {
                        ttl: self.key_ttl(key).await?,
                        ..held
                    });
                    return Ok((held, acks));
                }
                outcome => return Ok((outcome, acks)),
            }
        }
        Box::pin(self.obtain_by_script(claim, how.mark_holder || queue.is_some(), queue)).await
    }

    /// Tries once to lock every key of `claim` in its mode, by `lua/modes_obtain.lua`.
    pub(super) async fn obtain_by_modes(
        &self,
        claim: &Claim<'_>,
        modes: &Modes,
        how: IfHeld,
    ) -> Result<Written<Obtain>> {
        // A fair waiter queues with its keys' modes (see `lua/queue.lua`).
        let queue = claim.ticket.filter(|_| how.queue);
        let rest = (
            claim.ttl.millis,
            self.fence_arg(claim),
            u8::from(how.mark_holder || queue.is_some()),
            u8::from(how.retries),
            queue.map(queue_args),
        );
        let args = mode_args("obtain", modes, claim, rest);
        let (reply, acks) = self
            .write(&scripts::MODES_OBTAIN, claim.keys, claim.counter, args)
            .await?;
        if let Value::Array(items) = &reply
            && let [Value::Int(scripts::MODE_MISMATCH), Value::Int(index), held] = items.as_slice()
        {
            return Err(mode_mismatch(claim.keys, modes, *index, held));
        }
        Ok((parse_obtain_reply(reply)?, acks))
    }

    /// The scripts' fencing argument: 0 without a counter, else the epoch plus one.
    pub(super) fn fence_arg(&self, claim: &Claim<'_>) -> u64 {
        claim.counter.map_or(0, |_| self.epoch() + 1)
    }

    /// What is left of `key`'s TTL, as the script reports a holder's: `None` without an
    /// expiry, zero when the key is gone (its holder just released it).
    pub(super) async fn key_ttl(&self, key: &str) -> Result<Option<Duration>> {
        let left: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match left {
            -1 => None,
            left => Some(Duration::from_millis(u64::try_from(left).unwrap_or(0))),
        })
    }

    /// One key, no script: `SET key value NX PX ttl GET` either sets the key (reply nil) or
    /// returns the holder's value. Returns `None` when the script must decide: the key
    /// already holds our own token, or the server does not know this form of SET.
    pub(super) async fn obtain_one(
        &self,
        key: &str,
        claim: &Claim<'_>,
    ) -> Result<Option<Written<Obtain>>> {
        let mut set = Cmd::with_capacity(7, 32 + key.len() + claim.value.len());
        set.arg("SET")
            .arg(key)
            .arg(claim.value)
            .arg("NX")
            .arg("PX")
            .arg(claim.ttl.millis)
            .arg("GET");
        let reply: RedisResult<(Option<Vec<u8>>, _)> = self.query(set, true).await;
        match reply {
            Ok((None, acks)) => Ok(Some((Obtain::Obtained { fence: None }, acks))),
            // Held by ourselves: re-obtain by script, which also keeps the longer TTL.
            Ok((Some(holder), _)) if claim.owner.owns(&holder) => Ok(None),
            Ok((Some(holder), acks)) => {
                let held = Held {
                    holder: holder_metadata(&holder),
                    ..Held::UNKNOWN
                };
                Ok(Some((Obtain::Held(held), acks)))
            }
            Err(err) if err.code() == Some("WRONGTYPE") => Err(Error::WrongType {
                key: key.to_owned(),
            }),
            Err(err) if classify::is_syntax_error(&err) => {
                tracing::debug!("server rejects SET NX GET; obtaining single keys by script");
                self.set_nx_get.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(err) => Err(err.into()),
        }
    }

    pub(super) async fn obtain_by_script(
        &self,
        claim: &Claim<'_>,
        mark_holder: bool,
        queue: Option<&Ticket>,
    ) -> Result<Written<Obtain>> {
        // The fencing counter, if any, goes last in KEYS, flagged by ARGV[3]. The flags and
        // the queue are left out when all are off: the common case, one argument less each.
        let counted = claim.counter.is_some();
        let rest = (counted || mark_holder || queue.is_some()).then(|| {
            (
                self.fence_arg(claim),
                u8::from(mark_holder),
                queue.map(queue_args),
            )
        });
        let args = (claim.value, claim.ttl.millis, rest);
        let (reply, acks) = self
            .write(&scripts::OBTAIN, claim.keys, claim.counter, args)
            .await?;
        Ok((parse_obtain_reply(reply)?, acks))
    }
}

/// A fair waiter's queue arguments, as `obtain.lua` and `lua/modes_*.lua` take them: its lease,
/// id, turn, the key it hears its hand-off on (Lua counts from 1), and its client's hand-off
/// tag when it hears it on its client's own channel for that key.
pub(super) fn queue_args(ticket: &Ticket) -> (u64, &str, u64, usize, &str) {
    let listen = ticket.listen + 1;
    let tag = ticket.tag.as_deref().unwrap_or_default();
    (
        ticket.lease.millis,
        ticket.id.as_str(),
        ticket.turn,
        listen,
        tag,
    )
}

/// The arguments of the `lua/modes_*.lua` script for operation `op` for `claim`, followed by the operation's
/// own (`rest`).
pub(super) fn mode_args<'a, T: ToRedisArgs>(
    op: &'static str,
    modes: &'a Modes,
    claim: &Claim<'a>,
    rest: T,
) -> impl ToRedisArgs + use<'a, T> {
    (
        op,
        modes.encoded(),
        claim.value,
        u8::from(claim.owner.is_custom()),
        rest,
    )
}

/// The error for `modes_obtain.lua`'s reply that `keys[index - 1]` is held as `held`.
pub(super) fn mode_mismatch(keys: &[String], modes: &Modes, index: i64, held: &Value) -> Error {
    let index = usize::try_from(index - 1).unwrap_or(0);
    let held: String = redis::from_redis_value_ref(held).unwrap_or_default();
    Error::ModeMismatch {
        key: keys.get(index).cloned().unwrap_or_default(),
        held: Mode::from_code(&held).unwrap_or(Mode::Shared),
        requested: modes.list().get(index).copied().unwrap_or(Mode::Shared),
    }
}

pub(super) fn parse_obtain_reply(reply: Value) -> Result<Obtain> {
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
        // Lua's false arrives as nil (no fencing).
        [Value::Int(scripts::OBTAINED)] | [Value::Int(scripts::OBTAINED), Value::Nil] => {
            Ok(Obtain::Obtained { fence: None })
        }
        // The token, as a decimal string (the script refuses counters below 1).
        [
            Value::Int(scripts::OBTAINED),
            fence @ (Value::BulkString(_) | Value::Int(_)),
        ] => Ok(Obtain::Obtained {
            fence: redis::from_redis_value_ref::<u64>(fence).ok(),
        }),
        [
            Value::Int(scripts::HELD),
            Value::Int(ms),
            Value::Int(index),
            rest @ ..,
        ] => {
            Ok(Obtain::Held(Held {
                ttl: u64::try_from(*ms).ok().map(Duration::from_millis),
                // Lua counts from 1.
                key: usize::try_from(*index - 1).unwrap_or(0),
                // A fourth element: 1 when the attempt queued; a fifth: the holder's metadata.
                queued: matches!(rest.first(), Some(Value::Int(1))),
                holder: match rest.get(1) {
                    Some(Value::BulkString(metadata)) => Some(shown_metadata(metadata)),
                    _ => None,
                },
            }))
        }
        [Value::Int(scripts::WRONG_TYPE), key] => Err(Error::WrongType {
            key: redis::from_redis_value_ref(key).unwrap_or_default(),
        }),
        _ => Err(unexpected(&reply)),
    }
}
