#!lua flags=allow-oom
--[[ claim.lua: recover expired leases, promote due tasks, then claim up to k
  runnable tasks for one consumer.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:leases   ZSET id -> lease deadline (server ms)
  KEYS[4]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  KEYS[5]     {aiogroupq:<q>}:fence    STRING counter of fencing tokens
  KEYS[6]     {aiogroupq:<q>}:dead     ZSET id -> time dead-lettered (server ms)
  KEYS[7]     {aiogroupq:<q>}:inflight:<consumer>   SET, the consumer's recovery key
  KEYS[8]     {aiogroupq:<q>}:lastclaim:<consumer>  STRING "<nonce>:<id>,<id>..."
  ARGV[1]     key prefix
  ARGV[2]     consumer name
  ARGV[3]     k, the most tasks to claim
  ARGV[4]     lease duration in ms
  ARGV[5]     the most ready entries to look at (bounds the script's time)
  ARGV[6]     the most due delayed tasks to promote
  ARGV[7]     the most expired leases to recover
  ARGV[8]     a nonce unique to this call: a re-sent call (a client retrying
              after a lost reply) is answered with the tasks the first one
              claimed, instead of claiming more
  ARGV[9]     retention of expired and cancelled tasks in ms
  ARGV[10]    batch handlers (lib/batch.lua): how many task types, then each
              type and its batch size; absent or 0: none, and nothing of
              batches runs
  returns  {wait_ms, more, now_ms, {dead}, {problems}, {expired ids},
            id1, envelope1, attempt1, token1, due1, max_attempts1, id2, ...}
           wait_ms: ms until the next delayed task (or rate-limited
           group) is due, -1 if none
           more: 1 if runnable entries are left
           dead: id1, reason1, id2, reason2, ...: tasks this call
           dead-lettered (lease expired on the last attempt, damaged keys),
           for the consumer's log and on_dead
           problems: damaged keys met (entries dropped, a task holding no
           slot of its group), to log
           expired ids: tasks this call ended "expired" (for metrics)
           due: when the task became runnable (server ms): its enqueue, the
           end of its delay or retry backoff, its group's turn
           max_attempts: the task's own (the hash's, which recovery uses)
           With batch handlers each task has a 7th value: 1 for a member of
           the batch of the task before it (lib/batch.lua), 2 for the head
           of a recovered batch, which runs alone (bx), else 0.
  Effects: (a) each expired lease's task goes back to the front as its
           group's continuation (or, past its last attempt, is
           dead-lettered and its slot passed on); (b) due delayed tasks join
           their group, a retry or rate-limited head at the front; (c) each
           entry popped from the ready list is claimed: a fresh fencing
           token (in its hash and its group's slot), a lease, and an entry
           in the consumer's recovery key; unless its group is paused or
           halted, or its group's rate is used up (held aside, the rate with
           a "~<group>" member of the delayed ZSET due when it frees), or it
           expired (ended "expired"). A grouped task's claim time goes in its
           hash (cl), for a pause of its group to wait on (control.lua).
  Flags: allow-oom, so that a full Redis still drains: a claim adds about
  150 bytes per task, which the task's finish frees.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"
--- @include "recovery"
--- @include "batch"
--- @include "starts"
--- @include "tokens"

local consumer, k = ARGV[2], tonumber(ARGV[3])
local lease_ms, scan_limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local promote_limit, recover_limit = tonumber(ARGV[6]), tonumber(ARGV[7])
local nonce, retention = ARGV[8], tonumber(ARGV[9])
if not (k and lease_ms and scan_limit and promote_limit and recover_limit and retention)
    or lease_ms <= 0 or nonce == '' then
  return redis.error_reply('ERR aiogroupq claim: malformed arguments')
end
local batch_sizes = nil
if ARGV[10] and ARGV[10] ~= '0' then
  local types = tonumber(ARGV[10])
  if not types or #ARGV ~= 10 + 2 * types then
    return redis.error_reply('ERR aiogroupq claim: malformed arguments')
  end
  batch_sizes = {}
  for j = 0, types - 1 do batch_sizes[ARGV[11 + 2 * j]] = tonumber(ARGV[12 + 2 * j]) end
end
local inflight, last_key = KEYS[7], KEYS[8]
local bad = check_tokens(inflight, { last_key, 'string' })
if bad then return bad end
local now = now_ms()
local out = { -1, 0, now, {}, {}, {} }
local dead_ids, problems, expired_ids = out[4], out[5], out[6]
local function dead_letter(id, reason)
  dead_ids[#dead_ids + 1] = id
  dead_ids[#dead_ids + 1] = reason
end

-- The reply's tail: is more runnable, and when is the next delayed task due.
local function reply()
  if not conf().paused and ready_len() > 0 then
    out[2] = 1
    wake(1) -- others may be idle while we are full: keep one of them awake
  end
  local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if first[2] then
    local wait = tonumber(first[2]) - now
    out[1] = wait > 0 and wait or 0
  end
  flush()
  return out
end

local last = redis.call('GET', last_key)
if last and string.sub(last, 1, #nonce + 1) == nonce .. ':' then
  for id in string.gmatch(string.sub(last, #nonce + 2), '[^,]+') do
    local f = redis.pcall('HMGET', k_task(id), 'e', 'a', 'k', 's', 'c', 'dt', 'm', 'bh')
    if not wrong_type(f) and f[4] == 'running' and f[5] == consumer then
      for _, v in ipairs({ id, f[1], tonumber(f[2]), tonumber(f[3]), tonumber(f[6]) or now,
          tonumber(f[7]) or 1 }) do
        out[#out + 1] = v
      end
      if batch_sizes then out[#out + 1] = f[8] and 1 or 0 end
    end
  end
  return reply()
end

local readied = 0

-- (a) Recovery comes before any claim, so an interrupted task is at the front
-- of its group again before a later task of its group could be looked at.
-- A task of a batch brings its batch's members back with it: every task
-- moved counts against RECOVER_BUDGET, and once it is spent the rest waits
-- for the next claim (the script's time stays bounded).
local RECOVER_BUDGET, recovered = 1000, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, recover_limit)) do
  if recovered + MOVED >= RECOVER_BUDGET then break end
  recovered = recovered + 1
  local became, problem, reason, who = recover(id, now, 'lease expired', true, retention)
  if became == 'dead' then dead_letter(who or id, reason) end
  if problem then problems[#problems + 1] = problem end
end

local function bury_damaged(id, G, holder, what)
  local reason = damage_reason(what)
  readied = readied + bury(id, G, holder, now, reason, '')
  dead_letter(id, reason)
end

-- A ready entry its group never gave a slot: the group that did may hold
-- that slot for it for good (its field g was changed after it got one), so
-- the claim names the group the task was enqueued in (its envelope's, read
-- only on this path) for the log, and the check repairs both groups.
local function unmarked(id, g, e)
  local ok, env = pcall(cmsgpack.unpack, e)
  local was = ok and type(env) == 'table' and env[4]
  if type(was) == 'string' and was ~= g then
    return 'task ' .. id .. ' was enqueued in group ' .. was .. ' but its group field says '
      .. g .. ': group ' .. was .. ' keeps a slot for it and waits'
  end
  return 'task ' .. id .. ' in the ready list holds no slot of its group ' .. g
end

-- A task hash that exists but lacks what a live task needs (terminal tasks
-- drop their envelope, so only live states are held to it).
local LIVE = { queued = true, delayed = true, running = true }
local TERMINAL = { succeeded = true, dead = true, cancelled = true, expired = true }
local function incomplete(f, e, s, m, a)
  local state = f[s]
  if TERMINAL[state] then return false end
  if not LIVE[state] then return true end
  return not f[e] or not tonumber(f[m]) or (f[a] and not tonumber(f[a])) or false
end

-- (b) Promote due tasks in due order.
-- Ids are what producers make (printable ASCII); anything else in a list is
-- damage, dropped and reported rather than handed to a consumer.
local function not_an_id(id, where)
  -- '!'..'~' is %w%p (printable, no space) as one range: cheaper to match.
  if id ~= '' and not string.find(id, '[^!-~]') then return false end
  problems[#problems + 1] = 'an entry of ' .. where .. ' is not a task id: dropped'
  return true
end

-- *due* is the entry's score: when the task became runnable again, which
-- a retry's or a delayed task's pickup latency is measured from (not its
-- first enqueue, nor this claim's promotion, which may come later).
local function promote(id, due)
  redis.call('ZREM', K_DELAYED, id)
  if string.sub(id, 1, 1) == RATE_WAKE then -- a rate-limited group may start again
    bump('ratewait', -1)
    local G = group(string.sub(id, 2))
    if G then readied = readied + unshelve(G) end
    return
  end
  if not_an_id(id, K_DELAYED) then return end
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 'g', 's', 'a', 'xp', 'p', 'e', 'm')
  if wrong_type(f) then
    problems[#problems + 1] = key .. ' is not a task hash (' .. f.err .. '): delayed entry dropped'
    return
  end
  if not (f[1] or f[2] or f[6]) then return end -- no such task: a stale entry
  if f[2] ~= 'delayed' and not incomplete(f, 6, 2, 7, 3) then return end -- stale
  local g, G, m = f[1], nil, false
  if g then
    G = group(g)
    if not G then return bury_damaged(id, nil, false, 'a key of group ' .. g .. ' is damaged') end
    m = mark(G, id)
  end
  if incomplete(f, 6, 2, 7, 3) then
    if G and not m then G.d, G.dirty = G.d - 1, true end
    return bury_damaged(id, G, m, 'the task hash lacks fields it needs')
  end
  local xp = tonumber(f[4])
  local expired = xp and now >= xp and (tonumber(f[3]) or 0) == 0
  local level = tonumber(f[5]) or 0
  if m then -- a retry: its group waited for it
    if expired then
      expired_ids[#expired_ids + 1] = id
      readied = readied + expire(id, G, true, now, retention)
    else
      set_mark(G, id, '@')
      ready_push(id, true, group_level(G, level))
      redis.call('HSET', key, 's', 'queued', 'dt', due)
      readied = readied + 1
    end
    return
  end
  if G then G.d, G.dirty = G.d - 1, true end
  if expired then
    expired_ids[#expired_ids + 1] = id
    expire(id, nil, false, now, retention)
    return
  end
  local where = route(id, G, level)
  if not where then return bury_damaged(id, G, false, 'the line of group ' .. g .. ' is damaged') end
  redis.call('HSET', key, 's', 'queued', 'dt', due)
  if where == 'ready' then readied = readied + 1 end
end
local due_now = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, promote_limit)
for i = 1, #due_now, 2 do
  promote(due_now[i], tonumber(due_now[i + 1]) or now)
end

-- (c) Claim from the front of the ready list. The leases and the recovery
-- key's members are written once, after the loop (nothing in it reads them).
local ids, claimed, first_token, leases = {}, 0, nil, {}

-- A batch handler's head takes its members from its group's line, each
-- with a token of its own, listed in the reply right after it. At most
-- 1,000 members a call in all: the script's time stays bounded (a head
-- that finds the budget spent runs with fewer).
local member_budget = 1000
local function take_batch(head, G, i, bx)
  if bx then return end -- its batch was recovered: it runs alone (batch.lua)
  local typ = type_of(i)
  local n = batch_sizes[typ]
  if not n or n < 2 or not batch_allowed(G, 0) then return end
  local found = batch_candidates(G, typ, math.min(n - 1, member_budget), now)
  if #found == 0 then return end
  member_budget = member_budget - #found
  local first = redis.call('INCRBY', K_FENCE, #found) - #found + 1
  claim_members(G, head, found, first, consumer, now, true)
  reply_members(found, out, ids, leases, now, lease_ms, 1)
end

local function take(id)
  if not_an_id(id, 'the ready list') then return end
  local key = k_task(id)
  -- With batch handlers the same read brings the type and bx take_batch needs.
  local f
  if batch_sizes then
    f = redis.pcall('HMGET', key, 'e', 'g', 's', 'a', 'm', 'xp', 'dt', 'i', 'bx')
  else
    f = redis.pcall('HMGET', key, 'e', 'g', 's', 'a', 'm', 'xp', 'dt')
  end
  if wrong_type(f) then
    problems[#problems + 1] = key .. ' is not a task hash (' .. f.err .. '): ready entry dropped'
    return
  end
  if not (f[1] or f[2] or f[3]) then return end -- no such task: a stale entry
  local broken = incomplete(f, 1, 3, 5, 4)
  if f[3] ~= 'queued' and not broken then return end -- stale: it is elsewhere or ended
  local g, G, m = f[2], nil, false
  if g then
    G, m = group(g, id)
    if not G then return bury_damaged(id, nil, false, 'a key of group ' .. g .. ' is damaged') end
  end
  if broken then return bury_damaged(id, G, m, 'the task hash lacks fields it needs') end
  if G then
    if not m then -- an entry the scripts did not mark: only a damaged queue has one
      problems[#problems + 1] = unmarked(id, g, f[1])
      if not has_room(G) then
        if wrong_type(redis.pcall('RPUSH', k_park(g), id)) then
          return bury_damaged(id, G, false, 'the line of group ' .. g .. ' is damaged')
        end
        G.w, G.dirty = G.w + 1, true
        bump('parked', 1)
        return
      end
      take_slot(G, id, '@')
    end
    if G.halted or G.paused then
      if not shelve(G, id) then
        bury_damaged(id, G, true, 'the held list of group ' .. g .. ' is damaged')
      end
      return
    end
  end
  local attempt = tonumber(f[4] or 0)
  local xp = tonumber(f[6])
  if xp and attempt == 0 and now >= xp then
    expired_ids[#expired_ids + 1] = id
    readied = readied + expire(id, G, G ~= nil, now, retention)
    return
  end
  if G and G.rn then
    local free_at = rate_wait(G, now)
    if not free_at then
      return bury_damaged(id, G, true, 'the rate key of group ' .. g .. ' is damaged')
    end
    if free_at > 0 then -- waits aside, keeping its slot, until the rate frees
      if not rate_hold(G, id, free_at) then
        bury_damaged(id, G, true, 'the held list of group ' .. g .. ' is damaged')
      end
      return
    end
  end
  first_token = first_token or redis.call('INCRBY', K_FENCE, k) - k + 1
  local token = first_token + claimed
  if G then
    set_mark(G, id, token)
    if G.rn then rate_record(G, now) end
  end
  if G then
    -- cl: a pause of the group waits out the start window of its latest
    -- claim (control.lua), after which a consumer no longer starts it.
    redis.call('HSET', key, 's', 'running', 'k', token, 'c', consumer, 'a', attempt + 1, 'cl', now)
  else
    redis.call('HSET', key, 's', 'running', 'k', token, 'c', consumer, 'a', attempt + 1)
  end
  if xp then redis.call('HDEL', key, 'xp') end
  claimed = claimed + 1
  ids[#ids + 1] = id
  leases[#leases + 1], leases[#leases + 2] = now + lease_ms, id
  local o = #out
  out[o + 1], out[o + 2], out[o + 3] = id, f[1], attempt + 1
  out[o + 4], out[o + 5], out[o + 6] = token, tonumber(f[7]) or now, tonumber(f[5])
  if batch_sizes then
    out[o + 7] = f[9] and 2 or 0
    if G then take_batch(id, G, f[8], f[9]) end
  end
end

if not conf().paused then
  local scanned = 0
  while claimed < k and scanned < scan_limit do
    local id = pop_ready()
    if not id then break end
    scanned = scanned + 1
    take(id)
  end
end
if claimed > 0 then
  call_many(redis.call, 'ZADD', K_LEASES, leases)
  call_many(redis.call, 'SADD', inflight, ids)
end
bump('started', claimed)
count_starts(claimed, now)
redis.call('SET', last_key, nonce .. ':' .. table.concat(ids, ','), 'PX', lease_ms)
if readied > 0 then wake(readied) end
return reply()
