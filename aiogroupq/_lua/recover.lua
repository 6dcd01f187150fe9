#!lua flags=allow-oom
--[[ recover.lua: give back the tasks a consumer's recovery key holds, except
  those it still knows it runs.
  Three uses: a consumer restarted with the same name resumes its previous
  incarnation's tasks at once (counted: they may have run), a consumer
  whose claim reply was lost gives back what that claim took (not counted:
  they never started), and an operator hands back a dead consumer's tasks
  (Admin.release_consumer: counted). Each is fenced as a lease's expiry
  is: the task is no longer running under the holder's token, so the
  holder's late heartbeat, finish or batch top-up is refused.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]     {aiogroupq:<q>}:fence    STRING counter of fencing tokens (only
              checked: a consumer starting on a queue whose claims would be
              refused is refused at once, see below)
  KEYS[6]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  KEYS[7]     {aiogroupq:<q>}:inflight:<consumer>   SET, the recovery key
  ARGV[1]     key prefix
  ARGV[2]     1 to count the interrupted attempt, 0 not to, r to count it
              for a release by an operator (the reason a dead-lettered
              task gets says so)
  ARGV[3]     the consumer's name (a task another consumer owns is only
              dropped from this recovery key, never taken from its owner)
  ARGV[4]     retention of a task cancelled meanwhile, in ms
  ARGV[5..]   ids of tasks the consumer still runs (left alone)
  returns  {given back, {id1, reason1, id2, reason2, ...}}: how many tasks
           went back (each to the front of its group, or dead-lettered when
           counted past its last attempt), and those dead-lettered
  errors   "aiogroupq corrupt <key>: ..." for any fixed key the claim checks
           (the fence too), before anything is written: a consumer's first
           call, so that it refuses to start on a damaged queue
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"
--- @include "recovery"
--- @include "tokens"

local counted, consumer, retention = ARGV[2] ~= '0', ARGV[3], tonumber(ARGV[4])
local why = ARGV[2] == 'r' and 'consumer released by an operator' or 'consumer restarted'
if ARGV[2] ~= '0' and ARGV[2] ~= '1' and ARGV[2] ~= 'r' then
  return redis.error_reply('ERR aiogroupq recover: malformed arguments')
end
if not retention then
  return redis.error_reply('ERR aiogroupq recover: malformed arguments')
end
local bad = check_tokens(KEYS[7])
if bad then return bad end
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
local now = now_ms()
local n, readied, dead_ids = 0, 0, {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  if not keep[id] then
    local owner = redis.pcall('HGET', k_task(id), 'c')
    local became, reason, who
    if owner == consumer then
      local _problem
      became, _problem, reason, who = recover(id, now, why, counted, retention, keep)
      if became ~= 'kept' then n = n + 1 end
      if became == 'ready' then readied = readied + 1 end
      if became == 'dead' then
        dead_ids[#dead_ids + 1] = who or id
        dead_ids[#dead_ids + 1] = reason
      end
    end
    -- A kept member (its head still runs: lib/recovery.lua) stays in the
    -- recovery key, for the recovery that meets its batch later.
    if became ~= 'kept' then redis.call('SREM', KEYS[7], id) end
  end
end
flush()
if readied > 0 then wake(readied) end
return { n, dead_ids }
