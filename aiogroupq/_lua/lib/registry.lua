--[[ registry.lua: the consumer registry, read-only (heartbeat.lua writes it).
  K_CONSUMERS  {aiogroupq:<q>}:consumers  ZSET consumer name -> when it counts
               as gone (its last heartbeat + its lease, server ms)
  cinfo:<c>    HASH a consumer's registration: host, pid, hb last heartbeat,
               ttl lease ms, st first seen, n tasks in flight, c concurrency,
               and its counters
]]
--- @include "base"

local function k_cinfo(c) return PREFIX .. 'cinfo:' .. c end

-- Consumers whose gone-at score lies in [lo, hi], newest first, at most
-- *limit*: {name, gone_at, host, pid, ns, hb, ttl, st, n, c, counters...}
-- each (ns: its pid namespace, beside its pid).
local CONSUMER_FIELDS = { 'host', 'pid', 'ns', 'hb', 'ttl', 'st', 'n', 'c', 'claimed',
  'succeeded', 'retried', 'dead', 'cancelled', 'handed_back', 'lease_lost' }
local function consumer_rows(lo, hi, limit)
  local rows = {}
  local found = redis.call('ZREVRANGEBYSCORE', K_CONSUMERS, hi, lo, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #found, 2 do
    local f = redis.pcall('HMGET', k_cinfo(found[i]), unpack(CONSUMER_FIELDS))
    if not wrong_type(f) and f[4] then -- else expired: pruned by a heartbeat soon
      local row = { found[i], tonumber(found[i + 1]) }
      for j = 1, #CONSUMER_FIELDS do row[#row + 1] = f[j] or false end
      rows[#rows + 1] = row
    end
  end
  return rows
end
