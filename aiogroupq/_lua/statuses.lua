#!lua flags=no-writes
--[[ statuses.lua: the state of each of many tasks (Producer.status_many).
  KEYS[1..6]  the common keys (see lib/base.lua)
  ARGV[1]     key prefix
  ARGV[2..]   task ids (callers send at most 500 per call, several
              calls in one pipeline, so that no call holds the server long)
  returns  one entry per id: its state, false (nil) for no such task, or
           "!" when its key is not a task hash
]]
--- @include "base"

local out = {}
for i = 2, #ARGV do
  local s = redis.pcall('HGET', k_task(ARGV[i]), 's')
  if wrong_type(s) then s = '!' end
  out[#out + 1] = s or false
end
return out
