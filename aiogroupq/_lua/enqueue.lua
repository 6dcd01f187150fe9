#!lua
--[[ enqueue.lua: add a batch of tasks atomically.
  KEYS[1..6]  the common keys (see _lib.lua)
  ARGV[1]     key prefix
  ARGV[2]     deduplication window in ms
  ARGV[3]     n, the number of tasks; then 7 arguments per task:
    id            client-made task id
    group         group key, or "" for none
    envelope      MessagePack envelope (opaque here)
    delay_ms      0 for none, else milliseconds from now (server clock)
    max_attempts  integer >= 1
    dedup_key     "" for none
    run_at_ms     0 for none, else the due time in Unix ms (server clock);
                  wins over delay_ms
  returns  one id per task: its own, or, when its dedup key was used by a task
           enqueued within the window (also earlier in this batch), that
           task's id and nothing is written. A task whose id already exists is
           left as it is, so a re-sent enqueue (lost reply, client retry) is a
           no-op that returns the same ids.
  Effects: each task becomes a hash t:<id>; an undelayed task joins its group's
           order (see route()); a delayed one waits in the delayed ZSET.
]]
local window, n = tonumber(ARGV[2]), tonumber(ARGV[3])
if not window or window <= 0 or not n or #ARGV ~= 3 + 7 * n then
  return redis.error_reply('ERR aiogroupq enqueue: malformed arguments')
end
-- Validate everything before the first write: scripts do not roll back.
for i = 0, n - 1 do
  local b = 4 + 7 * i
  if not tonumber(ARGV[b + 3]) or not tonumber(ARGV[b + 4]) or not tonumber(ARGV[b + 6]) then
    return redis.error_reply('ERR aiogroupq enqueue: malformed task arguments')
  end
end

-- The clock and the earliest due time matter only to delayed tasks: read
-- them once, and only if the batch has one.
local now, earliest, earliest_read = nil, nil, false
local function clock()
  now = now or now_ms(true)
  return now
end
local ids, readied, earliest_changed = {}, 0, false
for i = 0, n - 1 do
  local b = 4 + 7 * i
  local id, g, env = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local delay, max_attempts, dedup = tonumber(ARGV[b + 3]), ARGV[b + 4], ARGV[b + 5]
  local run_at = tonumber(ARGV[b + 6])
  if run_at > 0 then delay = run_at - clock() end
  local key = k_task(id)
  if dedup ~= '' then
    local dkey = k_dedup(dedup)
    local first_id = redis.call('GET', dkey)
    if first_id and first_id ~= id then
      id = first_id
      key = nil
    else
      redis.call('SET', dkey, id, 'PX', window)
    end
  end
  ids[#ids + 1] = id
  if key and redis.call('EXISTS', key) == 0 then
    if g == '' then g = nil end
    local state = delay > 0 and 'delayed' or 'queued'
    if g then
      redis.call('HSET', key, 'e', env, 'm', max_attempts, 'a', 0, 's', state, 'g', g)
    else
      redis.call('HSET', key, 'e', env, 'm', max_attempts, 'a', 0, 's', state)
    end
    if delay > 0 then
      local due = run_at > 0 and run_at or clock() + delay
      if not earliest_read then -- before our own ZADD: was there an earlier one?
        local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
        earliest, earliest_read = first[2] and tonumber(first[2]) or nil, true
      end
      redis.call('ZADD', K_DELAYED, due, id)
      if not earliest or due < earliest then
        earliest, earliest_changed = due, true
      end
    elseif route(id, g) then
      readied = readied + 1
    end
  end
end
-- A new earliest due time must reach blocked fetchers, which sleep until the
-- old one: one token makes one of them recompute its timer.
if earliest_changed and readied == 0 then readied = 1 end
if readied > 0 then wake(readied) end
return ids
