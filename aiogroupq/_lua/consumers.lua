#!lua flags=no-writes
--[[ consumers.lua: the consumer registry, live consumers first.
  KEYS[1]     {aiogroupq:<q>}:consumers  ZSET the consumer registry
  ARGV[1]     key prefix
  ARGV[2]     the most consumers to list
  returns  {now, {consumer rows (lib/registry.lua), latest heartbeat first},
           {tasks each row's consumer holds in this partition},
           {the partitions each row's consumer serves, as its heartbeat
           registered them ("0-3,8"; false: not registered)}}: the live
           ones, then those gone whose registration has not expired yet
           (three leases after their last heartbeat). What a consumer holds
           is its recovery key's size (inflight:<c>), the server's record,
           not the count its latest heartbeat reported: a dead consumer
           holds its tasks until they are recovered
]]
--- @include "registry"

local limit = tonumber(ARGV[2])
if not limit then return redis.error_reply('ERR aiogroupq consumers: malformed arguments') end
local bad = preflight({ K_CONSUMERS, 'zset' })
if bad then return bad end
local rows = consumer_rows('-inf', '+inf', limit)
local held, parts = {}, {}
for i, row in ipairs(rows) do
  local n = redis.pcall('SCARD', k_inflight(row[1]))
  held[i] = wrong_type(n) and -1 or n -- -1: damaged (aiogroupq check reports it)
  local p = redis.pcall('HGET', k_cinfo(row[1]), 'parts')
  parts[i] = (not wrong_type(p)) and p or false
end
return { now_ms(), rows, held, parts }
