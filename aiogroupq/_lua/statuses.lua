#!lua flags=no-writes
--[[ statuses.lua: the state of each of many tasks (Producer.status_many).
  KEYS[1..n]  {aiogroupq:<q>}:t:<id>   HASH one task each (callers send at
              most 500 per call, several calls in one pipeline, so that no
              call holds the server long)
  ARGV[1]     key prefix
  returns  one entry per key: its task's state, false (nil) for no such
           task, or "!" when the key is not a task hash
]]
--- @include "base"

local out = {}
for i = 1, #KEYS do
  local s = redis.pcall('HGET', KEYS[i], 's')
  if wrong_type(s) then s = '!' end
  out[#out + 1] = s or false
end
return out
