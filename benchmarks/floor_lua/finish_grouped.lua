--[[ finish_grouped.lua (the floor): end a batch of grouped claimed tasks;
  each hands its group to the next task of its line, or unlocks it.
  KEYS[1]     {floor}:leases  ZSET claimed id -> lease deadline (ms)
  KEYS[2]     {floor}:ready   LIST runnable task ids, next first
  ARGV[1]     task key prefix ("{floor}:t:"): a task's HASH is prefix .. id
  ARGV[2]     lock key prefix ("{floor}:lock:"), as in enqueue_grouped.lua
  ARGV[3]     line key prefix ("{floor}:line:"), as in enqueue_grouped.lua
  ARGV[4..]   per task: id, group (the caller knows each task's group: the
              floor reads nothing back)
  Returns the number of tasks ended.
  Per task: DEL + ZREM + LPOP of the line, then RPUSH of the next task to the
  ready list (the lock passes to it) or DEL of the lock. ]]
local leases, ready = KEYS[1], KEYS[2]
local prefix, locks, lines = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV, 2 do
  local id, group = ARGV[i], ARGV[i + 1]
  redis.call('DEL', prefix .. id)
  redis.call('ZREM', leases, id)
  local nxt = redis.call('LPOP', lines .. group)
  if nxt then
    redis.call('RPUSH', ready, nxt)
  else
    redis.call('DEL', locks .. group)
  end
end
return (#ARGV - 3) / 2
