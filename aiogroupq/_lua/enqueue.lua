#!lua
--[[ enqueue.lua: add a batch of tasks atomically.
  KEYS[1]     {aiogroupq:<q>}:ready    LIST runnable task ids, next first
  KEYS[2]     {aiogroupq:<q>}:delayed  ZSET id -> due time (server ms)
  KEYS[3]     {aiogroupq:<q>}:wake     LIST wake tokens that blocked fetchers BLPOP
  ARGV[1]     key prefix
  ARGV[2]     deduplication window in ms
  ARGV[3]     n, the number of tasks; then 14 arguments per task:
    id            client-made task id
    group         group key, or "" for none
    envelope      MessagePack envelope (opaque here)
    delay_ms      0 for none, else ms from now (server clock)
    run_at_ms     0 for none, else the due time in Unix ms (server clock);
                  wins over delay_ms
    max_attempts  integer >= 1
    dedup_key     "" for none; a queue-wide key (valid UTF-8), or a key held
                  within the task's group: "\xff<group>\xff<key>"
                  (_store/keys.py scoped_dedup; 0xFF is never UTF-8, so the
                  two kinds never meet). Either is the task's "u" when unique
    unique        "1": the dedup key holds until the task ends, not for the
                  window
    priority      "" for the group's default (else 0), or 0..9
    expires_ms    0 for none, else ms from now before which it must start
    expire_at_ms  0 for none, else the Unix ms before which it must start
    schedule      "" for none, else a schedule name: the task is enqueued
                  only if its tick is later than the schedule's last one
    tick          the schedule tick (Unix ms), or 0
    identity      what the task keeps once ended (its hash's i): "<enqueue
                  ms> <payload size> <type>", or "" for nothing
  ARGV[4+14n]  (a partitioned queue, see _store/partition.py) this partition's
               number p; then one argument per task: crc32 of its group, or
               "" for an ungrouped task. A queue whose conf holds "parts"
               refuses calls without them.
  returns  one id per task: its own; or, when its dedup key is held by
           another task (within the window, or until it ends with unique),
           that task's id, and nothing is written; "" for a schedule tick
           already enqueued; ">" for a task whose group moved to its new
           partition (repartitioning, nothing written for it: the producer
           sends it there). A task whose id exists is left as it is, so a
           re-sent enqueue (lost reply, client retry) returns the same ids.
  errors   (nothing written) "aiogroupq group-full <i> <live> <cap>": task i
           would take its group over its max_size; "aiogroupq group-corrupt
           <i>" / "aiogroupq corrupt <key>: ...": a key the batch needs is
           damaged; "aiogroupq stale <parts>": a task does not belong in this
           partition under the layout it holds (<parts>, "1" if none): the
           producer reads the layout again and routes anew.
  Partitions: this partition holds tasks of groups whose crc32 % K is p, and
           ungrouped ones. While the queue moves from K to K' partitions
           ("K>K'"), a group's old partition keeps taking its tasks only
           while it is live there (so its older tasks finish before its new
           partition starts any), and answers ">" otherwise; its new
           partition takes them (producers ask the old one first).
  Effects: each new task becomes a hash t:<id>; an undelayed one joins its
           group (a free slot and the ready tail, or the group's line); a
           delayed one waits in the delayed ZSET.
]]
--- @include "base"
--- @include "ready"
--- @include "groups"

local PER = 14
-- A task's arguments are ARGV[b + ...], b = 4 + PER * i (the header's order).
local ID, GROUP, ENVELOPE, DELAY, RUN_AT, ATTEMPTS, DEDUP = 0, 1, 2, 3, 4, 5, 6
local UNIQUE, PRIO, EXPIRES, EXPIRE_AT, SCHED, TICK, IDENT = 7, 8, 9, 10, 11, 12, 13
local window, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local HASHES = n and 4 + PER * n -- ARGV[HASHES] is p, ARGV[HASHES + 1 + i] task i's hash
local routed = n and #ARGV == 4 + PER * n + n
if not window or window <= 0 or not n or (#ARGV ~= 3 + PER * n and not routed) then
  return redis.error_reply('ERR aiogroupq enqueue: malformed arguments')
end
local part = routed and tonumber(ARGV[HASHES])
local any_prio, any_unique = false, false -- any_prio: of the new tasks
for i = 0, n - 1 do
  local b = 4 + PER * i
  local delay, run_at, attempts = tonumber(ARGV[b + DELAY]), tonumber(ARGV[b + RUN_AT]), tonumber(ARGV[b + ATTEMPTS])
  local prio, tick = ARGV[b + PRIO], tonumber(ARGV[b + TICK])
  if not (delay and run_at and attempts and tonumber(ARGV[b + EXPIRES]) and tonumber(ARGV[b + EXPIRE_AT]) and tick)
      or (prio ~= '' and not tonumber(prio))
      or (routed and not (part and (ARGV[b + GROUP] == '') == (ARGV[HASHES + 1 + i] == '')
        and (ARGV[b + GROUP] == '' or tonumber(ARGV[HASHES + 1 + i])))) then
    return redis.error_reply('ERR aiogroupq enqueue: malformed task arguments')
  end
  any_unique = any_unique or ARGV[b + UNIQUE] == '1'
end

-- Read everything the batch will write before its first write: the
-- settings now, the fixed keys once the plan says which it writes.
local bad = read_conf()
if bad then return bad end
local now = now_ms(true)

-- Partitions: every task must belong here under the layout this partition
-- holds; a task of a group moving away is "moved" unless its group is
-- live here (read before this batch adds to it: all of a group's tasks in
-- the batch get the same answer).
local moved = {}
local stored = conf().parts
if stored or routed then
  local function stale()
    return redis.error_reply('ERR aiogroupq stale ' .. (stored or '1'))
  end
  if not routed then return stale() end
  local K, K2 = tonumber(stored or 1), nil
  if not K then
    local a, b = string.match(stored, '^(%d+)>(%d+)$')
    K, K2 = tonumber(a), tonumber(b)
  end
  if not K then return corrupt(K_CONF, 'parts is ' .. stored) end
  for i = 0, n - 1 do
    local h, ok = tonumber(ARGV[HASHES + 1 + i]), false
    if not h then
      ok = part < (K2 or K)
    elseif not K2 then
      ok = h % K == part
    elseif h % K2 == part then
      ok = true
    elseif h % K == part then
      local G = group(ARGV[5 + PER * i])
      if not G then return redis.error_reply('ERR aiogroupq group-corrupt ' .. i) end
      ok, moved[i] = true, not G.existed
    end
    if not ok then return stale() end
  end
end

local plan, seen, adds, first_of = {}, {}, {}, {}
local any_new, any_delayed = false, false
for i = 0, n - 1 do
  local b = 4 + PER * i
  local id, g, dkey, sched = ARGV[b + ID], ARGV[b + GROUP], ARGV[b + DEDUP], ARGV[b + SCHED]
  local p = { id = id, out = id, new = true, g = g ~= '' and g or nil, dkey = dkey }
  if moved[i] then p.new, p.out, p.dkey, sched = false, '>', '', '' end
  if sched ~= '' then
    local last = redis.pcall('GET', PREFIX .. 'sched:' .. sched)
    if wrong_type(last) then return corrupt(PREFIX .. 'sched:' .. sched, last.err) end
    if (tonumber(last) or -1) >= tonumber(ARGV[b + TICK]) then p.new, p.out = false, '' end
  end
  if p.new and dkey ~= '' then
    local first = seen[dkey]
    if not first then
      first = redis.pcall('GET', k_dedup(dkey))
      if wrong_type(first) then return corrupt(k_dedup(dkey), first.err) end
    end
    if first and first ~= id then p.new, p.out = false, first end
  end
  if p.out == id and dkey ~= '' then seen[dkey] = id end
  if p.new and redis.call('EXISTS', k_task(id)) == 1 then p.new = false end
  if p.new and p.g then
    local G = group(p.g)
    if not G then return redis.error_reply('ERR aiogroupq group-corrupt ' .. i) end
    adds[p.g] = (adds[p.g] or 0) + 1
    first_of[p.g] = first_of[p.g] or i
    local live = G.k + G.d + G.w + adds[p.g]
    if G.mx and live > G.mx then
      return redis.error_reply('ERR aiogroupq group-full ' .. i .. ' ' .. (live - 1) .. ' ' .. G.mx)
    end
  end
  if p.new and (tonumber(ARGV[b + PRIO]) or (p.g and GROUPS[p.g].prio) or 0) > 0 then
    any_prio = true
  end
  if p.new then
    any_new = true
    local run_at = tonumber(ARGV[b + RUN_AT])
    if (run_at > 0 and run_at or now + tonumber(ARGV[b + DELAY])) > now then any_delayed = true end
  end
  plan[i] = p
end
-- Only the fixed keys this batch writes are probed (a single ungrouped task
-- due now writes ready, stats and wake): a probe is a command per call.
if any_new then
  local more = {}
  if next(adds) then
    more[#more + 1] = K_BACKLOG; more[#more + 1] = 'zset'
    more[#more + 1] = K_WAITING; more[#more + 1] = 'zset'
  end
  if any_delayed then more[#more + 1] = K_DELAYED; more[#more + 1] = 'zset' end
  bad = preflight(runnable_keys(more))
  if bad then return bad end
end
-- A group that may queue tasks in its line: is the line's key usable?
for g, count in pairs(adds) do
  local G = GROUPS[g]
  if (count > 1 or not has_room(G)) and wrong_type(redis.pcall('LLEN', k_park(g))) then
    return redis.error_reply('ERR aiogroupq group-corrupt ' .. first_of[g])
  end
end

if any_prio and not conf().prio then
  local pbad = preflight({ K_PREADY, 'zset', K_PSEQ, 'string' })
  if pbad then return pbad end
  redis.call('HSET', K_CONF, 'pu', 1)
  CONF.prio = true
end
if any_unique and not conf().unique then
  redis.call('HSET', K_CONF, 'uq', 1)
  CONF.unique = true
end

local ids, readied, earliest, earliest_read, earliest_changed = {}, 0, nil, false, false
for i = 0, n - 1 do
  local b = 4 + PER * i
  local p = plan[i]
  ids[i + 1] = p.out
  if p.out == p.id and p.dkey ~= '' then
    if ARGV[b + UNIQUE] == '1' then
      redis.call('SET', k_dedup(p.dkey), p.id)
    else
      redis.call('SET', k_dedup(p.dkey), p.id, 'PX', window)
    end
  end
  if p.new then
    local id, g = p.id, p.g
    local G = g and GROUPS[g]
    local delay, run_at = tonumber(ARGV[b + DELAY]), tonumber(ARGV[b + RUN_AT])
    local due = run_at > 0 and run_at or now + delay
    local level = tonumber(ARGV[b + PRIO]) or (G and G.prio) or 0
    local expires, expire_at = tonumber(ARGV[b + EXPIRES]), tonumber(ARGV[b + EXPIRE_AT])
    local xp = expire_at > 0 and expire_at or (expires > 0 and now + expires) or nil
    if ARGV[b + SCHED] ~= '' then redis.call('SET', PREFIX .. 'sched:' .. ARGV[b + SCHED], ARGV[b + TICK]) end
    local state = 'queued'
    if due > now then
      state = 'delayed'
      if not earliest_read then -- before our own ZADD: was there an earlier one?
        local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
        earliest, earliest_read = first[2] and tonumber(first[2]) or nil, true
      end
      redis.call('ZADD', K_DELAYED, due, id)
      if not earliest or due < earliest then earliest, earliest_changed = due, true end
      if G then G.d, G.dirty = G.d + 1, true end
    else
      due = now
      if route(id, G, level) == 'ready' then readied = readied + 1 end
    end
    local fields = { 'e', ARGV[b + ENVELOPE], 'm', ARGV[b + ATTEMPTS], 'a', 0, 's', state, 'dt', due }
    if g then fields[#fields + 1] = 'g'; fields[#fields + 1] = g end
    if ARGV[b + IDENT] ~= '' then fields[#fields + 1] = 'i'; fields[#fields + 1] = ARGV[b + IDENT] end
    if level > 0 then fields[#fields + 1] = 'p'; fields[#fields + 1] = level end
    if xp then fields[#fields + 1] = 'xp'; fields[#fields + 1] = xp end
    if ARGV[b + UNIQUE] == '1' and p.dkey ~= '' then
      fields[#fields + 1] = 'u'; fields[#fields + 1] = p.dkey
    end
    redis.call('HSET', k_task(id), unpack(fields))
    bump('enqueued', 1)
  end
end
flush()
-- A new earliest due time must reach blocked fetchers, which sleep until the
-- old one: one token makes one of them recompute its timer.
if earliest_changed and readied == 0 then readied = 1 end
if readied > 0 then wake(readied) end
return ids
