-- Extends every key of a lock, only if every key is still held by the owner.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
-- ARGV[2]  new time to live in milliseconds
-- ARGV[3]  optional (Redlock): the lock's value, to re-create keys that are missing because
--          this master restarted empty. A key held by another owner still fails the refresh.
--
-- Reply: 1 when every key was extended, 0 when the lock is not held (nothing changed).
local owner, ttl, restore = ARGV[1], ARGV[2], ARGV[3]
local n = #owner

for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  -- Most values are the bare tag (no metadata): compare whole strings before slicing.
  if current ~= owner and (type(current) ~= 'string' or string.sub(current, 1, n) ~= owner) then
    if current or not restore then
      return 0
    end
  end
end

for i = 1, #KEYS do
  if not (restore and redis.call('SET', KEYS[i], restore, 'PX', ttl, 'NX')) then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
