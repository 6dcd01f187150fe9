#!lua flags=allow-oom
--[[ wait.lua: read a task's end, and mark it as waited for if it has not ended.
  KEYS[1]  {aiogroupq:<q>}:t:<id>   HASH the task
  ARGV[1]  key prefix
  returns  {} if there is no such task, else {state, result or false,
           reason or false}. A task not yet ended gets field w, so that its
           end pushes a token on done:<id> for waiters blocked there.
]]
--- @include "base"

local key = KEYS[1]
local f = redis.pcall('HMGET', key, 's', 'r', 'x')
if wrong_type(f) then return corrupt(key, f.err) end
if not f[1] then return {} end
if f[1] == 'queued' or f[1] == 'delayed' or f[1] == 'running' then
  redis.call('HSET', key, 'w', 1)
end
return f
