--[[ slots.lua: a group's state: its slots, counts and settings, read once
  per call and written back at its end (groups.lua moves a group's tasks).
  grp:<g>    HASH, exists while g has live tasks or is halted:
               k       slots held: tasks of g that are running or next to run
                       (ready, in a retry's backoff, waiting for the rate
                       limit, or held back while g is paused or halted)
               d       tasks of g still in their first delay (not in line yet),
                       or, in an exclusive group, in a retry's backoff
               w       tasks waiting in g's line park:<g>
               !       the dead task g is halted behind
               tn      turns g's line has kept the ready front in a row
                       (only while g's weight is above 1: groups.lua)
               h:<id>  one per slot holder: '@' ready, its fencing token while
                       running, 'r' retry backoff, '~' held back
  park:<g>   LIST g's line, oldest first
  held:<g>   LIST holders held back while g is paused, halted or out of its
             rate, in order; a rate-limited group has a member "~<g>" in the
             delayed ZSET, due when the rate frees (task ids are hex)
  gconf:<g>  HASH g's own settings: c concurrency, rn/rp rate (rn starts per
             rp ms, rn 0: none), mx most live tasks, pr default priority,
             p paused, wt weight (1-100: turns a round: wt - 1 at the ready front, one at its tail),
             o ordering: "exclusive" (a retry's backoff holds no slot), else
             strict
  rate:<g>   LIST server ms of g's latest starts (at most rn), PX rp
  backlog    ZSET group -> w, for groups with a line
  waiting    ZSET group -> since when its line is not empty (server ms)
]]
--- @include "base"

local MAX_WEIGHT = 100
--- @per-call
local GROUPS = {}

-- A stored weight, if it is one Admin could have written (the check reports
-- any other, which counts as unset).
local function weight_of(v)
  if type(v) ~= 'string' or not string.find(v, '^%d+$') then return nil end
  local n = tonumber(v)
  if n >= 1 and n <= MAX_WEIGHT then return n end
  return nil
end

-- A group's state and settings, read once per call; false if its state or
-- settings key is damaged (the caller then leaves the group alone). With
-- *id*, the same read fetches that task's mark, returned second (claim's
-- path: one read per group instead of two).
local function group(g, id)
  local G = GROUPS[g]
  if G ~= nil then
    if id and G then return G, redis.call('HGET', G.key, 'h:' .. id) end
    return G
  end
  local key = k_group(g)
  local st
  if id then
    st = redis.pcall('HMGET', key, 'k', 'd', 'w', '!', 'h:' .. id)
  else
    st = redis.pcall('HMGET', key, 'k', 'd', 'w', '!')
  end
  local k, d, w
  if not wrong_type(st) then
    k, d, w = tonumber(st[1] or 0), tonumber(st[2] or 0), tonumber(st[3] or 0)
  end
  if not (k and d and w) then
    GROUPS[g] = false
    return false
  end
  local c = conf()
  G = { name = g, key = key, k = k, d = d, w = w, w0 = w, halted = st[4] or nil,
        limit = c.conc, rn = c.rn, rp = c.rp, paused = false, wt = weight_of(c.wt) or 1 }
  G.existed = k > 0 or d > 0 or w > 0 or G.halted ~= nil
  if c.gconf then
    local cf = redis.pcall('HMGET', k_gconf(g), 'c', 'rn', 'rp', 'mx', 'pr', 'p', 'wt', 'o')
    if wrong_type(cf) then
      GROUPS[g] = false
      return false
    end
    G.limit = tonumber(cf[1]) or G.limit
    if cf[2] then G.rn, G.rp = tonumber(cf[2]), tonumber(cf[3]) end
    G.mx, G.prio, G.paused = tonumber(cf[4]), tonumber(cf[5]), cf[6] == '1'
    G.wt = weight_of(cf[7]) or G.wt -- unset or bad: the queue's default
    G.exclusive = cf[8] == 'exclusive'
  end
  if G.rn == 0 or not G.rp then G.rn = nil end
  GROUPS[g] = G
  if id then return G, st[5] end
  return G
end

-- Scripts that set this (finish) leave a dropped slot's mark in the group's
-- hash until flush, which deletes it with the others (one HDEL), or not at
-- all when the whole hash goes (an emptied group: most ends of a task in a
-- group of its own). Such a script reads marks only through mark().
--- @per-call
local DEFER_DROPS = false

-- Counters are written once per call; an empty group's hash goes away.
flush_groups = function()
  for g, G in pairs(GROUPS) do
    if G and G.dirty then
      if G.k < 0 then G.k = 0 end
      local alive = G.k > 0 or G.d > 0 or G.w > 0 or G.halted ~= nil
      if alive then
        if G.tn then -- a weighted group's turns, read only then (groups.lua)
          redis.call('HSET', G.key, 'k', G.k, 'd', G.d, 'w', G.w, 'tn', G.tn)
        else
          redis.call('HSET', G.key, 'k', G.k, 'd', G.d, 'w', G.w)
        end
        if G.drops and next(G.drops) then
          local fields = {}
          for id in pairs(G.drops) do fields[#fields + 1] = 'h:' .. id end
          call_many(redis.call, 'HDEL', G.key, fields)
        end
      else
        redis.call('DEL', G.key)
      end
      G.drops = nil
      if alive ~= G.existed then bump('groups', alive and 1 or -1) end
      if G.w ~= G.w0 then
        if G.w > 0 then
          redis.call('ZADD', K_BACKLOG, G.w, g)
          if G.w0 == 0 then redis.call('ZADD', K_WAITING, 'NX', now_ms(), g) end
        else
          redis.call('ZREM', K_BACKLOG, g)
          redis.call('ZREM', K_WAITING, g)
        end
      end
      G.existed, G.w0, G.dirty = alive, G.w, false
    end
  end
end

local function mark(G, id)
  if G.drops and G.drops[id] then return false end
  return redis.call('HGET', G.key, 'h:' .. id)
end
local function set_mark(G, id, m)
  if G.drops then G.drops[id] = nil end
  redis.call('HSET', G.key, 'h:' .. id, m)
end

local function take_slot(G, id, m)
  G.k, G.dirty = G.k + 1, true
  set_mark(G, id, m)
end

local function drop_slot(G, id)
  G.k, G.dirty = G.k - 1, true
  if DEFER_DROPS then
    G.drops = G.drops or {}
    G.drops[id] = true
  else
    redis.call('HDEL', G.key, 'h:' .. id)
  end
end

-- The level a holder of G waits at: its own (nil: read it), unless G has
-- several heads at once, which keep their order at the group's level.
local function group_level(G, level)
  if G and G.limit > 1 then return G.prio or 0 end
  return level
end

-- A new task may take a slot at once: one is free and nobody waits before it.
local function has_room(G)
  return not G.halted and not G.paused and G.k < G.limit and G.w == 0
end
