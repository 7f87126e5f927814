-- Locks every key of a lock with modes in its mode, or none (see modes_args.lua for the
-- arguments and the reply). Who may take a key is admit.lua's to say.
-- (fragments go here)

local ttl, fencing = tonumber(ARGV[5]), ARGV[6] ~= '0'
local mark, retries = ARGV[7] == '1', ARGV[8] == '1'
local lease, id, turn, listen, tag = ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local fair = lease ~= nil and lease ~= '' and queue_of(KEYS[1]) ~= nil
local member = fair and record_of(KEYS, id) or nil
local plans = {}
-- Whether this lock writes some key (see admit.lua: writers first).
local writes = false
for i = 1, count do
  writes = writes or modes[i] == 'x'
end

-- Blocked by KEYS[i], held for PTTL more ms (by the value `current`; nil for shares): a
-- fair waiter queues (or renews its place).
local function held(i, pttl, current)
  local keys = first_keys(count)
  local queued = 0
  if fair and settle(queue_up, member, keys, value, ARGV[5], lease, id, turn, listen, tag, i, ARGV[2]) then
    queued = 1
  elseif fair then
    -- Out of reach (see settle): waits unqueued; what it queued so far goes.
    settle(dequeue, member, keys)
  end
  return held_reply(i, pttl, queued, current)
end

-- A held key: mark what blocks us as asked, and say for how long it is held.
local function held_string(i, current)
  if mark and not owned(current) then
    mark_value(KEYS[i], current)
  end
  return held(i, redis.call('PTTL', KEYS[i]), current)
end
local function held_set(i, free_at)
  if mark then
    mark_set(KEYS[i])
  end
  return held(i, math.max(0, math.ceil(free_at - now)))
end

-- First every key is looked at, and nothing but marks (and expired members) is written;
-- then every key is written.
for i = 1, count do
  local key, mode = KEYS[i], modes[i]
  local what, stored = kind(key, mode)
  local own, score = nil, nil
  if what == 'set' then
    prune(key)
    if stored == '=' .. mode then
      own, score = own_member(key)
    end
  end
  if what == 'foreign' then
    return {2, key}
  elseif what == 'free' then
    plans[i] = 'new'
  elseif what == 'string' then
    local current = redis.call('GET', key)
    if not owned(current) then
      return held_string(i, current)
    elseif mode ~= 'x' then
      -- Ours, exclusively: a token holds a key in one mode, and would wait for itself.
      return {3, i, 'x'}
    end
    plans[i] = {current = current}
  elseif own then
    -- Ours already (a re-obtain by token).
    plans[i] = {member = own, score = score}
  else
    local verdict, writer, sharers = admit(key, stored, mode, writes)
    if verdict == 'writer' then
      return held_set(i, writer)
    elseif verdict == 'full' then
      return held_set(i, earliest(key))
    elseif verdict == 'other' and (mode ~= 'x' or own_member(key)) then
      -- Never going with ours; or ours, in another mode (a token holds a key in one mode,
      -- and would wait for itself).
      return {3, i, string.sub(stored, 2)}
    elseif verdict == 'other' then
      local _, last = latest(key)
      -- Writers first: no lock that only reads gets in until this writer tries again
      -- (it is woken by the last release, or wakes when the last holder expires). A fair
      -- writer's place in the key's queue does the same (queue_blocks).
      if retries and not fair then
        local upto = now + math.max(ttl, last - now)
        redis.call('ZADD', key, 'GT', upto, '=x')
        expire_set(key)
      end
      return held_set(i, last)
    elseif sharers == 0 and stored ~= '=' .. mode then
      -- A set in another mode that nobody holds any more is as good as free. An exclusive
      -- key's SET below replaces the set: deleted first, the key would be out of reach for
      -- that SET on a migrating slot's source (see settle).
      if mode ~= 'x' then
        redis.call('DEL', key)
      end
      plans[i] = 'new'
    elseif sharers > 0 and queue_blocks(key, mode, member) then
      -- First come, first served: a waiter that came before and cannot share the key
      -- with this lock goes first.
      return held_set(i, earliest(key))
    else
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
  if plan == 'new' and mode == 'x' then
    -- SET replaces a set whatever it holds; a DEL before it would put the key out of
    -- reach of the SET on a migrating slot's source.
    redis.call('SET', key, value, 'PX', ttl)
  elseif plan == 'new' or plan == 'join' then
    join_set(key, mode, value, now + ttl, true, plan == 'new')
  elseif plan.current then
    renew(key, plan.current, ttl)
  else
    -- Ours already (a re-obtain by token): never shorter, the new metadata.
    redis.call('ZREM', key, plan.member)
    join_set(key, mode, value, math.max(plan.score, now + ttl), true, false)
  end
end
-- A fair waiter leaves the queues it may be in (any attempt after its first may have
-- queued).
if fair and turn ~= '1' then
  settle(dequeue, member, first_keys(count))
end
return {1, fence}
