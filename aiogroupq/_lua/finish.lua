#!lua flags=allow-oom
--[[ finish.lua: apply a batch of attempt outcomes, each fenced by its token.
  KEYS[1..6]  the common keys (see _lib.lua)
  ARGV[1]     key prefix
  ARGV[2]     retention of succeeded and cancelled tasks in ms (at least a
              minute is kept, so that a re-sent batch is recognised)
  ARGV[3]     n, the number of outcomes; then 5 arguments per outcome:
    id, token  the task and the fencing token its claim handed out
    kind       "ok"      succeeded; arg1 is the encoded result to keep, or ""
               "retry"   run again after arg1 ms (counts as an attempt); arg2
                         is the error that caused it. A grouped task keeps its
                         group: no later task of the group starts before it.
               "dead"    dead-letter with reason arg1 and traceback arg2; the
                         group passes on to its next task
               "halt"    the same, but the group stops behind the dead task
                         until an operator requeues it or releases the group
               "cancel"  cancelled on request while running (a "retry" or
                         "back" of a task whose cancellation was requested
                         becomes "cancel" too)
               "back"    hand back unfinished (shutdown): front of its group,
                         the attempt not counted
    arg1, arg2 as above ("" where unused)
  returns  one code per outcome: 1 applied, 3 applied as "cancel" (a
           cancellation was requested), 2 already applied by an earlier call
           with this token (a re-sent batch), 0 refused: the lease was lost
           (the token no longer owns the task) and nothing was changed.
]]
local retention, n = tonumber(ARGV[2]), tonumber(ARGV[3])
if not retention or not n or #ARGV ~= 3 + 5 * n then
  return redis.error_reply('ERR aiogroupq finish: malformed arguments')
end
for i = 0, n - 1 do
  local kind = ARGV[4 + 5 * i + 2]
  if kind == 'retry' and not tonumber(ARGV[4 + 5 * i + 3]) then
    return redis.error_reply('ERR aiogroupq finish: malformed retry delay')
  elseif not (kind == 'ok' or kind == 'retry' or kind == 'dead' or kind == 'halt'
      or kind == 'cancel' or kind == 'back') then
    return redis.error_reply('ERR aiogroupq finish: unknown outcome ' .. tostring(kind))
  end
end

local now = now_ms(true) -- due times of retries round up
local codes, readied, delayed_earlier = {}, 0, false
for i = 0, n - 1 do
  local b = 4 + 5 * i
  local id, token, kind, arg1, arg2 = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local key = k_task(id)
  local f = redis.call('HMGET', key, 'k', 's', 'g', 'c', 'f', 'cx', 'w')
  if f[1] == token and f[2] == 'running' then
    -- A requested cancellation wins over running the task again.
    local converted = f[6] and (kind == 'retry' or kind == 'back')
    if converted then kind = 'cancel' end
    local g = f[3]
    drop_lease(id, f[4])
    if kind == 'ok' or kind == 'cancel' then
      if release(g) then readied = readied + 1 end
      local result = kind == 'ok' and arg1 ~= '' and arg1 or nil
      conclude(id, kind == 'ok' and 'succeeded' or 'cancelled', now, retention,
        f[7] ~= false, token, result)
    else
      redis.call('HDEL', key, 'c')
      if kind == 'retry' then
        local delay = tonumber(arg1)
        redis.call('HSET', key, 'f', token, 'x', arg2)
        if delay <= 0 then
          requeue_front(id, g)
          readied = readied + 1
        else
          if g then redis.call('SET', k_lock(g), '@' .. id) end
          local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
          if not first[2] or now + delay < tonumber(first[2]) then delayed_earlier = true end
          redis.call('ZADD', K_DELAYED, now + delay, id)
          redis.call('HSET', key, 's', 'delayed')
        end
      else
        redis.call('HSET', key, 'f', token)
        if kind == 'dead' or kind == 'halt' then
          if bury(id, g, now, arg1, arg2, kind == 'halt') then readied = readied + 1 end
        else -- back
          redis.call('HINCRBY', key, 'a', -1)
          requeue_front(id, g)
          readied = readied + 1
        end
      end
    end
    codes[#codes + 1] = converted and 3 or 1
  elseif f[5] == token then
    codes[#codes + 1] = 2
  else
    codes[#codes + 1] = 0
  end
end
if delayed_earlier and readied == 0 then readied = 1 end
if readied > 0 then wake(readied) end
return codes
