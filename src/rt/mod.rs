//! Small runtime helpers every layer may use: the background tasks a client spawns, the
//! lost-lock signal, running a future until a deadline, and a mutex lock that survives a
//! poisoned mutex.
//!
//! May import nothing of this crate outside `rt` (`tests/layers.rs` checks).

pub(crate) mod deadline;
pub(crate) mod signal;
pub(crate) mod tasks;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, also when a panic elsewhere poisoned it: every value kept behind one of
/// this crate's mutexes stays consistent between statements (maps and counters updated in
/// one step), so it is safe to go on with.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
