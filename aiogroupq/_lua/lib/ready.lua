--[[ ready.lua: the runnable tasks and the tokens that wake idle fetchers.
  Until a queue uses priorities its runnable ids are the LIST ready (O(1)
  pushes and pops). Once a task or group has a priority, conf pu is set and
  they go to the ZSET pready instead, scored so that ZPOPMIN yields the
  highest priority first and, within a priority, the order a list would
  give. Scores come from pseq, a sequence that never goes back and runs at
  8 per ms of server time, so it also measures waiting time:
    no aging:  (9 - p) * 2^49 + seq for a tail push, (9 - p) * 2^49 - seq for
               a front push (a group's continuation: before the level's tail)
    aging A:   seq - 8 * A * p for a tail push, seq - 8 * A * 10 for a front
               push: a task counts as pushed p * A ms earlier, so a low
               priority waits at most (difference in levels) * A behind
               higher ones
  Tasks a queue's list still holds when priorities come into use are
  claimed after pready's higher levels and before its level 0.
]]
--- @include "base"

local WAKE_CAP = 64 -- tokens beyond this wake nobody that is not already awake
local LEVEL_SPAN = 562949953421312 -- 2^49: levels' score ranges never overlap

-- Make sure at least n (capped) wake tokens wait for blocked fetchers.
local function wake(n)
  if n > WAKE_CAP then n = WAKE_CAP end
  local missing = n - redis.call('LLEN', K_WAKE)
  for _ = 1, missing do redis.call('RPUSH', K_WAKE, '1') end
end

-- A task's priority, read only when priorities are in use.
local function level_of(id)
  if not conf().prio then return 0 end
  local p = redis.pcall('HGET', k_task(id), 'p')
  if wrong_type(p) then return 0 end
  return tonumber(p) or 0
end

--- @per-call
local SEQ
local function seq_next()
  if not SEQ then
    local last = tonumber(redis.call('GET', K_PSEQ)) or 0
    SEQ = math.max(last, now_ms() * 8)
  end
  SEQ = SEQ + 1
  return SEQ
end
flush_seq = function()
  if SEQ then redis.call('SET', K_PSEQ, SEQ) end
end

-- A runnable task joins the tail, or with *front* the head, of its level.
local function ready_push(id, front, level)
  local c = conf()
  if not c.prio then
    if front then redis.call('LPUSH', K_READY, id) else redis.call('RPUSH', K_READY, id) end
    return
  end
  level = level or level_of(id)
  local seq, score = seq_next(), nil
  if c.age then
    score = seq - 8 * c.age * (front and 10 or level)
  elseif front then
    score = (9 - level) * LEVEL_SPAN - seq
  else
    score = (9 - level) * LEVEL_SPAN + seq
  end
  redis.call('ZADD', K_PREADY, score, id)
end

-- What the list still holds was pushed before priorities were in use: all
-- of priority 0 and older than anything in pready, so it goes after the
-- higher levels and before pready's level 0 (with aging: before all of it).
local function pop_ready()
  local c = conf()
  if not c.prio then return redis.call('LPOP', K_READY) end
  if redis.call('LLEN', K_READY) > 0 then
    local top = redis.call('ZRANGE', K_PREADY, 0, 0, 'WITHSCORES')
    if c.age or not top[2] or tonumber(top[2]) >= 9 * LEVEL_SPAN - LEVEL_SPAN / 2 then
      return redis.call('LPOP', K_READY)
    end
  end
  local top = redis.call('ZPOPMIN', K_PREADY)
  if top[1] then return top[1] end
  return redis.call('LPOP', K_READY)
end

-- Remove one waiting entry (cancel); true if it was there.
local function ready_remove(id)
  if conf().prio and redis.call('ZREM', K_PREADY, id) == 1 then return true end
  return redis.call('LREM', K_READY, 1, id) == 1
end

local function ready_len()
  local n = redis.call('LLEN', K_READY)
  if conf().prio then n = n + redis.call('ZCARD', K_PREADY) end
  return n
end

-- (key, type) pairs for preflight: the keys making a task runnable writes
-- (the ready list, or pready and its sequence once priorities are in use;
-- the wake tokens; the counters), then *more*.
local function runnable_keys(more)
  local keys = { K_READY, 'list', K_WAKE, 'list', K_STATS, 'hash' }
  if conf().prio then
    keys[#keys + 1] = K_PREADY; keys[#keys + 1] = 'zset'
    keys[#keys + 1] = K_PSEQ; keys[#keys + 1] = 'string'
  end
  for _, v in ipairs(more or {}) do keys[#keys + 1] = v end
  return keys
end

-- Check the fixed keys a script that moves runnable tasks writes, plus
-- *more* (key, type pairs): nil if all are usable, else the error reply.
local function check_fixed(more)
  local bad = read_conf()
  if bad then return bad end
  local keys = { K_BACKLOG, 'zset', K_WAITING, 'zset' }
  for _, v in ipairs(more or {}) do keys[#keys + 1] = v end
  return preflight(runnable_keys(keys))
end
