#!lua
--[[ enqueue_one.lua: add one plain task (no group, due now, no dedup key,
  no schedule, no priority of its own) to a queue of one partition: what
  enqueue.lua does for such a task, without the helpers and the plan that
  groups, delays, dedup keys and batches need.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  ARGV[1]     key prefix
  ARGV[2]     id            client-made task id
  ARGV[3]     envelope      MessagePack envelope (opaque here)
  ARGV[4]     max_attempts  integer >= 1
  ARGV[5]     expires_ms    0 for none, else ms from now before which it must start
  ARGV[6]     expire_at_ms  0 for none, else the Unix ms before which it must start
  ARGV[7]     identity      what the task keeps once ended (its hash's i), or ""
  returns  the id (a task whose id exists is left as it is: a re-sent call
           returns it again)
  errors   (nothing written) "aiogroupq stale <parts>": the queue is
           partitioned (the producer reads its layout and sends the task
           with enqueue.lua); "aiogroupq corrupt <key>: ...": a key it
           writes is damaged
]]
--- @include "base"
--- @include "ready"

local id, attempts = ARGV[2], tonumber(ARGV[4])
local expires, expire_at = tonumber(ARGV[5]), tonumber(ARGV[6])
if #ARGV ~= 7 or not (attempts and expires and expire_at) then
  return redis.error_reply('ERR aiogroupq enqueue: malformed arguments')
end
local bad = read_conf()
if bad then return bad end
local parts = conf().parts
if parts then return redis.error_reply('ERR aiogroupq stale ' .. parts) end
if redis.call('EXISTS', k_task(id)) == 1 then return id end
bad = preflight(runnable_keys())
if bad then return bad end

local now = now_ms(true)
-- m as sent, as enqueue.lua stores it (a Lua number would be stored as a
-- double's text: 1e+17)
local fields = { 'e', ARGV[3], 'm', ARGV[4], 'a', 0, 's', 'queued', 'dt', now }
if ARGV[7] ~= '' then fields[#fields + 1] = 'i'; fields[#fields + 1] = ARGV[7] end
local xp = expire_at > 0 and expire_at or (expires > 0 and now + expires) or nil
if xp then fields[#fields + 1] = 'xp'; fields[#fields + 1] = xp end
ready_push(id, false, 0)
redis.call('HSET', k_task(id), unpack(fields))
bump('enqueued', 1)
flush()
wake(1)
return id
