-- The smallest remaining TTL of a lock with modes (see modes_args.lua for the arguments and
-- the reply).
-- (fragments go here)

local failed, states = check_all(-2, -3, false)
if failed then
  return failed
end
local least = -1
for i = 1, count do
  local left
  if modes[i] == 'x' then
    left = redis.call('PTTL', KEYS[i])
  else
    left = math.ceil(states[i][3] - now)
  end
  if left >= 0 and (least < 0 or left < least) then
    least = left
  end
end
return least
