-- The admission rule, the one place that says whether a key may be taken in a mode now: by
-- modes_obtain.lua, and by a release's hand-off to a waiter (handoff.lua). Needs clock.lua.
--
-- A shared or counted key is a sorted set (see modes_args.lua) of its mode member ("=s" or
-- "=p<N>", score -inf), maybe "=w" (somebody waits, score -inf), maybe "=x" (a writer waits
-- for the holders to leave, scored by until when), and its holders scored by when they
-- expire. Members whose score has passed count for nothing, pruned or not.

-- The mode member ('=s' or '=p<N>') of a set this library wrote at KEY, if any; a set in
-- MODE (as asked for) is found with one command.
local function set_mode(key, mode)
  if mode and mode ~= 'x' and redis.call('ZSCORE', key, '=' .. mode) then
    return '=' .. mode
  end
  local meta = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf')
  for j = 1, #meta do
    if meta[j] == '=s' or string.match(meta[j], '^=p%d+$') then
      return meta[j]
    end
  end
  return nil
end

-- What KEY is: "free", "string", "set" (with its mode member, see set_mode) or "foreign"
-- (another type, or a set this library did not write).
local function kind(key, mode)
  local type = redis.call('TYPE', key)['ok']
  if type == 'none' then
    return 'free'
  elseif type == 'string' then
    return 'string'
  elseif type == 'zset' then
    local stored = set_mode(key, mode)
    if stored then
      return 'set', stored
    end
  end
  return 'foreign'
end

-- How many hold set KEY now (a waiting writer is no holder), and until when a writer waits
-- for them to leave (nil: none does).
local function holders_of(key)
  local now = now_ms()
  local score = redis.call('ZSCORE', key, '=x')
  local writer = score and tonumber(score) > now and tonumber(score) or nil
  local live = redis.call('ZCOUNT', key, string.format('(%.3f', now), '+inf')
  return live - (writer and 1 or 0), writer
end

-- May set KEY, stored in mode STORED, be taken in MODE ('x', 's' or 'p<N>') now, by a lock
-- that WRITES (holds some key exclusive) or not? Returns the verdict, until when a waiting
-- writer waits (or nil), and how many hold KEY:
--   'take'    yes: nobody holds KEY (any mode replaces the set), or it is held in MODE with
--             room for one more (any number of shared holders; fewer than N permit holders)
--   'writer'  no, writers first: a writer waits for KEY's holders to leave, and a lock that
--             writes nothing gets in no sooner. A lock that writes some key reads past it: it
--             may itself be the writer another such lock reads past, and two locks that each
--             waited for the other's writer would wait forever
--   'full'    no: every one of KEY's N permits is held
--   'other'   no: KEY is held in another mode (also: any holder keeps out MODE 'x')
local function admit(key, stored, mode, writes)
  local holders, writer = holders_of(key)
  if holders == 0 then
    if writer and not writes then
      return 'writer', writer, holders
    end
    return 'take', writer, holders
  elseif mode == 'x' or stored ~= '=' .. mode then
    return 'other', writer, holders
  elseif writer and not writes then
    return 'writer', writer, holders
  elseif mode ~= 's' and holders >= tonumber(string.sub(mode, 2)) then
    return 'full', writer, holders
  end
  return 'take', writer, holders
end
