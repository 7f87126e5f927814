-- Extends every key of a lock, only if every key is still held by the owner.
--
-- ARGV[1]  the lock's value: the owner tag "<token length>:<token>" followed by its metadata
-- ARGV[2]  new time to live in milliseconds
-- ARGV[3]  optional (Redlock, once a majority still holds the lock): "1" to re-create missing
--          keys with the lock's value, on a master that restarted empty
-- ARGV[4]  optional, only when the metadata changes: "1" to store ARGV[1] in place of the
--          keys' values (behind a waiter's mark, which stays)
--
-- Reply: 1  every key was extended (or re-created)
--        2  no key is another owner's, but some are missing; nothing changed
--        0  some key holds another owner's value, or another type; nothing changed
--        an error: any other error reading a key (the server's own), before anything changed
local value, ttl, restore, rewrite = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4] == '1'
-- (fragments go here)

-- What each key held, kept only for a rewrite (the common path stays as cheap as it was).
local missing, held = false, rewrite and {} or nil
for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  if type(current) == 'table' and string.sub(current.err, 1, 9) ~= 'WRONGTYPE' then
    return current  -- an error other than another type: the server's own message
  end
  if not current then
    missing = true
  elseif not owned(current) then
    return 0
  end
  if held then
    held[i] = current
  end
end
if missing and not restore then
  return 2
end

for i = 1, #KEYS do
  if not (missing and redis.call('SET', KEYS[i], value, 'PX', ttl, 'NX')) then
    if held then
      redis.call('SET', KEYS[i], remarked(held[i], value), 'PX', ttl)
    else
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end
return 1
