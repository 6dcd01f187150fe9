--[[ batch.lua: ordered group batches (Handler(batch_size=N)).
  A batch is a head, claimed from the ready list as any task, and members:
  the next tasks of the head's group's line (park:<g>), consecutive and of
  the head's type, taken at the head's claim (claim.lua) or while the
  consumer waits to fill the batch (batch_extend.lua). A member is claimed
  as a task of its own (fencing token, lease, recovery-key entry, attempt)
  and also holds a slot of the group (its mark: its token), so that the
  group holds more slots than its limit while the batch runs and starts
  nothing else until every slot of the batch is dropped. Members are taken
  only while the batch holds its group alone (its limit is 1: batch_allowed).
  A member is recovered only with its batch, from its head (lib/recovery.lua),
  and a head's finish lines the members it leaves running (finish.lua).
  Task hash fields (only on tasks of a batch):
    bm  on the head: its members' ids, in order, comma-separated
    bh  on a member: its head's id
    bx  on the head of a recovered batch: it runs alone until it has an
        outcome, so that a task that kills its consumer every time (a
        member as well as the head) costs only its own attempts, never
        the attempts of the head it came with
  A member given back unjudged ("line": the batch failed before it, the
  consumer handed the batch back, or the batch was recovered) goes to the
  front of its group's line, its attempt not counted, its slot dropped
  without passing it on: the batch's other tasks still hold theirs.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"
--- @include "ends"
--- @include "starts"

-- Members lined by recoveries so far in this call: a claim charges them to
-- its recovery budget (claim.lua).
--- @per-call
local MOVED = 0

-- The task type of an i field ("<enqueue ms> <payload size> <type>").
local function type_of(i)
  if type(i) ~= 'string' then return nil end
  return string.match(i, '^%S+ %S+ (.*)$')
end

-- Up to *n* tasks from the front of G's line that may join a batch of type
-- *typ*: queued, whole, of that type, not past their expiry; the first that
-- is not stops the batch (it keeps its place). Nothing is written. Returns
-- a list of {id, envelope, attempt it will start, max attempts, expiry}.
local function batch_candidates(G, typ, n, now)
  if n <= 0 or G.halted or G.paused or G.w <= 0 then return {} end
  local front = redis.pcall('LRANGE', k_park(G.name), 0, n - 1)
  if wrong_type(front) then return {} end
  local found = {}
  for _, id in ipairs(front) do
    local f = redis.pcall('HMGET', k_task(id), 'e', 's', 'a', 'm', 'i', 'xp', 'cx')
    if wrong_type(f) or f[2] ~= 'queued' or not f[1] or not tonumber(f[4]) or f[7]
        or type_of(f[5]) ~= typ then
      break
    end
    local attempt = tonumber(f[3] or 0)
    if not attempt then break end
    local xp = tonumber(f[6])
    if xp and attempt == 0 and now >= xp then break end -- its own claim expires it
    found[#found + 1] = { id, f[1], attempt + 1, tonumber(f[4]), xp }
  end
  return found
end

-- Claim *found* (batch_candidates') for *head*'s batch: out of the line,
-- each with token first_token + i - 1, a slot of G, running for *consumer*.
-- *fresh*: the head's member list starts over (its claim), else it grows.
-- The caller adds the leases and the recovery-key entries.
local function claim_members(G, head, found, first_token, consumer, now, fresh)
  local n = #found
  redis.call('LTRIM', k_park(G.name), n, -1)
  G.w, G.dirty = G.w - n, true
  bump('parked', -n)
  bump('started', n)
  count_starts(n, now)
  local names = {}
  for i, t in ipairs(found) do
    local id, token = t[1], first_token + i - 1
    t[6] = token
    take_slot(G, id, token)
    local key = k_task(id)
    redis.call('HSET', key, 's', 'running', 'k', token, 'c', consumer, 'a', t[3],
      'cl', now, 'dt', now, 'bh', head)
    if t[5] then redis.call('HDEL', key, 'xp') end
    names[i] = id
  end
  local list = table.concat(names, ',')
  if not fresh then
    local had = task_field(head, 'bm')
    if had then list = had .. ',' .. list end
  end
  redis.call('HSET', k_task(head), 'bm', list)
end

-- A member back to the front of G's line, its slot dropped without passing
-- it on; false if the line's key is damaged (nothing written).
local function park_front(G, id)
  if wrong_type(redis.pcall('LPUSH', k_park(G.name), id)) then return false end
  drop_slot(G, id)
  G.w, G.dirty = G.w + 1, true
  bump('parked', 1)
  return true
end

-- The one way a member goes back unjudged (finish's "line", a recovery):
-- the front of its line, queued, its attempt not counted; *token* (finish)
-- is recorded as applied. Returns false if the line is damaged: the task is
-- then dead-lettered as corrupt.
local function back_in_line(G, id, now, token)
  local key = k_task(id)
  if not park_front(G, id) then
    if token then redis.call('HSET', key, 'f', token) end
    bury(id, G, true, now, damage_reason('the line of group ' .. G.name .. ' is damaged'), '')
    return false
  end
  if token then
    redis.call('HSET', key, 'f', token, 's', 'queued')
  else
    redis.call('HSET', key, 's', 'queued')
  end
  incr(key, 'a', -1)
  return true
end

-- Members just claimed (claim_members') into a claim's reply *out*, the
-- leases and recovery-key ids the caller writes; *flag*: a 7th value per
-- task (claim's reply with batch handlers: 1, a member), or nil.
local function reply_members(found, out, ids, leases, now, lease_ms, flag)
  for _, t in ipairs(found) do
    ids[#ids + 1] = t[1]
    leases[#leases + 1], leases[#leases + 2] = now + lease_ms, t[1]
    local o = #out
    out[o + 1], out[o + 2], out[o + 3] = t[1], t[2], t[3]
    out[o + 4], out[o + 5], out[o + 6] = t[6], now, t[4]
    if flag then out[o + 7] = flag end
  end
end

-- Members may be taken for a head of G only while the batch holds G alone:
-- G's limit is 1 and its slots are the head's and its *members* running
-- ones. With a higher limit an earlier task of G may still run, and a member
-- would start beside it: each task then runs as a batch of one.
local function batch_allowed(G, members)
  return G.limit == 1 and G.k <= 1 + members
end

-- Recovery of one member of *head*'s batch still running: back to the front
-- of the line uncounted (a cancellation requested ends it cancelled).
-- Returns whether it was one.
local function line_member(id, head, G, now, retention)
  local key = k_task(id)
  local f = redis.pcall('HMGET', key, 's', 'bh', 'c', 'cx')
  if wrong_type(f) or f[1] ~= 'running' or f[2] ~= head then return false end
  redis.call('ZREM', K_LEASES, id)
  if f[3] then redis.pcall('SREM', k_inflight(f[3]), id) end
  redis.call('HDEL', key, 'c', 'bh')
  MOVED = MOVED + 1
  if f[4] then
    drop_slot(G, id)
    conclude(id, 'cancelled', now, retention)
  else
    back_in_line(G, id, now, nil)
  end
  return true
end

-- Recovery of *head*'s batch (lib/recovery.lua): its members still running
-- go back to the front of the line in order (reversed front pushes), so
-- that none of them comes back runnable beside the others; the head is
-- recovered by the caller, and runs alone next (bx). Idempotent: a member
-- no longer running is left.
-- (line_members: also the members a finished head leaves running, finish.lua.)
local function line_members(list, head, G, now, retention)
  local members = {}
  for id in string.gmatch(list, '[^,]+') do members[#members + 1] = id end
  for i = #members, 1, -1 do line_member(members[i], head, G, now, retention) end
end
local function line_batch(head, G, now, retention)
  local list = task_field(head, 'bm')
  if not list then return end
  redis.call('HDEL', k_task(head), 'bm')
  redis.call('HSET', k_task(head), 'bx', '1')
  line_members(list, head, G, now, retention)
end
