--[[ recovery.lua: the one recovery path, shared by the claim (expired
  leases) and recover.lua (a restarted consumer, a lost claim reply).
]]
--- @include "base"
--- @include "ends"

-- The one recovery path (expired lease, restarted owner, lost claim reply):
-- the running task goes back to the front of its group, or, when counted
-- and past its last attempt, to the dead letters; a task whose cancellation
-- was requested ends cancelled. Returns what became of it ('ready', 'dead',
-- 'cancelled' or nil for nothing to recover), a problem to report, if a
-- damaged key was met, and the reason a dead-lettered task got (for the
-- consumer's log line).
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
    local reason = damage_reason('a key of group ' .. g .. ' is damaged')
    bury(id, nil, false, now, reason, '')
    return 'dead', 'a key of group ' .. g .. ' is damaged', reason
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
    local reason = why .. ' on the last attempt (' .. attempt .. ' of ' ..
      max_attempts .. '); consumer ' .. tostring(f[4])
    bury(id, G, true, now, reason, '')
    return 'dead', nil, reason
  end
  continue_front(G, id, tonumber(f[7]) or 0)
  if counted then
    -- A new attempt: its pickup latency runs from now, not from the
    -- attempt that died. An uncounted recovery never started: it keeps its own.
    redis.call('HSET', key, 's', 'queued', 'dt', now)
  else
    redis.call('HSET', key, 's', 'queued')
  end
  return 'ready'
end
