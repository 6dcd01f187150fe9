#!lua flags=allow-oom
--[[ finish.lua: apply a batch of attempt outcomes, each fenced by its token.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  ARGV[1]     key prefix
  ARGV[2]     retention of succeeded and cancelled tasks in ms (at least a
              minute is kept, so that a re-sent batch is recognised)
  ARGV[3]     n, the number of outcomes; then 5 arguments per outcome:
    id, token  the task and the fencing token its claim handed out
    kind       "ok"      succeeded; arg1 is the encoded result to keep, or ""
               "retry"   run again after arg1 ms (counts as an attempt); arg2
                         is the error that caused it. A grouped task keeps its
                         slot: no later task of the group starts before it;
                         in an exclusive group (ordering "exclusive") its
                         slot passes on during the backoff, and it re-joins
                         the tail of its group's line when due (claim.lua
                         promotes it as it would a first delay)
               "dead"    dead-letter with reason arg1 and traceback arg2; the
                         group passes on to its next task
               "halt"    the same, but the group stops behind the dead task
                         until an operator requeues it or releases the group
               "cancel"  cancelled on request while running (a "retry" or
                         "back" of a task whose cancellation was requested
                         becomes "cancel" too)
               "back"    hand back unfinished (shutdown): front of its group,
                         the attempt not counted
               "line"    a member of a batch not judged (lib/batch.lua): to
                         the front of its group's line, the attempt not
                         counted, its slot dropped without passing it on
                         (the batch's other tasks hold theirs); a batch's
                         lines come in reverse order, so that the line
                         keeps their order, and its head's outcome last
    arg1, arg2 as above ("" where unused)
  returns  one code per outcome: 1 applied, 3 applied as "cancel" (a
           cancellation was requested), 2 already applied by an earlier call
           with this token (a re-sent batch), 0 refused: the lease was lost
           (the token no longer owns the task, or its lease expired, even
           if no claim has recovered the task yet) and nothing was changed,
           4 applied to the task alone: a key of its group is damaged, so
           the task ended (a failure dead-lettered as corrupt) and the group
           was left as it is, 5 refused: the task's hash is damaged.
  Each outcome is applied on its own: a damaged key fails only its outcome.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"
--- @include "batch"

local retention, n = tonumber(ARGV[2]), tonumber(ARGV[3])
if not retention or not n or #ARGV ~= 3 + 5 * n then
  return redis.error_reply('ERR aiogroupq finish: malformed arguments')
end
local KINDS = { ok = true, retry = true, dead = true, halt = true, cancel = true, back = true,
  line = true }
local halting = false
for i = 0, n - 1 do
  local kind = ARGV[4 + 5 * i + 2]
  if kind == 'retry' and not tonumber(ARGV[4 + 5 * i + 3]) then
    return redis.error_reply('ERR aiogroupq finish: malformed retry delay')
  elseif not KINDS[kind] then
    return redis.error_reply('ERR aiogroupq finish: unknown outcome ' .. tostring(kind))
  end
  halting = halting or kind == 'halt'
end
local more = { K_DELAYED, 'zset', K_LEASES, 'zset', K_DEAD, 'zset' }
if halting then more[#more + 1] = K_HALTED; more[#more + 1] = 'set' end
local bad = check_fixed(more)
if bad then return bad end

local now = now_ms(true) -- due times of retries round up
local codes, readied, delayed_earlier = {}, 0, false
-- A slot's mark goes with the group's hash when the group empties, else in
-- one HDEL at flush; leases and recovery-key members go in one command each
-- after the loop (its lease read is only for a running task, and an applied
-- one is no longer running: an id twice in a batch is answered 2 again).
DEFER_DROPS = true
local unleased, unclaimed = {}, {}
-- Heads of batches (lib/batch.lua) ended here: {id, member list, G}.
local ended_heads = {}

-- The priority level a task runnable again takes (0 without one).
local function level(key)
  return tonumber(redis.call('HGET', key, 'p')) or 0
end

-- Apply one outcome whose token owns the running task (f: its fields k, s,
-- g, c, cx, w, bh, bm, bx, as read below); returns its code.
local function apply(id, token, kind, arg1, arg2, f)
  local key = k_task(id)
  local converted = f[5] and (kind == 'retry' or kind == 'back' or kind == 'line')
  if converted then kind = 'cancel' end
  unleased[#unleased + 1] = id
  if f[4] then
    local of = unclaimed[f[4]]
    if not of then
      of = {}
      unclaimed[f[4]] = of
    end
    of[#of + 1] = id
  end
  if f[7] or f[8] or f[9] then redis.call('HDEL', key, 'bh', 'bm', 'bx') end -- batch over
  local g, G = f[3], nil
  if g then
    G = group(g)
    if G and f[8] and not f[7] then ended_heads[#ended_heads + 1] = { id, f[8], G } end
    if not G then -- end the task on its own; its group stays as it is
      if kind == 'ok' or kind == 'cancel' then
        conclude(id, kind == 'ok' and 'succeeded' or 'cancelled', now, retention, f[6] ~= false, token)
      else
        redis.call('HSET', key, 'f', token)
        bury(id, nil, false, now, damage_reason('a key of group ' .. g .. ' is damaged'), arg2)
      end
      return 4
    end
  end
  if kind == 'ok' or kind == 'cancel' then
    if G then readied = readied + release(G, id) end
    local result = kind == 'ok' and arg1 ~= '' and arg1 or nil
    conclude(id, kind == 'ok' and 'succeeded' or 'cancelled', now, retention,
      f[6] ~= false, token, result)
  elseif kind == 'retry' then
    local delay = tonumber(arg1)
    redis.call('HDEL', key, 'c')
    redis.call('HSET', key, 'f', token, 'x', arg2)
    bump('retried', 1)
    if delay <= 0 then
      continue_front(G, id, level(key))
      -- Runnable again now: its pickup latency starts here, not at enqueue.
      redis.call('HSET', key, 's', 'queued', 'dt', now)
      readied = readied + 1
    else
      if G and G.exclusive then
        -- Counted as a first delay meanwhile (d), holding no slot.
        G.d, G.dirty = G.d + 1, true
        readied = readied + release(G, id)
      elseif G then
        set_mark(G, id, 'r')
      end
      local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
      if not first[2] or now + delay < tonumber(first[2]) then delayed_earlier = true end
      redis.call('ZADD', K_DELAYED, now + delay, id)
      redis.call('HSET', key, 's', 'delayed')
    end
  elseif kind == 'dead' or kind == 'halt' then
    redis.call('HSET', key, 'f', token)
    readied = readied + bury(id, G, true, now, arg1, arg2, kind == 'halt')
  elseif kind == 'line' and G then
    redis.call('HDEL', key, 'c')
    if not back_in_line(G, id, now, token) then return 4 end
    readied = readied + fill(G) -- the batch's last slot dropped: the line moves
  else -- back (a line of no group too)
    redis.call('HDEL', key, 'c')
    redis.call('HSET', key, 'f', token, 's', 'queued')
    incr(key, 'a', -1)
    continue_front(G, id, level(key))
    readied = readied + 1
  end
  return converted and 3 or 1
end

for i = 0, n - 1 do
  local b = 4 + 5 * i
  local id, token = ARGV[b], ARGV[b + 1]
  -- Only what every outcome needs: each field named costs the read, most
  -- of all one that is absent (f, p, the batch fields mostly are); the
  -- rest is read on the paths that use it.
  local f = redis.pcall('HMGET', k_task(id), 'k', 's', 'g', 'c', 'cx', 'w', 'bh', 'bm', 'bx')
  if wrong_type(f) then
    codes[#codes + 1] = 5
  elseif f[1] == token and f[2] == 'running'
      and (tonumber(redis.call('ZSCORE', K_LEASES, id)) or 0) > now then
    codes[#codes + 1] = apply(id, token, ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], f)
  elseif redis.call('HGET', k_task(id), 'f') == token then
    codes[#codes + 1] = 2
  else
    codes[#codes + 1] = 0
  end
end
-- A head's outcome comes after its members' (the consumer sends it last):
-- a member still running under it now was left without an outcome (its
-- lease was lost, or its consumer abandoned it). Nobody would line it in
-- order once the head's member list is gone, so it goes back now, the
-- batch's members in their order, ahead of the rest of the line.
for _, h in ipairs(ended_heads) do
  line_members(h[2], h[1], h[3], now, retention)
  readied = readied + fill(h[3])
end
call_many(redis.call, 'ZREM', K_LEASES, unleased)
for consumer, of in pairs(unclaimed) do
  call_many(redis.pcall, 'SREM', k_inflight(consumer), of)
end
flush()
if delayed_earlier and readied == 0 then readied = 1 end
if readied > 0 then wake(readied) end
return codes
