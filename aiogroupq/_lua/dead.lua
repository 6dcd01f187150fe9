#!lua flags=allow-oom
--[[ dead.lua: operator actions on dead letters and halted groups.
  KEYS[1..6]  the common keys (see _lib.lua)
  ARGV[1]     key prefix
  ARGV[2]     "requeue": each dead task id in ARGV[3..] runs again with a
                         fresh set of attempts, at the front of its group
                         (first in line behind a running task, if any)
              "purge":   each dead task id in ARGV[3..] is deleted; a group
                         halted by it passes on to its next task
              "release": each group in ARGV[3..] halted by a dead task passes
                         on to its next task (the dead task stays dead)
  returns  how many of ARGV[3..] were acted on (others were not dead, or not
           halted, and were left alone)
]]
local op, n, readied = ARGV[2], 0, 0
if op ~= 'requeue' and op ~= 'purge' and op ~= 'release' then
  return redis.error_reply('ERR aiogroupq dead: unknown operation ' .. tostring(op))
end
for i = 3, #ARGV do
  if op == 'release' then
    local g = ARGV[i]
    local lock = redis.call('GET', k_lock(g))
    if lock and string.sub(lock, 1, 1) == '!' then
      n = n + 1
      if release(g) then readied = readied + 1 end
    end
  else
    local id = ARGV[i]
    local key = k_task(id)
    local f = redis.call('HMGET', key, 's', 'g')
    local g = f[2]
    -- An index entry of a task that is not dead is stale: drop it, so that
    -- purging everything always ends.
    if f[1] ~= 'dead' and op == 'purge' then redis.call('ZREM', K_DEAD, id) end
    if f[1] == 'dead' then
      n = n + 1
      redis.call('ZREM', K_DEAD, id)
      local lock = g and redis.call('GET', k_lock(g))
      local halted_by_it = lock == '!' .. id
      if op == 'purge' then
        redis.call('DEL', key)
        if halted_by_it and release(g) then readied = readied + 1 end
      else
        redis.call('HDEL', key, 'x', 'tb', 'ft', 'f', 'k', 'cx', 'w')
        redis.call('DEL', k_done(id)) -- its end is in the future again
        redis.call('HSET', key, 'a', 0, 's', 'queued')
        if not g or halted_by_it or not lock then
          requeue_front(id, g)
          readied = readied + 1
        else
          redis.call('LPUSH', k_park(g), id)
        end
      end
    end
  end
end
if readied > 0 then wake(readied) end
return n
