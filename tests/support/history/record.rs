//! The recorded history and its checker.
//!
//! A *belief* is an interval in which one owner (one token) believes it holds a set of keys:
//! from when an obtain or refresh returned success until the `valid_until()` it read right
//! after, or until it called release, whichever is first. Every timestamp comes from one
//! monotonic clock and is taken under the history's mutex, so the recording order is the time
//! order. Beliefs change while their lock is in use (a refresh extends or shortens one, a lost
//! lock ends one early, even retroactively), so pairs are only judged once both are closed;
//! closed beliefs that nothing can overlap any more are dropped, which keeps memory flat.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lockset::Mode;
use tokio::time::Instant;

/// How late an obtain may return after its deadline.
pub const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// At most this many reports of each kind are kept (the first ones are the telling ones).
const KEEP_REPORTS: usize = 3;

/// How many of the latest operations on a lock a belief remembers, for the report.
const KEEP_OPS: usize = 5;

/// The history of one run, shared by every client task, the fault injector and the checker.
pub struct History {
    pub name: String,
    pub seed: u64,
    pub start: Instant,
    /// Go on after a violation (to see every kind a run finds), instead of stopping.
    keep_going: bool,
    stop: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    beliefs: HashMap<u64, Belief>,
    lines: HashMap<String, Line>,
    fences: HashMap<String, Fenced>,
    faults: Vec<FaultSpan>,
    stats: Stats,
    violations: Vec<String>,
    misses: Vec<String>,
}

/// What a run did, for the summary line.
#[derive(Default, Clone, Debug)]
pub struct Stats {
    pub ops: u64,
    pub obtains: u64,
    pub beliefs: u64,
    pub faults: u64,
    /// Faults after which another node was the primary.
    pub failovers: u64,
    pub cancelled: u64,
    pub errors: u64,
    /// Scenarios run by a client made for them alone, and how many of those clients
    /// failed to connect.
    pub fresh_clients: u64,
    pub fresh_connects_failed: u64,
    /// The closest two beliefs of different owners on one key came (None: never adjacent).
    pub min_gap: Option<Duration>,
    pub deadlines_missed: u64,
    /// Deadlines missed while no fault was active.
    pub missed_without_faults: u64,
    /// The most beliefs the checker kept in memory at once (it drops settled ones).
    pub most_kept: usize,
    pub violations: u64,
}

struct Belief {
    client: usize,
    owner: Arc<str>,
    keys: Arc<[String]>,
    modes: Arc<[Mode]>,
    start: Instant,
    end: Instant,
    origin: Arc<str>,
    /// The latest operations on the lock while this belief was open, and what they did to
    /// its validity.
    log: VecDeque<String>,
    closed: bool,
    checked: bool,
    /// How many key lines still hold this belief.
    lines: usize,
}

impl Belief {
    /// The mode this belief holds `key` in.
    fn mode_of(&self, key: &str) -> Mode {
        let at = self.keys.iter().position(|k| k == key);
        at.and_then(|i| self.modes.get(i).copied())
            .unwrap_or(Mode::Exclusive)
    }
}

/// The beliefs of one key that may still matter.
#[derive(Default)]
struct Line {
    ids: Vec<u64>,
    /// The latest ends of dropped beliefs, one per owner, at most two: for the gap figure.
    dropped: Vec<(Arc<str>, Instant)>,
}

struct Fenced {
    start: Instant,
    token: u64,
    what: String,
}

struct FaultSpan {
    start: Instant,
    end: Option<Instant>,
    what: String,
}

/// A lock's current belief, as its client task tracks it.
pub struct Held {
    client: usize,
    owner: Arc<str>,
    keys: Arc<[String]>,
    modes: Arc<[Mode]>,
    origin: Arc<str>,
    /// The open belief, if any (none while the lock is known lost).
    current: Option<u64>,
}

impl History {
    /// A history that stops the run at the first violation, unless `keep_going`.
    pub fn new(name: &str, seed: u64, keep_going: bool) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            seed,
            keep_going,
            start: Instant::now(),
            stop: AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking client task must not hide the history from the report.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True once a violation was found: every task winds down.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// `at` as seconds since the start of the run.
    pub fn at(&self, at: Instant) -> String {
        let secs = at.saturating_duration_since(self.start).as_secs_f64();
        format!("+{secs:.3}s")
    }

    /// Counts an operation (obtain, refresh, ttl, release, with_lock).
    pub fn op(&self) {
        self.state().stats.ops += 1;
    }

    pub fn error(&self) {
        self.state().stats.errors += 1;
    }

    /// A client made for one scenario connected (`true`), or failed to: counted as an
    /// operation, and a failure as an error.
    pub fn connected(&self, ok: bool) {
        let mut state = self.state();
        state.stats.ops += 1;
        state.stats.fresh_clients += 1;
        if !ok {
            state.stats.fresh_connects_failed += 1;
            state.stats.errors += 1;
        }
    }

    pub fn cancelled(&self) {
        let mut state = self.state();
        state.stats.cancelled += 1;
        state.stats.ops += 1;
    }

    /// An obtain that started at `start` with `deadline` returned at `end`: checks liveness.
    pub fn obtain_returned(&self, start: Instant, deadline: Instant, end: Instant, what: &str) {
        let mut state = self.state();
        state.stats.ops += 1;
        state.stats.obtains += 1;
        if end <= deadline + DEADLINE_GRACE {
            return;
        }
        state.stats.deadlines_missed += 1;
        // Misses without any fault are the telling ones: keep those apart.
        let calm = Self::active(&state, start, end).next().is_none();
        if calm {
            state.stats.missed_without_faults += 1;
        }
        let kept = state
            .misses
            .iter()
            .filter(|m| m.ends_with("faults then: none") == calm)
            .count();
        if kept < KEEP_REPORTS {
            let late = end - deadline;
            let report = format!(
                "obtain returned {late:?} after its deadline (allowed {DEADLINE_GRACE:?}): \
                 {what}, called {}, deadline {}, returned {}\n  faults then: {}",
                self.at(start),
                self.at(deadline),
                self.at(end),
                self.faults_between(&state, start, end)
            );
            state.misses.push(report);
        }
    }

    /// A successful obtain: opens a belief from now until `valid_until`, and checks that
    /// the fencing token (counter key, token) is higher than the last one from its counter.
    pub fn obtained(
        &self,
        client: usize,
        owner: &str,
        (keys, modes): (&[String], &[Mode]),
        valid_until: Instant,
        fence: Option<(String, u64)>,
        what: String,
    ) -> Held {
        let mut held = Held {
            client,
            owner: owner.into(),
            keys: keys.into(),
            modes: modes.into(),
            origin: what.into(),
            current: None,
        };
        let mut state = self.state();
        let now = Instant::now();
        if valid_until <= now {
            return held; // valid for no time at all: nobody believes anything
        }
        if let Some((counter, token)) = fence {
            self.check_fence(&mut state, counter, token, now, &held.origin);
        }
        let origin = held.origin.clone();
        held.current = Some(self.open(&mut state, &held, now, valid_until, origin));
        held
    }

    /// A lock holder read `valid_until` after an operation (`what`): a refresh, a TTL
    /// query, the end of a nested section. Its belief follows.
    pub fn observe(&self, held: &mut Held, valid_until: Instant, what: &str) {
        let mut state = self.state();
        let now = Instant::now();
        self.observe_at(&mut state, held, now, valid_until, what, true);
    }

    /// A guard's work read `valid_until` (its watchdog may have refreshed meanwhile).
    pub fn poll(&self, held: &mut Held, valid_until: Instant, what: &str) {
        let mut state = self.state();
        let now = Instant::now();
        self.observe_at(&mut state, held, now, valid_until, what, false);
    }

    /// A `with_lock` worker checked its lost signal: while not lost, it believes up to now.
    pub fn alive(&self, held: &mut Held, lost: &lockset::LostSignal) {
        let mut state = self.state();
        let now = Instant::now();
        if lost.is_lost() {
            return;
        }
        match held.current {
            Some(id) => {
                let belief = state.beliefs.get_mut(&id).expect("open belief");
                belief.end = belief.end.max(now);
            }
            None => {
                let origin = held.origin.clone();
                held.current = Some(self.open(&mut state, held, now, now, origin));
            }
        }
    }

    /// A `with_lock` holder: no token is visible to its work, so it gets an owner of its own.
    pub fn with_lock_holder(
        &self,
        client: usize,
        owner: String,
        keys: &[String],
        modes: &[Mode],
        what: String,
    ) -> Held {
        Held {
            client,
            owner: owner.into(),
            keys: keys.into(),
            modes: modes.into(),
            origin: what.into(),
            current: None,
        }
    }

    /// The holder calls release, drops a guard (which releases) or leaves a nested section:
    /// its belief ends now.
    pub fn stop_believing(&self, held: Held, valid_until: Instant) {
        self.let_go(held, valid_until, true);
    }

    /// The holder lets the lock go without releasing it: its belief ends at its validity.
    pub fn let_expire(&self, held: Held, valid_until: Instant) {
        self.let_go(held, valid_until, false);
    }

    fn let_go(&self, mut held: Held, valid_until: Instant, ends_now: bool) {
        let mut state = self.state();
        let now = Instant::now();
        let what = if ends_now {
            "stops believing"
        } else {
            "lets it expire"
        };
        self.observe_at(&mut state, &mut held, now, valid_until, what, false);
        if let Some(belief) = held.current.and_then(|id| state.beliefs.get_mut(&id))
            && ends_now
        {
            belief.end = belief.end.min(now);
        }
        Self::close(&mut state, &held);
    }

    /// The end of a `with_lock` holder's work.
    pub fn done(&self, held: Held) {
        Self::close(&mut self.state(), &held);
    }

    /// Follows a holder's belief after it read `valid_until` at `now`; `what` goes into the
    /// belief's log when `noted` or when the validity changed.
    fn observe_at(
        &self,
        state: &mut State,
        held: &mut Held,
        now: Instant,
        valid_until: Instant,
        what: &str,
        noted: bool,
    ) {
        let note = || {
            format!(
                "{what} at {}: valid until {}",
                self.at(now),
                self.at(valid_until)
            )
        };
        let Some(id) = held.current else {
            if valid_until > now {
                let origin = format!("{}; then {}", held.origin, note());
                held.current = Some(self.open(state, held, now, valid_until, origin.into()));
            }
            return;
        };
        let belief = state.beliefs.get_mut(&id).expect("open belief");
        let changed = belief.end != valid_until;
        if now < belief.end {
            // Still believing: the new validity replaces the old one, longer or shorter.
            belief.end = valid_until;
        } else {
            // The old belief ran out before now: only a success can start a new one.
            belief.end = belief.end.min(valid_until);
        }
        if noted || changed {
            belief.log.push_back(note());
            if belief.log.len() > KEEP_OPS {
                belief.log.pop_front();
            }
        }
        if now >= belief.end && valid_until > now {
            belief.closed = true;
            let origin = format!("{}; then, after a gap, {}", held.origin, note());
            held.current = Some(self.open(state, held, now, valid_until, origin.into()));
        }
    }

    fn open(
        &self,
        state: &mut State,
        held: &Held,
        start: Instant,
        end: Instant,
        origin: Arc<str>,
    ) -> u64 {
        state.next_id += 1;
        let id = state.next_id;
        state.stats.beliefs += 1;
        for key in held.keys.iter() {
            state.lines.entry(key.clone()).or_default().ids.push(id);
        }
        state.beliefs.insert(
            id,
            Belief {
                client: held.client,
                owner: held.owner.clone(),
                keys: held.keys.clone(),
                modes: held.modes.clone(),
                start,
                end,
                origin,
                log: VecDeque::new(),
                closed: false,
                checked: false,
                lines: held.keys.len(),
            },
        );
        id
    }

    fn close(state: &mut State, held: &Held) {
        if let Some(belief) = held.current.and_then(|id| state.beliefs.get_mut(&id)) {
            belief.closed = true;
        }
    }

    fn check_fence(
        &self,
        state: &mut State,
        counter: String,
        token: u64,
        now: Instant,
        what: &str,
    ) {
        // Also across a server restarted empty: a counter it forgot starts from its clock.
        let fenced = Fenced {
            start: now,
            token,
            what: what.to_owned(),
        };
        let Some(last) = state.fences.insert(counter.clone(), fenced) else {
            return;
        };
        if token <= last.token {
            let report = format!(
                "{}: fencing tokens of {counter} went from {} (belief from {}, {}) to {token} \
                 (belief from {}, {what})",
                self.header(),
                last.token,
                self.at(last.start),
                last.what,
                self.at(now),
            );
            self.violation(state, report);
        }
    }

    pub fn fault_started(&self, what: String) -> usize {
        let mut state = self.state();
        state.stats.faults += 1;
        state.faults.push(FaultSpan {
            start: Instant::now(),
            end: None,
            what,
        });
        state.faults.len() - 1
    }

    pub fn fault_ended(&self, fault: usize) {
        self.state().faults[fault].end = Some(Instant::now());
    }

    /// As [`History::fault_ended`], with what came of the fault (for reports).
    pub fn fault_ended_with(&self, fault: usize, outcome: &str) {
        let mut state = self.state();
        let span = &mut state.faults[fault];
        span.end = Some(Instant::now());
        if !outcome.is_empty() {
            let _ = write!(span.what, " ({outcome})");
        }
    }

    /// A fault left another node the primary.
    pub fn failed_over(&self) {
        self.state().stats.failovers += 1;
    }

    /// The faults active at some point between `from` and `to`, or "none".
    fn faults_between(&self, state: &State, from: Instant, to: Instant) -> String {
        let active: Vec<String> = Self::active(state, from, to)
            .map(|f| {
                let end = f.end.map_or("still on".to_owned(), |end| self.at(end));
                format!("{} [{}, {end}]", f.what, self.at(f.start))
            })
            .collect();
        if active.is_empty() {
            return "none".to_owned();
        }
        active.join("; ")
    }

    fn active(state: &State, from: Instant, to: Instant) -> impl Iterator<Item = &FaultSpan> {
        // Faults start in order and none lasts longer than a few seconds: look back a little.
        let horizon = from.checked_sub(Duration::from_secs(5)).unwrap_or(from);
        let recent = state.faults.partition_point(|f| f.start < horizon);
        state.faults[recent..]
            .iter()
            .filter(move |f| f.start <= to && f.end.is_none_or(|end| end >= from))
    }

    fn header(&self) -> String {
        format!("VIOLATION in {} (seed {})", self.name, self.seed)
    }

    fn violation(&self, state: &mut State, report: String) {
        state.stats.violations += 1;
        if state.violations.len() < KEEP_REPORTS {
            state.violations.push(report);
        }
        if !self.keep_going {
            self.stop.store(true, Ordering::SeqCst);
        }
    }

    /// Judges every pair of closed beliefs on one key not judged yet, then drops the closed
    /// beliefs that no open or future belief can overlap.
    pub fn check(&self) {
        let mut state = self.state();
        let now = Instant::now();
        let keys: Vec<String> = state.lines.keys().cloned().collect();
        for key in keys {
            self.check_line(&mut state, &key, now);
        }
        let kept = state.beliefs.len();
        state.stats.most_kept = state.stats.most_kept.max(kept);
    }

    fn check_line(&self, state: &mut State, key: &str, now: Instant) {
        let line = state.lines.get(key).expect("line");
        let ids = line.ids.clone();
        let dropped = line.dropped.clone();
        let fresh: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| state.beliefs[id].closed && !state.beliefs[id].checked)
            .collect();
        for &x in &fresh {
            for &y in &ids {
                let other = &state.beliefs[&y];
                // Fresh pairs are judged once, from the later of the two.
                if y == x || !other.closed || (!other.checked && y > x) {
                    continue;
                }
                self.judge(state, key, x, y);
            }
            self.count_permits(state, key, x, &ids);
            let (owner, start) = (state.beliefs[&x].owner.clone(), state.beliefs[&x].start);
            for (other, end) in &dropped {
                if *other != owner && start >= *end {
                    Self::gap(state, start - *end);
                }
            }
        }
        for id in &fresh {
            state.beliefs.get_mut(id).expect("belief").checked = true;
        }
        // Nothing can start before the earliest open belief, or before now.
        let horizon = ids
            .iter()
            .filter(|id| !state.beliefs[id].closed)
            .map(|id| state.beliefs[id].start)
            .fold(now, Instant::min);
        let (keep, drop): (Vec<u64>, Vec<u64>) = ids.into_iter().partition(|id| {
            let belief = &state.beliefs[id];
            !(belief.checked && belief.end <= horizon)
        });
        for id in drop {
            let belief = state.beliefs.get_mut(&id).expect("belief");
            belief.lines -= 1;
            let (owner, end, gone) = (belief.owner.clone(), belief.end, belief.lines == 0);
            if gone {
                state.beliefs.remove(&id);
            }
            let line = state.lines.get_mut(key).expect("line");
            remember_dropped(&mut line.dropped, owner, end);
        }
        state.lines.get_mut(key).expect("line").ids = keep;
    }

    fn judge(&self, state: &mut State, key: &str, x: u64, y: u64) {
        let (a, b) = (&state.beliefs[&x], &state.beliefs[&y]);
        if a.owner == b.owner || a.end <= a.start || b.end <= b.start {
            return;
        }
        // Shared holders may overlap, and so may permit holders (counted apart).
        if a.mode_of(key) != Mode::Exclusive && b.mode_of(key) != Mode::Exclusive {
            return;
        }
        let ((first_id, first), (_, second)) = if a.start <= b.start {
            ((x, a), (y, b))
        } else {
            ((y, b), (x, a))
        };
        if second.start >= first.end {
            let gap = second.start - first.end;
            Self::gap(state, gap);
            return;
        }
        let overlap = first.end.min(second.end) - second.start;
        let mut report = format!(
            "{}: key {key} believed held by two owners at once for {overlap:?} ({} and {})",
            self.header(),
            first.mode_of(key),
            second.mode_of(key),
        );
        for (label, belief) in [("A", first), ("B", second)] {
            let _ = write!(
                report,
                "\n  {label}: client {} token {} keys {:?} believed [{}, {}]\n     from {}",
                belief.client,
                prefix(&belief.owner),
                belief.keys,
                self.at(belief.start),
                self.at(belief.end),
                belief.origin,
            );
            for op in &belief.log {
                let _ = write!(report, "\n     then {op}");
            }
        }
        // Another lock handle of the first owner (a nested section) may have changed its keys.
        for id in &state.lines[key].ids {
            let other = &state.beliefs[id];
            if *id != first_id && other.owner == first.owner {
                let _ = write!(
                    report,
                    "\n  A's owner also believed [{}, {}] from {}",
                    self.at(other.start),
                    self.at(other.end),
                    other.origin
                );
            }
        }
        let faults = self.faults_between(state, first.start, first.end.min(second.end));
        let _ = write!(
            report,
            "\n  faults then: {faults}\n  reproduce: LOCKSET_HISTORY_SEED={}",
            self.seed
        );
        self.violation(state, report);
    }

    /// For a permit belief `x` of `key`: no moment in it where more owners than the limit
    /// believe they hold a permit of `key` (counted over closed beliefs: the last of any
    /// overlapping group to close sees the others).
    fn count_permits(&self, state: &mut State, key: &str, x: u64, ids: &[u64]) {
        let belief = &state.beliefs[&x];
        let Mode::Permit { limit } = belief.mode_of(key) else {
            return;
        };
        let (from, to) = (belief.start, belief.end);
        let holders: Vec<&Belief> = ids
            .iter()
            .map(|id| &state.beliefs[id])
            .filter(|b| b.closed && b.start < to && b.end > from && b.start < b.end)
            .filter(|b| matches!(b.mode_of(key), Mode::Permit { .. }))
            .collect();
        // The most owners at once is reached at some belief's start.
        let mut worst: Option<(Instant, Vec<&Belief>)> = None;
        for at in holders.iter().map(|b| b.start.max(from)) {
            let mut at_once: Vec<&Belief> = Vec::new();
            for b in holders.iter().filter(|b| b.start <= at && b.end > at) {
                if !at_once.iter().any(|o| o.owner == b.owner) {
                    at_once.push(b);
                }
            }
            if at_once.len() > limit as usize
                && worst.as_ref().is_none_or(|(_, w)| at_once.len() > w.len())
            {
                worst = Some((at, at_once));
            }
        }
        let Some((at, at_once)) = worst else {
            return;
        };
        let mut report = format!(
            "{}: key {key} believed held by {} owners of {limit} permits at once, at {}",
            self.header(),
            at_once.len(),
            self.at(at),
        );
        for belief in &at_once {
            let _ = write!(
                report,
                "\n  client {} token {} believed [{}, {}] from {}",
                belief.client,
                prefix(&belief.owner),
                self.at(belief.start),
                self.at(belief.end),
                belief.origin,
            );
        }
        let faults = self.faults_between(state, from, to);
        let _ = write!(
            report,
            "\n  faults then: {faults}\n  reproduce: LOCKSET_HISTORY_SEED={}",
            self.seed
        );
        self.violation(state, report);
    }

    fn gap(state: &mut State, gap: Duration) {
        let min = &mut state.stats.min_gap;
        *min = Some(min.map_or(gap, |min| min.min(gap)));
    }

    /// Closes what is still open (at the end of a run) and judges everything.
    pub fn finish(&self) {
        {
            let mut state = self.state();
            for belief in state.beliefs.values_mut() {
                belief.closed = true;
            }
        }
        self.check();
    }

    pub fn stats(&self) -> Stats {
        self.state().stats.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    pub fn misses(&self) -> Vec<String> {
        self.state().misses.clone()
    }
}

/// Keeps the latest end per owner, for the two latest owners.
fn remember_dropped(dropped: &mut Vec<(Arc<str>, Instant)>, owner: Arc<str>, end: Instant) {
    match dropped.iter_mut().find(|(o, _)| *o == owner) {
        Some(entry) => entry.1 = entry.1.max(end),
        None => dropped.push((owner, end)),
    }
    dropped.sort_by_key(|(_, end)| std::cmp::Reverse(*end));
    dropped.truncate(2);
}

/// The first characters of a token, enough to tell owners apart in a report (a `with_lock`
/// holder's made-up owner in full).
fn prefix(token: &str) -> &str {
    match token.contains(' ') {
        true => token,
        false => token.get(..8).unwrap_or(token),
    }
}
