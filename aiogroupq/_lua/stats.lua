#!lua flags=no-writes
--[[ stats.lua: a queue's counts in one call, without scanning anything.
  KEYS[1]     {aiogroupq:<q>}:ready      LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed    ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases     ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:dead       ZSET id -> time dead-lettered (server ms)
  KEYS[5]     {aiogroupq:<q>}:consumers  ZSET the consumer registry
  ARGV[1]     key prefix
  ARGV[2]     the most live consumers to list
  returns  {now, exists, paused, ready list, ready zset, delayed members,
            leases, dead, groups with a line, halted, paused groups,
            consumers alive, consumers recently gone, dt of the ready head,
            dt of the priority head, earliest line start, next due,
            {stats hash field, value, ...}, {consumer rows (lib/registry.lua)},
            {tasks in the lines of paused or halted groups, their heads
             still in the ready list}}
           Every count is a ZCARD, LLEN, SCARD or a counter the scripts keep
           in the stats hash, so the call is O(log n) however deep the
           queue, except what paused and halted groups hold back: a pause
           or a halt leaves their tasks where they are (their heads in the
           ready list until a claim sets them aside, their lines parked),
           so those are read from each such group's hash, for at most
           HELD_SCAN paused and HELD_SCAN halted groups (about 3 ms at that
           bound; the tasks of groups beyond it count as ready or parked).
  errors   "aiogroupq corrupt <key>: ..." if a key it reads is damaged
]]
--- @include "inspect"
--- @include "registry"

local limit = tonumber(ARGV[2])
if not limit then return redis.error_reply('ERR aiogroupq stats: malformed arguments') end
local bad = check_views()
if bad then return bad end
local now = now_ms()

-- When the entry at the head of a runnable index became runnable.
local function head_dt(id)
  if not id then return false end
  return tonumber(task_field(id, 'dt')) or false
end
local ready_head = redis.call('LINDEX', K_READY, 0)
local pready_head = redis.call('ZRANGE', K_PREADY, 0, 0)[1]
local earliest_line = redis.call('ZRANGE', K_WAITING, 0, 0, 'WITHSCORES')[2]
local next_due = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')[2]

local gone = 0
for _, name in ipairs(redis.call('ZREVRANGEBYSCORE', K_CONSUMERS, '(' .. now, '-inf', 'LIMIT', 0, 100)) do
  if redis.call('EXISTS', k_cinfo(name)) == 1 then gone = gone + 1 end
end
local exists = redis.call('EXISTS', K_STATS, K_CONF, K_CONSUMERS) > 0

-- What paused and halted groups hold back besides their held lists (the
-- held counter): their lines, and their heads still in the ready list.
local HELD_SCAN = 1000
local lines, heads, seen = 0, 0, {}
for _, index in ipairs({ K_PAUSED, K_HALTED }) do
  local names
  if redis.call('SCARD', index) <= HELD_SCAN then
    names = redis.call('SMEMBERS', index)
  else
    names = redis.call('SSCAN', index, 0, 'COUNT', HELD_SCAN)[2]
  end
  for _, g in ipairs(names) do
    if not seen[g] then
      seen[g] = true
      local h = redis.pcall('HGETALL', k_group(g))
      if not wrong_type(h) then
        for i = 1, #h, 2 do
          if h[i] == 'w' then
            lines = lines + (tonumber(h[i + 1]) or 0)
          elseif h[i + 1] == '@' and string.sub(h[i], 1, 2) == 'h:' then
            heads = heads + 1
          end
        end
      end
    end
  end
end

return {
  now, exists and 1 or 0, conf().paused and 1 or 0,
  redis.call('LLEN', K_READY), redis.call('ZCARD', K_PREADY),
  redis.call('ZCARD', K_DELAYED), redis.call('ZCARD', K_LEASES), redis.call('ZCARD', K_DEAD),
  redis.call('ZCARD', K_BACKLOG), redis.call('SCARD', K_HALTED), redis.call('SCARD', K_PAUSED),
  redis.call('ZCOUNT', K_CONSUMERS, now, '+inf'), gone,
  head_dt(ready_head), head_dt(pready_head),
  tonumber(earliest_line) or false, tonumber(next_due) or false,
  redis.call('HGETALL', K_STATS),
  consumer_rows(now, '+inf', limit),
  { lines, heads },
}
