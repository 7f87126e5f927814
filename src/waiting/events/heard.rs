//! The releases a quorum's listeners heard lately: the same release announced by several
//! masters wakes one waiter, not one per master.

use super::*;

/// One announcement: the channel it came on and its payload.
pub(super) type Announcement = (String, Box<[u8]>);

/// What a quorum's listeners know of one release.
pub(super) struct Release {
    first_heard: Instant,
    /// How many masters announced it so far.
    heard: u32,
    /// How many had when its waiter last learned of it.
    known: u32,
    /// Its waiter found the lock still held (the release had not reached a majority): the
    /// next master to announce it wakes one waiter again.
    owed: bool,
}

/// The releases heard lately (oldest first), and per channel the last one that woke a
/// waiter.
#[derive(Default)]
pub(super) struct Recent {
    releases: HashMap<Announcement, Release>,
    order: VecDeque<Announcement>,
    woke: HashMap<String, Box<[u8]>>,
}

/// The releases that a quorum's listeners heard, so that each wakes one waiter: a release
/// is announced by every master that held the lock, at slightly different times.
#[derive(Default)]
pub(crate) struct Heard {
    recent: Mutex<Recent>,
}

impl Heard {
    /// Whether this announcement of `payload` on `channel` should wake a waiter: the first
    /// time the release is heard, and once more after its waiter came too early.
    pub(super) fn wakes(&self, channel: &str, payload: &[u8]) -> bool {
        let mut recent = lock(&self.recent);
        recent.forget_stale();
        let key = (channel.to_owned(), Box::<[u8]>::from(payload));
        if let Some(release) = recent.releases.get_mut(&key) {
            release.heard += 1;
            return std::mem::take(&mut release.owed);
        }
        let release = Release {
            first_heard: Instant::now(),
            heard: 1,
            known: 1,
            owed: false,
        };
        recent.releases.insert(key.clone(), release);
        recent.woke.insert(key.0.clone(), key.1.clone());
        recent.order.push_back(key);
        true
    }

    /// A waiter woken by the last release on `channel` found the lock still held. True when
    /// more masters announced that release since: try again now. Otherwise the next master
    /// to announce it wakes a waiter.
    pub(super) fn too_early(&self, channel: &str) -> bool {
        let mut recent = lock(&self.recent);
        let Recent { releases, woke, .. } = &mut *recent;
        let Some(release) = woke
            .get(channel)
            .and_then(|payload| releases.get_mut(&(channel.to_owned(), payload.clone())))
        else {
            return false;
        };
        if release.heard > release.known {
            release.known = release.heard;
            return true;
        }
        release.owed = true;
        false
    }
}

impl Recent {
    pub(super) fn forget_stale(&mut self) {
        while let Some(oldest) = self.order.front() {
            let stale = self
                .releases
                .get(oldest)
                .is_none_or(|r| r.first_heard.elapsed() >= REMEMBER_FOR);
            if !stale && self.order.len() < REMEMBER_AT_MOST {
                break;
            }
            if let Some((channel, payload)) = self.order.pop_front() {
                if self.woke.get(&channel) == Some(&payload) {
                    self.woke.remove(&channel);
                }
                self.releases.remove(&(channel, payload));
            }
        }
    }
}
