#!lua flags=no-writes
--[[ consumers.lua: the consumer registry, live consumers first.
  KEYS[1]     {aiogroupq:<q>}:consumers  ZSET the consumer registry
  ARGV[1]     key prefix
  ARGV[2]     the most consumers to list
  returns  {now, {consumer rows (lib/registry.lua), latest heartbeat first}}:
           the live ones, then those gone whose registration has not
           expired yet (three leases after their last heartbeat)
]]
--- @include "registry"

local limit = tonumber(ARGV[2])
if not limit then return redis.error_reply('ERR aiogroupq consumers: malformed arguments') end
local bad = preflight({ K_CONSUMERS, 'zset' })
if bad then return bad end
return { now_ms(), consumer_rows('-inf', '+inf', limit) }
