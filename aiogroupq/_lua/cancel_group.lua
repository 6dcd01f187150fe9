#!lua flags=allow-oom
--[[ cancel_group.lua: cancel tasks of one group, as cancel.lua cancels one
  task, a bounded number per call (Admin.cancel_group loops over calls).
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[4]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     retention of the cancelled state in ms
  ARGV[3]     the group
  ARGV[4]     "1": also ask the consumers of the group's running tasks to
              cancel them (as cancel.lua does for a running task); "": leave
              them running
  ARGV[5]     "line": cancel the tasks of the group's line park:<g>, from
                      position ARGV[6] (entries left there by earlier calls
                      are skipped), at most ARGV[7] (<= 1000) of them
              "ids":  cancel each task of ARGV[6..] (<= 1000 ids) that is a
                      queued or delayed task of the group; other ids are
                      left alone (the caller found them among the group's
                      slot holders)
              "first": as "ids", but only the tasks in their first delay
                      (the caller found them in the delayed ZSET): a slot
                      holder there, a retry in its backoff, is left for the
                      last call, as cancelling it passes its slot to the
                      line's head, which could start before the line's
                      call cancels it
              Admin sends 500 a call (CANCEL_GROUP_BATCH in
              _store/scripts.py): about 6 ms of Redis time.
  returns  {cancelled, running tasks asked to cancel, line entries looked
           at, of those the ones left in the line (not queued tasks of the
           group: damage the check reports), then the group's k, d, w after
           the call}
  errors   "aiogroupq corrupt <key>: ..." if a key the cancel needs is
           damaged (nothing written)
  Dead letters, the dead task a halted group waits behind included, and
  ended tasks are left alone. A call that leaves the group nothing held
  back drops the wake-up of its rate ("~<g>" in the delayed ZSET).
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"

local retention, g, running, op = tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1', ARGV[5]
local MAX = 1000
if not retention or g == '' or (op ~= 'line' and op ~= 'ids' and op ~= 'first') then
  return redis.error_reply('ERR aiogroupq cancel_group: malformed arguments')
end
local skip, count = 0, 0
if op == 'line' then
  skip, count = tonumber(ARGV[6]), tonumber(ARGV[7])
  if not skip or not count or skip < 0 or count < 0 or count > MAX then
    return redis.error_reply('ERR aiogroupq cancel_group: malformed arguments')
  end
elseif #ARGV - 5 > MAX then
  return redis.error_reply('ERR aiogroupq cancel_group: more than 1000 ids')
end
-- Every key a cancel may write is checked before the first one is.
local bad = check_fixed({ K_DELAYED, 'zset', k_park(g), 'list', k_held(g), 'list' })
if bad then return bad end
local G = group(g)
if not G then return corrupt(k_group(g), 'damaged state or settings') end

local now, cancelled, asked, readied, unheld = now_ms(), 0, 0, 0, false

-- cancel.lua's cancel of one task, for a task of this group only.
local function cancel_one(id)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 's', 'g')
  if wrong_type(f) or f[2] ~= g then return end -- a damaged hash: check reports it
  local state = f[1]
  if state == 'running' then
    if running then
      redis.call('HSET', key, 'cx', 1)
      asked = asked + 1
    end
    return
  end
  if state ~= 'queued' and state ~= 'delayed' then return end
  local m = mark(G, id)
  if m and op == 'first' then return end
  if m then -- it holds a slot: leave the place it holds it in, pass the slot on
    if m == '~' then
      redis.call('LREM', k_held(g), 1, id)
      bump('held', -1)
      unheld = true
    elseif m == 'r' then
      redis.call('ZREM', K_DELAYED, id)
    else
      ready_remove(id)
    end
    conclude(id, 'cancelled', now, retention)
    readied = readied + release(G, id)
  elseif state == 'delayed' then
    redis.call('ZREM', K_DELAYED, id)
    G.d, G.dirty = G.d - 1, true
    conclude(id, 'cancelled', now, retention)
  else -- in the group's line
    if redis.call('LREM', k_park(g), 1, id) == 1 then
      G.w, G.dirty = G.w - 1, true
      bump('parked', -1)
    end
    conclude(id, 'cancelled', now, retention)
  end
  cancelled = cancelled + 1
end

local looked, kept = 0, 0
if op == 'line' then
  if count > 0 then
    local ids = redis.call('LRANGE', k_park(g), skip, skip + count - 1)
    looked = #ids
    -- From the head: each LREM finds its id at once.
    local w = G.w
    for _, id in ipairs(ids) do cancel_one(id) end
    kept = looked - (w - G.w)
  end
else
  for i = 6, #ARGV do cancel_one(ARGV[i]) end
end
-- Nothing held back any more: the wake-up of the group's rate would wake
-- nothing, and would count the group rate-limited until it came.
if unheld and redis.call('LLEN', k_held(g)) == 0
    and redis.call('ZREM', K_DELAYED, RATE_WAKE .. g) == 1 then
  bump('ratewait', -1)
end
flush()
if readied > 0 then wake(readied) end
if G.k < 0 then G.k = 0 end
return { cancelled, asked, looked, kept, G.k, G.d, G.w }
