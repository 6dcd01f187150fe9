#!lua flags=allow-oom
--[[ repair.lua: one step of "aiogroupq check --repair". _check/repair.py plans the
  steps from a consistency check; each step reads again what it changes and
  decides from what it finds, not from the check's reading, so it is
  idempotent and safe on a live queue (a step the queue has made needless
  changes nothing).
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]     {aiogroupq:<q>}:fence    STRING counter of fencing tokens
  KEYS[6]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     the step, its arguments after it:
    "drop" key type [max]  delete key if it holds another type than *type*;
                          with type "" delete it (a key no script makes);
                          the fence key is set to *max* (the highest token
                          tasks hold) in the same call, so that no claim
                          between the drop and the counters stage can hand
                          out a token a stale holder still has
    "bury" id state why label ...  dead-letter a task whose hash is
                          damaged, if it is still in *state* ("" for none):
                          out of the places named and any sorted set, its
                          slot passed on (or its empty group field dropped,
                          if it has ended)
    "place" id pivot label ...  put a task in the one place its state calls
                          for, with one entry: its entries in the places
                          named (ready, pready, delayed, leases, dead,
                          park:<g>, held:<g>, inflight:<c>) and in any other
                          wrong one are removed; a lost task goes back (a
                          queued one of a group's line before *pivot*, ""
                          for the tail; a running one with a lease of its
                          holder's length when the holder is registered
                          here, so a live holder renews it and a dead one's
                          runs out, else an expired one, so the next claim
                          recovers it); a task that does not exist loses its
                          entries in the places named.
                          Lists are searched only where the check saw an
                          entry, or, to tell whether a task is lost, among
                          the 10,000 entries at each end of a longer list
    "group" g d_seen d_want id pivot ...  rebuild group g: each slot mark
                          from its task's state and place (an unmarked entry
                          of the ready or held list goes into the line
                          before *pivot*), the halt marker, the counts (d is
                          set to *d_want* if it still reads *d_seen*), its
                          indexes; then its held-back heads and free slots
                          move on as the scripts would move them
    "index" g ...         the backlog, waiting, halted and paused entries of
                          these groups, from their keys
    "stat" field want seen  set a stats counter, if it still reads *seen*
    "fence" max           raise the fence counter to at least *max*
    "flag" name           set a conf flag (pu, gc or uq) to 1
    "setting" g           remove group g's stored weight and ordering
                          ("": the queue's default weight) where they hold
                          a value no call writes (a weight not from 1 to
                          100, an ordering not "exclusive"), so that the
                          default applies
    "conf" type why f v ...  rebuild the conf hash, if it is still of *type*
                          (the wrong one the check saw) or gone: delete it
                          and write the fields f v ... the repair could
                          read (from the damaged key, the other partitions);
                          *why* says where they came from
  returns  what was changed, in words ("" for nothing), or "retry" when the
           queue moved on since the check (nothing written: plan again)
  errors   "aiogroupq corrupt <key>: ..." if a key the step writes is
           damaged (nothing written: the "drop" step comes first)
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"

-- The commands a step may call beyond a worker's rule (docs/operations.md).
-- One refused inside the script comes back as a plain ERR on Redis 7.0 and
-- Valkey (its NOPERM code lost), after the step's earlier writes (scripts
-- never roll back): each is asked about first, before any write, and a
-- refusal is the NOPERM reply (raised as PermissionDeniedError).
local BEYOND_WORKER = { 'HGETALL', 'LINSERT', 'LPOS', 'SISMEMBER', 'TYPE' }
for _, command in ipairs(BEYOND_WORKER) do
  if not redis.acl_check_cmd(command, K_READY) then
    return redis.error_reply('NOPERM this user has no permissions to run the '
      .. string.lower(command) .. ' command on ' .. K_READY .. ' (nothing was '
      .. 'changed): a repair needs the worker rule and +hgetall +linsert '
      .. '+lpos +sismember +type')
  end
end

local op = ARGV[2]
local LIVE = { queued = true, delayed = true, running = true }
local TERMINAL = { succeeded = true, dead = true, cancelled = true, expired = true }
local LIST_PLACES = { ready = true, park = true, held = true }
-- Entries looked at from each end of a longer list: what changed since the
-- check was pushed at an end, and a step stays short however long the list.
local SEARCH = 10000
local ZSET_PLACES = { pready = true, delayed = true, leases = true, dead = true }
local done, readied = {}, 0

local function note(text) done[#done + 1] = text end

local function fixed_ok()
  return check_fixed({ K_PREADY, 'zset', K_DELAYED, 'zset', K_LEASES, 'zset',
    K_DEAD, 'zset', K_HALTED, 'set', K_PAUSED, 'set' })
end

-- The family of a place label ("park:g" -> "park", "g").
local function family(label)
  local i = string.find(label, ':', 1, true)
  if not i then return label, nil end
  return string.sub(label, 1, i - 1), string.sub(label, i + 1)
end

-- Whether *id* has an entry in the place *label* (in a list of more than
-- 2 * SEARCH entries: among the SEARCH at each end).
local function is_in(label, id)
  local fam = family(label)
  local key = PREFIX .. label
  local found
  if LIST_PLACES[fam] then
    local n = redis.pcall('LLEN', key)
    if wrong_type(n) then return false end
    if n <= 2 * SEARCH then
      found = redis.call('LPOS', key, id)
    else
      found = redis.call('LPOS', key, id, 'MAXLEN', SEARCH)
        or redis.call('LPOS', key, id, 'RANK', -1, 'MAXLEN', SEARCH)
    end
  elseif fam == 'inflight' then
    found = redis.pcall('SISMEMBER', key, id)
    if found == 0 then found = false end
  else
    found = redis.pcall('ZSCORE', key, id)
  end
  if wrong_type(found) then return false end
  return found ~= false and found ~= nil
end

-- Remove every entry of *id* from the place *label*, or all but the first
-- with *keep_one*; the counts of a line and of held lists follow.
local function remove(label, id, keep_one)
  local fam, item = family(label)
  local key = PREFIX .. label
  local n
  if LIST_PLACES[fam] then
    if keep_one then
      local at = redis.pcall('LPOS', key, id, 'COUNT', 0)
      if wrong_type(at) or #at < 2 then return 0 end
      n = redis.call('LREM', key, 1 - #at, id) -- from the tail: the first stays
    else
      n = redis.pcall('LREM', key, 0, id)
    end
  elseif ZSET_PLACES[fam] then
    if keep_one then return 0 end
    n = redis.pcall('ZREM', key, id)
  elseif fam == 'inflight' then
    if keep_one then return 0 end
    n = redis.pcall('SREM', key, id)
  else
    return 0
  end
  if wrong_type(n) or n == 0 then return 0 end
  if fam == 'park' then
    local G = group(item)
    if G then G.w, G.dirty = G.w - n, true end
    bump('parked', -n)
  elseif fam == 'held' then
    bump('held', -n)
  end
  note('removed ' .. n .. ' from ' .. label)
  return n
end

-- A group's mark of *id*, read raw (the group's counts may be damaged).
local function raw_mark(g, id)
  local m = redis.pcall('HGET', k_group(g), 'h:' .. id)
  if wrong_type(m) or not m then return nil end
  return m
end

-- The level a task of group g waits at when it goes back to the ready list.
local function level_in(G, p)
  return group_level(G or nil, tonumber(p) or 0)
end

-- Put a lost task of a group's line back before *pivot* ("" for the tail).
local function into_line(g, id, pivot)
  local park = k_park(g)
  if pivot ~= '' then
    redis.call('LINSERT', park, 'BEFORE', pivot, id)
  else
    redis.call('RPUSH', park, id)
  end
  local G = group(g)
  if G then G.w, G.dirty = G.w + 1, true end
  bump('parked', 1)
end

-- "place": see the header.
local function place(id, pivot, labels)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 's', 'g', 'c', 'dt', 'ft', 'p')
  if wrong_type(f) then return end -- the "drop" step deals with it
  local s, g, c = f[1], f[2], f[3]
  local exists = redis.call('EXISTS', key) == 1
  if exists and not (LIVE[s] or TERMINAL[s]) then return end -- the "bury" step
  if not exists then s, g, c = nil, nil, nil end
  if g == '' then return end -- the "bury" step
  if g then
    local bad = preflight({ k_group(g), 'hash', k_park(g), 'list', k_held(g), 'list' })
    if bad then return bad end
  end
  -- Lists are searched only where the check saw an entry (a list may be
  -- long); sorted sets and sets are cheap to look into.
  local named = {}
  for _, label in ipairs(labels) do named[label] = (named[label] or 0) + 1 end
  local candidates = { 'pready', 'delayed', 'leases', 'dead' }
  for label in pairs(named) do candidates[#candidates + 1] = label end
  local m = nil
  if g and LIVE[s] then m = raw_mark(g, id) end
  if c then candidates[#candidates + 1] = 'inflight:' .. c end

  local right = nil
  if s == 'running' then
    right = 'leases'
  elseif s == 'delayed' then
    right = 'delayed'
  elseif s == 'dead' then
    right = 'dead'
  elseif s == 'queued' then
    if g and m == '~' then
      right = 'held:' .. g
    elseif g and not m then
      right = 'park:' .. g
    elseif is_in('pready', id) then
      right = 'pready'
    else
      right = 'ready'
    end
  end
  local inflight = (s == 'running' and c) and ('inflight:' .. c) or nil
  local lost = right and not named[right] and not is_in(right, id)
  -- Twice in its line: which entry is at its place is not known, so all go
  -- and one comes back at its place, as a lost one would.
  local relined = right == 'park:' .. tostring(g) and (named[right] or 0) > 1
  if (lost or relined) and right == 'park:' .. tostring(g) and pivot ~= ''
      and (pivot == id or not redis.call('LPOS', k_park(g), pivot)) then
    return 'retry' -- the line changed since the check: plan again
  end

  local seen = {}
  for _, label in ipairs(candidates) do
    if not seen[label] then
      seen[label] = true
      if label ~= right and label ~= inflight then remove(label, id, false) end
    end
  end
  if relined then
    remove(right, id, false)
    into_line(g, id, pivot)
  elseif right and (named[right] or 0) > 1 then
    remove(right, id, true)
  end
  if lost then
    if right == 'leases' then
      -- A fresh lease of its holder's length, where the holder is registered
      -- in this partition: alive, it renews it as ever (no other consumer
      -- may run the task meanwhile); dead, it runs out as after a crash.
      -- Not known here: already expired, the next claim recovers it.
      local ttl = c and redis.pcall('HGET', PREFIX .. 'cinfo:' .. c, 'ttl')
      ttl = type(ttl) == 'string' and tonumber(ttl) or nil
      redis.call('ZADD', K_LEASES, ttl and now_ms() + ttl or 0, id)
    elseif right == 'delayed' then
      redis.call('ZADD', K_DELAYED, math.max(tonumber(f[4]) or 0, now_ms()), id)
      readied = readied + 1 -- fetchers recompute their timers
    elseif right == 'dead' then
      redis.call('ZADD', K_DEAD, tonumber(f[5]) or now_ms(), id)
    elseif right == 'park:' .. tostring(g) then
      into_line(g, id, pivot)
    elseif right == 'held:' .. tostring(g) then
      -- Held back again; a wake-up due now brings it back at the next claim
      -- unless its group is still paused or halted.
      redis.call('RPUSH', k_held(g), id)
      bump('held', 1)
      if redis.call('ZADD', K_DELAYED, 'NX', now_ms(), RATE_WAKE .. g) == 1 then
        bump('ratewait', 1)
      end
    elseif g then -- a slot holder: its turn had come, the front
      if m ~= '@' then redis.call('HSET', k_group(g), 'h:' .. id, '@') end
      ready_push(id, true, level_in(group(g), f[6]))
      readied = readied + 1
    else
      ready_push(id, false, tonumber(f[6]) or 0)
      readied = readied + 1
    end
    note('put back in ' .. right)
  end
  if inflight and not is_in(inflight, id) then
    redis.call('SADD', PREFIX .. inflight, id)
    note('added to ' .. inflight)
  end
end

-- "bury": see the header.
local function bury_damaged(id, state, why, named)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 's', 'g', 'c')
  if wrong_type(f) then return end
  local s, g, c = f[1], f[2], f[3]
  if (s or '') ~= state then return 'retry' end
  if TERMINAL[s] then -- only its group field can be wrong: "" names no group
    if g == '' then
      redis.call('HDEL', key, 'g')
      note('dropped its empty group field')
    end
    return
  end
  if redis.call('EXISTS', key) == 0 then return end
  if g == '' then
    redis.call('HDEL', key, 'g') -- names no group: it never held a slot
    g = nil
  end
  local G, m = nil, nil
  if g then
    local bad = preflight({ k_park(g), 'list', k_held(g), 'list' })
    if bad then return bad end
    G = group(g)
    m = raw_mark(g, id)
  end
  -- Lists where the check saw it (a list may be long), and the cheap rest.
  local labels = { 'pready', 'leases' }
  for _, label in ipairs(named) do labels[#labels + 1] = label end
  if c then labels[#labels + 1] = 'inflight:' .. c end
  for _, label in ipairs(labels) do remove(label, id, false) end
  local first_delay = redis.call('ZREM', K_DELAYED, id) == 1 and not m
  if G and first_delay then G.d, G.dirty = G.d - 1, true end
  local reason = 'Corrupt: ' .. why .. ' (dead-lettered by "aiogroupq check --repair")'
  readied = readied + bury(id, G, m ~= nil and G ~= false, now_ms(), reason, '')
  if m and not G then redis.call('HDEL', k_group(g), 'h:' .. id) end
  note('dead-lettered: ' .. why)
end

-- The backlog, waiting, halted and paused entries of group g, from its keys.
local function reindex(g)
  local w = redis.pcall('LLEN', k_park(g))
  if wrong_type(w) then w = 0 end
  if w > 0 then
    if redis.call('ZADD', K_BACKLOG, 'CH', w, g) == 1 then note('backlog ' .. g) end
    if redis.call('ZADD', K_WAITING, 'NX', now_ms(), g) == 1 then note('waiting ' .. g) end
  else
    if redis.call('ZREM', K_BACKLOG, g) == 1 then note('backlog ' .. g) end
    if redis.call('ZREM', K_WAITING, g) == 1 then note('waiting ' .. g) end
  end
  local halted = redis.pcall('HGET', k_group(g), '!')
  if wrong_type(halted) then halted = false end
  if halted then
    if redis.call('SADD', K_HALTED, g) == 1 then note('halted ' .. g) end
  elseif redis.call('SREM', K_HALTED, g) == 1 then
    note('halted ' .. g)
  end
  local paused = redis.pcall('HGET', k_gconf(g), 'p')
  if wrong_type(paused) then paused = false end
  if paused == '1' then
    if redis.call('SADD', K_PAUSED, g) == 1 then note('paused ' .. g) end
  elseif redis.call('SREM', K_PAUSED, g) == 1 then
    note('paused ' .. g)
  end
end

-- "group": see the header.
local function regroup(g, d_seen, d_want, fixes)
  local gkey, park, held = k_group(g), k_park(g), k_held(g)
  local bad = preflight({ gkey, 'hash', park, 'list', held, 'list',
    k_gconf(g), 'hash', k_rate(g), 'list' })
  if bad then return bad end
  local fields = redis.call('HGETALL', gkey)
  local marks, halted, other = {}, nil, {}
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if string.sub(name, 1, 2) == 'h:' then
      marks[string.sub(name, 3)] = value
    elseif name == '!' then
      halted = value
    elseif name ~= 'k' and name ~= 'd' and name ~= 'w' and name ~= 'tn' then
      other[#other + 1] = name -- (tn: a weighted group's turns, kept)
    end
  end
  -- What the mark of a task of g must be, from its state and place: a token,
  -- 'r', '@', '~', "none" (not a slot holder) or "lost" (the place step's).
  local function expected(id)
    local f = redis.pcall('HMGET', k_task(id), 's', 'g', 'k', 'a')
    if wrong_type(f) or f[2] ~= g then return 'none' end
    local s = f[1]
    if s == 'running' then return f[3] or 'none' end
    if s == 'delayed' then
      if (tonumber(f[4]) or 0) > 0 then return 'r' end
      return 'none'
    end
    if s ~= 'queued' then return 'none' end
    if is_in('ready', id) or is_in('pready', id) then return '@' end
    if is_in('held:' .. g, id) then return '~' end
    if is_in('park:' .. g, id) then return 'none' end
    return 'lost'
  end
  -- Read everything first: a pivot gone from the line means plan again.
  local want, moves = {}, {}
  for id in pairs(marks) do want[id] = expected(id) end
  for i = 1, #fixes, 2 do
    local id, pivot = fixes[i], fixes[i + 1]
    if not marks[id] then
      local e = expected(id)
      if e == '@' or e == '~' then -- an unmarked entry: back into the line
        if pivot ~= '' and not redis.call('LPOS', park, pivot) then return 'retry' end
        moves[#moves + 1] = { id, pivot }
      elseif e ~= 'none' and e ~= 'lost' then
        want[id] = e
      end
    end
  end
  local halting = nil
  if halted then
    local f = redis.pcall('HMGET', k_task(halted), 's', 'g')
    if not wrong_type(f) and f[1] == 'dead' and f[2] == g then halting = halted end
  end

  for _, name in ipairs(other) do
    redis.call('HDEL', gkey, name)
    note('dropped field ' .. name)
  end
  local k = 0
  for id, e in pairs(want) do
    if e == 'none' then
      redis.call('HDEL', gkey, 'h:' .. id)
      note('dropped the mark of ' .. id)
    else
      if e ~= 'lost' and marks[id] ~= e then
        redis.call('HSET', gkey, 'h:' .. id, e)
        note('marked ' .. id .. ' ' .. e)
      end
      k = k + 1
    end
  end
  for _, move in ipairs(moves) do
    remove('ready', move[1], false)
    remove('pready', move[1], false)
    remove('held:' .. g, move[1], false)
    if move[2] ~= '' then
      redis.call('LINSERT', park, 'BEFORE', move[2], move[1])
    else
      redis.call('RPUSH', park, move[1])
    end
    bump('parked', 1)
    note('moved ' .. move[1] .. ' into the line')
  end
  if halted and not halting then
    redis.call('HDEL', gkey, '!')
    note('dropped the halt marker')
  end
  local w = redis.call('LLEN', park)
  local d = redis.call('HGET', gkey, 'd')
  if (d or '') == d_seen or not tonumber(d) then d = tonumber(d_want) end
  d = tonumber(d)
  local cur = redis.call('HMGET', gkey, 'k', 'd', 'w')
  if k > 0 or d > 0 or w > 0 or halting then
    if tonumber(cur[1]) ~= k or tonumber(cur[2]) ~= d or tonumber(cur[3]) ~= w then
      redis.call('HSET', gkey, 'k', k, 'd', d, 'w', w)
      note('counts k=' .. k .. ' d=' .. d .. ' w=' .. w)
    end
  elseif redis.call('DEL', gkey) == 1 then
    note('deleted the empty group hash')
  end
  reindex(g)
  local G = group(g)
  if G and not G.halted and not G.paused then
    local pending = redis.call('ZSCORE', K_DELAYED, RATE_WAKE .. g)
    local n
    if pending then n = fill(G) else n = unshelve(G) end
    if n > 0 then note(n .. ' more runnable') end
    readied = readied + n
  end
end

local bad = nil
local reply = nil
if op == 'drop' then
  local key, kind = ARGV[3], ARGV[4]
  local t = redis.call('TYPE', key)
  t = type(t) == 'table' and t.ok or t
  if t ~= 'none' and (kind == '' or t ~= kind) then
    redis.call('DEL', key)
    note('deleted ' .. key .. ' (a ' .. t .. ')')
    if key == K_FENCE and ARGV[5] then
      redis.call('SET', K_FENCE, ARGV[5])
      note('fence set to ' .. ARGV[5] .. ', the highest token held')
    end
  end
elseif op == 'bury' then
  bad = fixed_ok()
  if not bad then
    local labels = {}
    for i = 6, #ARGV do labels[#labels + 1] = ARGV[i] end
    bad = bury_damaged(ARGV[3], ARGV[4], ARGV[5], labels)
    if bad == 'retry' then bad, reply = nil, 'retry' end
  end
elseif op == 'place' then
  bad = fixed_ok()
  if not bad then
    local labels = {}
    for i = 5, #ARGV do labels[#labels + 1] = ARGV[i] end
    bad = place(ARGV[3], ARGV[4], labels)
    if bad == 'retry' then bad, reply = nil, 'retry' end
  end
elseif op == 'group' then
  bad = fixed_ok()
  if not bad then
    local fixes = {}
    for i = 6, #ARGV do fixes[#fixes + 1] = ARGV[i] end
    bad = regroup(ARGV[3], ARGV[4], ARGV[5], fixes)
    if bad == 'retry' then bad, reply = nil, 'retry' end
  end
elseif op == 'index' then
  bad = fixed_ok()
  if not bad then
    for i = 3, #ARGV do reindex(ARGV[i]) end
  end
elseif op == 'stat' then
  bad = preflight({ K_STATS, 'hash' })
  if not bad then
    local cur = redis.call('HGET', K_STATS, ARGV[3])
    if (cur or '') == ARGV[5] and cur ~= ARGV[4] then
      redis.call('HSET', K_STATS, ARGV[3], ARGV[4])
      note('stats ' .. ARGV[3] .. ' ' .. tostring(cur) .. ' -> ' .. ARGV[4])
    end
  end
elseif op == 'fence' then
  bad = preflight({ K_FENCE, 'string' })
  if not bad then
    local cur = redis.call('GET', K_FENCE)
    local n = cur and string.match(cur, '^%-?%d+$') and tonumber(cur) or nil
    local floor = tonumber(ARGV[3]) or 0
    if not n or n < floor then
      redis.call('SET', K_FENCE, math.max(n or 0, floor))
      note('fence ' .. tostring(cur) .. ' -> ' .. math.max(n or 0, floor))
    end
  end
elseif op == 'flag' then
  local name = ARGV[3]
  if name ~= 'pu' and name ~= 'gc' and name ~= 'uq' then
    return redis.error_reply('ERR aiogroupq repair: unknown flag ' .. tostring(name))
  end
  bad = preflight({ K_CONF, 'hash' })
  if not bad and redis.call('HGET', K_CONF, name) ~= '1' then
    redis.call('HSET', K_CONF, name, 1)
    note('conf ' .. name .. ' = 1')
  end
elseif op == 'setting' then
  local g = ARGV[3] or ''
  local key = g == '' and K_CONF or k_gconf(g)
  bad = preflight({ key, 'hash' })
  if not bad then
    local v, o = unpack(redis.call('HMGET', key, 'wt', 'o'))
    local n = v and string.find(v, '^%d+$') and tonumber(v)
    if v and not (n and n >= 1 and n <= 100) then
      redis.call('HDEL', key, 'wt')
      note('removed weight ' .. v .. ' of ' .. key)
    end
    if o and g ~= '' and o ~= 'exclusive' then
      redis.call('HDEL', key, 'o')
      note('removed ordering ' .. o .. ' of ' .. key)
    end
  end
elseif op == 'conf' then
  local t = redis.call('TYPE', K_CONF)
  t = type(t) == 'table' and t.ok or t
  if t == ARGV[3] or t == 'none' then
    redis.call('DEL', K_CONF)
    local fields = {}
    for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
    if #fields > 0 then redis.call('HSET', K_CONF, unpack(fields)) end
    note('rebuilt ' .. K_CONF .. ' (a ' .. t .. '): ' .. ARGV[4])
  end
else
  return redis.error_reply('ERR aiogroupq repair: unknown step ' .. tostring(op))
end
if bad then return bad end
if reply == 'retry' then return 'retry' end
flush()
if readied > 0 then wake(readied) end
return table.concat(done, '; ')
