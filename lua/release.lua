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
  if type(current) ~= 'string' or string.sub(current, 1, n) ~= owner then
    return 0
  end
end

-- The release channel of a key stays in its cluster slot (see release_channel in Rust):
-- "<key>:released" for a key with a hash tag, "{<key>}:released" for one without, and the
-- key itself when neither keeps the slot.
local function channel(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then
      return key .. ':released'
    end
  end
  if string.find(key, '}', 1, true) then
    return key
  end
  return '{' .. key .. '}:released'
end

for i = 1, #KEYS do
  redis.call('DEL', KEYS[i])
  if publish then
    redis.call(publish, channel(KEYS[i]), '')
  end
end
return 1
