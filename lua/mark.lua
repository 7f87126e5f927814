-- Marking and re-obtaining, the one place where a waiter's mark (owner.lua) is written or
-- carried over to a new value.

-- Marks string KEY, whose holder's value is CURRENT, so that its release announces itself
-- (or hands on); only a value this library wrote, and not marked yet.
local function mark_value(key, current)
  if ours_to_mark(current) then
    redis.call('SET', key, MARK .. current, 'KEEPTTL')
  end
end

-- Marks set KEY: somebody waits, so a release that makes room announces it.
local function mark_set(key)
  redis.call('ZADD', key, '-inf', '=w')
end

-- NEW, to be stored in place of CURRENT: behind CURRENT's mark, if it has one (a waiter
-- still waits).
local function remarked(current, new)
  return marked(current) and MARK .. new or new
end

-- A re-obtain by this owner of string KEY, which holds CURRENT: our value, marked as CURRENT
-- was, and never for less than KEY has left (a re-obtain never shortens what an earlier
-- obtain by the same token was told). TTL: ms, a number.
local function renew(key, current, ttl)
  local stored = remarked(current, value)
  local left = redis.call('PTTL', key)
  if left >= 0 and left < ttl then
    redis.call('SET', key, stored, 'PX', ttl)
  else
    redis.call('SET', key, stored, 'KEEPTTL')
  end
end
