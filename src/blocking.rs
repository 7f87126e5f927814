//! The blocking API (feature `blocking`): the async client's operations for synchronous
//! code, run on a tokio runtime of the client's own, as `reqwest::blocking` does.
//!
//! Every call blocks the calling thread until the async operation it wraps is done; nothing
//! about locks is decided here. The runtime has one worker thread of its own, where the
//! background work runs while callers block or do work of theirs: watchdogs, releases of
//! dropped guards, pub/sub listeners, a quorum's slower masters. Any number of threads may
//! call at once (each call runs on its caller's thread). A call from inside an async runtime
//! is refused with [`Error::InsideAsyncRuntime`] before anything is sent, instead of
//! panicking or blocking that runtime.
//!
//! ```no_run
//! use std::time::Duration;
//! use lockset::Options;
//! use lockset::blocking::Client;
//!
//! # fn main() -> Result<(), lockset::Error> {
//! let client = Client::connect("redis://127.0.0.1/")?;
//! let report = client.with_lock(["nightly-report"], Duration::from_secs(10), &Options::default(), |lost| {
//!     // Blocking work; the watchdog keeps the lock alive meanwhile.
//!     std::thread::sleep(Duration::from_secs(30));
//!     if lost.is_lost() { "lost the lock: discard" } else { "done" }
//! })?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::runtime::{Handle, Runtime};

use crate::client::options::Options;
use crate::error::{Error, Result};
use crate::model::key::IntoKey;
use crate::topology::quorum::QuorumConfig;
use crate::topology::sentinel::SentinelConfig;

/// How long the last handle of a client waits for its background work (releases of dropped
/// guards, the slower masters' share of a quorum's operations) before the runtime stops.
const SETTLE: Duration = Duration::from_secs(2);

/// A runtime of the blocking API's own, shared by a client, its clones, locks and signals;
/// stopped when the last of them is dropped.
struct Engine {
    handle: Handle,
    /// Taken when dropped.
    runtime: Option<Runtime>,
}

impl Engine {
    fn start() -> Result<Arc<Self>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lockset-blocking")
            .enable_all()
            .build()
            .map_err(redis::RedisError::from)?;
        Ok(Arc::new(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        }))
    }

    /// Runs `future` to completion on the calling thread, unless it is inside an async
    /// runtime.
    fn block_on<F: Future>(&self, future: F) -> Result<F::Output> {
        refuse_inside_runtime()?;
        Ok(self.handle.block_on(future))
    }

    /// Runs `f` in the runtime's context (so that what it spawns runs there).
    fn within<T>(&self, f: impl FnOnce() -> T) -> T {
        let _context = self.handle.enter();
        f()
    }

    /// Makes every background task of `client` run on this runtime.
    fn adopt<C>(&self, client: &crate::client::handle::Client<C>)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        client.tasks().run_on(self.handle.clone());
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Never waits: this may run inside another runtime, where waiting panics.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// [`Error::InsideAsyncRuntime`] inside an async runtime's context.
fn refuse_inside_runtime() -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Err(Error::InsideAsyncRuntime),
        Err(_) => Ok(()),
    }
}

/// A blocking [`crate::Client`]: the same operations, each blocking until done. Cheap to
/// clone; clones share the connection and the runtime.
///
/// See the guide: [the blocking API](crate::guide::blocking).
///
/// ```no_run
/// use std::time::Duration;
/// use lockset::{Mode, Options};
/// use lockset::blocking::Client;
///
/// # fn main() -> Result<(), lockset::Error> {
/// let client = Client::connect("redis://127.0.0.1/")?;
/// let lock = client.obtain_multi(
///     [("order:42", Mode::Exclusive), ("catalog", Mode::Shared)],
///     Duration::from_secs(10),
///     &Options::default(),
/// )?;
/// println!("{:?} left", lock.ttl()?);
/// lock.release()?;
/// # Ok(())
/// # }
/// ```
pub struct Client<C = ConnectionManager>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    inner: Arc<Inner<C>>,
}

/// What a client, its clones and its locks share.
struct Inner<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    client: crate::client::handle::Client<C>,
    engine: Arc<Engine>,
    /// A quorum's masters, kept: their runtimes drive their connections.
    _masters: Vec<Client<C>>,
}

impl<C> Drop for Inner<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        // Lets the background work finish (a dropped guard's release, say), for a while,
        // before the runtime stops. Inside an async runtime, where this thread must not
        // block, a thread of its own waits, and lets the runtime go after.
        if refuse_inside_runtime().is_err() {
            let (client, engine) = (self.client.clone(), self.engine.clone());
            // A quorum's masters too: their runtimes drive the connections its background
            // work (a dropped guard's release) goes over.
            let masters = std::mem::take(&mut self._masters);
            let waiting = std::thread::Builder::new()
                .name("lockset-settle".to_owned())
                .spawn(move || {
                    settle(&client, &engine);
                    drop(masters);
                });
            if let Err(err) = waiting {
                tracing::warn!(%err, "no thread to finish background work on: it is cut off");
            }
            return;
        }
        settle(&self.client, &self.engine);
    }
}

/// Waits on `engine` for `client`'s background work to finish, for at most [`SETTLE`]. (The
/// timer is made inside the runtime, where it must be.)
fn settle<C>(client: &crate::client::handle::Client<C>, engine: &Engine)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let idle = async { tokio::time::timeout(SETTLE, client.background_idle()).await };
    let _ = engine.block_on(idle);
}

impl<C> Clone for Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl Client<ConnectionManager> {
    /// Connects to `url` as [`crate::Client::connect`] does (release events on).
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::connect`].
    pub fn connect(url: &str) -> Result<Self> {
        Self::build(|| crate::client::handle::Client::connect(url))
    }
}

impl Client {
    /// Connects to the primary the sentinels of `config` name, as
    /// [`crate::Client::connect_sentinel`] does.
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::connect_sentinel`].
    pub fn connect_sentinel(config: SentinelConfig) -> Result<Self> {
        Self::build(|| crate::client::handle::Client::connect_sentinel(config))
    }
}

#[cfg(feature = "cluster")]
impl Client {
    /// Connects to a Redis Cluster through the seed nodes `nodes`, as
    /// [`crate::Client::connect_cluster`] does (features `blocking` and `cluster`).
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::connect_cluster`].
    pub fn connect_cluster<T>(nodes: impl IntoIterator<Item = T>) -> Result<Self>
    where
        T: redis::IntoConnectionInfo,
    {
        Self::build(|| crate::client::handle::Client::connect_cluster(nodes))
    }
}

impl<C> Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A blocking client over the async client `make` builds, on a new runtime (where
    /// `make` runs, so that its connections live there): for any connection and setting
    /// of the async API.
    ///
    /// ```no_run
    /// use lockset::Replication;
    /// use lockset::blocking::Client;
    ///
    /// # fn main() -> Result<(), lockset::Error> {
    /// let client = Client::build(|| async {
    ///     lockset::Client::connect("redis://primary.internal/")
    ///         .await?
    ///         .replicated(Replication::replicas(1))
    ///         .await
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; [`Error::Redis`] when no
    /// runtime can be started; `make`'s errors.
    pub fn build<F, Fut>(make: F) -> Result<Self>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<crate::client::handle::Client<C>>>,
    {
        refuse_inside_runtime()?;
        let engine = Engine::start()?;
        let client = engine.block_on(make())??;
        Ok(Self::on(client, engine, Vec::new()))
    }

    fn on(client: crate::client::handle::Client<C>, engine: Arc<Engine>, nodes: Vec<Self>) -> Self {
        engine.adopt(&client);
        Self {
            inner: Arc::new(Inner {
                client,
                engine,
                _masters: nodes,
            }),
        }
    }

    /// A Redlock client over the masters `nodes`, as [`crate::Client::quorum`] makes one.
    ///
    /// # Errors
    ///
    /// The errors of [`crate::Client::quorum`].
    pub fn quorum(nodes: impl IntoIterator<Item = Self>, config: QuorumConfig) -> Result<Self> {
        let nodes: Vec<Self> = nodes.into_iter().collect();
        let engine = Engine::start()?;
        let masters = nodes.iter().map(|node| node.inner.client.clone());
        let client = engine.within(|| crate::client::handle::Client::quorum(masters, config))?;
        Ok(Self::on(client, engine, nodes))
    }

    /// The async client underneath, for what this API does not offer (use it inside an
    /// async runtime of your own only if its connections were made there).
    pub fn as_async(&self) -> &crate::client::handle::Client<C> {
        &self.inner.client
    }

    fn block_on<F: Future>(&self, future: F) -> Result<F::Output> {
        self.inner.engine.block_on(future)
    }

    fn lock(&self, lock: crate::client::lock::Lock<C>) -> Lock<C> {
        Lock {
            lock,
            inner: self.inner.clone(),
        }
    }

    /// Locks one key (or a key with its [`Mode`](crate::Mode)), as
    /// [`crate::Client::obtain`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::obtain`].
    pub fn obtain(&self, key: impl IntoKey, ttl: Duration, options: &Options) -> Result<Lock<C>> {
        let lock = self.block_on(self.inner.client.obtain(key, ttl, options))??;
        Ok(self.lock(lock))
    }

    /// Locks every key of `keys`, all or nothing, as [`crate::Client::obtain_multi`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::obtain_multi`].
    pub fn obtain_multi<I>(&self, keys: I, ttl: Duration, options: &Options) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let lock = self.block_on(self.inner.client.obtain_multi(keys, ttl, options))??;
        Ok(self.lock(lock))
    }

    /// A handle on the lock `options`' token holds on `keys`, as [`crate::Client::adopt`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::adopt`].
    pub fn adopt<I>(&self, keys: I, ttl: Duration, options: &Options) -> Result<Lock<C>>
    where
        I: IntoIterator,
        I::Item: IntoKey,
    {
        let lock = self.block_on(self.inner.client.adopt(keys, ttl, options))??;
        Ok(self.lock(lock))
    }

    /// Obtains `keys`, runs `work` on this thread while a watchdog (on the client's runtime)
    /// keeps the lock alive, then releases the lock and returns `work`'s output, as
    /// [`crate::Client::with_lock`] does.
    ///
    /// `work` gets the lock's [`LostSignal`]: check it between steps. The lock is released
    /// also when `work` panics (in the background, as a dropped [`Guard`]).
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Client::obtain_multi`]; `work` does not run then.
    pub fn with_lock<I, F, T>(
        &self,
        keys: I,
        ttl: Duration,
        options: &Options,
        work: F,
    ) -> Result<T>
    where
        I: IntoIterator,
        I::Item: IntoKey,
        F: FnOnce(&LostSignal) -> T,
    {
        let guard = self.obtain_multi(keys, ttl, options)?.watched(options);
        let output = work(&guard.lost_signal());
        crate::client::guard::released_after_work(guard.release());
        Ok(output)
    }

    /// How many background tasks this client and its clones run now (see
    /// [`crate::Client::background_tasks`]).
    pub fn background_tasks(&self) -> usize {
        self.inner.client.background_tasks()
    }

    /// Waits up to `timeout` until no background task runs; true when none does.
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime.
    pub fn wait_background(&self, timeout: Duration) -> Result<bool> {
        let idle =
            async { tokio::time::timeout(timeout, self.inner.client.background_idle()).await };
        Ok(self.block_on(idle)?.is_ok())
    }
}

impl<C> fmt::Debug for Client<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::Client").finish_non_exhaustive()
    }
}

/// A held lock of a blocking [`Client`]. Derefs to the async [`crate::Lock`] for its keys,
/// token, metadata, fencing token and validity; its operations block.
///
/// As with the async lock, dropping it does not release it (the keys expire with their
/// TTL): call [`Lock::release`], or make it a [`Guard`].
pub struct Lock<C = ConnectionManager>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    lock: crate::client::lock::Lock<C>,
    inner: Arc<Inner<C>>,
}

impl<C> Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// What is left of the lock, as [`crate::Lock::ttl`]; `None` when it was lost.
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Lock::ttl`].
    pub fn ttl(&self) -> Result<Option<Duration>> {
        self.inner.engine.block_on(self.lock.ttl())?
    }

    /// Extends the lock to `ttl`, as [`crate::Lock::refresh`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Lock::refresh`].
    pub fn refresh(&self, ttl: Duration, options: &Options) -> Result<()> {
        self.inner
            .engine
            .block_on(self.lock.refresh(ttl, options))?
    }

    /// Releases the lock, as [`crate::Lock::release`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime (the lock is not released
    /// then: it expires with its TTL); the errors of [`crate::Lock::release`].
    pub fn release(self) -> Result<()> {
        self.inner.engine.block_on(self.lock.release())?
    }

    /// A signal that fires when the lock is known lost (see [`crate::LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            signal: self.lock.lost_signal(),
            engine: self.inner.engine.clone(),
        }
    }

    /// Turns the lock into a [`Guard`] that releases it when dropped, without a watchdog.
    pub fn into_guard(self) -> Guard<C> {
        self.guard(crate::client::lock::Lock::into_guard)
    }

    /// Turns the lock into a [`Guard`] whose watchdog refreshes it every third of its TTL,
    /// on the client's runtime, whatever this thread does meanwhile.
    pub fn keep_alive(self) -> Guard<C> {
        self.guard(crate::client::lock::Lock::keep_alive)
    }

    /// Like [`Lock::keep_alive`], refreshing every `interval` (see
    /// [`crate::Lock::keep_alive_every`]).
    pub fn keep_alive_every(self, interval: Duration) -> Guard<C> {
        self.guard(|lock| lock.keep_alive_every(interval))
    }

    fn watched(self, options: &Options) -> Guard<C> {
        self.guard(|lock| lock.watched(options))
    }

    /// The async lock made a guard by `make`: its watchdog, and its release when dropped,
    /// run on the client's runtime.
    fn guard(
        self,
        make: impl FnOnce(crate::client::lock::Lock<C>) -> crate::client::guard::Guard<C>,
    ) -> Guard<C> {
        Guard {
            guard: make(self.lock),
            inner: self.inner,
        }
    }
}

impl<C> Deref for Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Target = crate::client::lock::Lock<C>;

    fn deref(&self) -> &crate::client::lock::Lock<C> {
        &self.lock
    }
}

impl<C> fmt::Debug for Lock<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lock.fmt(f)
    }
}

/// A lock of a blocking [`Client`] that is released when dropped (in the background, on the
/// client's runtime, from any thread), optionally kept alive by a watchdog: see
/// [`crate::Guard`]. Derefs to the async [`crate::Lock`] for its keys, token and validity.
pub struct Guard<C = ConnectionManager>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    guard: crate::client::guard::Guard<C>,
    inner: Arc<Inner<C>>,
}

impl<C> Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// What is left of the lock, as [`crate::Lock::ttl`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime; the errors of
    /// [`crate::Lock::ttl`].
    pub fn ttl(&self) -> Result<Option<Duration>> {
        self.inner.engine.block_on(self.guard.ttl())?
    }

    /// A signal that fires when the lock is known lost (see [`crate::LostSignal`]).
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            signal: self.guard.lost_signal(),
            engine: self.inner.engine.clone(),
        }
    }

    /// Stops the watchdog and releases the lock, as [`crate::Guard::release`].
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime (the guard is then dropped,
    /// which releases the lock in the background); the errors of [`crate::Guard::release`].
    pub fn release(self) -> Result<()> {
        self.inner.engine.block_on(self.guard.release())?
    }
}

impl<C> Deref for Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Target = crate::client::lock::Lock<C>;

    fn deref(&self) -> &crate::client::lock::Lock<C> {
        &self.guard
    }
}

impl<C> fmt::Debug for Guard<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.guard.fmt(f)
    }
}

/// Fires when a lock is known lost (see [`crate::LostSignal`]); blocking waits. Cheap to
/// clone; keeps the client's runtime running.
#[derive(Clone)]
pub struct LostSignal {
    signal: crate::rt::signal::LostSignal,
    engine: Arc<Engine>,
}

impl LostSignal {
    /// True once the lock is known lost (or released).
    pub fn is_lost(&self) -> bool {
        self.signal.is_lost()
    }

    /// Blocks until the lock is known lost (or released).
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime.
    pub fn wait(&self) -> Result<()> {
        self.engine.block_on(self.signal.lost())
    }

    /// Blocks until the lock is known lost (true), or for `timeout` at most (false).
    ///
    /// # Errors
    ///
    /// [`Error::InsideAsyncRuntime`] inside an async runtime.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        let lost = async { tokio::time::timeout(timeout, self.signal.lost()).await };
        Ok(self.engine.block_on(lost)?.is_ok())
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::LostSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}
