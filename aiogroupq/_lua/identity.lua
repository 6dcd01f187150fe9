#!lua flags=allow-oom
--[[ identity.lua: a consumer name held by one live process at a time.
  KEYS[1]     {aiogroupq:<q>}:consumer:<name>   STRING holder "<host>:<pid>:<nonce>"
  ARGV[1]     key prefix
  ARGV[2]     "take"   hold the name if it is free (or already ours)
              "force"  take it from the holder in ARGV[5], known to be dead
                       (refused if the holder changed meanwhile)
              "renew"  extend our hold, or take the name again if our hold
                       lapsed and nobody took it
              "drop"   let go of it, if ours
  ARGV[3]     our holder value
  ARGV[4]     how long a hold lasts without renewal, in ms
  ARGV[5]     with "force": the dead holder's value
  returns  "" when the operation succeeded, else the current holder ("" is
           also returned by drop when the name was not ours)
]]
--- @include "base"
local key, op, me, ttl = KEYS[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if not ttl then
  return redis.error_reply('ERR aiogroupq identity: malformed arguments')
end
local holder = redis.pcall('GET', key)
if wrong_type(holder) then return corrupt(key, holder.err) end
if (op == 'force' and holder == ARGV[5])
    or ((op == 'take' or op == 'renew') and (not holder or holder == me)) then
  redis.call('SET', key, me, 'PX', ttl)
  return ''
elseif op == 'drop' then
  if holder == me then redis.call('DEL', key) end
  return ''
end
return holder or ''
