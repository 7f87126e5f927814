//! One client's random, seeded lock operations, each recorded in the history.
//!
//! A client runs small scenarios one after another: a plain lock used for a while (TTL
//! queries, refreshes to shorter and longer TTLs) then released or left to expire; a lock
//! with a custom token re-obtained inside itself (same keys, a superset, a shorter TTL); a
//! guard kept alive by its watchdog; `with_lock`; and obtains cancelled mid-flight. Where
//! the topology allows it, some scenarios go through a client made for that one scenario,
//! as a short-lived process (`lockset run`) makes one.

use std::sync::Arc;
use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::{Client, Error, Jitter, Lock, Mode, Options, Retry, fencing_key_for};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::time::Instant;

use super::Connect;
use super::record::{Held, History};
use crate::support::ms;

/// The shortest and longest TTL any operation asks for.
pub const MIN_TTL: Duration = Duration::from_millis(30);
pub const MAX_TTL: Duration = Duration::from_millis(500);
/// The longest waiter lease: the default for any TTL up to 1.33 s (explicit ones are
/// shorter).
pub const MAX_LEASE: Duration = Duration::from_secs(2);

/// The longest TTL a client made for one scenario asks for: a short-lived process (`lockset
/// run`) holds its lock longer than the long-lived clients' requests do (at most 1.33 s,
/// so that its waiters' default lease is still [`MAX_LEASE`]). Such a lock often outlives
/// the second or so a fast restart's replicas take to reconnect (before which nothing is
/// replicated, so nothing is granted), which a lock of [`MAX_TTL`] rarely does: the fast
/// restart's test is what these locks' holders believe meanwhile.
pub const MAX_FRESH_TTL: Duration = Duration::from_millis(1_300);

/// How often a worker that can make a client for one scenario does so.
const ONE_OPERATION: f64 = 0.3;

/// How long a worker waits after its client for one scenario failed to connect, as
/// `lockset run --wait` pauses between two connections to a deployment that is not ready,
/// rather than connecting again and again while the deployment fails over.
const CONNECT_PAUSE: Duration = Duration::from_millis(200);

/// How long a client made for one scenario waits for its background work (a release on
/// drop) before it goes, as `lockset` does before it exits.
const SETTLE: Duration = Duration::from_secs(2);

/// One client (as if one process) and what it draws its operations from.
pub struct Worker<C> {
    id: usize,
    /// The client the scenario at hand locks through: the worker's long-lived one, or one
    /// made for it alone.
    client: Client<C>,
    /// How this worker makes a client for one scenario, if the topology has them.
    fresh: Option<Connect<C>>,
    /// The number of the client made for the scenario at hand, if it is one.
    one_operation: Option<u64>,
    rng: SmallRng,
    /// Groups of keys; the keys of one lock come from one group (one cluster slot).
    pool: Arc<Vec<Vec<String>>>,
    history: Arc<History>,
    fencing: bool,
    made: u64,
}

/// How an obtain is limited in time.
#[derive(Clone, Copy)]
enum Limit {
    /// No limit given: the TTL.
    Ttl,
    Timeout(Duration),
    Deadline(Instant),
}

/// An obtain's inputs, drawn at random.
struct Request {
    keys: Vec<String>,
    /// Each key's mode.
    modes: Vec<Mode>,
    ttl: Duration,
    options: Options,
    limit: Limit,
    /// The whole request, for reports.
    what: String,
    /// Its options (retry, time limit, token, fencing), for reports.
    options_what: String,
}

impl Request {
    /// The request for reports: `<who> <action> [keys (modes)] ttl .., options`.
    fn describe(&self, who: &str, action: &str) -> String {
        let keys: Vec<String> = self
            .keys
            .iter()
            .zip(&self.modes)
            .map(|(key, mode)| match mode {
                Mode::Exclusive => key.clone(),
                mode => format!("{key} ({mode})"),
            })
            .collect();
        format!(
            "{who} {action} [{}] ttl {:?}, {}",
            keys.join(", "),
            self.ttl,
            self.options_what
        )
    }

    /// The keys paired with their modes, as obtain takes them.
    fn pairs(&self) -> Vec<(String, Mode)> {
        self.keys
            .iter()
            .cloned()
            .zip(self.modes.iter().copied())
            .collect()
    }

    /// The deadline of a call that started at `start`.
    fn deadline(&self, start: Instant) -> Instant {
        match self.limit {
            Limit::Ttl => start + self.ttl,
            Limit::Timeout(timeout) => start + timeout,
            Limit::Deadline(deadline) => deadline,
        }
    }
}

impl<C> Worker<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Worker `id`, with its long-lived client and how it makes one for a single scenario
    /// (if the topology has those).
    pub fn new(
        id: usize,
        (client, fresh): (Client<C>, Option<Connect<C>>),
        seed: u64,
        pool: Arc<Vec<Vec<String>>>,
        history: Arc<History>,
        fencing: bool,
    ) -> Self {
        let rng = SmallRng::seed_from_u64(
            seed.wrapping_add(0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(id as u64 + 1)),
        );
        Self {
            id,
            client,
            fresh,
            one_operation: None,
            rng,
            pool,
            history,
            fencing,
            made: 0,
        }
    }

    /// Runs scenarios until `until`, or until the history found a violation.
    pub async fn run(mut self, until: Instant) {
        while Instant::now() < until && !self.history.stopped() {
            if self.fresh.is_some() && self.rng.random_bool(ONE_OPERATION) {
                self.one_operation().await;
                self.pause(10).await;
                continue;
            }
            match self.rng.random_range(0..100) {
                0..30 => self.plain().await,
                30..45 => self.nested().await,
                45..60 => self.guarded().await,
                60..72 => self.with_lock().await,
                72..85 => self.permit().await,
                _ => self.cancelled().await,
            }
            self.pause(10).await;
        }
    }

    /// A scenario as a short-lived process (`lockset run`) runs it, through a client made
    /// for it alone: connect, obtain, hold (refreshes, a watchdog), release or let expire,
    /// wait a while for the background work, drop. A connect that fails while the
    /// deployment changes over (an unavailable primary, too few replicas) is an operation
    /// that did not get the lock.
    async fn one_operation(&mut self) {
        let connect = self.fresh.clone().expect("a worker that makes clients");
        let client = match connect().await {
            Ok(client) => client,
            Err(err) => {
                self.history.connected(false);
                assert!(
                    err.is_unavailable(),
                    "client {}: a connect failed with what retrying cannot fix: {err}",
                    self.id
                );
                tokio::time::sleep(CONNECT_PAUSE).await;
                return;
            }
        };
        self.history.connected(true);
        self.made += 1;
        self.one_operation = Some(self.made);
        let long_lived = std::mem::replace(&mut self.client, client);
        match self.rng.random_range(0..3) {
            0 => self.plain().await,
            1 => self.guarded().await,
            _ => self.permit().await,
        }
        let client = std::mem::replace(&mut self.client, long_lived);
        self.one_operation = None;
        let _ = tokio::time::timeout(SETTLE, client.background_idle()).await;
    }

    /// Who runs the scenario at hand, for reports: `client <id>`, or the client it made for
    /// the scenario.
    fn who(&self) -> String {
        match self.one_operation {
            Some(n) => format!("client {} (its one-operation client {n})", self.id),
            None => format!("client {}", self.id),
        }
    }

    /// Obtain, use for a while, release or let expire.
    async fn plain(&mut self) {
        let request = self.request(None, true);
        if let Some((lock, mut held)) = self.obtain(request, None).await {
            self.use_lock(&lock, &mut held).await;
            self.finish(lock, held).await;
        }
    }

    /// A semaphore: one of 2 permits of a group's counted key (the one ending in 0), alone,
    /// so that holders crowd it; then as a plain lock.
    async fn permit(&mut self) {
        let mut request = self.request(None, false);
        let group = &self.pool[self.rng.random_range(0..self.pool.len())];
        let counted = group.iter().find(|key| key.ends_with('0'));
        request.keys = vec![counted.expect("every group has a counted key").clone()];
        request.modes = vec![Mode::Permit { limit: 2 }];
        request.what = request.describe(&self.who(), "obtain");
        if let Some((lock, mut held)) = self.obtain(request, None).await {
            self.use_lock(&lock, &mut held).await;
            self.finish(lock, held).await;
        }
    }

    /// A lock with a custom token, re-obtained inside itself by the same token. The inner
    /// section ends without releasing (the guide's rule for nested sections) and only asks
    /// for the TTL: a refresh through it would change the outer lock's keys behind its back.
    async fn nested(&mut self) {
        let token = self.token();
        let outer = self.request(Some(&token), true);
        let outer_ttl = outer.ttl;
        let Some((lock, mut held)) = self.obtain(outer, None).await else {
            return;
        };
        self.pause(outer_ttl.as_millis() as u64 / 2).await;
        let mut inner = self.request(Some(&token), true);
        inner.keys = lock.keys().to_vec();
        inner.modes = lock.modes();
        let variant = match self.rng.random_range(0..3) {
            0 => "same keys",
            1 => {
                self.widen(&mut inner.keys, &mut inner.modes);
                "a superset"
            }
            _ => {
                let shorter = MIN_TTL.as_millis() as u64..=outer_ttl.as_millis() as u64;
                inner.ttl = ms(self.rng.random_range(shorter));
                "a shorter TTL"
            }
        };
        let action = format!("re-obtain by its token, {variant}:");
        inner.what = inner.describe(&self.who(), &action);
        let inner_what = inner.what.clone();
        let inner_outcome = match self.obtain(inner, None).await {
            Some((inner_lock, mut inner_held)) => {
                if self.rng.random_bool(0.5) {
                    self.ttl(&inner_lock, &mut inner_held).await;
                }
                // Leaving the inner section: it stops believing, the keys stay the outer's.
                self.history
                    .stop_believing(inner_held, inner_lock.valid_until());
                "obtained"
            }
            None => "not obtained",
        };
        // A re-obtain may change the outer lock's keys even when it fails (its reply lost).
        let what = format!("after an inner section ({inner_what}: {inner_outcome})");
        self.history.observe(&mut held, lock.valid_until(), &what);
        self.use_lock(&lock, &mut held).await;
        self.finish(lock, held).await;
    }

    /// A guard whose watchdog keeps the lock alive while the work polls its validity.
    async fn guarded(&mut self) {
        let request = self.request(None, true);
        let ttl = request.ttl;
        let Some((lock, mut held)) = self.obtain(request, None).await else {
            return;
        };
        let (guard, kind) = match self.rng.random_range(0..5) {
            0 => (lock.into_guard(), "guard without watchdog"),
            1 | 2 => (lock.keep_alive(), "watchdog"),
            _ => {
                let every = ms(self.rng.random_range(1..=ttl.as_millis() as u64));
                (lock.keep_alive_every(every), "watchdog (own interval)")
            }
        };
        // Sometimes far beyond the TTL: only the watchdog keeps the lock then.
        let work = ms(self.rng.random_range(0..=3 * ttl.as_millis() as u64));
        let until = Instant::now() + work;
        while Instant::now() < until && !self.history.stopped() {
            self.pause(10).await;
            self.history.poll(&mut held, guard.valid_until(), kind);
        }
        self.history.stop_believing(held, guard.valid_until());
        if self.rng.random_bool(0.7) {
            let released = guard.release().await;
            self.outcome(released);
        } else {
            drop(guard); // released in the background
        }
    }

    /// `with_lock`: the work sees only the lost signal, and believes while it is not lost.
    async fn with_lock(&mut self) {
        let request = self.request(None, false);
        self.made += 1;
        let owner = format!("with_lock {}.{}", self.id, self.made);
        let mut options = request.options.clone();
        if self.rng.random_bool(0.5) {
            options = options.watchdog_interval(ms(self
                .rng
                .random_range(1..=request.ttl.as_millis() as u64)));
        }
        let work = ms(self
            .rng
            .random_range(0..=2 * request.ttl.as_millis() as u64));
        let poll = ms(self.rng.random_range(1..=10));
        let holder = self.history.with_lock_holder(
            self.id,
            owner,
            &request.keys,
            &request.modes,
            request.what.clone(),
        );
        let history = self.history.clone();
        let start = Instant::now();
        let deadline = request.deadline(start);
        let what = request.what.clone();
        let outcome = self
            .client
            .with_lock(request.pairs(), request.ttl, &options, |lost| async move {
                history.obtain_returned(start, deadline, Instant::now(), &what);
                let mut held = holder;
                let until = Instant::now() + work;
                loop {
                    history.alive(&mut held, &lost);
                    if Instant::now() >= until || lost.is_lost() || history.stopped() {
                        return held;
                    }
                    tokio::time::sleep(poll).await;
                }
            })
            .await;
        match outcome {
            Ok(held) => self.history.done(held),
            Err(err) => {
                let what = &request.what;
                self.history
                    .obtain_returned(start, deadline, Instant::now(), what);
                self.failed(&err);
            }
        }
    }

    /// An obtain dropped mid-flight at a random point; if it won first, a plain lock.
    async fn cancelled(&mut self) {
        let request = self.request(None, true);
        let after = match self.rng.random_bool(0.2) {
            true => Duration::ZERO,
            false => Duration::from_micros(self.rng.random_range(0..=20_000)),
        };
        if let Some((lock, mut held)) = self.obtain(request, Some(after)).await {
            self.use_lock(&lock, &mut held).await;
            self.finish(lock, held).await;
        }
    }

    /// Obtains per `request` (dropped after `cancel`, if given) and records the outcome.
    async fn obtain(
        &mut self,
        request: Request,
        cancel: Option<Duration>,
    ) -> Option<(Lock<C>, Held)> {
        let start = Instant::now();
        let deadline = request.deadline(start);
        let obtain = self
            .client
            .obtain_multi(request.pairs(), request.ttl, &request.options);
        let result = match cancel {
            Some(after) => match tokio::time::timeout(after, obtain).await {
                Ok(result) => result,
                Err(_) => {
                    self.history.cancelled();
                    return None;
                }
            },
            None => obtain.await,
        };
        self.history
            .obtain_returned(start, deadline, Instant::now(), &request.what);
        let lock = match result {
            Ok(lock) => lock,
            Err(err) => {
                self.failed(&err);
                return None;
            }
        };
        let fence = lock.fencing_token().map(|token| {
            let counter = fencing_key_for(lock.key()).expect("pool keys have fencing counters");
            (counter, token)
        });
        let held = self.history.obtained(
            self.id,
            lock.token(),
            (lock.keys(), &lock.modes()),
            lock.valid_until(),
            fence,
            request.what,
        );
        Some((lock, held))
    }

    /// A few TTL queries and refreshes, with pauses between them (sometimes past the
    /// validity).
    async fn use_lock(&mut self, lock: &Lock<C>, held: &mut Held) {
        let steps = self.rng.random_range(0..4);
        for _ in 0..steps {
            let left = lock.valid_until().saturating_duration_since(Instant::now());
            self.pause(left.as_millis() as u64 * 2 / steps).await;
            if self.history.stopped() {
                return;
            }
            match self.rng.random_bool(0.4) {
                true => self.ttl(lock, held).await,
                false => self.refresh(lock, held).await,
            }
        }
    }

    async fn ttl(&mut self, lock: &Lock<C>, held: &mut Held) {
        let left = lock.ttl().await;
        self.history.op();
        let what = format!("ttl() = {left:?}");
        if left.is_err() {
            self.history.error();
        }
        self.history.observe(held, lock.valid_until(), &what);
    }

    /// A refresh to a random TTL: shorter or longer than the lock had.
    async fn refresh(&mut self, lock: &Lock<C>, held: &mut Held) {
        let ttl = self.draw_ttl();
        let mut options = Options::default().timeout(ms(self.rng.random_range(20..=300)));
        if self.rng.random_bool(0.5) {
            options = options.retry(Retry::linear(ms(5)));
        }
        let refreshed = lock.refresh(ttl, &options).await;
        self.history.op();
        let what = match &refreshed {
            Ok(()) => format!("refresh({ttl:?}) ok"),
            Err(err) => format!("refresh({ttl:?}) failed: {err}"),
        };
        if refreshed.is_err() {
            self.history.error();
        }
        self.history.observe(held, lock.valid_until(), &what);
    }

    /// Releases the lock (it stops believing as it calls release), or lets it expire.
    async fn finish(&mut self, lock: Lock<C>, held: Held) {
        if self.rng.random_bool(0.75) {
            self.history.stop_believing(held, lock.valid_until());
            let released = lock.release().await;
            self.outcome(released);
        } else {
            self.history.let_expire(held, lock.valid_until());
        }
    }

    fn outcome(&self, result: Result<(), Error>) {
        self.history.op();
        if result.is_err() {
            self.history.error();
        }
    }

    fn failed(&self, err: &Error) {
        assert!(
            !matches!(
                err,
                Error::InvalidInput(_) | Error::WrongType { .. } | Error::ModeMismatch { .. }
            ),
            "the workload asked for something invalid: {err}"
        );
        self.history.error();
    }

    /// Draws an obtain: keys, TTL, retry strategy, time limit, maybe fencing and metadata.
    fn request(&mut self, token: Option<&str>, fencing: bool) -> Request {
        let keys = self.draw_keys();
        let modes = self.draw_modes(&keys);
        let ttl = self.draw_ttl();
        let (retry, limit) = (self.draw_retry(), self.draw_limit());
        let mut options = Options::default().retry(retry.clone());
        // Fair waiting is the default; some waiters barge, some hold short queue leases.
        if self.rng.random_bool(0.2) {
            options = options.fair(false);
        } else if self.rng.random_bool(0.3) {
            options = options.waiter_lease(ms(self.rng.random_range(30..=1_000)));
        }
        options = match limit {
            Limit::Ttl => options,
            Limit::Timeout(timeout) => options.timeout(timeout),
            Limit::Deadline(deadline) => options.deadline(deadline),
        };
        let limit_what = match limit {
            Limit::Ttl => "no timeout (the TTL)".to_owned(),
            Limit::Timeout(timeout) => format!("timeout {timeout:?}"),
            Limit::Deadline(at) => {
                format!(
                    "deadline in {:?}",
                    at.saturating_duration_since(Instant::now())
                )
            }
        };
        let mut options_what = format!("{retry:?}, {limit_what}");
        if let Some(token) = token {
            options = options.token(token);
            options_what.push_str(", custom token");
        }
        // Tokens order the holders of the first key: only exclusive ones are in order.
        if fencing && self.fencing && modes[0] == Mode::Exclusive && self.rng.random_bool(0.3) {
            options = options.fencing();
            options_what.push_str(", fencing");
        }
        if self.rng.random_bool(0.2) {
            options = options.metadata(format!("client-{}", self.id));
        }
        let mut request = Request {
            keys,
            modes,
            ttl,
            options,
            limit,
            what: String::new(),
            options_what,
        };
        request.what = request.describe(&self.who(), "obtain");
        request
    }

    /// 1 to 5 distinct keys of one group, in random order (the first names the fencing
    /// counter).
    fn draw_keys(&mut self) -> Vec<String> {
        let group = &self.pool[self.rng.random_range(0..self.pool.len())];
        let count = self.rng.random_range(1..=group.len().min(5));
        let mut keys: Vec<String> = Vec::with_capacity(count);
        while keys.len() < count {
            let key = &group[self.rng.random_range(0..group.len())];
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        keys
    }

    /// Modes for `keys`: all exclusive (a plain lock) in most locks; else shared or
    /// exclusive, and keys ending in 0 one of 2 permits or exclusive.
    fn draw_modes(&mut self, keys: &[String]) -> Vec<Mode> {
        let mixed = self.rng.random_bool(0.4);
        keys.iter()
            .map(|key| match (mixed, key.ends_with('0')) {
                (false, _) => Mode::Exclusive,
                (true, true) if self.rng.random_bool(0.7) => Mode::Permit { limit: 2 },
                (true, false) if self.rng.random_bool(0.5) => Mode::Shared,
                _ => Mode::Exclusive,
            })
            .collect()
    }

    /// Adds one or two keys of the same group to `keys` (with modes), when there are any
    /// left.
    fn widen(&mut self, keys: &mut Vec<String>, modes: &mut Vec<Mode>) {
        let before = keys.len();
        self.add_keys(keys);
        let added = self.draw_modes(&keys[before..]);
        modes.extend(added);
    }

    fn add_keys(&mut self, keys: &mut Vec<String>) {
        let group = self
            .pool
            .iter()
            .find(|group| group.contains(&keys[0]))
            .expect("keys come from the pool");
        let others: Vec<&String> = group.iter().filter(|k| !keys.contains(k)).collect();
        for _ in 0..self.rng.random_range(1..=2).min(others.len()) {
            let key = others[self.rng.random_range(0..others.len())];
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
    }

    fn draw_ttl(&mut self) -> Duration {
        let max = match self.one_operation {
            Some(_) => MAX_FRESH_TTL,
            None => MAX_TTL,
        };
        ms(self
            .rng
            .random_range(MIN_TTL.as_millis() as u64..=max.as_millis() as u64))
    }

    fn draw_retry(&mut self) -> Retry {
        let every = ms(self.rng.random_range(1..=20));
        match self.rng.random_range(0..7) {
            0 => Retry::default(),
            1 => Retry::linear(every),
            2 => Retry::linear(every).jitter(Jitter::Full),
            3 => Retry::exponential(ms(1), ms(64)),
            4 => Retry::exponential(ms(2), ms(32))
                .jitter(Jitter::Equal)
                .limit(5),
            5 => Retry::intervals([ms(5), ms(10), ms(20), ms(40)]),
            _ => Retry::linear(ms(5)).limit(self.rng.random_range(1..=10)),
        }
    }

    fn draw_limit(&mut self) -> Limit {
        match self.rng.random_range(0..4) {
            0 => Limit::Ttl,
            1 => Limit::Timeout(ms(self.rng.random_range(0..=50))),
            2 => Limit::Timeout(ms(self.rng.random_range(50..=1_000))),
            _ => Limit::Deadline(Instant::now() + ms(self.rng.random_range(0..=600))),
        }
    }

    /// A custom token, unique to this client and scenario.
    fn token(&mut self) -> String {
        self.made += 1;
        let salt: u64 = self.rng.random();
        format!("c{}n{}-{salt:016x}", self.id, self.made)
    }

    /// Sleeps up to `max_ms`.
    async fn pause(&mut self, max_ms: u64) {
        tokio::time::sleep(ms(self.rng.random_range(0..=max_ms))).await;
    }
}
