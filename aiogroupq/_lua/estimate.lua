#!lua flags=no-writes
--[[ estimate.lua: what Admin.estimate computes a task's start time from
  (_inspect/estimate.py): the partition's rolling start counter, how much
  runs and waits, and the task's place in the ready line or its group's.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  ARGV[1]     key prefix
  ARGV[2]     task id, or "" for the counter alone
  ARGV[3]     the most entries of a list looked through for the task (the
              LPOS bound: one native scan, no Lua loop)
  ARGV[4]     seconds of the counter to read (its window)
  returns  {now, counting, starts, running, ready, queue paused, drain, task}
           counting: 1 if conf est is set (claims count their starts)
           starts: the counter's starts of each second, this one first,
           then back in time (false for a second without), or false if the
           counter key is damaged
           running: entries of leases (claimed and not finished)
           ready: entries of the ready line (list and pready)
           task: false if there is no such task, else {state, group, due,
           mark, ready place, line place, group facts}, false each where
           none: due is its delayed entry's score; ready place its index in
           the ready line (-1: beyond the bound); line place its index in
           its group's line (-1: beyond the bound); group facts {k, limit,
           w, rn, rp, paused, halted, weight, rate frees at, {the group's
           latest starts, oldest first, for its rate}, {{mark, ready place
           or due time}, ... of its first 32 slot holders}} (rn 0: no rate)
  errors   "aiogroupq corrupt <key>: ..." if the conf or the task's hash
           is damaged
]]
--- @include "base"
--- @include "slots"

-- The levels of pready (lib/ready.lua): scores of level p lie around
-- (9 - p) * 2^49 without aging.
local LEVEL_SPAN = 562949953421312
local HOLDERS = 32 -- slot holders of a group described (the others count as running)

local bad = preflight({ K_CONF, 'hash' })
if bad then return bad end
local id, bound, window = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not bound or not window or bound < 1 or window < 1 or window > 120 then
  return redis.error_reply('ERR aiogroupq estimate: malformed arguments')
end
local now = now_ms()
local c = conf()

local starts = {}
local sec = math.floor(now / 1000)
local names = {}
for i = 0, window - 1 do names[#names + 1] = string.format('%d', sec - i) end
local counted = redis.pcall('HMGET', K_STARTS, unpack(names))
if wrong_type(counted) then
  starts = false
else
  for i = 1, #names do starts[i] = counted[i] or false end
end

-- A count, 0 for a damaged key (the check reports it).
local function count(n)
  if type(n) ~= 'number' then return 0 end
  return n
end
local listed = count(redis.pcall('LLEN', K_READY))
local ready = listed
if c.prio then ready = ready + count(redis.pcall('ZCARD', K_PREADY)) end
local function num(x) return string.format('%.17g', x) end

-- Index of id in a list, -1 if the list is longer than the bound and the
-- id is not within it, false if it is not there.
local function place_in(key, length, which)
  local at = redis.pcall('LPOS', key, which or id, 'MAXLEN', bound)
  if type(at) == 'number' then return at end
  if length > bound then return -1 end
  return false
end

-- Its index in the ready line as pop_ready() takes it (lib/ready.lua).
local function ready_place(which)
  which = which or id
  if not c.prio then return place_in(K_READY, listed, which) end
  local s = score(K_PREADY, which)
  local low = 9 * LEVEL_SPAN - LEVEL_SPAN / 2 -- scores above: level 0
  if s then
    local before = redis.pcall('ZCOUNT', K_PREADY, '-inf', '(' .. num(s))
    if type(before) ~= 'number' then return false end
    -- The list's entries go before level 0 (and before everything with aging).
    if c.age or s >= low then before = before + listed end
    return before
  end
  local at = place_in(K_READY, listed, which)
  if not at or at < 0 or c.age then return at end
  local higher = redis.pcall('ZCOUNT', K_PREADY, '-inf', '(' .. num(low))
  if type(higher) ~= 'number' then return at end
  return at + higher
end

local task = false
if id ~= '' then
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 's', 'g')
  if wrong_type(f) then return corrupt(key, f.err) end
  if f[1] then
    local s, g = f[1], f[2]
    local due = score(K_DELAYED, id)
    local mark, at_ready, at_line, facts = false, false, false, false
    if g then
      local G = group(g)
      if G then
        mark = redis.call('HGET', G.key, 'h:' .. id) or false
        if s == 'queued' and not mark then
          at_line = place_in(k_park(g), G.w)
        end
        -- The slot holders, each with when it may start: its place in the
        -- ready line ('@', the first HOLDERS), its retry's due time ('r').
        local holders = {}
        local h = redis.pcall('HGETALL', G.key)
        if wrong_type(h) then h = {} end
        for i = 1, #h, 2 do
          if string.sub(h[i], 1, 2) == 'h:' and #holders < HOLDERS then
            local hid, m, at = string.sub(h[i], 3), h[i + 1], false
            if m == '@' then
              at = ready_place(hid)
            elseif m == 'r' then
              at = score(K_DELAYED, hid)
            end
            holders[#holders + 1] = { m, at }
          end
        end
        local recent = {}
        if G.rn then
          local got = redis.pcall('LRANGE', k_rate(g), -math.min(G.rn, 1000), -1)
          if not wrong_type(got) then recent = got end
        end
        facts = { G.k, G.limit, G.w, G.rn or 0, G.rp or 0, G.paused and 1 or 0,
          G.halted or false, G.wt or 1, score(K_DELAYED, RATE_WAKE .. g), recent, holders }
      end
    end
    if s == 'queued' and (not g or mark == '@') then at_ready = ready_place() end
    task = { s, g or false, due, mark, at_ready, at_line, facts }
  end
end

return { now, c.est and 1 or 0, starts, count(redis.pcall('ZCARD', K_LEASES)), ready,
  c.paused and 1 or 0, c.drain and 1 or 0, task }
