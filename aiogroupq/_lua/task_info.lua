#!lua flags=no-writes
--[[ task_info.lua: one task as seen now, and its place in its group.
  KEYS[1]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[2]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[3]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     task id
  returns  {} if there is no such task, else {now, {field, value, ...} of
           its hash, lease deadline, due time (delayed ZSET), dead since,
           ms left before the hash expires (-1: kept until purged), its
           group's slot mark, tasks of its group before it, queue paused,
           its group: {paused, the dead task it is halted behind, when its
           rate frees} or false}
           Tasks before it: false unless the task waits in its group's
           order: 0 for a slot holder (running, or next to run), else the
           group's slot holders plus its place in the group's line (LPOS:
           O(line)).
  errors   "aiogroupq corrupt <key>: ..." if the task's hash or the queue's
           conf is damaged
]]
--- @include "base"
--- @include "slots"

-- conf() and group() read the queue's settings: a damaged conf is refused.
local bad = preflight({ K_CONF, 'hash' })
if bad then return bad end
local id = ARGV[2]
local key = k_task(id)
local fields = redis.pcall('HGETALL', key)
if wrong_type(fields) then return corrupt(key, fields.err) end
if #fields == 0 then return {} end
local s, g = redis.call('HGET', key, 's'), redis.call('HGET', key, 'g')
local mark, ahead, facts = false, false, false
if g then
  local G = group(g)
  if G then
    facts = { G.paused and 1 or 0, G.halted or false, score(K_DELAYED, RATE_WAKE .. g) }
    mark = redis.call('HGET', G.key, 'h:' .. id) or false
    if mark then
      ahead = 0
    elseif s == 'queued' then
      local at = redis.pcall('LPOS', k_park(g), id)
      if type(at) == 'number' then ahead = G.k + at end
    end
  end
end
return { now_ms(), fields, score(K_LEASES, id), score(K_DELAYED, id), score(K_DEAD, id),
  redis.call('PTTL', key), mark, ahead, conf().paused and 1 or 0, facts }
