-- Locks every key in KEYS, or none of them (MSETNX semantics, re-entrant by owner).
--
-- KEYS     the lock's keys; with fencing, followed by the fencing counter key
-- ARGV[1]  owner tag: "<token length>:<token>"; it starts every value this owner writes
-- ARGV[2]  the full value to store: owner tag followed by the caller's metadata
-- ARGV[3]  time to live in milliseconds
-- ARGV[4]  "1" when the last key is a fencing counter to increment on success
--
-- Reply: {1}            every key is now ours, with a fresh TTL and the new value
--        {1, fence}     the same, with the counter's new value
--        {0, pttl, i}   KEYS[i] is held by another owner, for pttl more ms (-1: no expiry)
--        {2, key}       key holds a value of the wrong type; nothing was changed
--
-- Keys are visited one by one instead of unpack()-ing KEYS, which overflows Lua's C stack
-- at a few thousand keys. The owner tag carries the token's length, so a prefix match on it
-- is an exact token match: no token can pass for another that merely starts with it.
local owner, value, ttl = ARGV[1], ARGV[2], ARGV[3]
local n = #owner
local count = #KEYS
local counter = nil
if ARGV[4] == '1' then
  counter = KEYS[count]
  count = count - 1
end

for i = 1, count do
  local current = redis.pcall('GET', KEYS[i])
  if type(current) == 'table' then
    return {2, KEYS[i]}
  end
  if current and current ~= owner and string.sub(current, 1, n) ~= owner then
    return {0, redis.call('PTTL', KEYS[i]), i}
  end
end

-- Mint before writing: an error here (a counter that is not an integer) changes nothing.
local fence = nil
if counter then
  fence = redis.pcall('INCR', counter)
  if type(fence) == 'table' then
    return {2, counter}
  end
end

for i = 1, count do
  redis.call('SET', KEYS[i], value, 'PX', ttl)
end
return {1, fence}
