-- The server's clock, the one every script reads: asked once per script (TIME), and only by
-- a script that needs it (a hand-off of exclusive keys does not). Scripts replicate their
-- effects, so TIME is allowed.
local server_time = nil

-- TIME's reply: {seconds, microseconds} as strings (fence.lua keeps every digit).
local function clock()
  if not server_time then
    server_time = redis.call('TIME')
  end
  return server_time
end

-- The clock in ms (with microseconds), as sets score their holders and queues their
-- waiters.
local function now_ms()
  local time = clock()
  return tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
end
