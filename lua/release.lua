-- Deletes every key of a lock, only if every key is still held by the owner, then announces
-- the release of each key that somebody waits for (a waiter marked its value with a leading
-- "!"), so that waiters can try at once instead of polling. A release nobody waits for
-- announces nothing.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
-- ARGV[2]  the lock's value: owner tag followed by its metadata
-- ARGV[3]  "PUBLISH", "SPUBLISH", or empty for no announcement
-- ARGV[4]  the announcement's payload
--
-- Reply: 1 when every key was deleted; 0 when some key holds another owner's value or another
--        type, 2 when none does but some are missing: the lock is not held (nothing changed).
--
-- All or nothing: every key is checked before any is deleted, and every key is deleted before
-- anything is announced. Announcing is best effort (redis.pcall): a user without channel
-- rights (Redis 7's default `acl-pubsub-default resetchannels`) or a server without the
-- command still releases every key. Keys are read and deleted in chunks, one command each.
local value = ARGV[2]
local count = #KEYS
local CHUNK = 1000

-- The common case first, with nothing to set up: every key holds exactly our value (nobody
-- waits, the metadata is unchanged). String comparison is a pointer comparison in Lua.
local single = nil  -- the value of a single key, when not exactly ours
if count == 1 then
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

local owner, announce, payload = ARGV[1], ARGV[3], ARGV[4]
local n = #owner

-- Redis before 7.0 has no sharded pub/sub: a cluster's waiters listen with SUBSCRIBE there.
if announce == 'SPUBLISH' and (redis.REDIS_VERSION_NUM or 0) < 0x070000 then
  announce = 'PUBLISH'
end

-- Announces the release of each key in `keys` (after every key was deleted).
local function announce_all(keys)
  if announce ~= '' then
    -- A key's release channel is named like the key (a separate namespace), which keeps it
    -- in the key's cluster slot for sharded pub/sub at no cost.
    for i = 1, #keys do
      redis.pcall(announce, keys[i], payload)
    end
  end
end

-- Next, a single key that holds our value behind a waiter's mark.
if single == '!' .. value then
  redis.call('DEL', KEYS[1])
  announce_all(KEYS)
  return 1
end

-- Whether a stored value is ours: whole, by tag, or by tag behind a waiter's mark.
local function owned(current)
  return current == value or (type(current) == 'string' and (string.sub(current, 1, n) == owner
    or (string.byte(current, 1) == 33 and string.sub(current, 2, n + 1) == owner)))
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

announce_all(marked)
return 1
