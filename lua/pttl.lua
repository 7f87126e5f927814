-- Remaining time of a lock: the smallest PTTL across its keys.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
-- ARGV[2]  the lock's value: owner tag followed by its metadata
--
-- Reply: -2 when any key is not ours (the lock is not held),
--        -1 when every key is held without an expiry,
--        otherwise the smallest remaining time in milliseconds.
local owner, value = ARGV[1], ARGV[2]
local n = #owner

-- Whether a stored value is ours: whole, by tag, or by tag behind a waiter's mark.
local function owned(current)
  return current == value or (type(current) == 'string' and (string.sub(current, 1, n) == owner
    or (string.byte(current, 1) == 33 and string.sub(current, 2, n + 1) == owner)))
end

local least = -1
for i = 1, #KEYS do
  if not owned(redis.pcall('GET', KEYS[i])) then
    return -2
  end
  local left = redis.call('PTTL', KEYS[i])
  if left >= 0 and (least < 0 or left < least) then
    least = left
  end
end
return least
