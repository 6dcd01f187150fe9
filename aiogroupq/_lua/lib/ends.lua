--[[ ends.lua: a task's terminal states, and the one recovery path.
  Terminal states: succeeded, cancelled and expired expire after the
  retention window (never sooner than a minute, so that a re-sent finish
  still finds its token); dead stays until purged. Each ends the task's
  count in its group and frees a unique dedup key held by it.
  An ended task's envelope goes (a payload may be large, and is kept only
  by a dead letter); what identifies the task stays in i, written at
  enqueue ("<enqueue ms> <payload size> <type>", one small field), so that
  ending a task reads nothing of its envelope; dt (when it last became
  runnable) and cl (its latest claim) go with the envelope.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "holds"

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
  redis.call('HDEL', key, 'e', 'c', 'xp', 'dt', 'cl')
  redis.call('PEXPIRE', key, math.max(retention, MIN_RETENTION))
  bump(state, 1) -- succeeded, cancelled, expired: each its own counter
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
