-- Reads one lock key for lockset::inspect (src/waiting/inspect.rs): its type and PTTL;
-- a string's value; a mode set's (sets.lua) marks of waiting writers (score -inf) and its
-- live holders with what each has left, by the server's clock. Read-only; never spliced.
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
local pttl = redis.call('PTTL', key)
if kind == 'string' then
  return {kind, pttl, redis.call('GET', key)}
elseif kind ~= 'zset' then
  return {kind, pttl}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
local marks = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')
local live = redis.call('ZRANGEBYSCORE', key, string.format('(%.3f', now), '+inf', 'WITHSCORES')
local left = {}
for j = 1, #live, 2 do
  left[#left + 1] = live[j]
  left[#left + 1] = math.max(0, math.ceil(tonumber(live[j + 1]) - now))
end
return {kind, pttl, marks, left}
