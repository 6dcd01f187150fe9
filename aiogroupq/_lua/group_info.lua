#!lua flags=no-writes
--[[ group_info.lua: groups as seen now, for "why is my group not running".
  KEYS[1]     {aiogroupq:<q>}:ready      LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed    ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases     ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:dead       ZSET id -> time dead-lettered (server ms)
  KEYS[5]     {aiogroupq:<q>}:consumers  ZSET the consumer registry
  ARGV[1]     key prefix
  ARGV[2]     what to describe:
    "groups" g1 g2 ...         these groups
    "busiest" offset count     groups with the longest lines, longest first
    "oldest" offset count      groups whose line has waited longest, oldest first
    "halted" cursor count      halted groups (an SSCAN step)
    "paused" cursor count      paused groups (an SSCAN step)
  returns  {now, queue paused, consumers alive, next cursor or -1,
            {group description (describe() in lib/inspect.lua)}, ...}
           The listings take at most count groups per call (a page), so no
           call walks every group.
  errors   "aiogroupq corrupt <key>: ..." if a fixed key it reads is damaged
]]
--- @include "inspect"

local op = ARGV[2]
local bad = check_views()
if bad then return bad end
local now = now_ms()
local names, next_cursor = {}, -1
if op == 'groups' then
  for i = 3, #ARGV do names[#names + 1] = ARGV[i] end
else
  local start, count = tonumber(ARGV[3]), tonumber(ARGV[4])
  if not start or not count or count < 1 or count > 100 then
    return redis.error_reply('ERR aiogroupq group_info: malformed arguments')
  end
  if op == 'busiest' or op == 'oldest' then
    local key = op == 'busiest' and K_BACKLOG or K_WAITING
    local cmd = op == 'busiest' and 'ZREVRANGE' or 'ZRANGE'
    names = redis.call(cmd, key, start, start + count - 1)
    if #names == count and redis.call('ZCARD', key) > start + count then
      next_cursor = start + count
    end
  elseif op == 'halted' or op == 'paused' then
    local reply = redis.call('SSCAN', op == 'halted' and K_HALTED or K_PAUSED, start, 'COUNT', count)
    names = reply[2]
    if reply[1] ~= '0' then next_cursor = reply[1] end
  else
    return redis.error_reply('ERR aiogroupq group_info: unknown operation ' .. tostring(op))
  end
end
local out = { now, conf().paused and 1 or 0, redis.call('ZCOUNT', K_CONSUMERS, now, '+inf'), next_cursor }
for _, g in ipairs(names) do out[#out + 1] = describe(g) end
return out
