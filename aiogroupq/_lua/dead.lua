#!lua flags=allow-oom
--[[ dead.lua: operator actions on dead letters and halted groups.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[4]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     "requeue": each dead task id in ARGV[3..] runs again with a
                         fresh set of attempts, first in its group's line
                         (at once if a slot is free); not while its group
                         holds max_size live tasks (the cap enqueue keeps),
                         unless it is the task the group is halted behind
                         (then the group's way on, one over the cap at most)
              "requeue_here": as "requeue", but only a task whose group is
                         live in this partition (a partitioned queue: a
                         group lives in one partition at a time, and this
                         is not the one it belongs to now)
              "purge":   each dead task id in ARGV[3..] is deleted; a group
                         halted by it goes on with its next task
              "release": each group in ARGV[3..] halted by a dead task goes
                         on with its next task (the dead task stays dead)
              "preview": a read: ARGV[3] bytes at most of the envelope of
                         each task id in ARGV[4..], so that a page showing
                         the start of payloads (the dashboard's dead
                         letters) is not sent each one whole
              Callers send at most a few hundred targets per call, so that
              one call stays short.
  returns  how many of ARGV[3..] were acted on (others were not dead, or not
           halted, or had damaged keys, or their group was full, and were
           left alone); for "preview", per id the first bytes of its
           envelope, false if it has none (or its hash is damaged)
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "holds"

local op, n, readied = ARGV[2], 0, 0
if op == 'preview' then -- reads only: no fixed key needed
  local most, heads = tonumber(ARGV[3]), {}
  if not most or most < 1 then
    return redis.error_reply('ERR aiogroupq dead: malformed preview')
  end
  for i = 4, #ARGV do
    local e = redis.pcall('HGET', k_task(ARGV[i]), 'e')
    heads[#heads + 1] = type(e) == 'string' and string.sub(e, 1, most) or false
  end
  return heads
end
if op ~= 'requeue' and op ~= 'requeue_here' and op ~= 'purge' and op ~= 'release' then
  return redis.error_reply('ERR aiogroupq dead: unknown operation ' .. tostring(op))
end
local bad = check_fixed({ K_DEAD, 'zset', K_HALTED, 'set' })
if bad then return bad end

local function requeue(id, key, g, u)
  local G = nil
  if g then
    G = group(g)
    if not G then return false end
    if op == 'requeue_here' and not G.existed then return false end
    -- The cap an enqueue keeps (a requeue adds a live task as one does).
    if G.mx and G.halted ~= id and G.k + G.d + G.w >= G.mx then return false end
    if G.halted ~= id and not has_room(G)
        and wrong_type(redis.pcall('LLEN', k_park(g))) then return false end
  elseif op == 'requeue_here' then
    return false
  end
  redis.call('ZREM', K_DEAD, id)
  redis.call('HDEL', key, 'x', 'tb', 'ft', 'f', 'k', 'cx', 'w')
  redis.call('DEL', k_done(id)) -- its end is in the future again
  redis.call('HSET', key, 'a', 0, 's', 'queued', 'dt', now_ms())
  if u then redis.call('SET', k_dedup(u), id, 'NX') end
  if not G then
    ready_push(id, true)
  elseif G.halted == id then -- it halted its group: the group resumes with it
    take_slot(G, id, '@')
    ready_push(id, true, group_level(G, nil))
    G.halted = nil
    redis.call('HDEL', G.key, '!')
    redis.call('SREM', K_HALTED, g)
    readied = readied + unshelve(G)
  elseif has_room(G) then
    take_slot(G, id, '@')
    ready_push(id, true, group_level(G, nil))
  else -- first in its group's line
    redis.call('LPUSH', k_park(g), id)
    G.w, G.dirty = G.w + 1, true
    bump('parked', 1)
    return true
  end
  readied = readied + 1
  return true
end

local function purge(id, key, g)
  redis.call('ZREM', K_DEAD, id)
  redis.call('DEL', key)
  if g then
    local G = group(g)
    if G and G.halted == id then readied = readied + unhalt(G) end
  end
end

for i = 3, #ARGV do
  if op == 'release' then
    local G = group(ARGV[i])
    if G and G.halted then
      n = n + 1
      readied = readied + unhalt(G)
    end
  else
    local id = ARGV[i]
    local key = k_task(id)
    local f = redis.pcall('HMGET', key, 's', 'g', 'u')
    if wrong_type(f) then
      if op == 'purge' then redis.call('ZREM', K_DEAD, id) end
    elseif f[1] == 'dead' then
      if op == 'purge' then
        purge(id, key, f[2] or nil)
        n = n + 1
      elseif requeue(id, key, f[2] or nil, f[3] or nil) then
        n = n + 1
      end
    elseif op == 'purge' then
      -- An index entry of a task that is not dead is stale: drop it, so that
      -- purging everything always ends.
      redis.call('ZREM', K_DEAD, id)
    end
  end
end
flush()
if readied > 0 then wake(readied) end
return n
