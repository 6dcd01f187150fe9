--[[ groups.lua: where a group's task goes when it becomes runnable, when a
  slot frees and when its turn had come (lib/slots.lua has a group's keys).

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
--- @include "slots"

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

-- Whether the group's next task goes to the ready front: always with fairness
-- "drain"; with weight w > 1, w - 1 times in a row, then once to the tail (w
-- turns a round, deficit round-robin: under backlog a group's share of starts
-- is w over the sum of the weights, and every turn at the front is bounded, so
-- a group behind waits at most the others' weights' worth of starts). The
-- counter is read and written only for such a group: weight 1 costs nothing.
local function front_turn(G)
  if conf().drain then return true end
  if G.wt <= 1 then return false end
  if not G.tn then G.tn = tonumber(redis.call('HGET', G.key, 'tn')) or 0 end
  G.tn = G.tn + 1
  if G.tn < G.wt then return true end
  G.tn = 0
  return false
end

-- Give the group's free slots to the oldest tasks of its line. A released
-- group's next task joins the ready tail (round-robin: every group waiting
-- there gets a turn first), or the front with fairness "drain" or while a
-- weighted group's turn lasts (front_turn). Returns how many became
-- runnable.
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
    ready_push(nxt, front_turn(G), group_level(G, nil))
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

