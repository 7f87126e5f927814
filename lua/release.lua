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
--
-- Only ARGV[1] is required: the rest default to PUBLISH, an empty payload, no waiter leaving
-- and PUBLISH, the common case, which so costs the server one argument. (Five arguments cost
-- it about 0.35 µs per call, more than the GET and the DEL below.)
--
-- A key somebody queues for (see queue.lua) is not left free: it is handed, in the same
-- step, to the first waiter in its queue that can take its whole lock (then told so on its
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
-- (owner.lua goes here)
-- (queue.lua goes here)
local notice = ARGV[5] or 'PUBLISH'
-- Redis before 7.0 has no sharded pub/sub: a cluster's waiters listen with SUBSCRIBE there.
local redis7 = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
if notice == 'SPUBLISH' and not redis7 then
  notice = 'PUBLISH'
end

-- Hands MEMBER, a live waiter whose lease has LEFT ms to run, every key in KEYS (all free)
-- for its TTL, but no longer than its lease: a waiter that died since it last renewed holds
-- the keys no longer than that. LISTEN: the key on whose release channel it listens, where
-- it is told "g<id>:<turn>:<ms>": the keys are its own for <ms> from this moment, which
-- came after it sent attempt <turn> (the last to queue or renew it), so they are its own
-- for <ms> from when it sent that attempt at least (see src/waiting/fair.rs). A record written
-- before records kept turns has none: turn 0, which no attempt has (the waiter then makes
-- the keys its own by an attempt). KEY, the key being released, was marked (somebody waits
-- for it, queued or not): it stays marked, so that its next release tells them too; the
-- waiter's other keys are marked when others queue for them.
local function grant(member, record, keys, left, listen, key)
  local value, id, turn = record[1], record[3], record[6] or '0'
  local px = math.min(tonumber(record[2]), left)
  for j = 1, #keys do
    local queue = queue_of(keys[j])
    redis.call('ZREM', queue, member)
    local marked = keys[j] == key or redis.call('EXISTS', queue) == 1
    redis.call('SET', keys[j], marked and '!' .. value or value, 'PX', px)
  end
  redis.call('DEL', member)
  if notice ~= '' then
    redis.pcall(notice, listen, 'g' .. id .. ':' .. turn .. ':' .. string.format('%.0f', px))
  end
end

-- The keys of the waiter MEMBER, whose record says it waits for N keys, the first FIRST.
local function keys_of(member, n, first_key)
  local keys = {first_key}
  for first = 2, n, CHUNK do
    local fields = {}
    for j = first, math.min(first + CHUNK - 1, n) do
      fields[#fields + 1] = j
    end
    local some = redis.call('HMGET', member, unpack(fields))
    for j = 1, #some do
      keys[#keys + 1] = some[j]
    end
  end
  return keys
end

-- KEY was just freed: hands it, with the rest of its lock, to the first live waiter in its
-- queue that can take every key of its lock now. A waiter that cannot, first in all its
-- queues, has the holders of its other keys marked, so that their releases hand on too;
-- the key itself goes on down the queue (nothing is reserved: a waiter never keeps others
-- from a key it cannot use yet). Dead waiters met on the way leave the queue. True when KEY
-- went to a waiter (maybe with another key of this release, earlier).
-- The keys this release frees, when more than one: each goes to its own queue's first.
local released = {}
for i = 1, (count > 1 and count or 0) do
  released[KEYS[i]] = true
end

local function hand_off(key)
  local queue = queue_of(key)
  if not queue then
    return false
  end
  -- Handed on already, with another key of this release.
  if count > 1 and redis.call('EXISTS', key) == 1 then
    return true
  end
  local members = redis.call('ZRANGE', queue, 0, LOOK_AT_MOST - 1)
  for m = 1, #members do
    local member = members[m]
    local record = redis.call('HMGET', member, 'v', 't', 'i', 'n', 'l', 's', 1)
    local left = record[1] and redis.call('PTTL', member) or -2
    if left <= 0 then
      redis.call('ZREM', queue, member)
    else
      local keys = keys_of(member, tonumber(record[4]), record[7])
      -- Another key's queue may share this one's name ("job" and "{job}"): only a waiter
      -- for KEY itself may have it.
      local wants = false
      local behind = false  -- behind another waiter for a key this release frees
      local held = {}  -- {key, value} of its keys that others hold
      for j = 1, #keys do
        if keys[j] == key then
          wants = true
        else
          -- A key this release freed may have gone to another waiter already, with a key
          -- handed on before this one: it is held then, as any other.
          local current = redis.pcall('GET', keys[j])
          if current then
            held[#held + 1] = {keys[j], current}
          elseif released[keys[j]] then
            behind = behind or live_head(queue_of(keys[j])) ~= member
          end
        end
      end
      if wants and not behind and #held == 0 then
        grant(member, record, keys, left, keys[tonumber(record[5])] or key, key)
        return true
      elseif wants and first_in_all(member, keys) then
        for j = 1, #held do
          local current = held[j][2]
          if type(current) == 'string' and ours_to_mark(current) then
            redis.call('SET', held[j][1], '!' .. current, 'KEEPTTL')
          end
        end
      end
    end
  end
  return false
end

-- A fair waiter that gives up leaves its queues.
if leaving and queue_of(KEYS[1]) then
  dequeue(record_of(KEYS, leaving), KEYS)
end

local announce, payload = ARGV[2] or 'PUBLISH', ARGV[3] or ''

if announce == 'SPUBLISH' and not redis7 then
  announce = 'PUBLISH'
end

-- Hands on, or else announces the release of, each key in `keys`; deletes one that is not
-- handed on first when DELETE (else every key was deleted already). Nobody sees the order
-- of the steps within this script.
local function announce_all(keys, delete)
  for i = 1, #keys do
    if not hand_off(keys[i]) then
      if delete then
        redis.call('DEL', keys[i])
      end
      if announce ~= '' then
        -- A key's release channel is named like the key (a separate namespace), which
        -- keeps it in the key's cluster slot for sharded pub/sub at no cost.
        redis.pcall(announce, keys[i], payload)
      end
    end
  end
end

-- Next, a single key that holds our value behind a waiter's mark: a hand-off overwrites it.
if single == '!' .. value then
  announce_all(KEYS, true)
  return 1
end

local missing = false
local marked = {}
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
      elseif string.byte(current, 1) == 33 then
        marked[#marked + 1] = KEYS[first + j - 1]
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

announce_all(marked, false)
return 1
