--[[ enqueue.lua (the floor): add a batch of ungrouped tasks; nothing else.
  KEYS[1]     {floor}:ready  LIST runnable task ids, next first
  ARGV[1]     task key prefix ("{floor}:t:"): a task's HASH is prefix .. id
  ARGV[2..]   per task: id, payload
  Returns the number of tasks added.
  Per task: HSET + RPUSH. ]]
local ready, prefix = KEYS[1], ARGV[1]
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  redis.call('HSET', prefix .. id, 'p', ARGV[i + 1])
  redis.call('RPUSH', ready, id)
end
return (#ARGV - 1) / 2
