--[[ ends.lua: a task's terminal states, and the one recovery path.
  Terminal states: succeeded, cancelled and expired expire after the
  retention window (never sooner than a minute, so that a re-sent finish
  still finds its token); dead stays until purged. Each ends the task's
  count in its group and frees a unique dedup key held by it.
  An ended task's envelope goes (a payload may be large, and is kept only
  by a dead letter); what identifies the task stays in one small field,
  one entry of the hash rather than three:
    i  "<enqueue time> <payload size> <type>": the producer's clock at
       enqueue in ms and the encoded payload's size in bytes (each empty
       if unknown), then the type
  and dt (when it last became runnable, which an ended task no longer
  waits to be) goes, as does cl (its latest claim time, which only a
  running task's group reads), so that an ended task's hash grows by a few
  dozen bytes at most (each hash entry costs about 50 bytes of overhead).
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "holds"

-- Shortest life of a finished task's hash: a re-sent finish must still find
-- its token there to be answered "already applied", not "lease lost".
local MIN_RETENTION = 60000

-- Wake whoever waits for this task's end (Producer.result), if anyone does:
-- a waiter marks the task with field w before it blocks on done:<id>.
-- *waited*: the caller's read of w, or nil to read it here.
local function notify(id, key, waited)
  if waited == nil then waited = redis.call('HEXISTS', key, 'w') == 1 end
  if waited then
    local done = k_done(id)
    if not wrong_type(redis.pcall('RPUSH', done, '1')) then
      redis.call('PEXPIRE', done, 300000)
    end
  end
end

-- A unique dedup key (enqueue with unique=True) is free again at the end.
local function free_unique(id, key)
  if not conf().unique then return end
  local u = redis.call('HGET', key, 'u')
  if u and redis.pcall('GET', k_dedup(u)) == id then redis.call('DEL', k_dedup(u)) end
end

-- MessagePack, read just far enough to find the envelope's fields (see
-- Envelope in task.py: an array of id, type, payload, group, max_attempts,
-- timeout_ms, enqueued_ms, ...). Values are stepped over, never built, so
-- a large payload costs nothing to pass; one made of many small values
-- costs one step each, up to MP_STEPS (about a millisecond), past which it
-- is left unmeasured (and the enqueue time is read from the task id).
local MP_STEPS = 10000
-- Bytes taken by a value of fixed size, by its first byte.
local MP_FIXED = { [0xc0] = 1, [0xc2] = 1, [0xc3] = 1, [0xca] = 5, [0xcb] = 9,
  [0xcc] = 2, [0xcd] = 3, [0xce] = 5, [0xcf] = 9, [0xd0] = 2, [0xd1] = 3, [0xd2] = 5,
  [0xd3] = 9, [0xd4] = 3, [0xd5] = 4, [0xd6] = 6, [0xd7] = 10, [0xd8] = 18 }
-- Bytes of a length (or count) field after the first byte, and what a
-- counted item adds: str, bin and ext are lengths (ext's type byte follows
-- its length), arrays count values, maps pairs.
local MP_SIZED = { [0xd9] = { 1, 0 }, [0xda] = { 2, 0 }, [0xdb] = { 4, 0 },
  [0xc4] = { 1, 0 }, [0xc5] = { 2, 0 }, [0xc6] = { 4, 0 },
  [0xc7] = { 1, 1 }, [0xc8] = { 2, 1 }, [0xc9] = { 4, 1 } }
local MP_COUNTED = { [0xdc] = { 2, 1 }, [0xdd] = { 4, 1 }, [0xde] = { 2, 2 }, [0xdf] = { 4, 2 } }

-- The big-endian unsigned number of *n* bytes at *pos*, nil past the end.
local function mp_uint(s, pos, n)
  if pos + n - 1 > #s then return nil end
  local v = 0
  for i = pos, pos + n - 1 do v = v * 256 + string.byte(s, i) end
  return v
end

-- The position after the value at *pos* and those *more* values after
-- it, or nil for bytes that are not MessagePack or past MP_STEPS values.
local function mp_skip(s, pos, more)
  local left, steps = 1 + (more or 0), 0
  while left > 0 do
    steps = steps + 1
    if steps > MP_STEPS then return nil end
    local b = string.byte(s, pos)
    if not b then return nil end
    left = left - 1
    if b < 0x80 or b >= 0xe0 then
      pos = pos + 1
    elseif b < 0x90 then
      pos, left = pos + 1, left + 2 * (b - 0x80)
    elseif b < 0xa0 then
      pos, left = pos + 1, left + (b - 0x90)
    elseif b < 0xc0 then
      pos = pos + 1 + (b - 0xa0)
    elseif MP_FIXED[b] then
      pos = pos + MP_FIXED[b]
    elseif MP_SIZED[b] then
      local width, extra = MP_SIZED[b][1], MP_SIZED[b][2]
      local len = mp_uint(s, pos + 1, width)
      if not len then return nil end
      pos = pos + 1 + width + extra + len
    elseif MP_COUNTED[b] then
      local width, per = MP_COUNTED[b][1], MP_COUNTED[b][2]
      local n = mp_uint(s, pos + 1, width)
      if not n then return nil end
      pos, left = pos + 1 + width, left + per * n
    else
      return nil -- 0xc1: never used
    end
  end
  if pos > #s + 1 then return nil end
  return pos
end

-- The string at *pos* and the position after it, or nil.
local function mp_str(s, pos)
  local b = string.byte(s, pos)
  if not b then return nil end
  local len, at
  if b >= 0xa0 and b < 0xc0 then
    len, at = b - 0xa0, pos + 1
  elseif b == 0xd9 or b == 0xda or b == 0xdb then
    local width = MP_SIZED[b][1]
    len, at = mp_uint(s, pos + 1, width), pos + 1 + width
  end
  if not len or at + len - 1 > #s then return nil end
  return string.sub(s, at, at + len - 1), at + len
end

-- The non-negative integer at *pos*, or nil.
local function mp_count(s, pos)
  local b = string.byte(s, pos)
  if not b then return nil end
  if b < 0x80 then return b end
  local width = ({ [0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8 })[b]
  if width then return mp_uint(s, pos + 1, width) end
  return nil
end

-- An id made by new_task_id() (task.py) starts with the producer's clock
-- in ms, in 12 hex digits, read just before it stamps enqueued_ms.
local MADE_ID = '^(' .. string.rep('%x', 12) .. ')' .. string.rep('%x', 16) .. '%-?%d*$'

-- A task's type, payload size and enqueue time from its envelope, each
-- nil where the bytes do not tell (the size and time only past a payload
-- of at most MP_STEPS values).
local function envelope_identity(e)
  local b = string.byte(e, 1)
  local n, pos
  if b and b >= 0x90 and b < 0xa0 then
    n, pos = b - 0x90, 2
  elseif b == 0xdc then
    n, pos = mp_uint(e, 2, 2), 4
  end
  if not n or n < 3 then return nil end
  local _, after_id = mp_str(e, pos)
  if not after_id then return nil end
  local task_type, at = mp_str(e, after_id)
  if not task_type then return nil end
  local after = mp_skip(e, at)
  if not after then return task_type end
  local size, enqueued = after - at, nil
  if n >= 7 then
    local at_time = mp_skip(e, after, 2) -- group, max_attempts, timeout_ms
    if at_time then enqueued = mp_count(e, at_time) end
    if enqueued == 0 then enqueued = nil end -- not stamped
  end
  return task_type, size, enqueued
end

-- A terminal state that expires after the retention window; *token* (the
-- finishing claim's, kept so a re-sent finish is recognised) and *result*
-- are written with it when given, *waited* as for notify().
local function conclude(id, state, now, retention, waited, token, result)
  local key = k_task(id)
  notify(id, key, waited)
  free_unique(id, key)
  if result then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token, 'r', result)
  elseif token then
    redis.call('HSET', key, 's', state, 'ft', now, 'f', token)
  else
    redis.call('HSET', key, 's', state, 'ft', now)
  end
  local e = redis.call('HGET', key, 'e')
  local task_type, size, enqueued
  if e then task_type, size, enqueued = envelope_identity(e) end
  if task_type then
    if not enqueued then -- a payload too long to walk
      local made = string.match(id, MADE_ID)
      enqueued = made and tonumber(made, 16)
    end
    redis.call('HSET', key, 'i', string.format('%s %s %s',
      enqueued and string.format('%d', enqueued) or '', size or '', task_type))
  end
  redis.call('HDEL', key, 'e', 'c', 'xp', 'dt', 'cl')
  redis.call('PEXPIRE', key, math.max(retention, MIN_RETENTION))
  bump(state, 1) -- succeeded, cancelled, expired: each its own counter
end

-- Terminal state "dead": keep the envelope for inspection and requeue, until
-- purged. A slot *holder* passes its slot on, or with *halt_it* the group
-- stops behind it. Returns how many tasks became runnable.
local function bury(id, G, holder, now, reason, trace, halt_it)
  local key = k_task(id)
  redis.call('HSET', key, 's', 'dead', 'x', reason, 'tb', trace, 'ft', now)
  redis.call('HDEL', key, 'c', 'xp')
  redis.call('ZADD', K_DEAD, now, id)
  notify(id, key)
  free_unique(id, key)
  bump('dead', 1)
  if not (G and holder) then return 0 end
  if halt_it then
    halt(G, id)
    return 0
  end
  return release(G, id)
end

-- The reason a task with damaged keys is dead-lettered with.
local function damage_reason(what)
  return 'Corrupt: ' .. what .. ' (run "aiogroupq check --repair")'
end

-- A task not started before its expiry time ends "expired" and never runs.
local function expire(id, G, holder, now, retention)
  redis.call('HSET', k_task(id), 'x', 'Expired: not started before its expiry time')
  conclude(id, 'expired', now, retention)
  if G and holder then return release(G, id) end
  return 0
end
