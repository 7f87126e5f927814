-- Remaining time of a lock: the smallest PTTL across its keys.
--
-- ARGV[1]  the lock's value: the owner tag "<token length>:<token>" followed by its metadata
--
-- Reply: -2 when some key holds another owner's value or another type (not held),
--        -3 when no key is another owner's but some are missing (expired, or the server
--           restarted empty),
--        -1 when every key is held without an expiry,
--        otherwise the smallest remaining time in milliseconds.
--        an error: any other error reading a key (the server's own), before anything changed
local value = ARGV[1]
-- (fragments go here)

local least, missing = -1, false
for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  if type(current) == 'table' and string.sub(current.err, 1, 9) ~= 'WRONGTYPE' then
    return current  -- an error other than another type: the server's own message
  end
  if not current then
    missing = true
  elseif not owned(current) then
    return -2
  else
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and (least < 0 or left < least) then
      least = left
    end
  end
end
if missing then
  return -3
end
return least
