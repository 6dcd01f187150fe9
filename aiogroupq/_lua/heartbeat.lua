#!lua flags=allow-oom
--[[ heartbeat.lua: extend the leases of a consumer's running tasks.
  KEYS[1..6]  the common keys (see lib/base.lua)
  ARGV[1]     key prefix
  ARGV[2]     lease duration in ms, counted from now (server clock)
  ARGV[3..]   pairs: task id, fencing token
  returns  one code per pair: 1 extended, 0 lost (the token no longer owns a
           running task: the lease expired, whether or not a claim has
           recovered the task yet, or the task was taken, or its hash is
           damaged), 2 extended but cancellation was requested
           (Producer.cancel)
]]
--- @include "base"

local lease_ms = tonumber(ARGV[2])
if not lease_ms or #ARGV % 2 ~= 0 then
  return redis.error_reply('ERR aiogroupq heartbeat: malformed arguments')
end
local bad = preflight({ K_LEASES, 'zset' })
if bad then return bad end
local now = now_ms()
local deadline = now + lease_ms
local codes = {}
for b = 3, #ARGV, 2 do
  local id = ARGV[b]
  local f = redis.pcall('HMGET', k_task(id), 'k', 's', 'cx')
  -- An expired lease is lost even before a claim recovers its task: its
  -- consumer was silent past the deadline, and must stop.
  if not wrong_type(f) and f[1] == ARGV[b + 1] and f[2] == 'running'
      and (tonumber(redis.call('ZSCORE', K_LEASES, id)) or 0) > now then
    redis.call('ZADD', K_LEASES, 'XX', deadline, id)
    codes[#codes + 1] = f[3] and 2 or 1
  else
    codes[#codes + 1] = 0
  end
end
return codes
