-- Waiter queues (fair waiting), shared by obtain.lua, release.lua and modes.lua: this text
-- takes the place of their line "-- (queue.lua goes here)" when they are loaded, after
-- their fast paths, so that an uncontended obtain or release defines none of these
-- functions. In release.lua and modes.lua it comes after owner.lua (hand_off marks values).
--
-- Each lock key K has a queue: a sorted set named by queue_of(K), in K's cluster slot. Its
-- members are the names of waiter records, scored by when the waiter first queued (the
-- server's clock, in microseconds): FIFO by arrival, across every client, whatever mode
-- each waiter wants K in. A waiter record is a hash named queue_of(first key) .. ':' .. id,
-- in the slot of every key of its lock:
--   v  the value the waiter stores when it gets the lock     t  its TTL in milliseconds
--   i  the waiter's id                                      n  how many keys it waits for
--   l  the index of the key on whose release channel it hears its hand-off: one it was
--      subscribed to when the attempt that wrote it was sent (src/waiting/waiter.rs)
--   s  the turn of the attempt that last queued or renewed it (src/waiting/fair.rs)
--   m  its keys' modes as modes.lua takes them ("x,s,p3"); absent: every key exclusive
--   1..n  its keys
-- The record's own expiry is the waiter's lease: a waiter that stops renewing it (crashed,
-- cut off) is dead once it expires, and is skipped and dropped from the queues.
--
-- Order on a key. A release hands the key on down its queue: to the first live waiter that
-- can take its whole lock now (every key free, or shared in its mode with room), and, while
-- the key can still be shared, to each next such waiter (every reader at the head at once,
-- as many permit waiters as permits came free). It stops at the first waiter that could take
-- its whole lock but for this key (a writer behind readers, a permit waiter with no permit
-- left): nobody behind it gets the key first. A waiter that cannot take its whole lock for
-- another key is passed over: nothing is reserved for it. A lock that would join a key's
-- sharers (shared, or a permit) while a waiter that came before it wants the key in a mode
-- that cannot share with it waits behind it (see queue_blocks): so readers never starve a
-- queued writer, nor writers a queued reader.

-- Queues and records are not in the scripts' KEYS (only the lock's keys are): they are in
-- the lock keys' slot, and Redis checks ACL patterns and slots on each command anyway; named
-- in KEYS, a queue not yet on the node that has the lock key while the slot migrates would
-- make Redis refuse the whole script (TRYAGAIN) until the migration ends. See the cluster
-- guide, and settle below for what a script does without them.
local QUEUE_SUFFIX = ':lockset:queue'
-- Queue entries a release looks at before it leaves a key free.
local LOOK_AT_MOST = 16
-- Keys read or written by one command.
local QUEUE_CHUNK = 1000

-- The name of KEY's waiter queue: it begins with KEY (one ACL key pattern per key prefix
-- covers it and the records named after it) and hashes to KEY's cluster slot: a key with a
-- hash tag keeps it, a key without one becomes the tag after itself ("job" ->
-- "job{job}:lockset:queue"). nil for a key without a hash tag that contains '{' or '}': it
-- has no queue, and its waiters do not queue. The rule's home is src/slots.rs
-- (queue_key_for); this copy names the queues of the waiters a release hands on to, whose
-- keys only their records know.
local function queue_of(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then
      return key .. QUEUE_SUFFIX
    end
    return nil
  end
  if string.find(key, '}', 1, true) then
    return nil
  end
  return key .. '{' .. key .. '}' .. QUEUE_SUFFIX
end

-- The record name of waiter ID waiting for KEYS (named after the first key).
local function record_of(keys, id)
  return queue_of(keys[1]) .. ':' .. id
end

-- The server's clock in ms (with microseconds), as modes.lua scores holders: asked once
-- per script, and only by a script that needs it (a hand-off of exclusive keys does not).
local queue_clock = nil
local function clock_ms()
  if not queue_clock then
    local now = redis.call('TIME')
    queue_clock = tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000
  end
  return queue_clock
end

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

-- Takes MEMBER out of the queue of every key in KEYS, and deletes its record. The record
-- goes first: once it is gone, an entry left in some queue (see settle) is a dead waiter's,
-- which the next release drops.
local function dequeue(member, keys)
  redis.call('DEL', member)
  for i = 1, #keys do
    local queue = queue_of(keys[i])
    if queue then
      redis.call('ZREM', queue, member)
    end
  end
end

-- Runs FN(...) for queue work a lock can do without; false when a command of it failed.
-- While a cluster slot migrates, its source node refuses a script every key it does not
-- hold (ASK), KEYS or not: a queue or record still to be made, or moved already, or a key
-- this script just deleted. The work stops there, and what ran before the failing command
-- stays (scripts are not rolled back): each caller orders its writes so that what stays is
-- sound, and goes on as if nobody queued (waiters are announced the release instead, and
-- wait unqueued, as barging ones do).
local function settle(fn, ...)
  return (pcall(fn, ...))
end

-- Waiter MEMBER (id ID, attempt TURN, lease LEASE ms) blocked by KEYS[BLOCKED] queues on
-- every key of KEYS, or renews its lease (the record's expiry), keeping its place. Its
-- record names every key, also a single one (two keys' queues may share a name: "job" and
-- "job{job}"), the value it stores (VALUE, for TTL ms), the channel it hears its hand-off on
-- (KEYS[LISTEN], else the blocking key's) and MODES (nil: every key exclusive).
local function queue_up(member, keys, value, ttl, lease, id, turn, listen, blocked, modes)
  local count = #keys
  local l = tonumber(listen) or blocked
  -- A first turn has no record yet; a later one renews it, unless it lapsed.
  if turn == '1' or redis.call('PEXPIRE', member, lease) == 0 then
    -- One HSET with the first chunk of keys, one more per further chunk (unpack() has a
    -- limit).
    local fields = {'v', value, 't', ttl, 'i', id, 'n', count, 'l', l, 's', turn}
    if modes then
      fields[#fields + 1] = 'm'
      fields[#fields + 1] = modes
    end
    for first = 1, count, QUEUE_CHUNK do
      for j = first, math.min(first + QUEUE_CHUNK - 1, count) do
        fields[#fields + 1] = j
        fields[#fields + 1] = keys[j]
      end
      redis.call('HSET', member, unpack(fields))
      fields = {}
    end
    redis.call('PEXPIRE', member, lease)
  else
    redis.call('HSET', member, 'l', l, 's', turn)
  end
  local arrival = math.floor(clock_ms() * 1000)
  for j = 1, count do
    local queue = queue_of(keys[j])
    redis.call('ZADD', queue, 'NX', arrival, member)
    -- A queue whose waiters all died goes with them; never sooner than another waiter's
    -- longer lease asked for.
    if redis.call('PTTL', queue) < 3 * lease then
      redis.call('PEXPIRE', queue, 3 * lease)
    end
  end
end

-- The keys of the waiter MEMBER, whose record says it waits for N keys, the first FIRST.
local function keys_of(member, n, first_key)
  local keys = {first_key}
  for first = 2, n, QUEUE_CHUNK do
    local fields = {}
    for j = first, math.min(first + QUEUE_CHUNK - 1, n) do
      fields[#fields + 1] = j
    end
    local some = redis.call('HMGET', member, unpack(fields))
    for j = 1, #some do
      keys[#keys + 1] = some[j]
    end
  end
  return keys
end

-- The modes of a record's N keys from its field 'm' (CODES; nil: every key exclusive).
local function modes_of(codes, n)
  local modes = {}
  if codes then
    for mode in string.gmatch(codes, '[^,]+') do
      modes[#modes + 1] = mode
    end
  end
  for j = #modes + 1, n do
    modes[j] = 'x'
  end
  return modes
end

-- The waiter MEMBER: its keys, their modes and its record's fields (v, t, i, l, s: see
-- above); nil when its record is gone (it died, or was handed its lock).
local function waiter_of(member)
  local r = redis.call('HMGET', member, 'n', 'm', 1, 'v', 't', 'i', 'l', 's')
  if not r[1] then
    return nil
  end
  local keys = keys_of(member, tonumber(r[1]), r[3])
  local record = {v = r[4], t = r[5], i = r[6], l = r[7], s = r[8]}
  return keys, modes_of(r[2], #keys), record
end

-- The keys KEYS[1..COUNT] (without a fencing counter after them).
local function first_keys(count)
  local keys = {}
  for i = 1, count do
    keys[i] = KEYS[i]
  end
  return keys
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

-- The mode member ('=s' or '=p<N>') of a set this library wrote at KEY, if any.
local function set_mode(key)
  local meta = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')
  for j = 1, #meta do
    if meta[j] == '=s' or string.match(meta[j], '^=p%d+$') then
      return meta[j]
    end
  end
  return nil
end

-- Whether KEY can be taken now in MODE ('x', 's' or 'p<N>') by a lock that WRITES some key
-- or not, as far as its holders go: it is free, or a set of
-- shared holders in that mode, or of permit holders in that mode with a permit left. A set
-- whose holders all left takes any mode, but while a writer's mark ("=x", modes.lua) is
-- live, only for a lock that writes.
local function admits(key, mode, writes)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return true
  elseif kind ~= 'zset' then
    return false
  end
  local stored = set_mode(key)
  if not stored then
    return false
  end
  local now = clock_ms()
  local writer = redis.call('ZSCORE', key, '=x')
  writer = writer and tonumber(writer) > now
  local holders = redis.call('ZCOUNT', key, string.format('(%.3f', now), '+inf')
    - (writer and 1 or 0)
  if holders == 0 then
    return writes or not writer
  elseif mode == 'x' or stored ~= '=' .. mode or (writer and not writes) then
    return false
  end
  return mode == 's' or holders < tonumber(string.sub(mode, 2))
end

-- Makes KEY held in MODE by VALUE for PX ms (it admits it: see admits), MARKED for its
-- release to announce itself (somebody else waits for it). A set's member is scored by
-- its expiry, and the set lives as long as its latest member.
local function take(key, mode, value, px, marked)
  if mode == 'x' then
    -- Also over a set whose holders all left.
    redis.call('SET', key, marked and '!' .. value or value, 'PX', px)
    return
  end
  if redis.call('EXISTS', key) == 1 and not redis.call('ZSCORE', key, '=' .. mode) then
    -- A set of another mode that nobody holds any more.
    redis.call('DEL', key)
  end
  redis.call('ZADD', key, '-inf', '=' .. mode, clock_ms() + px, value)
  if marked then
    redis.call('ZADD', key, '-inf', '=w')
  end
  if redis.call('PTTL', key) < px then
    redis.call('PEXPIRE', key, px)
  end
end

-- Marks KEY (held by another owner) so that its release announces itself, or hands on.
local function mark(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then
    local current = redis.call('GET', key)
    if string.byte(current, 1) ~= 33 and ours_to_mark(current) then
      redis.call('SET', key, '!' .. current, 'KEEPTTL')
    end
  elseif kind == 'zset' and set_mode(key) then
    redis.call('ZADD', key, '-inf', '=w')
  end
end

-- Hands MEMBER, a live waiter whose lease has LEFT ms to run, every key in KEYS in its mode
-- (MODES; each admits it) for its TTL, but no longer than its lease: a waiter that died since
-- it last renewed holds the keys no longer than that. LISTEN: the key on whose release
-- channel it hears its hand-off, told with NOTICE ("PUBLISH" or "SPUBLISH"; "" tells
-- nobody) as "g<id>:<turn>:<ms>": the keys are its own for <ms> from this moment, which came
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
    -- Counted before the removal: a queue left empty is gone, and on a migrating slot's
    -- source a key gone is out of reach for the rest of the script.
    local others = redis.call('ZCARD', queue) - redis.call('ZREM', queue, member)
    take(keys[j], modes[j], value, px, keys[j] == key or others > 0)
  end
  redis.call('DEL', member)
  if notice ~= '' then
    redis.pcall(notice, listen, 'g' .. id .. ':' .. turn .. ':' .. string.format('%.0f', px))
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
          mark(held[j])
        end
      end
    end
  end
  return handed
end

-- Whether a waiter in QUEUE, KEY's queue, that came before MEMBER wants KEY in a mode that
-- cannot share it with MODE (see queue_blocks).
local function waits_before(queue, key, mode, member)
  local members = redis.call('ZRANGE', queue, 0, LOOK_AT_MOST - 1)
  for m = 1, #members do
    if members[m] == member then
      return false
    end
    local keys, modes = waiter_of(members[m])
    for j = 1, (keys and #keys or 0) do
      if keys[j] == key and modes[j] ~= mode then
        return true
      end
    end
  end
  return false
end

-- Whether a lock that would join KEY's holders in MODE ('s', or 'p<N>' with a permit left)
-- must let a waiter go first: a live waiter in KEY's queue that came before MEMBER (every
-- waiter there, for a lock that is not queued: MEMBER nil) and wants KEY in a mode that
-- cannot share it with MODE. A queue out of reach (see settle) shows nobody: the lock goes
-- ahead as where nobody queues.
local function queue_blocks(key, mode, member)
  local queue = queue_of(key)
  if not queue then
    return false
  end
  local ok, blocks = pcall(waits_before, queue, key, mode, member)
  return ok and blocks
end
