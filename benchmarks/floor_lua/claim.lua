--[[ claim.lua (the floor): take up to n runnable tasks and lease them.
  KEYS[1]     {floor}:ready   LIST runnable task ids, next first
  KEYS[2]     {floor}:leases  ZSET claimed id -> lease deadline (ms)
  ARGV[1]     task key prefix ("{floor}:t:"): a task's HASH is prefix .. id
  ARGV[2]     n, the most tasks to take
  ARGV[3]     the lease deadline (ms; the caller's clock: the floor reads no
              server time)
  ARGV[4]     the claiming consumer's token, stored in each task's hash
  Returns the claimed ids (an empty array when none is ready).
  Per call: LPOP n; per task: HSET + ZADD. The same for grouped tasks: the
  ready list holds only tasks whose group lock is theirs. ]]
local ids = redis.call('LPOP', KEYS[1], ARGV[2])
if not ids then
  return {}
end
local leases, prefix, deadline, token = KEYS[2], ARGV[1], ARGV[3], ARGV[4]
for _, id in ipairs(ids) do
  redis.call('HSET', prefix .. id, 'c', token)
  redis.call('ZADD', leases, deadline, id)
end
return ids
