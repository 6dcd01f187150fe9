--[[ holds.lua: slot holders held back (a paused or halted group, a group
  out of its rate), halting and rate limits.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"

-- A holder of a paused or halted group, or one out of its rate, waits
-- aside, in order; false if the held list's key is damaged (nothing
-- written).
local function shelve(G, id)
  if wrong_type(redis.pcall('RPUSH', k_held(G.name), id)) then return false end
  set_mark(G, id, '~')
  bump('held', 1)
  return true
end

-- The group may run again: its held-back holders go to the front, in order,
-- then free slots take from the line. Returns how many became runnable.
local function unshelve(G)
  if G.halted or G.paused then return 0 end
  local held = k_held(G.name)
  local ids = redis.pcall('LRANGE', held, 0, -1)
  local n = 0
  if not wrong_type(ids) and #ids > 0 then
    redis.call('DEL', held)
    bump('held', -#ids)
    for i = #ids, 1, -1 do -- front pushes in reverse keep the order
      if mark(G, ids[i]) == '~' then
        set_mark(G, ids[i], '@')
        ready_push(ids[i], true, group_level(G, nil))
        n = n + 1
      end
    end
  end
  return n + fill(G)
end

-- The group stops behind dead task *id* (the "halt" policy) until an
-- operator requeues, purges or releases it.
local function halt(G, id)
  drop_slot(G, id)
  G.halted = id
  redis.call('HSET', G.key, '!', id)
  redis.call('SADD', K_HALTED, G.name)
end

local function unhalt(G)
  G.halted, G.dirty = nil, true
  redis.call('HDEL', G.key, '!')
  redis.call('SREM', K_HALTED, G.name)
  return unshelve(G)
end

-- When the group may start another task under its rate limit: 0 for now,
-- else the server ms; nil if its rate key is damaged.
local function rate_wait(G, now)
  -- The list holds at most rn starts, newest last: the rn-th newest, if
  -- there is one, is the start whose window must pass first.
  local nth = redis.pcall('LINDEX', k_rate(G.name), -G.rn)
  if wrong_type(nth) then return nil end
  if not nth then return 0 end
  local free_at = (tonumber(nth) or 0) + G.rp
  if free_at <= now then return 0 end
  return free_at
end

-- A head out of its group's rate waits aside until the rate frees, when a
-- "~<g>" member of the delayed ZSET brings the group's held heads back.
local function rate_hold(G, id, free_at)
  if not shelve(G, id) then return false end
  if redis.call('ZADD', K_DELAYED, 'NX', free_at, RATE_WAKE .. G.name) == 1 then
    bump('ratewait', 1)
  end
  return true
end

local function rate_record(G, now)
  local key = k_rate(G.name)
  if redis.call('RPUSH', key, now) > G.rn then redis.call('LTRIM', key, -G.rn, -1) end
  redis.call('PEXPIRE', key, G.rp)
end
