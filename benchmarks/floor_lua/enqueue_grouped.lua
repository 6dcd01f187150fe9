--[[ enqueue_grouped.lua (the floor): add a batch of grouped tasks; a task
  whose group is idle takes the group's lock and goes to the ready list, any
  other waits in its group's line.
  KEYS[1]     {floor}:ready  LIST runnable task ids, next first
  ARGV[1]     task key prefix ("{floor}:t:"): a task's HASH is prefix .. id
  ARGV[2]     lock key prefix ("{floor}:lock:"): a group's lock is prefix .. group
              (STRING, held from its first task's enqueue until its line is empty)
  ARGV[3]     line key prefix ("{floor}:line:"): a group's line is prefix .. group
              (LIST of the task ids waiting behind the running one)
  ARGV[4..]   per task: id, group, payload
  Returns the number of tasks added.
  Per task: HSET + SET NX, then RPUSH to the ready list or to the line. ]]
local ready, prefix, locks, lines = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV, 3 do
  local id, group = ARGV[i], ARGV[i + 1]
  redis.call('HSET', prefix .. id, 'p', ARGV[i + 2], 'g', group)
  if redis.call('SET', locks .. group, id, 'NX') then
    redis.call('RPUSH', ready, id)
  else
    redis.call('RPUSH', lines .. group, id)
  end
end
return (#ARGV - 3) / 3
