#!lua flags=allow-oom
--[[ heartbeat.lua: extend the leases of a consumer's running tasks, and
  keep its entry in the consumer registry.
  KEYS[1]     {aiogroupq:<q>}:leases        ZSET id -> lease deadline (server ms)
  KEYS[2]     {aiogroupq:<q>}:consumers     ZSET consumer name -> when it
              counts as gone: last heartbeat + its lease (server ms)
  KEYS[3]     {aiogroupq:<q>}:cinfo:<name>  HASH the consumer's registration
              (KEYS[2] and KEYS[3] only with a registration, below)
  ARGV[1]     key prefix
  ARGV[2]     lease duration in ms, counted from now (server clock)
  ARGV[3]     "1" to restore leases, else "": a lease whose token still owns
              its running task is set again even if it expired or is gone.
              The consumer sends it once after it met the leases key
              damaged: the check's repair puts a running task back with an
              expired lease (it cannot tell a live holder from a dead one),
              and while the key was damaged no heartbeat could extend it
              nor any claim recover the task, so its token still owning the
              task means nobody else took it
  ARGV[4]     n, the number of (task id, fencing token) pairs that follow
  ARGV[5..4+2n]  the pairs
  ARGV[5+2n..]   with KEYS[2..3]: the consumer's name, then field, value
              pairs of its registration (host, pid, in-flight count, ...)
  returns  one code per pair: 1 extended, 0 lost (the token no longer owns a
           running task: the lease expired, whether or not a claim has
           recovered the task yet, unless restoring, or the task was taken,
           or its hash is damaged), 2 extended but cancellation was
           requested (Producer.cancel)
  Registry: the hash gets the fields, hb = now and st (first seen), and
  lives three leases, so a consumer that stops without leaving stays listed
  as gone for two leases after its last heartbeat. st is set again when the
  registration names another process than the stored one (its host, pid or
  incarnation field i differs): a consumer restarted with the same name
  counts its uptime from its own start, though the dead one's hash
  outlives it. Entries whose hash has expired are pruned (a few per call). A damaged registry key skips the
  registration, never the leases.
]]
--- @include "base"

local lease_ms, restore, n = tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
if not lease_ms or not n or n < 0 or #ARGV < 4 + 2 * n
    or (#KEYS >= 3 and (#ARGV - 4 - 2 * n) % 2 ~= 1) then
  return redis.error_reply('ERR aiogroupq heartbeat: malformed arguments')
end
local bad = preflight({ K_LEASES, 'zset' })
if bad then return bad end
-- A damaged registry key costs the consumer its entry, never its leases:
-- the registration is skipped (aiogroupq check reports the key).
local register = #KEYS >= 3 and not preflight({ KEYS[2], 'zset', KEYS[3], 'hash' })
local now = now_ms()
local deadline = now + lease_ms
local codes = {}
for b = 5, 4 + 2 * n, 2 do
  local id = ARGV[b]
  local f = redis.pcall('HMGET', k_task(id), 'k', 's', 'cx')
  -- An expired lease is lost even before a claim recovers its task: its
  -- consumer was silent past the deadline, and must stop.
  if not wrong_type(f) and f[1] == ARGV[b + 1] and f[2] == 'running'
      and (restore or (tonumber(redis.call('ZSCORE', K_LEASES, id)) or 0) > now) then
    if restore then
      redis.call('ZADD', K_LEASES, deadline, id)
    else
      redis.call('ZADD', K_LEASES, 'XX', deadline, id)
    end
    codes[#codes + 1] = f[3] and 2 or 1
  else
    codes[#codes + 1] = 0
  end
end

local PRUNE = 16 -- gone entries looked at per call
if register then
  local registry, info, r = KEYS[2], KEYS[3], 5 + 2 * n
  local fields = { 'hb', now, 'ttl', lease_ms }
  local given = {}
  for i = r + 1, #ARGV, 2 do
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
    given[ARGV[i]] = ARGV[i + 1]
  end
  local was = redis.call('HMGET', info, 'st', 'host', 'pid', 'i')
  local another = not was[1]
  for j, field in ipairs({ 'host', 'pid', 'i' }) do
    if given[field] and was[j + 1] and given[field] ~= was[j + 1] then another = true end
  end
  if another then
    fields[#fields + 1] = 'st'
    fields[#fields + 1] = now
  end
  redis.call('HSET', info, unpack(fields))
  redis.call('PEXPIRE', info, 3 * lease_ms)
  redis.call('ZADD', registry, deadline, ARGV[r])
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', registry, '-inf', '(' .. now, 'LIMIT', 0, PRUNE)) do
    if redis.call('EXISTS', PREFIX .. 'cinfo:' .. name) == 0 then
      redis.call('ZREM', registry, name)
    end
  end
end
return codes
