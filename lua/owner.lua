-- Ownership, for every script that looks past its fast path: where `value` (the lock's
-- value) is set.
--
-- The owner tag leads every value an owner writes: "<token length>:<token>", which spells out
-- its own length, so it is read off the value instead of being sent beside it (an argument
-- costs the server about half as much as a GET). Since it carries the token's length, a prefix
-- match on it is an exact token match: no token can pass for another that merely starts with
-- it.
local digits = string.match(value, '^%d+')
local n = #digits + 1 + tonumber(digits)
local owner = string.sub(value, 1, n)

-- A waiter's mark: a leading '!' on a string key's value, put there by somebody who waits
-- for the key, so that its release announces itself or hands the key on (mark.lua writes
-- it; a set key is marked by its member "=w" instead).
local MARK, MARK_BYTE = '!', 33

-- Whether a stored value carries a waiter's mark.
local function marked(current)
  return string.byte(current, 1) == MARK_BYTE
end

-- Whether a stored value is ours: whole, by tag, or by tag behind a waiter's mark.
local function owned(current)
  return current == value or (type(current) == 'string' and (string.sub(current, 1, n) == owner
    or (marked(current) and string.sub(current, 2, n + 1) == owner)))
end

-- Whether a value was written by this library: "<token length>:<token>..." with a token as
-- long as it says. Only those are ever marked (and a marked value is not one: it leads with
-- the mark).
local function ours_to_mark(current)
  local digits = string.match(current, '^(%d+):')
  local len = tonumber(digits)
  return len ~= nil and len > 0 and #current >= #digits + 1 + len
end

-- At most this many bytes of a holder's metadata go back to a refused caller (it may be up
-- to 64 KiB, and a waiter may be refused often): HOLDER_SHOWN in src/model/value.rs.
local HOLDER_SHOWN = 256

-- The metadata in another owner's value `current`: what follows its tag, never the token
-- itself, up to HOLDER_SHOWN bytes; nil when there is none, or when the value was not
-- written by this library.
local function metadata_of(current)
  local from = marked(current) and 2 or 1
  local digits = string.match(current, '^%d+', from)
  if not digits or tonumber(digits) == 0
      or string.sub(current, from + #digits, from + #digits) ~= ':' then
    return nil
  end
  local after = from + #digits + 1 + tonumber(digits)
  if after > #current then
    return nil
  end
  return string.sub(current, after, after + HOLDER_SHOWN - 1)
end

-- The reply for KEYS[i], held by another owner for `pttl` more ms: {0, pttl, i}; with
-- `queued` (1 when the waiter queued, else 0) and the holder's metadata after it when its
-- value `current` (nil for a key of shares) has any, so that the refusal can say who holds.
local function held_reply(i, pttl, queued, current)
  local metadata = current and metadata_of(current)
  if metadata then
    return {0, pttl, i, queued, metadata}
  elseif queued == 1 then
    return {0, pttl, i, 1}
  end
  return {0, pttl, i}
end
