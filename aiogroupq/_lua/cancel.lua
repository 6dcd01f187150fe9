#!lua flags=allow-oom
--[[ cancel.lua: cancel a task wherever it waits, or ask its consumer to.
  KEYS[1..6]  the common keys (see _lib.lua)
  ARGV[1]     key prefix
  ARGV[2]     retention of the cancelled state in ms
  ARGV[3]     task id
  returns  0 no such task, 1 cancelled (it was queued, parked or delayed, or
           already cancelled: a re-sent call), 2 running: cancellation
           requested (its consumer sees it at the next heartbeat and cancels
           the handler), 3 already finished otherwise (left alone)
]]
local retention, id = tonumber(ARGV[2]), ARGV[3]
if not retention then
  return redis.error_reply('ERR aiogroupq cancel: malformed arguments')
end
local key = k_task(id)
local f = redis.call('HMGET', key, 's', 'g')
local state, g = f[1], f[2]
if not state then return 0 end
if state == 'running' then
  redis.call('HSET', key, 'cx', 1)
  return 2
end
if state == 'cancelled' then return 1 end
if state ~= 'queued' and state ~= 'delayed' then return 3 end

-- Only the group's head can hold its lock ("@" .. id): cancelling the head
-- passes the group on; any other waiting task just leaves its line.
local head = g and redis.call('GET', k_lock(g)) == '@' .. id
if state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif g and not head then
  redis.call('LREM', k_park(g), 1, id)
else
  redis.call('LREM', K_READY, 1, id)
end
if head and release(g) then wake(1) end
conclude(id, 'cancelled', now_ms(), retention)
return 1
