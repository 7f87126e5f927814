-- Deletes every key of a lock, only if every key is still held by the owner, then announces
-- the release of each key that somebody waits for (a waiter marked its value with a leading
-- "!"), so that waiters can try at once instead of polling. A release nobody waits for
-- announces nothing.
--
-- ARGV[1]  the lock's value: the owner tag "<token length>:<token>" followed by its metadata
-- ARGV[2]  "PUBLISH", "SPUBLISH", or empty for no announcement
-- ARGV[3]  the announcement's payload
-- ARGV[4]  the id of a fair waiter that gives up (else empty): it leaves the queues of KEYS,
--          and releases the lock if it was handed it
-- ARGV[5]  "PUBLISH" or "SPUBLISH": how a waiter is told that it was handed the lock
-- ARGV[6]  "1" when the waiter of ARGV[4] only leaves its queues (a caller's own token:
--          its keys may be an outer lock's), nothing else changes; else "0" or absent
--
-- Only ARGV[1] is required: the rest default to PUBLISH, an empty payload, no waiter leaving
-- and PUBLISH, the common case, which so costs the server one argument. (Five arguments cost
-- it about 0.35 µs per call, more than the GET and the DEL below.)
--
-- A key somebody queues for (see queue.lua) is not left free: it is handed, in the same
-- step, down its queue to the waiters that can take their whole lock (each told so on its
-- release channel with "g" .. id); only when no waiter can have it is it announced as above.
--
-- Reply: 1 when every key was deleted; 0 when some key holds another owner's value or another
--        type, 2 when none does but some are missing: the lock is not held (nothing changed).
--
-- All or nothing: every key is checked before any is deleted, and every key is deleted before
-- anything is announced. Announcing is best effort (redis.pcall): a user without channel
-- rights (Redis 7's default `acl-pubsub-default resetchannels`) or a server without the
-- command still releases every key. Keys are read and deleted in chunks, one command each.
local value = ARGV[1]
local count = #KEYS
local CHUNK = 1000
-- A fair waiter that gives up (its id), else nil.
local leaving = ARGV[4] ~= nil and ARGV[4] ~= '' and ARGV[4] or nil

-- The common case first, with nothing to set up: every key holds exactly our value (nobody
-- waits, the metadata is unchanged). String comparison is a pointer comparison in Lua.
local single = nil  -- the value of a single key, when not exactly ours
if leaving then
  -- A fair waiter that gives up: below.
elseif count == 1 then
  -- pcall: a key that became a hash is not ours, and must not abort the script.
  single = redis.pcall('GET', KEYS[1])
  if single == value then
    redis.call('DEL', KEYS[1])
    return 1
  end
elseif count <= CHUNK then
  local values = redis.call('MGET', unpack(KEYS))
  local exact = true
  for i = 1, count do
    if values[i] ~= value then
      exact = false
      break
    end
  end
  if exact then
    redis.call('DEL', unpack(KEYS))
    return 1
  end
end

-- The slow path: somebody waits, the metadata changed, or the lock is not held as it was.
-- (fragments go here)
local notice = ARGV[5] or 'PUBLISH'
-- Redis before 7.0 has no sharded pub/sub: a cluster's waiters listen with SUBSCRIBE there.
local redis7 = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
if notice == 'SPUBLISH' and not redis7 then
  notice = 'PUBLISH'
end

-- The keys this release frees, when more than one: each goes to its own queue's first.
local released = {}
for i = 1, (count > 1 and count or 0) do
  released[KEYS[i]] = true
end

-- A fair waiter that gives up leaves its queues.
if leaving and queue_of(KEYS[1]) then
  settle(dequeue, record_of(KEYS, leaving), KEYS)
end
if ARGV[6] == '1' then
  return 1
end

local announce, payload = ARGV[2] or 'PUBLISH', ARGV[3] or ''

if announce == 'SPUBLISH' and not redis7 then
  announce = 'PUBLISH'
end

-- Hands on, or else announces the release of, each key in `keys` (deleted already). A
-- hand-off that fails part-way (see settle) announces: the keys are deleted, the release
-- is done, and its waiters try for themselves.
local function announce_all(keys)
  for i = 1, #keys do
    -- A single key was just deleted; of several, one may have gone on with another.
    local ok, handed = pcall(hand_off, keys[i], released, notice, count == 1)
    if not (ok and handed) then
      if announce ~= '' then
        -- A key's release channel is named like the key (a separate namespace), which
        -- keeps it in the key's cluster slot for sharded pub/sub at no cost.
        redis.pcall(announce, keys[i], payload)
      end
    end
  end
end

-- Next, a single key that holds our value behind a waiter's mark: a hand-off overwrites it.
if single == MARK .. value then
  redis.call('DEL', KEYS[1])
  announce_all(KEYS)
  return 1
end

local missing = false
local marked_keys = {}
for first = 1, count, CHUNK do
  local last = math.min(first + CHUNK - 1, count)
  local values = redis.call('MGET', unpack(KEYS, first, last))
  for j = 1, last - first + 1 do
    local current = values[j]
    -- Most values are exactly ours: one comparison (interned strings), nothing else.
    if current ~= value then
      if not current then
        -- Missing, or not a string (MGET answers nil for both): tell them apart.
        if redis.call('EXISTS', KEYS[first + j - 1]) == 1 then
          return 0
        end
        missing = true
      elseif not owned(current) then
        return 0
      elseif marked(current) then
        marked_keys[#marked_keys + 1] = KEYS[first + j - 1]
      end
    end
  end
end
if missing then
  return 2
end

for first = 1, count, CHUNK do
  redis.call('DEL', unpack(KEYS, first, math.min(first + CHUNK - 1, count)))
end

announce_all(marked_keys)
return 1
