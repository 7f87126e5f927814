-- Waiter queues (fair waiting): what a waiter needs to queue, to leave its queues, and to
-- read another waiter's record. Spliced into every script that queues or hands on (after
-- the fast paths of obtain.lua and release.lua, so that an uncontended obtain or release
-- defines none of these functions); a release's hand-off is in handoff.lua. Needs clock.lua.
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
--   c  the tag of its client's own hand-off channel (handoff_channel), when that was live
--      too when the attempt was sent: the hand-off is told there, to that client alone,
--      instead of on the release channel of key l, which every waiting client hears;
--      empty or absent (a record of an older client): on key l's release channel
--   m  its keys' modes as modes_obtain.lua takes them ("x,s,p3"); absent: every key exclusive
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
-- has no queue, and its waiters do not queue. The rule's home is src/model/names.rs
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

-- The channel on which the client with hand-off tag TAG hears the hand-offs of KEY to its
-- waiters: named after KEY's queue, so that it begins with KEY (an ACL channel pattern per
-- key prefix covers it) and hashes to KEY's slot. Its home is src/model/names.rs
-- (handoff_channel).
local function handoff_channel(key, tag)
  return queue_of(key) .. ':to:' .. tag
end

-- The record name of waiter ID waiting for KEYS (named after the first key).
local function record_of(keys, id)
  return queue_of(keys[1]) .. ':' .. id
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

-- The keys KEYS[1..COUNT] (without a fencing counter after them).
local function first_keys(count)
  local keys = {}
  for i = 1, count do
    keys[i] = KEYS[i]
  end
  return keys
end

-- Waiter MEMBER (id ID, attempt TURN, lease LEASE ms) blocked by KEYS[BLOCKED] queues on
-- every key of KEYS, or renews its lease (the record's expiry), keeping its place. Its
-- record names every key, also a single one (two keys' queues may share a name: "job" and
-- "job{job}"), the value it stores (VALUE, for TTL ms), the channel it hears its hand-off on
-- (KEYS[LISTEN], else the blocking key's; its client's own channel for that key when TAG is
-- not empty) and MODES (nil: every key exclusive).
local function queue_up(member, keys, value, ttl, lease, id, turn, listen, tag, blocked, modes)
  local count = #keys
  local l = tonumber(listen) or blocked
  tag = tag or ''
  -- A first turn has no record yet; a later one renews it, unless it lapsed.
  if turn == '1' or redis.call('PEXPIRE', member, lease) == 0 then
    -- One HSET with the first chunk of keys, one more per further chunk (unpack() has a
    -- limit).
    local fields = {'v', value, 't', ttl, 'i', id, 'n', count, 'l', l, 's', turn, 'c', tag}
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
    redis.call('HSET', member, 'l', l, 's', turn, 'c', tag)
  end
  local arrival = math.floor(now_ms() * 1000)
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

-- The waiter MEMBER: its keys, their modes and its record's fields (v, t, i, l, s, c: see
-- above); nil when its record is gone (it died, or was handed its lock).
local function waiter_of(member)
  local r = redis.call('HMGET', member, 'n', 'm', 1, 'v', 't', 'i', 'l', 's', 'c')
  if not r[1] then
    return nil
  end
  local keys = keys_of(member, tonumber(r[1]), r[3])
  local record = {v = r[4], t = r[5], i = r[6], l = r[7], s = r[8], c = r[9]}
  return keys, modes_of(r[2], #keys), record
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
