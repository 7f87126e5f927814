-- Reads one key's waiter queue (queue.lua) for lockset::read_queue (src/waiting/reader.rs):
-- the server's time, then per entry its arrival score, its record's PTTL and the record.
-- Read-only; never spliced.
local now = redis.call('TIME')
local out = {now[1], now[2]}
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local member = entries[i]
  out[#out + 1] = entries[i + 1]
  out[#out + 1] = redis.call('PTTL', member)
  out[#out + 1] = redis.call('HGETALL', member)
end
return out
