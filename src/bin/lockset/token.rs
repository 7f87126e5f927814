//! `acquire`, `refresh` and `release`: a lock held across the steps of a shell script,
//! named by its token.
//!
//! The library has no way to rebuild a lock from its token. `refresh` and `release` check
//! that every key holds the token, then re-obtain the lock with the token
//! ([`Options::token`]: a re-obtain succeeds only when each key is free or already ours),
//! and refresh or release what they got. The check keeps a lock that expired from being
//! taken anew and reported as refreshed; between the check and the re-obtain a lock that
//! expires is obtained again by its last owner, which nobody else could have held.

use std::io::Write as _;
use std::time::Duration;

use lockset::redis::RedisError;
use lockset::redis::aio::ConnectionLike;
use lockset::{Lock, Options};

use crate::cli::{AcquireArgs, RefreshArgs, ReleaseArgs};
use crate::connect::Redis;
use crate::exit::{self, Failure, LOST, UNAVAILABLE};
use crate::holder::{self, Key};
use crate::obtain;
use crate::signals::Signals;
use crate::ui::Ui;

/// The TTL of the short-lived re-obtain before a release, for keys without expiry.
const RELEASE_TTL: Duration = Duration::from_secs(30);

/// Obtains the lock and prints its token (and fencing token) on stdout.
pub(crate) async fn acquire<C>(
    redis: &Redis<C>,
    args: &AcquireArgs,
    ui: Ui,
    signals: &mut Signals,
) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let lock = obtain::obtain(redis, &args.keys, &args.obtain, ui, signals).await?;
    let mut text = format!("{}\n", lock.token());
    if let Some(fence) = lock.fencing_token() {
        text.push_str(&format!("{fence}\n"));
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // Nobody learned the token: nobody could release the lock.
        let _ = lock.release().await;
        return Err(Failure::new(
            exit::SYSTEM,
            format!("cannot print the token ({err}); released the lock"),
        ));
    }
    Ok(0)
}

/// Extends the lock held by `--token` to `--ttl`.
pub(crate) async fn refresh<C>(redis: &Redis<C>, args: &RefreshArgs) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = held_by(redis, &args.keys, &args.token).await?;
    let metadata = match &args.metadata {
        Some(metadata) => metadata.clone(),
        None => holders_metadata(&keys, &args.token),
    };
    reobtain(redis, &args.keys, &args.token, &metadata, args.ttl).await?;
    Ok(0)
}

/// Releases the lock held by `--token`.
pub(crate) async fn release<C>(redis: &Redis<C>, args: &ReleaseArgs) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = held_by(redis, &args.keys, &args.token).await?;
    let metadata = holders_metadata(&keys, &args.token);
    // Keep the keys' expiry: if the release below never arrives, they go as they would have.
    let ttl = keys
        .iter()
        .map(|key| key.ttl().unwrap_or(RELEASE_TTL))
        .min()
        .unwrap_or(RELEASE_TTL)
        .max(Duration::from_millis(1));
    let lock = reobtain(redis, &args.keys, &args.token, &metadata, ttl).await?;
    match lock.release().await {
        Ok(()) => Ok(0),
        Err(err) if err.is_not_held() => Err(not_held(&err.to_string())),
        Err(err) => Err(Failure::from_error(&err)),
    }
}

/// Reads `keys` and checks that `token` holds each of them (on a majority of the masters
/// of a Redlock quorum).
async fn held_by<C>(redis: &Redis<C>, keys: &[String], token: &str) -> Result<Vec<Key>, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let seen = holder::inspect_all(&redis.nodes, keys)
        .await
        .map_err(|err| unavailable(&err))?;
    let needed = redis.nodes.len() / 2 + 1;
    if let Some(key) = seen.iter().find(|key| key.held_by(token) < needed) {
        return Err(not_held(&key.describe()));
    }
    Ok(seen)
}

/// Obtains `keys` again with `token`.
async fn reobtain<C>(
    redis: &Redis<C>,
    keys: &[String],
    token: &str,
    metadata: &str,
    ttl: Duration,
) -> Result<Lock<C>, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let options = Options::default().token(token).metadata(metadata);
    match redis
        .client
        .obtain_multi(keys.iter().cloned(), ttl, &options)
        .await
    {
        Ok(lock) => Ok(lock),
        Err(err) if exit::is_conflict(&err) => Err(not_held("it was taken over")),
        Err(err) => Err(Failure::from_error(&err)),
    }
}

/// The metadata the holder of `token` stored (all keys of a lock store the same).
fn holders_metadata(keys: &[Key], token: &str) -> String {
    keys.iter()
        .find_map(|key| key.metadata_of(token))
        .unwrap_or_default()
        .to_owned()
}

fn not_held(why: &str) -> Failure {
    Failure::new(LOST, format!("the lock is not held by this token: {why}"))
}

fn unavailable(err: &RedisError) -> Failure {
    Failure::new(
        UNAVAILABLE,
        format!("cannot read the keys from Redis: {err}"),
    )
}
