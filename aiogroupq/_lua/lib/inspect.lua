--[[ inspect.lua: read-only views of a queue for the introspection scripts
  (stats, group_info). Nothing here writes, so those scripts carry the
  no-writes flag and may run on a replica. They declare the fixed keys
  ready, delayed, leases, dead and consumers, which check_views() reads.
  Times are returned as server ms, counts as integers, and a missing value
  as false (a nil reply), so that arrays keep their length.
]]
--- @include "base"
--- @include "slots"
--- @include "registry"

local HOLDER_DETAIL = 100 -- slot holders described per group (all are counted)
local REASON_CHARS = 300  -- of a halting task's reason
local DUE_SCAN = 1000     -- delayed entries looked at for groups' first due times

-- The fixed keys the views read, checked once: a damaged one is reported
-- as CorruptQueueError rather than failing half-way.
local function check_views()
  return preflight({ K_CONF, 'hash', K_STATS, 'hash', K_READY, 'list', K_PREADY, 'zset',
    K_DELAYED, 'zset', K_LEASES, 'zset', K_DEAD, 'zset', K_BACKLOG, 'zset',
    K_WAITING, 'zset', K_HALTED, 'set', K_PAUSED, 'set', K_CONSUMERS, 'zset' })
end

-- One group as seen now: its counts and settings, the task its line starts
-- with, and each slot holder with where it is. A damaged group key gives
-- {g, false}.
local function describe(g)
  local G = group(g)
  if not G then return { g, false } end
  local halted_at, halted_reason = false, false
  if G.halted then
    halted_at = task_field(G.halted, 'ft')
    halted_reason = task_field(G.halted, 'x')
    if halted_reason then halted_reason = string.sub(halted_reason, 1, REASON_CHARS) end
  end
  local line_head = redis.pcall('LINDEX', k_park(g), 0)
  if type(line_head) ~= 'string' then line_head = false end
  local out = {
    g, G.k, G.d, G.w, G.halted or false, G.limit, G.paused and 1 or 0,
    G.rn or 0, G.rp or 0, G.mx or 0,
    score(K_DELAYED, RATE_WAKE .. g),           -- 11: the rate frees at
    score(K_WAITING, g),                        -- 12: line not empty since
    line_head,                                  -- 13
    false,                                      -- 14: its {dt, a, m}
    halted_at, halted_reason,                   -- 15, 16
    {},                                         -- 17: holders
    {},                                         -- 18: marks by kind
  }
  if line_head then
    local f = redis.pcall('HMGET', k_task(line_head), 'dt', 'a', 'm')
    if not wrong_type(f) then out[14] = { f[1] or false, f[2] or false, f[3] or false } end
  end
  local holders, kinds = out[17], { ['@'] = 0, r = 0, ['~'] = 0, run = 0 }
  local h = redis.pcall('HGETALL', G.key)
  if wrong_type(h) then return { g, false } end
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'h:' then
      local id, m = string.sub(h[i], 3), h[i + 1]
      local kind = kinds[m] and m or 'run' -- a fencing token: running
      kinds[kind] = kinds[kind] + 1
      if #holders < HOLDER_DETAIL then
        local f = redis.pcall('HMGET', k_task(id), 's', 'a', 'm', 'c', 'dt')
        if wrong_type(f) then f = {} end
        -- A running holder's consumer as the registry has it: when it
        -- counts as gone, and its last heartbeat (false: not registered).
        local gone_at, beat = false, false
        if kind == 'run' and f[4] then
          gone_at = score(K_CONSUMERS, f[4])
          beat = redis.pcall('HGET', k_cinfo(f[4]), 'hb')
          if type(beat) ~= 'string' then beat = false end
        end
        holders[#holders + 1] = { id, m, f[1] or false, f[2] or false, f[3] or false,
          f[4] or false, f[5] or false, score(K_LEASES, id), score(K_DELAYED, id),
          gone_at, beat }
      end
    end
  end
  out[18] = { kinds.run, kinds['@'], kinds.r, kinds['~'] }
  return out
end

-- When the first delayed task of each group in *wanted* (a set of names)
-- is due: one pass over the earliest DUE_SCAN entries of the delayed ZSET
-- (nothing indexes a group's delayed tasks), shared by every group asked
-- about. Returns group -> due (server ms) for those found, and the due
-- time of the last entry looked at when the pass stopped short of the end
-- (a group not found is due no sooner), else false.
local function first_dues(wanted)
  local found, left = {}, 0
  for _ in pairs(wanted) do left = left + 1 end
  if left == 0 then return found, false end
  local entries = redis.call('ZRANGE', K_DELAYED, 0, DUE_SCAN - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local id = entries[i]
    if string.sub(id, 1, 1) ~= RATE_WAKE then
      local g = task_field(id, 'g')
      if g and wanted[g] and not found[g] then
        found[g] = tonumber(entries[i + 1])
        left = left - 1
        if left == 0 then return found, false end
      end
    end
  end
  if #entries < 2 * DUE_SCAN then return found, false end
  return found, tonumber(entries[#entries])
end
