--[[ groups.lua: a group's slots and its line.
  grp:<g>    HASH, exists while g has live tasks or is halted:
               k       slots held: tasks of g that are running or next to run
                       (ready, in a retry's backoff, waiting for the rate
                       limit, or held back while g is paused or halted)
               d       tasks of g still in their first delay (not in line yet)
               w       tasks waiting in g's line park:<g>
               !       the dead task g is halted behind
               h:<id>  one per slot holder: '@' ready, its fencing token while
                       running, 'r' retry backoff, '~' held back
  park:<g>   LIST g's line, oldest first
  held:<g>   LIST holders held back while g is paused, halted or out of its
             rate, in order; a rate-limited group has a member "~<g>" in the
             delayed ZSET, due when the rate frees (task ids are hex)
  gconf:<g>  HASH g's own settings: c concurrency, rn/rp rate (rn starts per
             rp ms, rn 0: none), mx most live tasks, pr default priority,
             p paused
  rate:<g>   LIST server ms of g's latest starts (at most rn), PX rp
  backlog    ZSET group -> w, for groups with a line
  waiting    ZSET group -> since when its line is not empty (server ms)

  Invariant: a group has a line only while it holds all its slots (its
  concurrency, 1 by default), or it is paused or halted. Tasks take slots
  in line order, so a group's tasks start in enqueue order, and with
  concurrency 1 never overlap. A group's live tasks number k + d + w.
  Priorities order the groups' heads; a group with concurrency above 1 has
  several, so they all wait at the group's priority (pr, else 0), and a
  later one never overtakes an earlier one.
]]
--- @include "base"
--- @include "ready"

local GROUPS = {}

-- A group's state and settings, read once per call; false if its state or
-- settings key is damaged (the caller then leaves the group alone).
local function group(g)
  local G = GROUPS[g]
  if G ~= nil then return G end
  local key = k_group(g)
  local st = redis.pcall('HMGET', key, 'k', 'd', 'w', '!')
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
        limit = c.conc, rn = c.rn, rp = c.rp, paused = false }
  G.existed = k > 0 or d > 0 or w > 0 or G.halted ~= nil
  if c.gconf then
    local cf = redis.pcall('HMGET', k_gconf(g), 'c', 'rn', 'rp', 'mx', 'pr', 'p')
    if wrong_type(cf) then
      GROUPS[g] = false
      return false
    end
    G.limit = tonumber(cf[1]) or G.limit
    if cf[2] then G.rn, G.rp = tonumber(cf[2]), tonumber(cf[3]) end
    G.mx, G.prio, G.paused = tonumber(cf[4]), tonumber(cf[5]), cf[6] == '1'
  end
  if G.rn == 0 or not G.rp then G.rn = nil end
  GROUPS[g] = G
  return G
end

-- Counters are written once per call; an empty group's hash goes away.
flush_groups = function()
  for g, G in pairs(GROUPS) do
    if G and G.dirty then
      if G.k < 0 then G.k = 0 end
      local alive = G.k > 0 or G.d > 0 or G.w > 0 or G.halted ~= nil
      if alive then
        redis.call('HSET', G.key, 'k', G.k, 'd', G.d, 'w', G.w)
      else
        redis.call('DEL', G.key)
      end
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

local function mark(G, id) return redis.call('HGET', G.key, 'h:' .. id) end
local function set_mark(G, id, m) redis.call('HSET', G.key, 'h:' .. id, m) end

local function take_slot(G, id, m)
  G.k, G.dirty = G.k + 1, true
  set_mark(G, id, m)
end

local function drop_slot(G, id)
  G.k, G.dirty = G.k - 1, true
  redis.call('HDEL', G.key, 'h:' .. id)
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

-- A task becomes runnable for the first time (enqueue, end of its first
-- delay): a free slot and the ready tail, or the tail of its group's line.
-- Returns 'ready', 'parked', or nil if the line's key is damaged (then
-- nothing was written).
local function route(id, G, level)
  if not G then
    ready_push(id, false, level)
    return 'ready'
  end
  if has_room(G) then
    take_slot(G, id, '@')
    ready_push(id, false, group_level(G, level))
    return 'ready'
  end
  if wrong_type(redis.pcall('RPUSH', k_park(G.name), id)) then return nil end
  G.w, G.dirty = G.w + 1, true
  bump('parked', 1)
  return 'parked'
end

-- Give the group's free slots to the oldest tasks of its line. A released
-- group's next task joins the ready tail (round-robin: every group waiting
-- there gets a turn first), or the front with fairness "drain". Returns how
-- many became runnable.
local function fill(G)
  if G.halted or G.paused then return 0 end
  local n = 0
  while G.k < G.limit and G.w > 0 do
    local nxt = redis.pcall('LPOP', k_park(G.name))
    if wrong_type(nxt) then break end -- a damaged line stays as it is: check reports it
    if not nxt then -- the count was off: trust the list
      bump('parked', -G.w)
      G.w, G.dirty = 0, true
      break
    end
    G.w = G.w - 1
    bump('parked', -1)
    take_slot(G, nxt, '@')
    redis.pcall('HSET', k_task(nxt), 'dt', now_ms()) -- runnable since
    ready_push(nxt, conf().drain, group_level(G, nil))
    n = n + 1
  end
  return n
end

-- The holder *id* is done for good: its slot passes on. Returns how many
-- tasks became runnable.
local function release(G, id)
  drop_slot(G, id)
  return fill(G)
end

-- A continuation of its group (recovered, handed back, retried, requeued)
-- keeps or takes a slot and goes to the front: its turn had come already.
local function continue_front(G, id, level)
  if G then
    if mark(G, id) then set_mark(G, id, '@') else take_slot(G, id, '@') end
  end
  ready_push(id, true, group_level(G, level))
end

