-- Extends every key of a lock, only if every key is still held by the owner.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
-- ARGV[2]  new time to live in milliseconds
--
-- Reply: 1 when every key was extended, 0 when the lock is not held (nothing changed).
local owner, ttl = ARGV[1], ARGV[2]
local n = #owner

for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  -- Most values are the bare tag (no metadata): compare whole strings before slicing.
  if current ~= owner and (type(current) ~= 'string' or string.sub(current, 1, n) ~= owner) then
    return 0
  end
end

for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 1
