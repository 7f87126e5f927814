//! Sending: a script by `EVALSHA`, whole by `EVAL` when the server lacks it, and a write's
//! `WAIT` for replicas in the same request; counting the replicas.

use super::*;

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store<C> {
    /// Runs `script` by EVALSHA over `keys` (then `extra_key`, if any) with `args`; when the
    /// server answers NOSCRIPT, sends it whole by EVAL, which also caches it there.
    ///
    /// EVAL goes where the keys are, as EVALSHA does. (`ScriptInvocation::invoke_async`
    /// loads the script instead, which a cluster connection sends to every master: one
    /// stopped master would hold up every release on the others. It also copies every key
    /// and argument into a second command: this runs on every lock operation.)
    pub(super) async fn invoke<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
    ) -> Result<T> {
        let (reply, _) = self
            .send(script, keys, extra_key, args, Sending::ByHash, false)
            .await?;
        Ok(reply)
    }

    /// Runs `script` as [`Store::invoke`] does, for a write that a lock counts on: when
    /// writes are replicated, the wait for its acknowledgements follows in the same request.
    pub(super) async fn write<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
    ) -> Result<Written<T>> {
        self.send(script, keys, extra_key, args, Sending::ByHash, true)
            .await
    }

    /// Runs `script` as [`Store::invoke`] does, or sends it whole at once; `wait`: a write
    /// that waits for replicas when they are asked for.
    pub(super) async fn send<T: FromRedisValue, A: ToRedisArgs>(
        &self,
        script: &Lua,
        keys: &[String],
        extra_key: Option<&str>,
        args: A,
        sending: Sending,
        wait: bool,
    ) -> Result<Written<T>> {
        let command = |verb: &str, script: &str| {
            let key_bytes: usize = keys.iter().map(String::len).sum();
            let mut cmd = Cmd::with_capacity(keys.len() + 8, key_bytes + script.len() + 128);
            cmd.arg(verb)
                .arg(script)
                .arg(keys.len() + usize::from(extra_key.is_some()))
                .arg(keys)
                .arg(extra_key)
                .arg(&args);
            cmd
        };
        // A script's own error names a line of the bundled script: the log says whose.
        let failed = |err: RedisError| {
            script.note_origin(&err);
            err
        };
        if sending == Sending::Whole {
            return Ok(self
                .query(command("EVAL", &script.source), wait)
                .await
                .map_err(failed)?);
        }
        match self.query(command("EVALSHA", &script.hash), wait).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(self
                    .query(command("EVAL", &script.source), wait)
                    .await
                    .map_err(|err| self.script_error(failed(err)))?)
            }
            reply => Ok(reply.map_err(|err| self.script_error(failed(err)))?),
        }
    }

    /// Sends `cmd`. With `wait`, when writes are replicated, the wait for replicas follows
    /// it in the same request, so on the same connection (see `server/replication/`), and its
    /// answer comes back beside the reply.
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        cmd: Cmd,
        wait: bool,
    ) -> RedisResult<Written<T>> {
        let mut conn = self.conn.clone();
        let Some(replicated) = self.replication().filter(|_| wait) else {
            return Ok((cmd.query_async(&mut conn).await?, None));
        };
        self.count_replicas_later(false);
        if let Some(promotable) = self.deployment.as_ref().and_then(|d| d.promotable()) {
            replicated.follow(promotable);
        }
        // With every replica in sync asked for, the replicas the primary has right after the
        // wait come back too: one that caught up counts from the next write on. (A cluster
        // counts its shards apart from writes.)
        let look = replicated.settings().follows_replicas() && !self.is_cluster();
        let (mut pipe, mut required) = replicated.pipeline(cmd, look);
        // The write's own error (WRONGTYPE, NOSCRIPT, ...) is reported as it would be alone.
        pipe.ignore_errors();
        let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        if look
            && let Some(info) = replies
                .get(2)
                .and_then(|info| redis::from_redis_value_ref::<String>(info).ok())
        {
            let replicas = Replicas::parse(&info);
            replicated.saw(&replicas);
            // Judged by the replicas the primary listed right after its wait too: one the
            // deployment could not promote may have acknowledged in place of one it could
            // (see `Replicated::requirement`), the first write on a new primary included.
            required = required.max(replicated.requirement(&replicas));
        }
        let mut replies = replies.drain(..);
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "replicated write: missing replies",
            )));
        };
        let reply = T::from_redis_value(reply.extract_error()?)?;
        // An error instead of a count: nothing is known to be acknowledged.
        let acks = Acks::parse(&acks, required).unwrap_or(Acks {
            replicas: 0,
            local: false,
            required,
        });
        Ok((reply, Some(acks)))
    }
}

/// A write's reply, and when writes are replicated, how many replicas acknowledged it.
pub(super) type Written<T> = (T, Option<Acks>);

/// The replicas the primary behind `conn` has: from `INFO replication` (see
/// [`Replicas::parse`]); on a cluster, the fewest healthy replicas of any shard that serves
/// slots (`CLUSTER NODES`).
pub(super) async fn replicas_now<C: ConnectionLike>(
    mut conn: C,
    cluster: bool,
) -> RedisResult<Replicas> {
    if cluster {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await?;
        return Ok(Replicas::counted(fewest_replicas_per_shard(&nodes)));
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await?;
    Ok(Replicas::parse(&info))
}

/// How a script goes to the server.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Sending {
    /// By its hash (EVALSHA), sent whole only when the server does not have it.
    ByHash,
    /// Whole (EVAL), never depending on a second round trip.
    Whole,
}

/// The fewest healthy replicas any primary that serves slots has, from `CLUSTER NODES`:
/// lines of `id address flags primary ping pong epoch link-state slots...`.
pub(super) fn fewest_replicas_per_shard(nodes: &str) -> u32 {
    let nodes: Vec<Vec<&str>> = nodes
        .lines()
        .map(|line| line.split(' ').collect())
        .filter(|fields: &Vec<&str>| fields.len() >= 8)
        .collect();
    let healthy = |fields: &[&str]| {
        fields[7] == "connected" && !fields[2].split(',').any(|flag| flag.starts_with("fail"))
    };
    nodes
        .iter()
        .filter(|fields| fields[2].contains("master") && fields.len() > 8 && healthy(fields))
        .map(|primary| {
            let replicas = nodes
                .iter()
                .filter(|fields| fields[3] == primary[0] && healthy(fields))
                .count();
            u32::try_from(replicas).unwrap_or(u32::MAX)
        })
        .min()
        .unwrap_or(0)
}
