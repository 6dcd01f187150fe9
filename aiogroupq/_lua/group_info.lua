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
            {group description (describe() in lib/inspect.lua), then when
             its first delayed task is due and, if that is not known, the
             time before which none is (both false unless the group has
             only delayed tasks), then its weight (its own, else the
             queue's default), then its ordering ("strict" or
             "exclusive")}, ...}
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
    -- Each command named as it is: the ACL rule of the views is derived
    -- from these names (tests/test_acl.py).
    if op == 'busiest' then
      names = redis.call('ZREVRANGE', key, start, start + count - 1)
    else
      names = redis.call('ZRANGE', key, start, start + count - 1)
    end
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
local queue_paused = conf().paused
local out = { now, queue_paused and 1 or 0, redis.call('ZCOUNT', K_CONSUMERS, now, '+inf'), next_cursor }
local rows, only_delayed = {}, {}
for _, g in ipairs(names) do
  local row = describe(g)
  rows[#rows + 1] = row
  out[#out + 1] = row
  -- k, d, w, halted, paused: a group whose only tasks are delayed ones
  if row[2] and row[2] == 0 and row[3] > 0 and row[4] == 0 and not row[5]
      and row[7] == 0 and not queue_paused then
    only_delayed[g] = true
  end
end
local dues, horizon = first_dues(only_delayed)
for _, row in ipairs(rows) do
  if row[2] then
    local due = only_delayed[row[1]] and dues[row[1]] or false
    row[#row + 1] = due
    row[#row + 1] = only_delayed[row[1]] and not due and horizon or false
    local G = group(row[1]) -- read by describe(): no command
    row[#row + 1] = G and G.wt or 1
    row[#row + 1] = G and G.exclusive and 'exclusive' or 'strict'

  end
end
return out
