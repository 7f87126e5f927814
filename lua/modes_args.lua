-- What every operation on a lock with modes starts with: exclusive keys mixed with shared
-- (read) keys and counted keys (one of N permits), all or nothing. One script per operation
-- (modes_obtain.lua, modes_pttl.lua, modes_refresh.lua, modes_release.lua), each with this
-- head (after clock.lua), so that their arguments and the storage of a shared or counted key
-- are written down in one place.
--
-- KEYS     the lock's keys; for an obtain with fencing, followed by the fencing counter
-- ARGV[1]  the operation: "obtain", "pttl", "refresh" or "release" (each script knows its own)
-- ARGV[2]  each key's mode, in the order of KEYS, separated by ",": "x" exclusive, "s"
--          shared, "p<N>" one of N permits
-- ARGV[3]  the lock's value: the owner tag "<token length>:<token>" (see owner.lua)
--          followed by the caller's metadata
-- ARGV[4]  "1" for a caller's own token, which may hold a key under other metadata (a
--          re-obtain by token); a random token's members are found by value alone
-- ARGV[5]  obtain, refresh: time to live in ms; release: the announce command, or ""
-- ARGV[6]  obtain: when the last key is a fencing counter, the primary's configuration
--          epoch plus one (see fence.lua), else "0"; refresh: "1" to re-create
--          missing keys (Redlock); release: the announcement's payload
-- ARGV[7]  obtain: "1" when the caller waits for release events (marks what blocks it);
--          refresh, only when the metadata changes: "1" to store ARGV[3] in place of the
--          owner's values and members
-- ARGV[7]  release: "PUBLISH" or "SPUBLISH": how a fair waiter is told that it was handed
--          the lock (absent: PUBLISH)
-- ARGV[8]  obtain: "1" when the caller will try again if blocked (a writer that does not
--          queue marks the key, below); release: the id of a fair waiter that gives up (else
--          empty or absent): it leaves the queues of KEYS, and releases what it was handed
-- ARGV[9]  release: "1" when the waiter of ARGV[8] only leaves its queues (a caller's own
--          token), nothing else changes
-- ARGV[9..13]  obtain, for a fair waiter: its lease in ms, its id, this attempt's turn, the
--          index of the key on whose channel it hears its hand-off and its client's hand-off
--          tag, as ARGV[5..9] of obtain.lua. A fair waiter that finds a key held queues on every key in its mode
--          (see queue.lua, and admit.lua for who may take a key); once it has the lock it leaves the queues
--
-- Storage. An exclusive key is a string, exactly as a lock without modes writes it. A shared
-- or counted key is a sorted set of
--   "=s" or "=p<N>"  (score -inf) the key's mode, and the sign that this library wrote it;
--   "=w"             (score -inf) somebody waits: a release that makes room announces it;
--   "=x"             (score: until when) an exclusive obtain waits for the holders to leave;
--                    until then no lock that writes nothing gets in (writers first);
--   each holder's value (owner tag + metadata), scored by when it expires, in ms of the
--   server's clock (TIME: allowed, scripts replicate their effects).
-- The set expires with its latest member. Expired members are removed on every touch; a set
-- left with no holder and no waiting writer is deleted.
--
-- Queues. Waiters of every mode queue together on a key (queue.lua): a release hands the
-- key down its queue, and a lock joins a key's sharers only when no waiter that came
-- before it wants the key in a mode that cannot share with it.
--
-- Replies, as the scripts for locks without modes give them:
--   obtain   {1, fence} | {0, pttl, i} | {0, pttl, i, 1} (queued) | {0, pttl, i, queued,
--            holder's metadata} (see held_reply) | {2, key} (another type) | {3, i, stored mode}
--   pttl     smallest remaining ms | -1 no expiry | -2 another owner's | -3 missing
--   refresh, release   1 done | 0 another owner's | 2 missing (nothing changed)
local op, value, custom = ARGV[1], ARGV[3], ARGV[4] == '1'
local redis7 = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
local modes = {}
for mode in string.gmatch(ARGV[2], '[^,]+') do
  modes[#modes + 1] = mode
end
local count = #modes

local now = now_ms()
-- Scores after now: members that have not expired (removed or not).
local live = string.format('(%.3f', now)
