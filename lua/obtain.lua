-- Locks every key in KEYS, or none of them (MSETNX semantics, re-entrant by owner).
--
-- KEYS     the lock's keys; with fencing, followed by the fencing counter key
-- ARGV[1]  the value to store: the owner tag "<token length>:<token>" (see owner.lua)
--          followed by the caller's metadata
-- ARGV[2]  time to live in milliseconds
-- ARGV[3]  when the last key is a fencing counter to increment on success: the primary's
--          configuration epoch plus one ("1" outside Sentinel; see fence.lua); absent: "0"
-- ARGV[4]  "1" when the caller waits for a held key: mark the holder's value with a leading
--          "!" so that its release announces itself (see release.lua); absent: "0"
-- ARGV[5]  for a fair waiter: its lease in milliseconds (else empty or absent). A fair
--          waiter that finds a key held queues on every key (see queue.lua), or renews its
--          lease; once it has the lock it leaves the queues
-- ARGV[6]  for a fair waiter: its id
-- ARGV[7]  for a fair waiter: this attempt's turn (1, 2, ... within one id). The waiter's
--          record keeps the turn that last queued or renewed it, and a hand-off names it:
--          that attempt was sent before the hand-off, which is where the new holder's
--          validity starts (see src/waiting/fair.rs)
-- ARGV[8]  for a fair waiter: the index of the key on whose release channel it hears its
--          hand-off (its subscription was live when this attempt was sent); absent: the
--          key that blocks this attempt
-- ARGV[9]  for a fair waiter: its client's hand-off tag, when it hears its hand-off on its
--          client's own channel for that key (see handoff_channel in queue.lua); empty or
--          absent: on the key's release channel
--
-- Reply: {1, fence}     every key is ours, with the new token as a decimal string (false
--                      without fencing)
--        {0, pttl, i}  KEYS[i] is held by another owner, for pttl more ms (-1: no expiry);
--                      {0, pttl, i, 1} when the waiter queued; {0, pttl, i, queued,
--                      metadata} when the holder's value has metadata (see held_reply)
--        {2, key}      key holds a value of the wrong type
--        an error      any other error (a counter that is not an integer or not positive, OOM)
-- Whenever the reply is not {1, ...}, nothing was changed (but for the waiter's mark, which
-- is only ever put on values this library wrote: "<digits>:...").
--
-- A key this owner already holds (a re-obtain by token) keeps the longer of its remaining TTL
-- and the new one: a re-obtain never shortens what an earlier obtain by the same token was
-- told. Keys are visited one by one instead of unpack()-ing KEYS, which overflows Lua's C
-- stack at a few thousand keys.
local value, ttl = ARGV[1], ARGV[2]
local mark_holder = ARGV[4] == '1'
local count = #KEYS
local counter, epoch = nil, 0
if ARGV[3] and ARGV[3] ~= '0' and ARGV[3] ~= '' then
  counter = KEYS[count]
  count = count - 1
  epoch = tonumber(ARGV[3]) - 1
end
local lease, id, turn, listen, tag = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local fair = lease ~= nil and lease ~= ''

local redis7 = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

-- The all-free case first, with nothing else set up: one EXISTS per chunk of keys, then one
-- SET .. PX per key, so that every key carries its TTL from its write on (a command refused
-- part-way, by the ACL or for memory, ends the script with what it wrote kept: never a key
-- without an expiry). A chunk that finds any key taken (or of another type) leaves the keys
-- to be looked at one by one below. A single key on Redis 7 goes straight to SET NX PX GET
-- below: one command, free or held.
local CHUNK = 1000
local created = 0  -- keys 1..created were visited: all created by this call but those in mine
local all_free = not (count == 1 and redis7)
for first = 1, (all_free and count or 0), CHUNK do
  if redis.call('EXISTS', unpack(KEYS, first, math.min(first + CHUNK - 1, count))) ~= 0 then
    all_free = false
    break
  end
end
for i = 1, (all_free and count or 0) do
  local set = redis.pcall('SET', KEYS[i], value, 'PX', ttl)
  if type(set) == 'table' and set.err then
    -- An error such as OOM: undo this call's keys.
    for j = 1, i - 1 do
      redis.call('DEL', KEYS[j])
    end
    return set
  end
  created = i
end

if all_free and not counter and not fair then
  return {1, false}
end

-- (fragments go here)
if fair and not queue_of(KEYS[1]) then
  fair = false
end
local member = fair and record_of(KEYS, id)

-- The lock's keys, without the fencing counter.
local function lock_keys()
  return counter and first_keys(count) or KEYS
end

-- Success: a fair waiter leaves the queues it may be in: any attempt after its first may
-- have queued, also one whose record has expired since (its entries outlive the record).
local function won(fence)
  if fair and turn ~= '1' then
    settle(dequeue, member, lock_keys())
  end
  return {1, fence}
end

if all_free and not counter then
  return won(false)
end

-- (fragments go here)
local mine = {}    -- {index, current value} of keys this owner already held
local function undo()
  local m = 1
  for i = 1, created do
    if mine[m] and mine[m][1] == i then
      m = m + 1
    else
      redis.call('DEL', KEYS[i])
    end
  end
end

local function failed(err, key)
  undo()
  if string.sub(err.err, 1, 9) == 'WRONGTYPE' then
    return {2, key}
  end
  return err
end

local function held_by_another(i, current)
  undo()
  if mark_holder then
    mark_value(KEYS[i], current)
  end
  local queued = 0
  if fair and settle(queue_up, member, lock_keys(), value, ttl, lease, id, turn, listen, tag, i, nil) then
    queued = 1
  elseif fair then
    -- Out of reach (see settle): waits unqueued; what it queued so far goes.
    settle(dequeue, member, lock_keys())
  end
  return held_reply(i, redis.call('PTTL', KEYS[i]), queued, current)
end

if all_free then
  -- Every key was created above.
elseif redis7 then
  -- One command per key sets it or returns its holder's value.
  for i = 1, count do
    local current = redis.pcall('SET', KEYS[i], value, 'NX', 'PX', ttl, 'GET')
    if current then
      if type(current) == 'table' then
        return failed(current, KEYS[i])
      elseif owned(current) then
        mine[#mine + 1] = {i, current}
      else
        return held_by_another(i, current)
      end
    end
    created = i
  end
else
  -- Before Redis 7, SET cannot return the old value: look at every key, then write.
  local free = {}
  for i = 1, count do
    local current = redis.pcall('GET', KEYS[i])
    if type(current) == 'table' then
      return failed(current, KEYS[i])
    elseif not current then
      free[#free + 1] = i
    elseif owned(current) then
      mine[#mine + 1] = {i, current}
    else
      return held_by_another(i, current)
    end
  end
  for j = 1, #free do
    -- A status reply is a table too: {ok = 'OK'}; an error has `err`.
    local done = redis.pcall('SET', KEYS[free[j]], value, 'PX', ttl)
    if type(done) == 'table' and done.err then
      return failed(done, KEYS[free[j]])
    end
    created = free[j]
  end
end

local fence = false
if counter then
  fence = mint(counter, epoch)
  if type(fence) == 'table' then
    return failed(fence, counter)
  end
end

-- Keys already ours: new value (keeping a waiter's mark), never a shorter TTL.
local wanted = tonumber(ttl)
-- A fair waiter's keys that a release handed it (for no longer than its TTL) get the full
-- TTL this way: an attempt after the notice (one that did not take the hand-off as it was
-- told) extends them; a caller's own token may also hold some key as an outer lock.
for j = 1, #mine do
  renew(KEYS[mine[j][1]], mine[j][2], wanted)
end
return won(fence)
