#!lua flags=allow-oom
--[[ cancel.lua: cancel a task wherever it waits, or ask its consumer to.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[4]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     retention of the cancelled state in ms
  ARGV[3]     task id
  returns  0 no such task, 1 cancelled (it was queued, in its group's line,
           delayed or held back, or already cancelled: a re-sent call), 2
           running: cancellation requested (its consumer sees it at the next
           heartbeat and cancels the handler), 3 already ended otherwise
           (left alone)
  errors   "aiogroupq corrupt <key>: ..." if a key the cancel needs is
           damaged (nothing written)
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"

local retention, id = tonumber(ARGV[2]), ARGV[3]
if not retention then
  return redis.error_reply('ERR aiogroupq cancel: malformed arguments')
end
local bad = check_fixed({ K_DELAYED, 'zset' })
if bad then return bad end
local key = k_task(id)
local f = redis.pcall('HMGET', key, 's', 'g')
if wrong_type(f) then return corrupt(key, f.err) end
local state, g = f[1], f[2]
if not state then return 0 end
if state == 'running' then
  redis.call('HSET', key, 'cx', 1)
  return 2
end
if state == 'cancelled' then return 1 end
if state ~= 'queued' and state ~= 'delayed' then return 3 end

local G, m = nil, false
if g then
  G = group(g)
  if not G then return corrupt(k_group(g), 'damaged state or settings') end
  m = mark(G, id)
end
local now = now_ms()
local readied = 0
if m then -- it holds a slot: leave the place it holds it in, pass the slot on
  if m == '~' then
    if wrong_type(redis.pcall('LREM', k_held(g), 1, id)) then return corrupt(k_held(g), 'not a list') end
    bump('held', -1)
  elseif m == 'r' then
    redis.call('ZREM', K_DELAYED, id)
  else
    ready_remove(id)
  end
  conclude(id, 'cancelled', now, retention)
  readied = release(G, id)
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
  if G then G.d, G.dirty = G.d - 1, true end
  conclude(id, 'cancelled', now, retention)
elseif G then -- in its group's line
  local removed = redis.pcall('LREM', k_park(g), 1, id)
  if wrong_type(removed) then return corrupt(k_park(g), removed.err) end
  if removed == 1 then
    G.w, G.dirty = G.w - 1, true
    bump('parked', -1)
  end
  conclude(id, 'cancelled', now, retention)
else
  ready_remove(id)
  conclude(id, 'cancelled', now, retention)
end
flush()
if readied > 0 then wake(readied) end
return 1
