-- Shared and counted keys as sets, for the modes_*.lua scripts: after modes_args.lua,
-- owner.lua and admit.lua.

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

-- The set expires with its latest member; with no holder and no waiting writer it goes.
local function expire_set(key)
  local last = latest(key)
  if not last then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, math.max(1, math.ceil(last - now)))
  end
end

-- Adds `member` to a set key (made with `mode` when missing), to expire at `expiry`. The
-- set then expires with its latest member: `fresh` when the set is new; `grow` when no
-- member expires sooner than before (only the new expiry can be the latest); else every
-- member is looked at.
local function join_set(key, mode, member, expiry, grow, fresh)
  redis.call('ZADD', key, '-inf', '=' .. mode, expiry, member)
  local left = math.max(1, math.ceil(expiry - now))
  if fresh then
    -- No command makes a set with an expiry. A refused PEXPIRE (the ACL) takes the set it
    -- would leave without one away, and the same command again ends the script with the
    -- server's own error.
    if type(redis.pcall('PEXPIRE', key, left)) == 'table' then
      redis.call('DEL', key)
      redis.call('PEXPIRE', key, left)
    end
  elseif not grow then
    expire_set(key)
  elseif redis7 then
    redis.call('PEXPIRE', key, left, 'GT')
  elseif redis.call('PTTL', key) < left then
    redis.call('PEXPIRE', key, left)
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
