--[[ recovery.lua: the one recovery path, shared by the claim (expired
  leases) and recover.lua (a restarted consumer, a lost claim reply).
]]
--- @include "base"
--- @include "ends"
--- @include "batch"

-- The one recovery path (expired lease, restarted owner, lost claim reply):
-- the running task goes back to the front of its group, or, when counted
-- and past its last attempt, to the dead letters; a task whose cancellation
-- was requested ends cancelled. Returns what became of it ('ready', 'dead',
-- 'cancelled' or nil for nothing to recover), a problem to report, if a
-- damaged key was met, and the reason a dead-lettered task got (for the
-- consumer's log line). A task of a batch (lib/batch.lua) brings its whole
-- batch back: the members to the front of the line, the head as any task;
-- what became of the head is then returned, its id fourth. A member whose
-- head still runs (its lease holds, or it is in *keep*: recover.lua's tasks
-- the consumer still runs) is left as it is, lease and recovery-key entry
-- included, and 'kept' returned: recovering it alone would let it overtake
-- its batch, and recovering its batch would take the head from a live
-- consumer. It is recovered with its batch once the head's lease runs out,
-- or lined by the head's finish (finish.lua).
local function head_holds(head, now, keep)
  if task_field(head, 's') ~= 'running' then return false end
  return (keep ~= nil and keep[head] == true) or (score(K_LEASES, head) or 0) > now
end
local function recover(id, now, why, counted, retention, keep)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 'g', 'a', 'm', 'c', 's', 'cx', 'p', 'bh', 'bm')
  if not wrong_type(f) and f[8] and f[5] == 'running' and head_holds(f[8], now, keep) then
    return 'kept'
  end
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
  if G and (f[8] or f[9]) then
    line_batch(f[8] or id, G, now, retention)
    if f[8] then -- a member: lined with its batch (or alone), then its head
      line_member(id, f[8], G, now, retention)
      if task_field(f[8], 's') == 'running' then
        local became, problem, reason = recover(f[8], now, why, counted, retention)
        return became, problem, reason, f[8]
      end
      return fill(G) > 0 and 'ready' or nil
    end
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
