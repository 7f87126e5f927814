-- Deletes every key of a lock with modes, handing each on to its queue's waiters (see
-- modes_args.lua for the arguments and the reply); a fair waiter that gives up leaves its
-- queues through it too.
-- (fragments go here)

local announce, payload, notice, leaving = ARGV[5], ARGV[6], ARGV[7] or 'PUBLISH', ARGV[8]
if not redis7 then
  announce = announce == 'SPUBLISH' and 'PUBLISH' or announce
  notice = notice == 'SPUBLISH' and 'PUBLISH' or notice
end
-- A fair waiter that gives up leaves its queues (and releases what it was handed). A
-- release names no fencing counter: KEYS are the lock's keys.
if leaving and leaving ~= '' and queue_of(KEYS[1]) then
  settle(dequeue, record_of(KEYS, leaving), KEYS)
end
if ARGV[9] == '1' then
  return 1
end
local failed, states = check_all(0, 2, false)
if failed then
  return failed
end
local waited = {}
for i = 1, count do
  local key, mode = KEYS[i], modes[i]
  if mode == 'x' then
    redis.call('DEL', key)
    waited[i] = marked(states[i][2])
  else
    redis.call('ZREM', key, states[i][2])
    local last, holder = latest(key)
    -- Room was made for a waiter: a permit, or a key that no holder shares any more.
    waited[i] = (mode ~= 's' or not holder) and redis.call('ZSCORE', key, '=w') ~= false
    if not last then
      redis.call('DEL', key)
    elseif states[i][3] > last then
      redis.call('PEXPIRE', key, math.max(1, math.ceil(last - now)))
    end
  end
end
-- Every key is let go before any is handed on: a waiter may want several of them.
local released = {}
for i = 1, (count > 1 and count or 0) do
  released[KEYS[i]] = true
end
-- Waiters that queue for a key mark it as any waiter does ('!', '=w'), and room is made
-- for them only where `waited` says so: a reader's release that leaves other readers lets
-- no waiter in that another key of this release does not.
-- A hand-off that fails part-way (see settle) announces: the release is done.
for i = 1, count do
  local handed = waited[i] and select(2, pcall(hand_off, KEYS[i], released, notice, false))
  if waited[i] and handed ~= true and announce ~= '' then
    redis.pcall(announce, KEYS[i], payload)
  end
end
return 1
