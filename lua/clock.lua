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

-- As clock, but a refused TIME (the ACL, a renamed command) comes back as its error reply
-- instead of ending the script: for a caller with keys of its own to undo first.
local function clock_or_error()
  if server_time then
    return server_time
  end
  local time = redis.pcall('TIME')
  if not time.err then
    server_time = time
  end
  return time
end

-- The clock in ms (with microseconds), as sets score their holders and queues their
-- waiters.
local function now_ms()
  local time = clock()
  return tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
end
