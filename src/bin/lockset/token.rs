//! `acquire`, `refresh` and `release`: a lock held across the steps of a shell script,
//! named by its token.
//!
//! `refresh` and `release` adopt the lock by its token ([`Client::adopt`]: one TTL query,
//! nothing written, a lock that expired stays lost), then refresh or release it. Before
//! that they read the keys, to say who holds them when the token does not.
//!
//! [`Client::adopt`]: lockset::Client::adopt

use std::io::Write as _;
use std::time::Duration;

use lockset::redis::RedisError;
use lockset::redis::aio::ConnectionLike;
use lockset::{Lock, Mode, Options};

use crate::cli::{AcquireArgs, RefreshArgs, ReleaseArgs};
use crate::connect::Redis;
use crate::exit::{self, DATA, Failure, LOST};
use crate::holder::{self, Key, Loss, State};
use crate::obtain;
use crate::signals::Signals;
use crate::ui::Ui;

/// The TTL a released lock's handle is adopted with (it is released at once). On a Redlock
/// quorum it sets how long a master may take to answer (5% of it, 500 ms): a paused one
/// holds a release up no longer.
const RELEASE_TTL: Duration = Duration::from_secs(10);

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

/// Extends the lock held by `--token` to `--ttl`, replacing its metadata with `--metadata`
/// when given.
pub(crate) async fn refresh<C>(redis: &Redis<C>, args: &RefreshArgs) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = held_by(redis, &args.keys, &args.token).await?;
    let metadata = holders_metadata(&keys);
    let lock = adopt(redis, &keys, &args.token, &metadata, args.ttl).await?;
    let mut options = Options::default();
    if let Some(metadata) = &args.metadata {
        options = options.metadata(metadata);
    }
    match lock.refresh(args.ttl, &options).await {
        Ok(()) => Ok(0),
        Err(err) if err.is_not_held() => Err(not_held("it expired or was taken over")),
        Err(err) => Err(Failure::from_error(&err)),
    }
}

/// Releases the lock held by `--token`.
pub(crate) async fn release<C>(redis: &Redis<C>, args: &ReleaseArgs) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = held_by(redis, &args.keys, &args.token).await?;
    let metadata = holders_metadata(&keys);
    let lock = adopt(redis, &keys, &args.token, &metadata, RELEASE_TTL).await?;
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
    let seen = holder::inspect_all(&redis.nodes, keys, Some(token))
        .await
        .map_err(|err| unavailable(&err))?;
    if let Some(loss) = Loss::find(&seen) {
        if loss.others.state() == State::WrongType {
            return Err(Failure::new(DATA, loss.describe()));
        }
        return Err(not_held(&loss.describe()));
    }
    Ok(seen)
}

/// A handle on the lock that `token` holds on `keys`.
async fn adopt<C>(
    redis: &Redis<C>,
    keys: &[Key],
    token: &str,
    metadata: &str,
    ttl: Duration,
) -> Result<Lock, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let options = Options::default().token(token).metadata(metadata);
    // Each key in the mode the token holds it in, as `acquire` took it (alone, shared or
    // as a permit): refresh and release need not be told.
    let keys = keys
        .iter()
        .map(|key| (key.name.as_str(), key.own_mode().unwrap_or(Mode::Exclusive)));
    match redis.client.adopt(keys, ttl, &options).await {
        Ok(lock) => Ok(lock),
        Err(err) if err.is_not_held() => Err(not_held("it expired or was taken over")),
        Err(err) => Err(Failure::from_error(&err)),
    }
}

/// The metadata the lock the keys were read for stored (all keys of a lock store the same).
fn holders_metadata(keys: &[Key]) -> String {
    keys.iter()
        .find_map(Key::own_metadata)
        .unwrap_or_default()
        .to_owned()
}

fn not_held(why: &str) -> Failure {
    Failure::new(LOST, format!("the lock is not held by this token: {why}"))
}

fn unavailable(err: &RedisError) -> Failure {
    exit::redis_failure("cannot read the keys from Redis", err)
}
