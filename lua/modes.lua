-- Every operation on a lock with modes: exclusive keys mixed with shared (read) keys and
-- counted keys (one of N permits), all or nothing. One script for the four operations, so
-- that the storage of a shared or counted key is written down in one place.
--
-- KEYS     the lock's keys; for an obtain with fencing, followed by the fencing counter
-- ARGV[1]  the operation: "obtain", "pttl", "refresh" or "release"
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
-- ARGV[9..12]  obtain, for a fair waiter: its lease in ms, its id, this attempt's turn and
--          the index of the key on whose channel it hears its hand-off, as ARGV[5..8] of
--          obtain.lua. A fair waiter that finds a key held queues on every key in its mode
--          (see queue.lua); once it has the lock it leaves the queues
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
--   obtain   {1, fence} | {0, pttl, i} | {0, pttl, i, 1} (queued) | {2, key} (another
--            type) | {3, i, stored mode}
--   pttl     smallest remaining ms | -1 no expiry | -2 another owner's | -3 missing
--   refresh, release   1 done | 0 another owner's | 2 missing (nothing changed)
local op, value, custom = ARGV[1], ARGV[3], ARGV[4] == '1'
local redis7 = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
local modes = {}
for mode in string.gmatch(ARGV[2], '[^,]+') do
  modes[#modes + 1] = mode
end
local count = #modes

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
-- Scores after now: members that have not expired (removed or not).
local live = string.format('(%.3f', now)

-- (owner.lua goes here)
-- (queue.lua goes here)

-- What a key is: "free", "string", "set" (with its mode member) or "foreign". A set in
-- `mode` (as asked for) is found with one command.
local function kind(key, mode)
  local type = redis.call('TYPE', key)['ok']
  if type == 'none' then
    return 'free'
  elseif type == 'string' then
    return 'string'
  elseif type == 'zset' then
    if mode ~= 'x' and redis.call('ZSCORE', key, '=' .. mode) then
      return 'set', '=' .. mode
    end
    local meta = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')
    for j = 1, #meta do
      if meta[j] == '=s' or string.match(meta[j], '^=p%d+$') then
        return 'set', meta[j]
      end
    end
  end
  return 'foreign'
end

-- Removes the set's expired members.
local function prune(key)
  redis.call('ZREMRANGEBYSCORE', key, '(-inf', now)
end

-- The latest expiry in a set (a holder's or a waiting writer's), and the latest holder's;
-- nil for none that has not expired.
local function latest(key)
  local top = redis.call('ZREVRANGEBYSCORE', key, '+inf', live, 'WITHSCORES', 'LIMIT', 0, 2)
  local first, holder = tonumber(top[2]), nil
  for j = 1, #top, 2 do
    if top[j] ~= '=x' then
      holder = holder or tonumber(top[j + 1])
    end
  end
  return first, holder
end

-- The earliest holder's expiry.
local function earliest(key)
  local low = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 2)
  for j = 1, #low, 2 do
    if low[j] ~= '=x' then
      return tonumber(low[j + 1])
    end
  end
  return now
end

-- How many hold the set (not counting a waiting writer), given the writer's mark.
local function holders(key, writer)
  return redis.call('ZCOUNT', key, live, '+inf') - (writer and 1 or 0)
end

-- The set expires with its latest member; with no holder and no waiting writer it goes.
local function expire_set(key)
  local last = latest(key)
  if not last then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, math.max(1, math.ceil(last - now)))
  end
end

-- This owner's member of a set and its score: by value, or else by tag (a re-obtain by
-- token may have changed the metadata). An obtain with a fresh random token skips the
-- search: nothing can hold that token yet.
local function own_member(key)
  local score = redis.call('ZSCORE', key, value)
  if score then
    return value, tonumber(score)
  end
  if op == 'obtain' and not custom then
    return nil
  end
  local members = redis.call('ZRANGEBYSCORE', key, '(-inf', '+inf', 'WITHSCORES')
  for j = 1, #members, 2 do
    if string.sub(members[j], 1, n) == owner then
      return members[j], tonumber(members[j + 1])
    end
  end
  return nil
end


-- Where a key of the lock stands for this owner: "ours", "missing" or "foreign"; for an
-- exclusive key also its value, for a set key our member and its score.
local function state(key, mode)
  -- The common case in one command: our member, by value, in a set.
  if mode ~= 'x' then
    local score = redis.pcall('ZSCORE', key, value)
    if type(score) == 'string' and tonumber(score) > now
      and redis.call('ZSCORE', key, '=' .. mode) then
      return 'ours', value, tonumber(score)
    end
  end
  local what, stored = kind(key, mode)
  if what == 'free' then
    return 'missing'
  elseif what == 'foreign' then
    return 'foreign'
  elseif mode == 'x' then
    if what ~= 'string' then
      return 'foreign'
    end
    local current = redis.call('GET', key)
    return owned(current) and 'ours' or 'foreign', current
  elseif what == 'string' or stored ~= '=' .. mode then
    -- Held exclusively, or in another mode: not as this lock holds it.
    return 'foreign'
  end
  local member, score = own_member(key)
  if member and score > now then
    return 'ours', member, score
  end
  return 'missing'
end

-- Checks every key of a held lock; returns the first failure's reply, or nil and each
-- key's state.
local function check_all(foreign, missing, restore)
  local states, gone = {}, false
  for i = 1, count do
    local found, a, b = state(KEYS[i], modes[i])
    if found == 'foreign' then
      return foreign
    end
    gone = gone or found == 'missing'
    states[i] = {found, a, b}
  end
  if gone and not restore then
    return missing
  end
  return nil, states
end

local function pttl()
  local failed, states = check_all(-2, -3, false)
  if failed then
    return failed
  end
  local least = -1
  for i = 1, count do
    local left
    if modes[i] == 'x' then
      left = redis.call('PTTL', KEYS[i])
    else
      left = math.ceil(states[i][3] - now)
    end
    if left >= 0 and (least < 0 or left < least) then
      least = left
    end
  end
  return least
end

-- Adds `member` to a set key (made with `mode` when missing), to expire at `expiry`. The
-- set then expires with its latest member: `fresh` when the set is new; `grow` when no
-- member expires sooner than before (only the new expiry can be the latest); else every
-- member is looked at.
local function join_set(key, mode, member, expiry, grow, fresh)
  redis.call('ZADD', key, '-inf', '=' .. mode, expiry, member)
  local left = math.max(1, math.ceil(expiry - now))
  if fresh then
    redis.call('PEXPIRE', key, left)
  elseif not grow then
    expire_set(key)
  elseif redis7 then
    redis.call('PEXPIRE', key, left, 'GT')
  elseif redis.call('PTTL', key) < left then
    redis.call('PEXPIRE', key, left)
  end
end

local function refresh()
  local ttl, restore, rewrite = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
  local failed, states = check_all(0, 2, restore)
  if failed then
    return failed
  end
  -- Missing keys are re-created (a Redlock master that restarted empty) only where there
  -- is room for all of them; else nothing changes.
  for i = 1, count do
    local key, mode = KEYS[i], modes[i]
    if states[i][1] == 'missing' and mode ~= 'x' and mode ~= 's' then
      if kind(key, mode) == 'set' then
        local writer = redis.call('ZSCORE', key, '=x')
        if holders(key, writer) >= tonumber(string.sub(mode, 2)) then
          return 2
        end
      end
    end
  end
  for i = 1, count do
    local key, mode, found = KEYS[i], modes[i], states[i][1]
    local stored = states[i][2]
    if mode == 'x' then
      if found ~= 'ours' then
        redis.call('SET', key, value, 'PX', ttl)
      elseif rewrite and stored ~= value then
        -- A waiter's mark stays in front.
        local mark = string.byte(stored, 1) == 33 and '!' or ''
        redis.call('SET', key, mark .. value, 'PX', ttl)
      else
        redis.call('PEXPIRE', key, ttl)
      end
    elseif found == 'ours' and rewrite and stored ~= value then
      redis.call('ZREM', key, stored)
      join_set(key, mode, value, now + ttl, false, false)
    elseif found == 'ours' then
      join_set(key, mode, stored, now + ttl, false, false)
    else
      join_set(key, mode, value, now + ttl, true, redis.call('EXISTS', key) == 0)
    end
  end
  return 1
end

local function release()
  local announce, payload, notice, leaving = ARGV[5], ARGV[6], ARGV[7] or 'PUBLISH', ARGV[8]
  if not redis7 then
    announce = announce == 'SPUBLISH' and 'PUBLISH' or announce
    notice = notice == 'SPUBLISH' and 'PUBLISH' or notice
  end
  local keys = first_keys(count)
  -- A fair waiter that gives up leaves its queues (and releases what it was handed).
  if leaving and leaving ~= '' and queue_of(KEYS[1]) then
    settle(dequeue, record_of(keys, leaving), keys)
  end
  if ARGV[9] == '1' then
    return 1
  end
  local failed, states = check_all(0, 2, false)
  if failed then
    return failed
  end
  local waited = {}
  for i = 1, count do
    local key, mode = KEYS[i], modes[i]
    if mode == 'x' then
      redis.call('DEL', key)
      waited[i] = string.byte(states[i][2], 1) == 33
    else
      redis.call('ZREM', key, states[i][2])
      local last, holder = latest(key)
      -- Room was made for a waiter: a permit, or a key that no holder shares any more.
      waited[i] = (mode ~= 's' or not holder) and redis.call('ZSCORE', key, '=w') ~= false
      if not last then
        redis.call('DEL', key)
      elseif states[i][3] > last then
        redis.call('PEXPIRE', key, math.max(1, math.ceil(last - now)))
      end
    end
  end
  -- Every key is let go before any is handed on: a waiter may want several of them.
  local released = {}
  for i = 1, (count > 1 and count or 0) do
    released[KEYS[i]] = true
  end
  -- Waiters that queue for a key mark it as any waiter does ('!', '=w'), and room is made
  -- for them only where `waited` says so: a reader's release that leaves other readers lets
  -- no waiter in that another key of this release does not.
  -- A hand-off that fails part-way (see settle) announces: the release is done.
  for i = 1, count do
    local handed = waited[i] and select(2, pcall(hand_off, KEYS[i], released, notice, false))
    if waited[i] and handed ~= true and announce ~= '' then
      redis.pcall(announce, KEYS[i], payload)
    end
  end
  return 1
end

-- (fence.lua goes here)
local function obtain()
  local ttl, fencing = tonumber(ARGV[5]), ARGV[6] ~= '0'
  local mark, retries = ARGV[7] == '1', ARGV[8] == '1'
  local lease, id, turn, listen = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
  local fair = lease ~= nil and lease ~= '' and queue_of(KEYS[1]) ~= nil
  local member = fair and record_of(KEYS, id) or nil
  local plans = {}
  -- A lock that writes some key reads past waiting writers: it may itself be the waiting
  -- writer that another such lock reads past, and two locks that each waited for the
  -- other's writer would wait forever. Only locks that write nothing wait behind writers.
  local writes = false
  for i = 1, count do
    writes = writes or modes[i] == 'x'
  end

  -- Blocked by KEYS[i], held for PTTL more ms: a fair waiter queues (or renews its place).
  local function held(i, pttl)
    local keys = first_keys(count)
    if fair and settle(queue_up, member, keys, value, ARGV[5], lease, id, turn, listen, i, ARGV[2]) then
      return {0, pttl, i, 1}
    elseif fair then
      -- Out of reach (see settle): waits unqueued; what it queued so far goes.
      settle(dequeue, member, keys)
    end
    return {0, pttl, i}
  end

  -- A held key: mark what blocks us as asked, and say for how long it is held.
  local function held_string(i, current)
    if mark and not owned(current) and ours_to_mark(current) then
      redis.call('SET', KEYS[i], '!' .. current, 'KEEPTTL')
    end
    return held(i, redis.call('PTTL', KEYS[i]))
  end
  local function held_set(i, free_at)
    if mark then
      redis.call('ZADD', KEYS[i], '-inf', '=w')
    end
    return held(i, math.max(0, math.ceil(free_at - now)))
  end

  -- First every key is looked at, and nothing but marks (and expired members) is written;
  -- then every key is written.
  for i = 1, count do
    local key, mode = KEYS[i], modes[i]
    local what, stored = kind(key, mode)
    if what == 'set' then
      prune(key)
      -- A set in another mode that nobody holds any more is as good as free; but while a
      -- writer waits (its mark is live), only for a lock that writes.
      if stored ~= '=' .. mode then
        local top, holder = latest(key)
        if not holder and top and not writes then
          return held_set(i, top)
        elseif not holder then
          -- An exclusive key's SET below replaces the set: deleted first, the key would be
          -- out of reach for that SET on a migrating slot's source (see settle).
          if mode ~= 'x' then
            redis.call('DEL', key)
          end
          what = 'free'
        end
      end
    end
    if what == 'foreign' then
      return {2, key}
    elseif what == 'free' then
      plans[i] = 'new'
    elseif what == 'string' then
      local current = redis.call('GET', key)
      if mode ~= 'x' or not owned(current) then
        return held_string(i, current)
      end
      plans[i] = 'own'
    elseif mode == 'x' then
      local _, last = latest(key)
      if last then
        -- Writers first: no lock that only reads gets in until this writer tries again
        -- (it is woken by the last release, or wakes when the last holder expires). A fair
        -- writer's place in the key's queue does the same (queue_blocks).
        if retries and not fair then
          local upto = now + math.max(ttl, last - now)
          redis.call('ZADD', key, 'GT', upto, '=x')
          expire_set(key)
        end
        return held_set(i, last)
      end
      plans[i] = 'replace'
    elseif stored ~= '=' .. mode then
      return {3, i, string.sub(stored, 2)}
    else
      local member, score = own_member(key)
      if member then
        plans[i] = {member, score}
      else
        local writer = (not writes or mode ~= 's') and redis.call('ZSCORE', key, '=x')
        if writer and not writes then
          return held_set(i, tonumber(writer))
        end
        if mode ~= 's' and holders(key, writer) >= tonumber(string.sub(mode, 2)) then
          return held_set(i, earliest(key))
        end
        -- First come, first served: a waiter that came before and cannot share the key
        -- with this lock goes first.
        if queue_blocks(key, mode, member)
          and holders(key, redis.call('ZSCORE', key, '=x')) > 0 then
          return held_set(i, earliest(key))
        end
        plans[i] = 'join'
      end
    end
  end

  local fence = false
  if fencing then
    local counter = KEYS[count + 1]
    fence = mint(counter, tonumber(ARGV[6]) - 1)
    if type(fence) == 'table' then
      if string.sub(fence.err, 1, 9) == 'WRONGTYPE' then
        return {2, counter}
      end
      return fence
    end
  end

  for i = 1, count do
    local key, mode, plan = KEYS[i], modes[i], plans[i]
    if plan == 'own' then
      -- Never shorter than an earlier obtain by the same token was told; a waiter's mark
      -- stays.
      local current = redis.call('GET', key)
      local stored = string.byte(current, 1) == 33 and '!' .. value or value
      local left = redis.call('PTTL', key)
      if left >= 0 and left < ttl then
        redis.call('SET', key, stored, 'PX', ttl)
      else
        redis.call('SET', key, stored, 'KEEPTTL')
      end
    elseif mode == 'x' then
      -- A set that somebody waited on becomes a value marked for its release to announce.
      -- SET replaces a set whatever it holds; a DEL before it would put the key out of
      -- reach of the SET on a migrating slot's source.
      local waited = plan == 'replace' and redis.call('ZSCORE', key, '=w')
      redis.call('SET', key, waited and '!' .. value or value, 'PX', ttl)
    elseif plan == 'new' or plan == 'join' then
      join_set(key, mode, value, now + ttl, true, plan == 'new')
    else
      -- Ours already (a re-obtain by token): never shorter, the new metadata.
      redis.call('ZREM', key, plan[1])
      join_set(key, mode, value, math.max(plan[2], now + ttl), true, false)
    end
  end
  -- A fair waiter leaves the queues it may be in (any attempt after its first may have
  -- queued).
  if fair and turn ~= '1' then
    settle(dequeue, member, first_keys(count))
  end
  return {1, fence}
end

if op == 'obtain' then
  return obtain()
elseif op == 'pttl' then
  return pttl()
elseif op == 'refresh' then
  return refresh()
end
return release()
