-- A release's hand-off: a key just freed goes down its queue (queue.lua) to the waiters
-- that can take their whole lock now, by the admission rule (admit.lua); marks by mark.lua.
-- Only release.lua and modes_release.lua hand on. See "Order on a key" in queue.lua.

-- The first live member of QUEUE, dropping dead ones before it (at most LOOK_AT_MOST).
local function live_head(queue)
  for _ = 1, LOOK_AT_MOST do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head or redis.call('EXISTS', head) == 1 then
      return head
    end
    redis.call('ZREM', queue, head)
  end
  return nil
end

-- Whether MEMBER is the first live waiter of the queue of every key in KEYS.
local function first_in_all(member, keys)
  for i = 1, #keys do
    if live_head(queue_of(keys[i])) ~= member then
      return false
    end
  end
  return true
end

-- Whether a lock with MODES holds some key exclusive (it writes).
local function writes_any(modes)
  for j = 1, #modes do
    if modes[j] == 'x' then
      return true
    end
  end
  return false
end

-- Whether KEY can be taken now in MODE ('x', 's' or 'p<N>') by a lock that WRITES some key
-- or not, as far as its holders go: it is free, or a set that admits it (admit.lua).
local function admits(key, mode, writes)
  local what, stored = kind(key, mode)
  if what == 'free' then
    return true
  end
  return what == 'set' and admit(key, stored, mode, writes) == 'take'
end

-- Makes KEY held in MODE by VALUE for PX ms (it admits it: see admits), marked (WAITED) for its
-- release to announce itself (somebody else waits for it). A set's member is scored by
-- its expiry, and the set lives as long as its latest member.
local function take(key, mode, value, px, waited)
  if mode == 'x' then
    -- Also over a set whose holders all left.
    redis.call('SET', key, waited and MARK .. value or value, 'PX', px)
    return
  end
  if redis.call('EXISTS', key) == 1 and not redis.call('ZSCORE', key, '=' .. mode) then
    -- A set of another mode that nobody holds any more.
    redis.call('DEL', key)
  end
  redis.call('ZADD', key, '-inf', '=' .. mode, now_ms() + px, value)
  if waited then
    mark_set(key)
  end
  if redis.call('PTTL', key) < px then
    redis.call('PEXPIRE', key, px)
  end
end

-- Marks KEY (held by another owner) so that its release announces itself, or hands on.
local function mark_key(key)
  local what = kind(key, 'x')
  if what == 'string' then
    mark_value(key, redis.call('GET', key))
  elseif what == 'set' then
    mark_set(key)
  end
end

-- Hands MEMBER, a live waiter whose lease has LEFT ms to run, every key in KEYS in its mode
-- (MODES; each admits it) for its TTL, but no longer than its lease: a waiter that died since
-- it last renewed holds the keys no longer than that. LISTEN: the key on whose release
-- channel it hears its hand-off (or its client's own channel for that key, when the record
-- names one: field c), told with NOTICE ("PUBLISH" or "SPUBLISH"; "" tells nobody) as
-- "g<id>:<turn>:<ms>": the keys are its own for <ms> from this moment, which came
-- after it sent attempt <turn> (the last to queue or renew it), so they are its own for
-- <ms> from when it sent that attempt at least (see src/waiting/fair.rs). A record written
-- before records kept turns has none: turn 0, which no attempt has (the waiter then makes
-- the keys its own by an attempt). KEY, the key being released, was marked (somebody waits
-- for it, queued or not): it stays marked, so that its next release tells them too; the
-- waiter's other keys are marked when others queue for them.
local function grant(member, record, keys, modes, left, listen, key, notice)
  local value, id, turn = record.v, record.i, record.s or '0'
  local px = math.min(tonumber(record.t), left)
  for j = 1, #keys do
    local queue = queue_of(keys[j])
    -- The freed key stays marked whoever else waits; another key is marked when others
    -- wait for it, counted before the removal: a queue left empty is gone, and on a
    -- migrating slot's source a key gone is out of reach for the rest of the script.
    local marks = keys[j] == key
    if marks then
      redis.call('ZREM', queue, member)
    else
      marks = redis.call('ZCARD', queue) - redis.call('ZREM', queue, member) > 0
    end
    take(keys[j], modes[j], value, px, marks)
  end
  redis.call('DEL', member)
  if notice ~= '' then
    local told = 'g' .. id .. ':' .. turn .. ':' .. string.format('%.0f', px)
    local refused = true
    if record.c and record.c ~= '' then
      -- Checked against this script's user's channel rights, not the waiter's: one that
      -- names channels one by one is refused it, and the waiter hears the key's channel too.
      local reply = redis.pcall(notice, handoff_channel(listen, record.c), told)
      refused = type(reply) == 'table' and reply.err ~= nil
    end
    if refused then
      redis.pcall(notice, listen, told)
    end
  end
end

-- KEY was just freed (or a holder left it): hands it on down its queue (see "Order on a
-- key" above), each waiter with the rest of its lock. A waiter that cannot take its whole
-- lock for another key, and is first in all its queues, has the holders of those keys
-- marked, so that their releases hand on too. Dead waiters met on the way leave the queue.
-- RELEASED: the keys this release frees, when more than one (each goes to its own queue's
-- first waiter); FREE: KEY is known to be free (deleted by this release), which spares a
-- look at it. True when KEY went to some waiter (maybe with another key of this release,
-- earlier).
local function hand_off(key, released, notice, free)
  local queue = queue_of(key)
  if not queue then
    return false
  end
  -- Handed on already, with another key of this release (exclusive: nobody else can have
  -- it now).
  if released[key] and redis.call('TYPE', key)['ok'] == 'string' then
    return true
  end
  local handed = false
  local members = redis.call('ZRANGE', queue, 0, LOOK_AT_MOST - 1)
  for m = 1, #members do
    local member = members[m]
    local keys, modes, record = waiter_of(member)
    local left = keys and redis.call('PTTL', member) or -2
    if left <= 0 then
      redis.call('ZREM', queue, member)
    else
      local writes = writes_any(modes)
      -- Another key's queue may share this one's name ("job" and "job{job}"): only a waiter
      -- for KEY itself may have it.
      local wants = nil
      local behind = false  -- behind another waiter for a key this release frees
      local held = {}  -- its other keys that it cannot take now
      for j = 1, #keys do
        if keys[j] == key then
          wants = j
        elseif not admits(keys[j], modes[j], writes) then
          -- A key this release freed may have gone to another waiter already, with a key
          -- handed on before this one: it is held then, as any other.
          held[#held + 1] = keys[j]
        elseif released[keys[j]] then
          behind = behind or live_head(queue_of(keys[j])) ~= member
        end
      end
      local ready = wants and not behind and #held == 0
      if ready and (free or admits(key, modes[wants], writes)) then
        grant(member, record, keys, modes, left, keys[tonumber(record.l)] or key, key, notice)
        handed = true
        free = false
        if modes[wants] == 'x' then
          return true
        end
      elseif ready then
        -- It could have its whole lock but for this key: it is next, nobody behind it
        -- gets the key first.
        return handed
      elseif wants and first_in_all(member, keys) then
        for j = 1, #held do
          mark_key(held[j])
        end
      end
    end
  end
  return handed
end
