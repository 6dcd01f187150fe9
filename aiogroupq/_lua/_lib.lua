--[[ _lib.lua: helpers prepended to every script (never run alone).
  Every script shares this KEYS/ARGV prefix:
  KEYS[1]  {aiogroupq:<q>}:ready     LIST runnable task ids, head first
  KEYS[2]  {aiogroupq:<q>}:delayed   ZSET id -> due time (server ms)
  KEYS[3]  {aiogroupq:<q>}:leases    ZSET id -> lease deadline (server ms)
  KEYS[4]  {aiogroupq:<q>}:wake      LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]  {aiogroupq:<q>}:fence     STRING counter of fencing tokens
  KEYS[6]  {aiogroupq:<q>}:dead      ZSET id -> time dead-lettered (server ms)
  ARGV[1]  key prefix "{aiogroupq:<q>}:" for the per-task and per-group keys

  Per-task and per-group keys are built from the prefix (they share its hash
  tag, so they live in the same cluster slot); _keys.py builds the same names.

  Group invariant kept by every script: the lock key of group g exists exactly
  while g has a task that is running (value = fencing token), or that is its
  head waiting in the ready list or in its retry backoff (value = "@" .. id),
  or while g is halted by a dead-lettered head (value = "!" .. id, the "halt"
  policy, until an operator requeues or releases it). Every later task of g
  waits in park:g, oldest first. So a group has at most one entry in the ready
  list, and the claim never scans past a busy group.
]]
local K_READY, K_DELAYED, K_LEASES, K_WAKE, K_FENCE, K_DEAD =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local PREFIX = ARGV[1]
local WAKE_CAP = 64 -- tokens beyond this wake nobody that is not already awake

local function k_task(id) return PREFIX .. 't:' .. id end
local function k_lock(g) return PREFIX .. 'lock:' .. g end
local function k_park(g) return PREFIX .. 'park:' .. g end
local function k_inflight(c) return PREFIX .. 'inflight:' .. c end
local function k_dedup(d) return PREFIX .. 'dedup:' .. d end
local function k_done(id) return PREFIX .. 'done:' .. id end

-- Server time in ms, rounded down; *up* rounds up instead, for computing a
-- due time, so that "due" is never before enqueue time + delay.
local function now_ms(up)
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
  if up then return math.ceil(ms) end
  return math.floor(ms)
end

-- Make sure at least n (capped) wake tokens wait for blocked fetchers.
local function wake(n)
  if n > WAKE_CAP then n = WAKE_CAP end
  local missing = n - redis.call('LLEN', K_WAKE)
  for _ = 1, missing do redis.call('RPUSH', K_WAKE, '1') end
end

-- A runnable task joins its group's order: the group's head if the group is
-- idle (to the ready list's tail), else the tail of the group's parked list.
-- Returns true when the ready list grew.
local function route(id, g)
  if not g then
    redis.call('RPUSH', K_READY, id)
    return true
  end
  local lock = k_lock(g)
  if redis.call('EXISTS', lock) == 1 then
    redis.call('RPUSH', k_park(g), id)
    return false
  end
  redis.call('SET', lock, '@' .. id)
  redis.call('RPUSH', K_READY, id)
  return true
end

-- Put a task back at the very front as its group's head (hand-back, recovery).
local function requeue_front(id, g)
  if g then redis.call('SET', k_lock(g), '@' .. id) end
  redis.call('LPUSH', K_READY, id)
  redis.call('HSET', k_task(id), 's', 'queued')
end

-- The group's current task is done for good: pass the group to the oldest
-- parked task (at the front of the ready list), or free it.
-- Returns true when the ready list grew.
local function release(g)
  if not g then return false end
  local nxt = redis.call('LPOP', k_park(g))
  if nxt then
    redis.call('SET', k_lock(g), '@' .. nxt)
    redis.call('LPUSH', K_READY, nxt)
    return true
  end
  redis.call('DEL', k_lock(g))
  return false
end

-- Stop tracking a claimed task's lease and its owner's recovery key.
local function drop_lease(id, owner)
  redis.call('ZREM', K_LEASES, id)
  if owner then redis.call('SREM', k_inflight(owner), id) end
end

-- Wake whoever waits for this task's end (Producer.result), if anyone does:
-- a waiter marks the task with field w before it blocks on done:<id>.
-- *waited*: the caller's read of w, or nil to read it here.
local function notify(id, key, waited)
  if waited == nil then waited = redis.call('HEXISTS', key, 'w') == 1 end
  if waited then
    local done = k_done(id)
    redis.call('RPUSH', done, '1')
    redis.call('PEXPIRE', done, 300000)
  end
end

-- Shortest life of a finished task's hash: a re-sent finish must still find
-- its token there to be answered "already applied", not "lease lost".
local MIN_RETENTION = 60000

-- A terminal state that expires after the retention window; *token* (the
-- finishing claim's, kept so a re-sent finish is recognised) and *result*
-- are written with it when given, *waited* as for notify().
local function conclude(id, state, now, retention, waited, token, result)
  local key = k_task(id)
  notify(id, key, waited)
  if result then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token, 'r', result)
  elseif token then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token)
  else
    redis.call('HSET', key, 's', state, 'ft', now)
  end
  redis.call('HDEL', key, 'e', 'c')
  redis.call('PEXPIRE', key, math.max(retention, MIN_RETENTION))
end

-- Terminal state "dead": keep the envelope for inspection and requeue, until
-- purged. With halt, the group stops behind it (lock "!" .. id) instead of
-- passing on. Returns true if the ready list grew.
local function bury(id, g, now, reason, trace, halt)
  local key = k_task(id)
  redis.call('HSET', key, 's', 'dead', 'x', reason, 'tb', trace, 'ft', now)
  redis.call('HDEL', key, 'c')
  redis.call('ZADD', K_DEAD, now, id)
  notify(id, key)
  if halt and g then
    redis.call('SET', k_lock(g), '!' .. id)
    return false
  end
  return release(g)
end

-- The one recovery path (expired lease, restarted owner, lost claim reply):
-- the task goes back to the very front of its group, or, when counted and
-- past its last attempt, to the dead letters; a task whose cancellation was
-- requested ends cancelled. Returns true if the ready list grew.
local function recover(id, now, why, counted)
  local key = k_task(id)
  local f = redis.call('HMGET', key, 'g', 'a', 'm', 'c', 's', 'cx')
  drop_lease(id, f[4])
  if f[5] ~= 'running' then return false end
  redis.call('HDEL', key, 'c')
  if f[6] then -- cancellation was requested: honour it instead of a rerun
    conclude(id, 'cancelled', now, 0)
    return release(f[1])
  end
  local attempt, max_attempts = tonumber(f[2] or 0), tonumber(f[3] or 1)
  if not counted then
    redis.call('HINCRBY', key, 'a', -1)
  elseif attempt >= max_attempts then
    return bury(id, f[1], now, why .. ' on the last attempt (' .. attempt .. ' of ' ..
      max_attempts .. '); consumer ' .. tostring(f[4]), '')
  end
  requeue_front(id, f[1])
  return true
end
