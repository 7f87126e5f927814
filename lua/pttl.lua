-- Remaining time of a lock: the smallest PTTL across its keys.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
--
-- Reply: -2 when any key no longer starts with the owner tag (the lock is not held),
--        -1 when every key is held without an expiry,
--        otherwise the smallest remaining time in milliseconds.
local owner = ARGV[1]
local n = #owner
local least = -1

for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  -- Most values are the bare tag (no metadata): compare whole strings before slicing.
  if current ~= owner and (type(current) ~= 'string' or string.sub(current, 1, n) ~= owner) then
    return -2
  end
  local left = redis.call('PTTL', KEYS[i])
  if left >= 0 and (least < 0 or left < least) then
    least = left
  end
end
return least
