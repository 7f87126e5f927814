-- Fencing tokens, for obtain.lua and modes_obtain.lua (needs clock.lua).
--
-- mint(counter, epoch) increments the counter and returns the new token as a decimal string,
-- or an error reply (WRONGTYPE, a counter that is not an integer or not positive, ...). The
-- token is the counter plus one or, when that is higher, the server's clock in microseconds,
-- led by the primary's configuration epoch (its digits, then the clock in 16 digits; the
-- clock alone for epoch 0). So tokens keep increasing when the counter is lost or comes back
-- older (a restart without persistence, an old snapshot, a replica promoted while behind) as
-- long as the clock does not go back, and across a Sentinel failover, which raises the
-- epoch, also when the promoted replica's clock is behind the old primary's. Everything is
-- done on decimal strings: tokens above 2^53 are not exact in Lua's numbers.
local function greater(a, b)
  return #a > #b or (#a == #b and a > b)
end

local function mint(counter, epoch)
  local incremented = redis.pcall('INCR', counter)
  if type(incremented) == 'table' then
    return incremented
  end
  if incremented < 1 then
    return redis.error_reply('ERR fencing counter ' .. counter .. ' is ' .. incremented .. ', not positive')
  end
  -- Every command by pcall: a refused one (the ACL) comes back as the error it is, for the
  -- caller to undo the lock's keys; raised, it would end the script with them written.
  local fence = redis.pcall('GET', counter)
  if type(fence) == 'table' then
    return fence
  end
  local time = clock_or_error()
  if time.err then
    return time
  end
  local micros = time[1] .. string.format('%06d', tonumber(time[2]))
  if epoch > 0 then
    micros = epoch .. string.rep('0', 16 - #micros) .. micros
  end
  if greater(micros, fence) then
    local set = redis.pcall('SET', counter, micros)
    if set.err then
      return set
    end
    fence = micros
  end
  return fence
end
