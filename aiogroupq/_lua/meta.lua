#!lua flags=allow-oom
--[[ meta.lua: the layout of a partitioned queue (see _store/partition.py): field
  "parts" of each partition's conf hash, absent for a queue of one
  partition ("1"), "K" for K partitions, "K>K'" while moving to K'.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     "create" K: (partition 0) store K, unless a layout is stored
                  already or the queue holds tasks (it keeps the one
                  partition it has always had)
              "cas" old new: store new if the layout is old (a step of a
                  repartition; "1" removes the field)
  returns  "create": the layout stored after the call; "cas": the one
           stored before it ("1" if none)
  errors   "aiogroupq corrupt <key>: ..." if the conf hash is not a hash
]]
--- @include "base"

-- The words of _store/layout.py's for a damaged conf, less the type found:
-- every role runs this script, and a worker's ACL rule does not grant TYPE.
if wrong_type(redis.pcall('HLEN', K_CONF)) then
  return corrupt(K_CONF,
    "it is not a hash: the queue's settings and partition layout cannot be read")
end
local op, stored = ARGV[2], redis.call('HGET', K_CONF, 'parts') or '1'
if op == 'create' then
  if stored ~= '1' or ARGV[3] == '1' then return stored end
  if redis.call('EXISTS', K_READY, K_DELAYED, K_LEASES, K_DEAD, K_PREADY,
      K_BACKLOG, K_HALTED, K_PAUSED) > 0 then
    return stored
  end
  redis.call('HSET', K_CONF, 'parts', ARGV[3])
  return ARGV[3]
elseif op == 'cas' then
  if stored == ARGV[3] then
    if ARGV[4] == '1' then
      redis.call('HDEL', K_CONF, 'parts')
    else
      redis.call('HSET', K_CONF, 'parts', ARGV[4])
    end
  end
  return stored
end
return redis.error_reply('ERR aiogroupq meta: unknown operation ' .. tostring(op))
