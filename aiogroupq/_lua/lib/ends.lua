--[[ ends.lua: a task's terminal states, and the one recovery path.
  Terminal states: succeeded, cancelled and expired expire after the
  retention window (never sooner than a minute, so that a re-sent finish
  still finds its token); dead stays until purged. Each ends the task's
  count in its group and frees a unique dedup key held by it.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"

-- Shortest life of a finished task's hash: a re-sent finish must still find
-- its token there to be answered "already applied", not "lease lost".
local MIN_RETENTION = 60000

-- Wake whoever waits for this task's end (Producer.result), if anyone does:
-- a waiter marks the task with field w before it blocks on done:<id>.
-- *waited*: the caller's read of w, or nil to read it here.
local function notify(id, key, waited)
  if waited == nil then waited = redis.call('HEXISTS', key, 'w') == 1 end
  if waited then
    local done = k_done(id)
    if not wrong_type(redis.pcall('RPUSH', done, '1')) then
      redis.call('PEXPIRE', done, 300000)
    end
  end
end

-- A unique dedup key (enqueue with unique=True) is free again at the end.
local function free_unique(id, key)
  if not conf().unique then return end
  local u = redis.call('HGET', key, 'u')
  if u and redis.pcall('GET', k_dedup(u)) == id then redis.call('DEL', k_dedup(u)) end
end

local COUNTER = { succeeded = 'succeeded', cancelled = 'cancelled', expired = 'expired' }

-- A terminal state that expires after the retention window; *token* (the
-- finishing claim's, kept so a re-sent finish is recognised) and *result*
-- are written with it when given, *waited* as for notify().
local function conclude(id, state, now, retention, waited, token, result)
  local key = k_task(id)
  notify(id, key, waited)
  free_unique(id, key)
  if result then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token, 'r', result)
  elseif token then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token)
  else
    redis.call('HSET', key, 's', state, 'ft', now)
  end
  redis.call('HDEL', key, 'e', 'c', 'xp')
  redis.call('PEXPIRE', key, math.max(retention, MIN_RETENTION))
  bump(COUNTER[state], 1)
end

-- Terminal state "dead": keep the envelope for inspection and requeue, until
-- purged. A slot *holder* passes its slot on, or with *halt_it* the group
-- stops behind it. Returns how many tasks became runnable.
local function bury(id, G, holder, now, reason, trace, halt_it)
  local key = k_task(id)
  redis.call('HSET', key, 's', 'dead', 'x', reason, 'tb', trace, 'ft', now)
  redis.call('HDEL', key, 'c', 'xp')
  redis.call('ZADD', K_DEAD, now, id)
  notify(id, key)
  free_unique(id, key)
  bump('dead', 1)
  if not (G and holder) then return 0 end
  if halt_it then
    halt(G, id)
    return 0
  end
  return release(G, id)
end

-- The reason a task with damaged keys is dead-lettered with.
local function damage_reason(what)
  return 'Corrupt: ' .. what .. ' (run "aiogroupq check --repair")'
end

-- A task not started before its expiry time ends "expired" and never runs.
local function expire(id, G, holder, now, retention)
  redis.call('HSET', k_task(id), 'x', 'Expired: not started before its expiry time')
  conclude(id, 'expired', now, retention)
  if G and holder then return release(G, id) end
  return 0
end

-- The one recovery path (expired lease, restarted owner, lost claim reply):
-- the running task goes back to the front of its group, or, when counted
-- and past its last attempt, to the dead letters; a task whose cancellation
-- was requested ends cancelled. Returns what became of it ('ready', 'dead',
-- 'cancelled' or nil for nothing to recover) and a problem to report, if a
-- damaged key was met.
local function recover(id, now, why, counted, retention)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 'g', 'a', 'm', 'c', 's', 'cx', 'p')
  redis.call('ZREM', K_LEASES, id)
  if wrong_type(f) then return nil, key .. ' is not a task hash (' .. f.err .. ')' end
  if f[4] then redis.pcall('SREM', k_inflight(f[4]), id) end
  if f[5] ~= 'running' then return nil end
  local g = f[1]
  local G = g and group(g)
  redis.call('HDEL', key, 'c')
  if g and not G then
    bury(id, nil, false, now, damage_reason('a key of group ' .. g .. ' is damaged'), '')
    return 'dead', 'a key of group ' .. g .. ' is damaged'
  end
  if f[6] then
    conclude(id, 'cancelled', now, retention)
    if G then release(G, id) end
    return 'cancelled'
  end
  local attempt, max_attempts = tonumber(f[2]) or 0, tonumber(f[3]) or 1
  if counted then bump('recovered', 1) end
  if not counted then
    incr(key, 'a', -1)
  elseif attempt >= max_attempts then
    bury(id, G, true, now, why .. ' on the last attempt (' .. attempt .. ' of ' ..
      max_attempts .. '); consumer ' .. tostring(f[4]), '')
    return 'dead'
  end
  continue_front(G, id, tonumber(f[7]) or 0)
  redis.call('HSET', key, 's', 'queued')
  return 'ready'
end
