-- Extends every key of a lock with modes (see modes_args.lua for the arguments and the
-- reply).
-- (fragments go here)

local ttl, restore, rewrite = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7] == '1'
local failed, states = check_all(0, 2, restore)
if failed then
  return failed
end
-- Missing keys are re-created (a Redlock master that restarted empty) only where there
-- is room for all of them; else nothing changes.
for i = 1, count do
  local key, mode = KEYS[i], modes[i]
  if states[i][1] == 'missing' and mode ~= 'x' and mode ~= 's' then
    if kind(key, mode) == 'set' and holders_of(key) >= tonumber(string.sub(mode, 2)) then
      return 2
    end
  end
end
for i = 1, count do
  local key, mode, found = KEYS[i], modes[i], states[i][1]
  local stored = states[i][2]
  if mode == 'x' then
    if found ~= 'ours' then
      redis.call('SET', key, value, 'PX', ttl)
    elseif rewrite and stored ~= value then
      redis.call('SET', key, remarked(stored, value), 'PX', ttl)
    else
      redis.call('PEXPIRE', key, ttl)
    end
  elseif found == 'ours' and rewrite and stored ~= value then
    redis.call('ZREM', key, stored)
    join_set(key, mode, value, now + ttl, false, false)
  elseif found == 'ours' then
    join_set(key, mode, stored, now + ttl, false, false)
  else
    join_set(key, mode, value, now + ttl, true, redis.call('EXISTS', key) == 0)
  end
end
return 1
