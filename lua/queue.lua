-- Waiter queues (fair waiting), shared by obtain.lua and release.lua: this text takes the
-- place of their line "-- (queue.lua goes here)" when they are loaded, after their fast
-- paths, so that an uncontended obtain or release defines none of these functions.
--
-- Each lock key K has a queue: a sorted set named by queue_of(K), in K's cluster slot. Its
-- members are the names of waiter records, scored by when the waiter first queued (the
-- server's clock, in microseconds): FIFO by arrival, across every client. A waiter record is
-- a hash named queue_of(first key) .. ':' .. id, in the slot of every key of its lock:
--   v  the value the waiter stores when it gets the lock     t  its TTL in milliseconds
--   i  the waiter's id                                      n  how many keys it waits for
--   l  the index of the key on whose release channel it hears its hand-off: one it was
--      subscribed to when the attempt that wrote it was sent (src/waiting/waiter.rs)
--   1..n  its keys
-- The record's own expiry is the waiter's lease: a waiter that stops renewing it (crashed,
-- cut off) is dead once it expires, and is skipped and dropped from the queues.


local QUEUE_SUFFIX = ':lockset:queue'
-- Queue entries a release looks at before it leaves a key free.
local LOOK_AT_MOST = 16

-- The name of KEY's waiter queue, which hashes to KEY's cluster slot: a key with a hash tag
-- keeps it, a key without one becomes the tag. nil for a key without a hash tag that
-- contains '}': it has no queue, and its waiters do not queue (src/slots.rs, same rule).
local function queue_of(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then
      return key .. QUEUE_SUFFIX
    end
  end
  if string.find(key, '}', 1, true) then
    return nil
  end
  return '{' .. key .. '}' .. QUEUE_SUFFIX
end

-- The record name of waiter ID waiting for KEYS (named after the first key).
local function record_of(keys, id)
  return queue_of(keys[1]) .. ':' .. id
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

-- Takes MEMBER out of the queue of every key in KEYS, and deletes its record.
local function dequeue(member, keys)
  for i = 1, #keys do
    local queue = queue_of(keys[i])
    if queue then
      redis.call('ZREM', queue, member)
    end
  end
  redis.call('DEL', member)
end

