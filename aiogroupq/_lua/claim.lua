#!lua
--[[ claim.lua: recover expired leases, promote due tasks, then claim up to k
  runnable tasks of distinct groups for one consumer.
  KEYS[1..6]  the common keys (see _lib.lua)
  KEYS[7]     {aiogroupq:<q>}:inflight:<consumer>   SET, the consumer's recovery key
  KEYS[8]     {aiogroupq:<q>}:lastclaim:<consumer>  STRING "<nonce>:<id>,<id>..."
  ARGV[1]     key prefix
  ARGV[2]     consumer name
  ARGV[3]     k, the most tasks to claim
  ARGV[4]     lease duration in ms
  ARGV[5]     the most ready entries to look at (bounds the script's time)
  ARGV[6]     the most due delayed tasks to promote
  ARGV[7]     the most expired leases to recover
  ARGV[8]     a nonce unique to this call: a re-sent call (a client retrying
              after a lost reply) is answered with the tasks the first one
              claimed, instead of claiming more
  returns  {wait_ms, more, id1, envelope1, attempt1, token1, id2, ...}
           wait_ms: ms until the next delayed task is due, -1 if none
           more: 1 if runnable entries are left in the ready list
  Effects: (a) each expired lease's task goes back to the front of the ready
           list as its group's head (or, past its last attempt, is
           dead-lettered and its group passed on); (b) due delayed tasks join
           their group's order, a retrying head at the front; (c) each claimed
           task gets a fresh fencing token (in its hash and its group's lock),
           a lease, and an entry in the consumer's recovery key.
]]
local consumer, k = ARGV[2], tonumber(ARGV[3])
local lease_ms, scan_limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local promote_limit, recover_limit = tonumber(ARGV[6]), tonumber(ARGV[7])
if not (k and lease_ms and scan_limit and promote_limit and recover_limit)
    or lease_ms <= 0 or ARGV[8] == '' then
  return redis.error_reply('ERR aiogroupq claim: malformed arguments')
end
local now = now_ms()
local nonce, last_key = ARGV[8], KEYS[8]

-- The reply's tail: is more runnable, and when is the next delayed task due.
local function reply(out)
  if redis.call('LLEN', K_READY) > 0 then
    out[2] = 1
    -- Others may be idle while we are full: keep one of them awake.
    wake(1)
  end
  local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if first[2] then
    local wait = tonumber(first[2]) - now
    out[1] = wait > 0 and wait or 0
  end
  return out
end

local last = redis.call('GET', last_key)
if last and string.sub(last, 1, #nonce + 1) == nonce .. ':' then
  local out = {-1, 0}
  for id in string.gmatch(string.sub(last, #nonce + 2), '[^,]+') do
    local f = redis.call('HMGET', k_task(id), 'e', 'a', 'k', 's', 'c')
    if f[4] == 'running' and f[5] == consumer then
      out[#out + 1] = id
      out[#out + 1] = f[1]
      out[#out + 1] = tonumber(f[2])
      out[#out + 1] = tonumber(f[3])
    end
  end
  return reply(out)
end

-- (a) Recovery comes before any claim, so an interrupted task is at the front
-- of its group again before a later task of its group could be looked at.
local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, recover_limit)
for _, id in ipairs(expired) do
  recover(id, now, 'lease expired', true)
end

-- (b) Promote due tasks in due order.
local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, promote_limit)
for _, id in ipairs(due) do
  redis.call('ZREM', K_DELAYED, id)
  local key = k_task(id)
  local f = redis.call('HMGET', key, 'g', 's')
  if f[2] then
    local g = f[1]
    if g and redis.call('GET', k_lock(g)) == '@' .. id then
      redis.call('LPUSH', K_READY, id) -- a retry: its group waited for it
    else
      route(id, g)
    end
    redis.call('HSET', key, 's', 'queued')
  end
end

-- (c) Claim from the head of the ready list.
local out = {-1, 0}
local ids = {}
local claimed, scanned = 0, 0
local first_token -- fencing tokens: one INCRBY per call, not one INCR per task
local inflight = KEYS[7]
while claimed < k and scanned < scan_limit do
  local id = redis.call('LPOP', K_READY)
  if not id then break end
  scanned = scanned + 1
  local key = k_task(id)
  local f = redis.call('HMGET', key, 'e', 'g', 's', 'a')
  if f[1] and f[3] == 'queued' then -- else a stale entry: drop it
    local g, ok = f[2], true
    if g then
      local lock = k_lock(g)
      local cur = redis.call('GET', lock)
      -- Only the group's marked head may run. The other two branches repair
      -- states the scripts never create (kept so a damaged queue still runs
      -- its groups in order): an unmarked entry of an idle group runs, one of
      -- a busy group waits at the tail of its parked list.
      if cur ~= '@' .. id and (cur or redis.call('LLEN', k_park(g)) > 0) then
        redis.call('RPUSH', k_park(g), id)
        ok = false
        -- A free group with a parked line has no head: give it one.
        if not cur then release(g) end
      end
    end
    if ok then
      first_token = first_token or redis.call('INCRBY', K_FENCE, k) - k + 1
      local token = first_token + claimed
      if g then redis.call('SET', k_lock(g), token) end
      local attempt = tonumber(f[4] or 0) + 1
      redis.call('HSET', key, 's', 'running', 'k', token, 'c', consumer, 'a', attempt)
      redis.call('ZADD', K_LEASES, now + lease_ms, id)
      redis.call('SADD', inflight, id)
      claimed = claimed + 1
      ids[claimed] = id
      out[#out + 1] = id
      out[#out + 1] = f[1]
      out[#out + 1] = attempt
      out[#out + 1] = token
    end
  end
end

redis.call('SET', last_key, nonce .. ':' .. table.concat(ids, ','), 'PX', lease_ms)
return reply(out)
