-- Deletes every key of a lock, only if every key is still held by the owner, and announces
-- the release so that waiters can try at once instead of polling.
--
-- ARGV[1]  owner tag: "<token length>:<token>"
-- ARGV[2]  optional: "PUBLISH" or "SPUBLISH", to announce each key on its release channel
--
-- Reply: 1 when the keys were deleted, 0 when the lock is not held (nothing changed).
local owner, publish = ARGV[1], ARGV[2]
local n = #owner

for i = 1, #KEYS do
  local current = redis.pcall('GET', KEYS[i])
  -- Most values are the bare tag (no metadata): compare whole strings before slicing.
  if current ~= owner and (type(current) ~= 'string' or string.sub(current, 1, n) ~= owner) then
    return 0
  end
end

for i = 1, #KEYS do
  redis.call('DEL', KEYS[i])
  if publish then
    -- A key's release channel is named like the key (a separate namespace), which keeps
    -- it in the key's cluster slot for sharded pub/sub at no cost.
    redis.call(publish, KEYS[i], '')
  end
end
return 1
