--[[ finish.lua (the floor): end a batch of ungrouped claimed tasks.
  KEYS[1]     {floor}:leases  ZSET claimed id -> lease deadline (ms)
  ARGV[1]     task key prefix ("{floor}:t:"): a task's HASH is prefix .. id
  ARGV[2..]   the finished task ids
  Returns the number of tasks ended.
  Per task: DEL + ZREM. ]]
local leases, prefix = KEYS[1], ARGV[1]
for i = 2, #ARGV do
  local id = ARGV[i]
  redis.call('DEL', prefix .. id)
  redis.call('ZREM', leases, id)
end
return #ARGV - 1
