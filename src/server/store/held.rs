//! A held lock's operations on one server: its TTL, refresh and release, natively where
//! the server can and the lock holds exactly its value, else by script.

use super::*;

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store<C> {
    /// The smallest remaining TTL across the keys, if they are ours. A lock held without
    /// expiry reports `Duration::MAX`.
    pub(crate) async fn pttl(&self, claim: &Claim<'_>) -> Result<Ownership<Duration>> {
        let left: i64 = match claim.modes {
            Some(modes) => {
                let args = mode_args("pttl", modes, claim, &[] as &[&str]);
                self.invoke(&scripts::MODES_PTTL, claim.keys, None, args)
                    .await?
            }
            None => {
                self.invoke(&scripts::PTTL, claim.keys, None, claim.value)
                    .await?
            }
        };
        Ok(match left {
            scripts::PTTL_NOT_HELD => Ownership::Foreign,
            scripts::PTTL_MISSING => Ownership::Missing,
            scripts::PTTL_PERSISTENT => Ownership::Ours(Duration::MAX),
            ms => Ownership::Ours(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        })
    }

    /// Extends every key to the claim's TTL, only if every key is ours. With `restore`,
    /// missing keys are re-created with the claim's value (Redlock, once a majority is known
    /// to hold the lock, on a master that restarted empty). With `rewrite`, the keys are
    /// given the claim's value (the metadata changed); without, the values stay as they are.
    /// When writes are replicated, an extension too few replicas acknowledged fails with
    /// [`Error::NotReplicated`]: it may have run on the primary, but a failover could undo
    /// it.
    pub(crate) async fn refresh(
        &self,
        claim: &Claim<'_>,
        restore: bool,
        rewrite: bool,
    ) -> Result<Ownership<()>> {
        // The rewrite flag goes only with a rewrite: the common path has one argument less.
        let rewrite = rewrite.then_some(1);
        let (done, acks): (i64, _) = match claim.modes {
            Some(modes) => {
                let rest = (claim.ttl.millis, u8::from(restore), rewrite);
                let args = mode_args("refresh", modes, claim, rest);
                self.write(&scripts::MODES_REFRESH, claim.keys, None, args)
                    .await?
            }
            None => match self.extend_natively(claim, rewrite.is_some()).await? {
                Some(acks) => (scripts::DONE, acks),
                None => {
                    let restore = match rewrite {
                        Some(_) => Some(u8::from(restore)),
                        None => restore.then_some(1),
                    };
                    let args = (claim.value, claim.ttl.millis, restore, rewrite);
                    self.write(&scripts::REFRESH, claim.keys, None, args)
                        .await?
                }
            },
        };
        if done == scripts::DONE
            && let Some(short) = acks.and_then(|acks| self.shortfall(&acks))
        {
            return Err(short);
        }
        Ok(Ownership::from_reply(done, ()))
    }

    /// A single key extended by the server's own compare-and-set (see `native.rs`), when it
    /// holds exactly the claim's value (no waiter's mark, the same metadata) and no rewrite
    /// is asked for: what `refresh.lua` would do then, in one command, followed by the wait
    /// for replicas as the script's write is. `Some(acks)` when extended; `None` when the
    /// script must decide (the server has no such command, or the key holds anything else).
    pub(super) async fn extend_natively(
        &self,
        claim: &Claim<'_>,
        rewrite: bool,
    ) -> Result<Option<Option<Acks>>> {
        let [key] = claim.keys else {
            return Ok(None);
        };
        if rewrite {
            return Ok(None);
        }
        let natives = self.natives().await?;
        let Some(cmd) = natives.extend_if_equal(key, claim.value, claim.ttl.millis) else {
            return Ok(None);
        };
        match self.query::<Value>(cmd, true).await {
            Ok((Value::Nil, _)) => Ok(None),
            Ok((_, acks)) => Ok(Some(acks)),
            Err(err) => self.after_native(err).map(|()| None),
        }
    }

    /// A single key deleted by the server's own compare-and-delete (see `native.rs`), when it
    /// holds exactly the claim's value: what `release.lua` does then, in one command (nobody
    /// marked the key, so there is nothing to announce or hand on). True when deleted; false
    /// when the script must decide (the server has no such command, or the key holds
    /// anything else).
    pub(super) async fn delete_natively(&self, key: &str, value: &str) -> Result<bool> {
        let Some(cmd) = self.natives().await?.delete_if_equal(key, value) else {
            return Ok(false);
        };
        match cmd.query_async::<i64>(&mut self.conn.clone()).await {
            Ok(deleted) => Ok(deleted == 1),
            Err(err) => self.after_native(err).map(|()| false),
        }
    }

    /// What the server has natively, asked once per connection and primary.
    pub(super) async fn natives(&self) -> Result<native::Found> {
        Ok(self.natives.found(&self.conn, self.primary_epoch()).await?)
    }

    /// A native command failed with `err`: the script decides instead (`Ok`), unless the
    /// connection failed. A server that refuses the command as such gets scripts from now on;
    /// any other error reply (WRONGTYPE, OOM) is the script's to judge.
    pub(super) fn after_native(&self, err: RedisError) -> Result<()> {
        if err.code().is_none() {
            return Err(err.into());
        }
        if classify::refuses_command_form(&err) {
            self.natives.give_up(&err);
        }
        Ok(())
    }

    /// Deletes every key, only if every key is ours. With a payload, announces the release
    /// of each key that somebody waits for.
    pub(crate) async fn release(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
    ) -> Result<Ownership<()>> {
        // A fair waiter that gives up leaves its queues by the script. A release whose
        // payload names it may have a waiter of this client handed the lock as soon as it
        // is queued (see `Lock::release_once`): it is one command, so that the waiter's next
        // attempt runs behind the delete; a native delete that finds the waiter's mark (or
        // asking what the server has, first) would leave a gap before the script.
        let named = payload.is_some_and(|payload| !payload.is_empty());
        if !named
            && claim.modes.is_none()
            && claim.ticket.is_none()
            && let [key] = claim.keys
            && self.delete_natively(key, claim.value).await?
        {
            return Ok(Ownership::Ours(()));
        }
        self.release_sent(claim, payload, Sending::ByHash, false)
            .await
    }

    /// As [`Store::release`], by script alone: for a Redlock quorum's masters. A release there
    /// is one command per master, so that a waiter of the same client, woken by another
    /// master's announcement, sends its next attempt to this master behind the delete (one
    /// connection answers in order). A native delete that finds a waiter's mark would leave
    /// that gap before its script, and the waiter would find the lock still held there.
    pub(crate) async fn release_by_script(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
    ) -> Result<Ownership<()>> {
        self.release_sent(claim, payload, Sending::ByHash, false)
            .await
    }

    /// Releases as [`Store::release`] does; with `only_leave`, a fair waiter leaves its
    /// queues and nothing else changes.
    pub(super) async fn release_sent(
        &self,
        claim: &Claim<'_>,
        payload: Option<&str>,
        sending: Sending,
        only_leave: bool,
    ) -> Result<Ownership<()>> {
        let only_leave = u8::from(only_leave);
        let announce = if payload.is_some() {
            self.flavor.announce()
        } else {
            ""
        };
        let payload = payload.unwrap_or("");
        // A fair waiter that gives up leaves its queues by the same script.
        let leaving = claim.ticket.map_or("", |ticket| ticket.id.as_str());
        let done: i64 = match claim.modes {
            Some(modes) => {
                let rest = (
                    announce,
                    payload,
                    self.flavor.announce(),
                    leaving,
                    only_leave,
                );
                let args = mode_args("release", modes, claim, rest);
                self.send(
                    &scripts::MODES_RELEASE,
                    claim.keys,
                    None,
                    args,
                    sending,
                    false,
                )
                .await?
                .0
            }
            None => {
                // The common case is the script's default, and then goes without the rest:
                // five arguments cost the server more than the GET and DEL the script runs.
                // (`announce` is PUBLISH only when `self.flavor.announce()` is.)
                let common =
                    announce == scripts::PUBLISH && payload.is_empty() && leaving.is_empty();
                let rest = (!common).then_some((
                    announce,
                    payload,
                    leaving,
                    self.flavor.announce(),
                    only_leave,
                ));
                self.send(
                    &scripts::RELEASE,
                    claim.keys,
                    None,
                    (claim.value, rest),
                    sending,
                    false,
                )
                .await?
                .0
            }
        };
        Ok(Ownership::from_reply(done, ()))
    }

    /// Like [`Store::release`], but sends the script's source with EVAL. For clean-up after
    /// an obtain with an unknown outcome: if the server is stalled, this queues behind the
    /// obtain and must not depend on a NOSCRIPT fallback that nobody will be waiting to run.
    /// Keys that somebody waits for are announced: the waiter marked them meanwhile.
    pub(crate) async fn release_by_eval(&self, claim: &Claim<'_>) -> Result<Ownership<()>> {
        self.release_sent(claim, Some(""), Sending::Whole, false)
            .await
    }

    /// A release owed to a Redlock master that stopped answering, sent once it answers
    /// again (see `health.rs`): by hash (its sender awaits the reload after NOSCRIPT), and
    /// announced to the keys' waiters, as [`Store::release_by_eval`] is.
    pub(crate) async fn release_owed(&self, claim: &Claim<'_>) -> Result<Ownership<()>> {
        self.release_sent(claim, Some(""), Sending::ByHash, false)
            .await
    }

    /// The clean-up after an obtain whose caller went away or got no reply, sent as
    /// [`Store::release_by_eval`] is: a random token releases its keys and leaves its
    /// queues; a caller's own token only leaves its queues, since the keys it holds may be
    /// an outer lock's (a re-obtain by the same token), which nothing but its holder may
    /// release. What a release handed it meanwhile expires with its TTL, or is made its own
    /// by the next obtain by that token.
    pub(crate) async fn clean_up(&self, claim: &Claim<'_>) -> Result<()> {
        let only_leave = claim.owner.is_custom();
        self.release_sent(claim, Some(""), Sending::Whole, only_leave)
            .await
            .map(drop)
    }
}
