#!lua flags=allow-oom
--[[ recover.lua: give back the tasks a consumer's recovery key holds, except
  those it still knows it runs.
  Two uses: a consumer restarted with the same name resumes its previous
  incarnation's tasks at once (counted: they may have run), and a consumer
  whose claim reply was lost gives back what that claim took (not counted:
  they never started).
  KEYS[1..6]  the common keys (see _lib.lua)
  KEYS[7]     {aiogroupq:<q>}:inflight:<consumer>   SET, the recovery key
  ARGV[1]     key prefix
  ARGV[2]     1 to count the interrupted attempt, 0 not to
  ARGV[3]     the consumer's name (a task another consumer owns is only
              dropped from this recovery key, never taken from its owner)
  ARGV[4..]   ids of tasks the consumer still runs (left alone)
  returns  the number of tasks given back (each to the front of its group,
           or dead-lettered when counted past its last attempt)
]]
local counted, consumer = ARGV[2] == '1', ARGV[3]
local keep = {}
for i = 4, #ARGV do keep[ARGV[i]] = true end
local now = now_ms()
local n, readied = 0, 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  if not keep[id] then
    if redis.call('HGET', k_task(id), 'c') == consumer then
      n = n + 1
      if recover(id, now, 'consumer restarted', counted) then readied = readied + 1 end
    end
    redis.call('SREM', KEYS[7], id)
  end
end
if readied > 0 then wake(readied) end
return n
